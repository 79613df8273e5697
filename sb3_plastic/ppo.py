"""PlasticPPO: SB3's PPO with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from stable_baselines3 import PPO
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.policies import (
    PlasticActorCriticCnnPolicy,
    PlasticActorCriticPolicy,
    PlasticMultiInputActorCriticPolicy,
)


class PlasticPPO(PlasticAlgorithmMixin, PPO):
    """Proximal Policy Optimization (Schulman et al., 2017) with isometry-preserving networks.

    Same constructor as ``stable_baselines3.PPO`` plus the plastic keywords of
    :class:`~sb3_plastic.common.plastic_algorithm.PlasticAlgorithmMixin` /
    :class:`~sb3_plastic.config.IsometryConfig` (``activation``, ``isometry_coef``, ``isometry_scale``,
    ``isometry_mode``, ``isometry_layers``, ``optimizer``, ``orthogonal_init``).
    Defaults: ReLU, AdamO with ``isometry_coef=0.1`` on hidden layers (Rosseau, Müller & Nowé, 2026).
    ``activation="tanh", isometry_mode="off", optimizer="adam"`` is exactly SB3's PPO.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticActorCriticPolicy,
        "CnnPolicy": PlasticActorCriticCnnPolicy,
        "MultiInputPolicy": PlasticMultiInputActorCriticPolicy,
    }
