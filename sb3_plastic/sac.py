"""PlasticSAC: SB3's SAC with plastic policies and AdamO for actor and critic."""

from __future__ import annotations

from typing import ClassVar

from stable_baselines3 import SAC
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.policies import PlasticSACCnnPolicy, PlasticSACMultiInputPolicy, PlasticSACPolicy


class PlasticSAC(PlasticAlgorithmMixin, SAC):
    """Soft Actor-Critic (Haarnoja et al., 2018) with isometry-preserving networks.

    Same constructor as ``stable_baselines3.SAC`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`. Actor and critic each use AdamO; the entropy
    coefficient keeps SB3's Adam. ``isometry_mode="off", optimizer="adam"`` is exactly SB3's SAC.
    """

    #: the SAC family's default ``isometry_coef`` (``None``): 2e-3, see ``IsometryConfig.isometry_coef``
    default_isometry_coef: ClassVar[float] = 2e-3
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticSACPolicy,
        "CnnPolicy": PlasticSACCnnPolicy,
        "MultiInputPolicy": PlasticSACMultiInputPolicy,
    }
