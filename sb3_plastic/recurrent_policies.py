"""Plastic versions of sb3-contrib's recurrent (LSTM) actor-critic policies (RecurrentPPO).

The LSTMs (Hochreiter & Schmidhuber, 1997) are hidden layers of the policy: their weight matrices are
regularised gate block by gate block (:mod:`sb3_plastic.recurrent` says why and what every mechanism does
to them), orthogonally initialised per gate block when the policy uses orthogonal initialisation, and put in
their own AdamO param group (``isometry_blocks=4``). Reference: Rosseau, Müller & Nowé (2026), "Preserving
Plasticity in Continual Learning via Dynamical Isometry".
"""

from __future__ import annotations

import math
from typing import Any

from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.type_aliases import Schedule
from torch import nn

from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
from sb3_plastic.policies import PlasticActorCriticPolicy, PlasticPolicyMixin
from sb3_plastic.recurrent import orthogonal_recurrent_init_, recurrent_weights


class PlasticRecurrentActorCriticPolicy(PlasticActorCriticPolicy, RecurrentActorCriticPolicy):
    """sb3-contrib's ``RecurrentActorCriticPolicy`` (RecurrentPPO's ``MlpLstmPolicy``) with the isometry keywords.

    Heads, their orthogonal gains and the Adam epsilon are :class:`~sb3_plastic.policies.PlasticActorCriticPolicy`'s;
    forward passes, LSTM states and ``predict`` stay sb3-contrib's.

    sb3-contrib builds the LSTMs (``lstm_actor``; ``lstm_critic`` with ``enable_critic_lstm``; the critic's
    Linear ``critic`` without it) *after* SB3's ``_build`` and then creates the optimizer again, so the plastic
    steps (orthogonal initialisation, AdamO param groups) run at the end of the constructor instead of in
    ``_build``. With plasticity off no random number is drawn beyond sb3-contrib's own.

    Isometry groups of AdamO: hidden Linear / Conv weights (``isometry_blocks=1``), the LSTM weight matrices
    ``weight_ih_l*`` / ``weight_hh_l*`` (``isometry_blocks=4``: each gate block ``(H, in)`` / ``(H, H)`` on its
    own), the rest (heads, biases, ``log_std``) with ``isometry_coef=0``. ``isometry_layers="hidden"`` counts the
    LSTMs as hidden layers; ``"all"`` and fnmatch patterns (``"lstm_actor.*"``) select LSTM matrices as any
    other parameter, and they are regularised per gate block in every case.

    Unit resets (Continual Backprop, ReDo) treat each cell of each LSTM layer as a unit
    (:mod:`sb3_plastic.recurrent`); new cells are drawn from the LSTM's own initialisation (orthogonal gate rows
    with orthogonal initialisation, PyTorch's uniform draw otherwise).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.isometry_config.use_orthogonal_init:
            self._plastic_orthogonal_init()
            gain = math.sqrt(self.isometry_config.isometry_scale)
            for module in self.plastic_recurrent_modules():
                orthogonal_recurrent_init_(module, gain)
        self._plastic_regroup_optimizers()

    def _build(self, lr_schedule: Schedule) -> None:
        # SB3's _build only: the LSTMs do not exist yet (see the class docstring)
        super(PlasticPolicyMixin, self)._build(lr_schedule)  # type: ignore[misc]
        self._plastic_halve_for_doubling()  # CReLU / Fourier: the MLP after the LSTM keeps half its units
        self._plastic_insert_layer_norms()  # NaP; sb3-contrib's later optimizer takes every parameter

    def plastic_recurrent_modules(self) -> list[nn.RNNBase]:
        """The policy's LSTMs: ``lstm_actor`` and, if present, ``lstm_critic``."""
        return [m for m in (self.lstm_actor, self.lstm_critic) if isinstance(m, nn.RNNBase)]

    def regularised_parameters(self) -> list[nn.Parameter]:
        """As :meth:`PlasticPolicyMixin.regularised_parameters`; ``"hidden"`` adds the LSTM weight matrices."""
        params = super().regularised_parameters()
        if self.isometry_config.isometry_layers == "hidden":
            chosen = {id(p) for p in params}
            params += [p for m in self.plastic_recurrent_modules() for _, p, _ in recurrent_weights(m) if id(p) not in chosen]
        return params

    def plastic_isometry_blocks(self) -> dict[int, int]:
        return {id(p): blocks for m in self.plastic_recurrent_modules() for _, p, blocks in recurrent_weights(m)}


class PlasticRecurrentActorCriticCnnPolicy(PlasticRecurrentActorCriticPolicy):
    """:class:`PlasticRecurrentActorCriticPolicy` with :class:`~sb3_plastic.networks.PlasticCNN` features
    (RecurrentPPO's ``CnnLstmPolicy``)."""

    _plastic_default_extractor = PlasticCNN


class PlasticRecurrentMultiInputActorCriticPolicy(PlasticRecurrentActorCriticPolicy):
    """:class:`PlasticRecurrentActorCriticPolicy` for ``Dict`` observations (RecurrentPPO's ``MultiInputLstmPolicy``)."""

    _plastic_default_extractor = PlasticCombinedExtractor
