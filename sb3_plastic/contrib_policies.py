"""Plastic versions of sb3-contrib's QR-DQN and TQC policies.

Each class only declares its output heads, optimizers and target networks; everything else (activation,
orthogonal initialisation, AdamO with the heads outside the isometry penalty, target re-sync) is
:class:`sb3_plastic.policies.PlasticPolicyMixin`.
"""

from __future__ import annotations

from typing import Any

from sb3_contrib.qrdqn.policies import QRDQNPolicy
from sb3_contrib.tqc.policies import TQCPolicy
from torch import nn

from sb3_plastic.common.surgery import head_layers
from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
from sb3_plastic.policies import PlasticPolicyMixin


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


class PlasticTQCPolicy(PlasticPolicyMixin, TQCPolicy):
    """sb3-contrib's ``TQCPolicy`` with the isometry keywords; actor and critic each get an AdamO.

    Heads: the actor's ``mu`` Linear (inside ``Sequential(Linear, Hardtanh)`` with gSDE and ``clip_mean``),
    its ``log_std`` Linear (without gSDE) and the last Linear of every quantile critic. The
    entropy-coefficient optimizer belongs to the algorithm and stays Adam.
    """

    def plastic_heads(self) -> list[nn.Module]:
        heads: list[nn.Module] = head_layers(self.actor.mu)
        if isinstance(self.actor.log_std, nn.Module):
            heads += head_layers(self.actor.log_std)
        heads += [q_net[-1] for q_net in self.critic.q_networks]
        return heads

    def plastic_optimizers(self) -> list[tuple[Any, str]]:
        return [(self.actor, "optimizer"), (self.critic, "optimizer")]

    def plastic_targets(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.critic_target, self.critic)]


class PlasticTQCCnnPolicy(PlasticTQCPolicy):
    """:class:`PlasticTQCPolicy` with :class:`PlasticCNN` features."""

    _plastic_default_extractor = PlasticCNN


class PlasticTQCMultiInputPolicy(PlasticTQCPolicy):
    """:class:`PlasticTQCPolicy` for ``Dict`` observations."""

    _plastic_default_extractor = PlasticCombinedExtractor
