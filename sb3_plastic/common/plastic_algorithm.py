"""The one mechanism behind PlasticPPO, PlasticDQN and PlasticSAC.

:class:`PlasticAlgorithmMixin` sits in front of an SB3 algorithm class in the MRO. It takes the
plastic keywords as top-level constructor arguments (so rl_zoo3 yaml files and optuna samplers can set
them), validates them into an :class:`~sb3_plastic.config.IsometryConfig`, hands them to the plastic
policy through ``policy_kwargs`` and passes every other argument to SB3 untouched.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Union

from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_plastic.config import ISOMETRY_KEYS, IsometryConfig
from sb3_plastic.policies import PlasticPolicyMixin


class PlasticAlgorithmMixin:
    """Adds the plastic keywords to an SB3 algorithm; everything else is SB3's.

    :param policy: as in SB3; ``"MlpPolicy"``, ``"CnnPolicy"`` and ``"MultiInputPolicy"`` resolve to the
        plastic policies, a class must subclass :class:`~sb3_plastic.policies.PlasticPolicyMixin`.
    :param env: as in SB3.
    :param args: SB3's positional arguments, unchanged.
    :param activation: see :class:`~sb3_plastic.config.IsometryConfig` (also for the keywords below).
    :param isometry_coef: ``lambda`` of the isometry penalty.
    :param isometry_scale: target scale ``s`` of ``W^T W``.
    :param isometry_mode: ``"decoupled"`` (AdamO), ``"coupled"`` or ``"off"``.
    :param isometry_layers: ``"hidden"``, ``"all"`` or a list of fnmatch patterns.
    :param optimizer: ``"adamo"``, ``"adam"`` or ``"adam_equal_betas"``.
    :param orthogonal_init: orthogonal hidden layers (default: only with MaxMin).
    :param kwargs: SB3's keyword arguments, unchanged.
    """

    isometry_config: IsometryConfig
    policy_aliases: dict[str, type]

    def __init__(
        self,
        policy: Union[str, type],
        env: Any,
        *args: Any,
        activation: Optional[str] = None,
        isometry_coef: float = 0.1,
        isometry_scale: float = 1.0,
        isometry_mode: str = "decoupled",
        isometry_layers: Union[str, list[str]] = "hidden",
        optimizer: str = "adamo",
        orthogonal_init: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        config = IsometryConfig(
            activation=activation,
            isometry_coef=isometry_coef,
            isometry_scale=isometry_scale,
            isometry_mode=isometry_mode,
            isometry_layers=isometry_layers,
            optimizer=optimizer,
            orthogonal_init=orthogonal_init,
        )
        base_init = super().__init__  # type: ignore[misc]
        try:
            bound = inspect.signature(base_init).bind(policy, env, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{type(self).__name__}: {exc}") from None
        policy_kwargs = dict(bound.arguments.get("policy_kwargs") or {})
        misplaced = sorted(set(ISOMETRY_KEYS) & set(policy_kwargs))
        if misplaced:
            raise ValueError(
                f"{misplaced} must be top-level keywords of {type(self).__name__}, not entries of policy_kwargs"
            )
        self._check_plastic_policy(policy)
        policy_kwargs.update(config.to_kwargs())
        bound.arguments["policy_kwargs"] = policy_kwargs
        self.isometry_config = config
        base_init(*bound.args, **bound.kwargs)

    def _check_plastic_policy(self, policy: Union[str, type]) -> None:
        if isinstance(policy, str):
            if policy not in self.policy_aliases:
                raise ValueError(
                    f"Unknown policy {policy!r} for {type(self).__name__}; allowed: {sorted(self.policy_aliases)}"
                )
            return
        if not (isinstance(policy, type) and issubclass(policy, PlasticPolicyMixin)):
            raise ValueError(
                f"{type(self).__name__} needs a plastic policy, got {policy!r}; use one of "
                f"{sorted(self.policy_aliases)} or a subclass of sb3_plastic.policies.PlasticPolicyMixin"
            )


def is_plastic(model: BaseAlgorithm) -> bool:
    """Whether ``model`` is one of the plastic algorithms."""
    return isinstance(model, PlasticAlgorithmMixin)
