"""PlasticDQN: SB3's DQN with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from stable_baselines3 import DQN
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.policies import PlasticDQNCnnPolicy, PlasticDQNMultiInputPolicy, PlasticDQNPolicy


class PlasticDQN(PlasticAlgorithmMixin, DQN):
    """Deep Q-Network (Mnih et al., 2015) with isometry-preserving networks.

    Same constructor as ``stable_baselines3.DQN`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`. The target network is a copy of the online network
    (also after orthogonal initialisation). ``isometry_mode="off", optimizer="adam"`` is exactly SB3's DQN.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticDQNPolicy,
        "CnnPolicy": PlasticDQNCnnPolicy,
        "MultiInputPolicy": PlasticDQNMultiInputPolicy,
    }
