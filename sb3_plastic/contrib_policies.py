"""Plastic versions of sb3-contrib's QR-DQN, TQC and MaskablePPO policies.

Each class only declares its output heads, optimizers and target networks; everything else (activation,
orthogonal initialisation, AdamO with the heads outside the isometry penalty, target re-sync) is
:class:`sb3_plastic.policies.PlasticPolicyMixin`.
"""

from __future__ import annotations

from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.qrdqn.policies import QRDQNPolicy
from sb3_contrib.tqc.policies import TQCPolicy
from torch import nn

from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
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
