"""Plastic versions of sb3-contrib's QR-DQN and TQC policies.

Each class only declares its output heads, optimizers and target networks; everything else (activation,
orthogonal initialisation, AdamO with the heads outside the isometry penalty, target re-sync) is
:class:`sb3_plastic.policies.PlasticPolicyMixin`.
"""

from __future__ import annotations

from sb3_contrib.qrdqn.policies import QRDQNPolicy
from sb3_contrib.tqc.policies import TQCPolicy
from torch import nn

from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
from sb3_plastic.policies import PlasticActorQCriticMixin, PlasticPolicyMixin


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
