"""PlasticDQN: SB3's DQN with plastic policies and AdamO, an optional Double DQN target and an optional squared TD
loss."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, ClassVar, Union

import stable_baselines3.dqn.dqn as sb3_dqn
import torch as th
import torch.nn.functional as F
from stable_baselines3 import DQN
from stable_baselines3.common.policies import BasePolicy
from torch import nn

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.policies import PlasticDQNCnnPolicy, PlasticDQNMultiInputPolicy, PlasticDQNPolicy


class DoubleQTarget(nn.Module):
    """Stands in for the target network inside SB3's ``DQN.train``: for next observations ``s'`` it returns a tensor
    whose maximum over actions is ``Q_target(s', argmax_a Q_online(s', a))`` (every other entry is ``-inf``), so
    SB3's own target ``r + gamma * max_a(...)`` becomes the Double DQN target (van Hasselt et al., 2016) and nothing
    of SB3's update is copied. Called under SB3's ``no_grad``; the online forward therefore feeds no gradient-gated
    hook (Continual Backprop records only forwards with gradients).

    :param online: the online Q-network (chooses the action).
    :param target: the target Q-network (evaluates it).
    """

    def __init__(self, online: nn.Module, target: nn.Module) -> None:
        super().__init__()
        self.online = online
        self.target = target

    def forward(self, obs: Any) -> th.Tensor:
        q_target = self.target(obs)
        action = self.online(obs).argmax(dim=1, keepdim=True)
        return th.full_like(q_target, -th.inf).scatter_(1, action, q_target.gather(1, action))


#: the losses of the TD error ``PlasticDQN(td_loss=...)`` accepts
TD_LOSSES = ("huber", "mse")


class _TDLossFunctional:
    """Stands in for ``torch.nn.functional`` in SB3's DQN module (installed there at the first ``td_loss="mse"`` update
    and left in place): its ``smooth_l1_loss`` is ``mse_loss`` while the calling thread runs a ``td_loss="mse"``
    update, SB3's Huber loss otherwise; every other name is torch's. Thread-local, so models training in parallel
    threads (optuna's ``n_jobs``) each keep their own loss."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)

    def smooth_l1_loss(self, *args: Any, **kwargs: Any) -> th.Tensor:
        if getattr(self._local, "squared", False):
            return F.mse_loss(*args, **kwargs)
        return F.smooth_l1_loss(*args, **kwargs)


@contextlib.contextmanager
def _squared_td_loss() -> Iterator[None]:
    """SB3's ``DQN.train`` with ``F.mse_loss`` where it calls ``F.smooth_l1_loss``, in this thread, for the call
    (:class:`_TDLossFunctional`), so nothing of SB3's update is copied."""
    functional = sb3_dqn.F
    if not isinstance(functional, _TDLossFunctional):
        functional = sb3_dqn.F = _TDLossFunctional()  # type: ignore[assignment]
    functional._local.squared = True
    try:
        yield
    finally:
        functional._local.squared = False


class PlasticDQN(PlasticAlgorithmMixin, DQN):
    """Deep Q-Network (Mnih et al., 2015) with isometry-preserving networks.

    Same constructor as ``stable_baselines3.DQN`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`, ``double_q`` and ``td_loss``. The target network is a copy of the
    online network (also after orthogonal initialisation). ``isometry_mode="off", optimizer="adam"`` is exactly SB3's DQN.

    :param double_q: the Double DQN target (van Hasselt, Guez & Silver, 2016, *Deep Reinforcement Learning with
        Double Q-learning*): the next action is chosen by the online network and evaluated by the target network,
        ``r + gamma * Q_target(s', argmax_a Q_online(s', a))``, instead of SB3's ``r + gamma * max_a Q_target(s',
        a)``. Default ``False`` (SB3's DQN). The agent of C-CHAIN's continual MinAtar (Tang et al., 2025) is a Double
        DQN. Saved with the model.
    :param td_loss: the loss of the TD error: ``"huber"`` (SB3's ``smooth_l1_loss``, the default) or ``"mse"``, the
        squared error (``mse_loss``) of C-CHAIN's Double DQN on continual MinAtar (Tang et al., 2025,
        bluecontra/C-CHAIN ``crl_minatar/agents/double_dqn.py``). Saved with the model.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticDQNPolicy,
        "CnnPolicy": PlasticDQNCnnPolicy,
        "MultiInputPolicy": PlasticDQNMultiInputPolicy,
    }

    def __init__(self, policy: Union[str, type[BasePolicy]], env: Any, *args: Any, double_q: bool = False,
                 td_loss: str = "huber", **kwargs: Any) -> None:
        if not isinstance(double_q, bool):
            raise ValueError(f"double_q must be True or False, got {double_q!r}")
        if td_loss not in TD_LOSSES:
            raise ValueError(f"td_loss must be 'huber' or 'mse', got {td_loss!r}")
        self.double_q = double_q
        self.td_loss = td_loss
        super().__init__(policy, env, *args, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        squared = getattr(self, "td_loss", "huber") == "mse"
        if not getattr(self, "double_q", False) and not squared:
            return super().train(gradient_steps, batch_size)
        target = self.q_net_target
        if self.double_q:
            self.q_net_target = DoubleQTarget(self.q_net, target)
        try:
            with _squared_td_loss() if squared else contextlib.nullcontext():
                super().train(gradient_steps, batch_size)
        finally:
            self.q_net_target = target
