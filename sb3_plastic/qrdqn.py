"""PlasticQRDQN: sb3-contrib's QR-DQN with plastic policies and AdamO."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch as th
from sb3_contrib import QRDQN
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.contrib_policies import PlasticQRDQNCnnPolicy, PlasticQRDQNMultiInputPolicy, PlasticQRDQNPolicy

_POLICY_KWARGS_INDEX = list(inspect.signature(QRDQN.__init__).parameters).index("policy_kwargs") - 1  # minus self


class PlasticQRDQN(PlasticAlgorithmMixin, QRDQN):
    """Quantile-Regression DQN (Dabney et al., 2018) with isometry-preserving networks.

    Same constructor as ``sb3_contrib.QRDQN`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`. The target network is a copy of the online network (also
    after orthogonal initialisation). ``isometry_mode="off", optimizer="adam"`` is exactly sb3-contrib's
    QRDQN.

    Without ``optimizer_class`` in ``policy_kwargs``, sb3-contrib writes ``optimizer_class=Adam,
    optimizer_kwargs={"eps": 0.01 / batch_size}`` into them; here only the epsilon is kept, so the optimizer
    chosen by ``optimizer=`` (AdamO or Adam) gets QR-DQN's epsilon.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticQRDQNPolicy,
        "CnnPolicy": PlasticQRDQNCnnPolicy,
        "MultiInputPolicy": PlasticQRDQNMultiInputPolicy,
    }

    def __init__(self, policy: Any, env: Any, *args: Any, **kwargs: Any) -> None:
        index = _POLICY_KWARGS_INDEX - 2  # after policy and env
        user = kwargs.get("policy_kwargs", args[index] if len(args) > index else None) or {}
        # sb3-contrib's default optimizer (set in QRDQN.__init__) is replaced in _setup_model; not saved
        self._plastic_contrib_optimizer = "optimizer_class" not in user
        super().__init__(policy, env, *args, **kwargs)

    def _setup_model(self) -> None:
        contrib_default = self.__dict__.pop("_plastic_contrib_optimizer", False)
        if contrib_default and self.policy_kwargs.get("optimizer_class") is th.optim.Adam:
            del self.policy_kwargs["optimizer_class"]  # keep optimizer_kwargs = {"eps": 0.01 / batch_size}
        super()._setup_model()
