"""Plastic versions of sb3-contrib's QR-DQN, TQC, CrossQ and MaskablePPO policies (RecurrentPPO's:
:mod:`sb3_plastic.recurrent_policies`).

Each class only declares its output heads, optimizers and target networks; everything else (activation,
orthogonal initialisation, AdamO with the heads outside the isometry penalty, target re-sync) is
:class:`sb3_plastic.policies.PlasticPolicyMixin`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.crossq.policies import CrossQPolicy
from sb3_contrib.qrdqn.policies import QRDQNPolicy
from sb3_contrib.tqc.policies import TQCPolicy
from torch import nn

from sb3_plastic.config import IsometryConfig
from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
from sb3_plastic.optim import AdamO
from sb3_plastic.policies import PlasticActorCriticPolicy, PlasticActorQCriticMixin, PlasticPolicyMixin


class PlasticQRDQNPolicy(PlasticPolicyMixin, QRDQNPolicy):
    """sb3-contrib's ``QRDQNPolicy`` with the isometry keywords. Head: the last Linear of the quantile
    network. As in sb3-contrib, no MLP layer follows the CNN unless ``net_arch`` says so."""

    _plastic_cnn_no_mlp = True

    def plastic_heads(self) -> list[nn.Module]:
        return [self.quantile_net.quantile_net[-1]]

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.quantile_net_target, self.quantile_net)]


class PlasticQRDQNCnnPolicy(PlasticQRDQNPolicy):
    """:class:`PlasticQRDQNPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticQRDQNMultiInputPolicy(PlasticQRDQNPolicy):
    """:class:`PlasticQRDQNPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor


class PlasticTQCPolicy(PlasticActorQCriticMixin, TQCPolicy):
    """sb3-contrib's ``TQCPolicy`` with the isometry keywords; actor and critic each get an AdamO
    (heads and targets as SAC's: :class:`~sb3_plastic.policies.PlasticActorQCriticMixin`)."""


class PlasticTQCCnnPolicy(PlasticTQCPolicy):
    """:class:`PlasticTQCPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticTQCMultiInputPolicy(PlasticTQCPolicy):
    """:class:`PlasticTQCPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor


class PlasticCrossQPolicy(PlasticActorQCriticMixin, CrossQPolicy):
    """sb3-contrib's ``CrossQPolicy`` (Bhatt et al., 2024) with the isometry keywords; actor and critic each get
    an AdamO. Heads as SAC's (:class:`~sb3_plastic.policies.PlasticActorQCriticMixin`); CrossQ has no target
    network.

    BatchRenorm layers: the isometry penalty acts on matrices, and a BatchRenorm layer has none (a per-feature
    scale and shift, plus running statistics that are buffers). Its scale and shift therefore stay in the
    AdamO group without the penalty (``isometry_coef=0``) under every ``isometry_layers`` setting, and the
    orthogonal initialisation (MaxMin) touches only the Linear layers. What the interventions do to the
    BatchRenorm layers is described in :class:`sb3_plastic.crossq.PlasticCrossQ`.

    Optimizer: sb3-contrib gives CrossQ's Adam ``betas=(0.5, 0.999)`` when ``optimizer_kwargs`` is not set; the
    same default is kept here for Adam and AdamO (``optimizer="adam_equal_betas"`` sets its own betas).
    """

    #: CrossQ's Adam betas (sb3-contrib's default when no optimizer_kwargs are given)
    _plastic_crossq_betas: tuple[float, float] = (0.5, 0.999)

    def _resolve_plastic_kwargs(self, config: IsometryConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(kwargs)
        user_class = kwargs.get("optimizer_class")
        if kwargs.get("optimizer_kwargs") is None and config.optimizer != "adam_equal_betas":
            # sb3-contrib gives these betas to Adam and AdamW; AdamO (and a user's Adam / AdamW with the isometry step) too
            if user_class is None or user_class in (th.optim.Adam, th.optim.AdamW, AdamO):
                kwargs["optimizer_kwargs"] = {"betas": self._plastic_crossq_betas}
        return super()._resolve_plastic_kwargs(config, kwargs)

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        return []


class PlasticMaskableActorCriticPolicy(PlasticPolicyMixin, MaskableActorCriticPolicy):
    """sb3-contrib's ``MaskableActorCriticPolicy`` (MaskablePPO) with the isometry keywords.

    sb3-contrib's maskable policy derives from ``BasePolicy``, not from SB3's ``ActorCriticPolicy``, so it
    cannot inherit :class:`~sb3_plastic.policies.PlasticActorCriticPolicy` without pulling SB3's
    forward/predict in front of the maskable ones. Its network layout is the same, so the heads
    (``action_net``, ``value_net``), their orthogonal gains (0.01 / 1) and the Adam epsilon (1e-5) are
    :class:`~sb3_plastic.policies.PlasticActorCriticPolicy`'s own, taken over here; every other method
    (masked distributions, ``predict(action_masks=...)``) stays sb3-contrib's.
    """

    _plastic_adam_eps = PlasticActorCriticPolicy._plastic_adam_eps
    _plastic_cnn_no_mlp = PlasticActorCriticPolicy._plastic_cnn_no_mlp
    plastic_heads = PlasticActorCriticPolicy.plastic_heads
    _plastic_head_gain = PlasticActorCriticPolicy._plastic_head_gain


class PlasticMaskableActorCriticCnnPolicy(PlasticMaskableActorCriticPolicy):
    """:class:`PlasticMaskableActorCriticPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticMaskableMultiInputActorCriticPolicy(PlasticMaskableActorCriticPolicy):
    """:class:`PlasticMaskableActorCriticPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor
