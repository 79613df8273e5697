"""PlasticPPO: SB3's PPO with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from stable_baselines3 import PPO
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy

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
    ``isometry_rect_scale``, ``isometry_normalize``, ``isometry_free_scale``, ``isometry_side``, ``isometry_mode``,
    ``isometry_layers``, ``isometry_interval``, ``optimizer``, ``orthogonal_init``).
    Defaults: SB3's activations (Tanh MLP, ReLU NatureCNN for ``"CnnPolicy"``, see ``activation`` in
    :class:`~sb3_plastic.config.IsometryConfig`), AdamO with ``isometry_coef=0.02`` on hidden layers and its exact
    isometry step at every update (``isometry_interval=1``; Rosseau, Müller & Nowé, 2026).
    ``isometry_mode="off", optimizer="adam"`` is exactly SB3's PPO for every policy alias (seeded runs are
    bit-identical), including SB3's warning that an ``"MlpPolicy"`` PPO belongs on the CPU.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticActorCriticPolicy,
        "CnnPolicy": PlasticActorCriticCnnPolicy,
        "MultiInputPolicy": PlasticMultiInputActorCriticPolicy,
    }

    def _maybe_recommend_cpu(self, mlp_class_name: str = ActorCriticPolicy.__name__) -> None:
        """SB3's advice to run an ``"MlpPolicy"`` PPO on the CPU. SB3 recognises the MlpPolicy by its class name
        (``ActorCriticPolicy``); the plastic MlpPolicy is :class:`~sb3_plastic.policies.PlasticActorCriticPolicy`."""
        if mlp_class_name == ActorCriticPolicy.__name__:
            mlp_class_name = self.policy_aliases["MlpPolicy"].__name__
        super()._maybe_recommend_cpu(mlp_class_name)
