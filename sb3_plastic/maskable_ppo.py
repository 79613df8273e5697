"""PlasticMaskablePPO: sb3-contrib's MaskablePPO (invalid-action masking) with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from sb3_contrib import MaskablePPO
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.contrib_policies import (
    PlasticMaskableActorCriticCnnPolicy,
    PlasticMaskableActorCriticPolicy,
    PlasticMaskableMultiInputActorCriticPolicy,
)


class PlasticMaskablePPO(PlasticAlgorithmMixin, MaskablePPO):
    """PPO with invalid-action masking (Huang & Ontañón, 2020) and isometry-preserving networks.

    Same constructor as ``sb3_contrib.MaskablePPO`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig`; ``learn``/``predict`` take ``action_masks`` as in
    sb3-contrib. Default activations are sb3-contrib's (Tanh MLP, ReLU NatureCNN); ``isometry_mode="off",
    optimizer="adam"`` is exactly sb3-contrib's MaskablePPO for every policy alias.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticMaskableActorCriticPolicy,
        "CnnPolicy": PlasticMaskableActorCriticCnnPolicy,
        "MultiInputPolicy": PlasticMaskableMultiInputActorCriticPolicy,
    }
