"""PlasticTQC: sb3-contrib's TQC with plastic policies and AdamO for actor and critic."""

from __future__ import annotations

from typing import ClassVar

from sb3_contrib import TQC
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.contrib_policies import PlasticTQCCnnPolicy, PlasticTQCMultiInputPolicy, PlasticTQCPolicy


class PlasticTQC(PlasticAlgorithmMixin, TQC):
    """Truncated Quantile Critics (Kuznetsov et al., 2020) with isometry-preserving networks.

    Same constructor as ``sb3_contrib.TQC`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`. Actor and critic each use AdamO; the entropy
    coefficient keeps Adam. ``isometry_mode="off", optimizer="adam"`` is exactly sb3-contrib's TQC.
    """

    #: the SAC family's default ``isometry_coef`` (``None``): 2e-3, see ``IsometryConfig.isometry_coef``
    default_isometry_coef: ClassVar[float] = 2e-3
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticTQCPolicy,
        "CnnPolicy": PlasticTQCCnnPolicy,
        "MultiInputPolicy": PlasticTQCMultiInputPolicy,
    }
