"""PlasticRecurrentPPO: sb3-contrib's RecurrentPPO (PPO with LSTM policies) with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from sb3_contrib import RecurrentPPO
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.recurrent_policies import (
    PlasticRecurrentActorCriticCnnPolicy,
    PlasticRecurrentActorCriticPolicy,
    PlasticRecurrentMultiInputActorCriticPolicy,
)


class PlasticRecurrentPPO(PlasticAlgorithmMixin, RecurrentPPO):
    """PPO (Schulman et al., 2017) with LSTM policies (Hochreiter & Schmidhuber, 1997) and isometry-preserving
    networks (Rosseau, Müller & Nowé, 2026).

    Same constructor as ``sb3_contrib.RecurrentPPO`` (policies ``"MlpLstmPolicy"``, ``"CnnLstmPolicy"``,
    ``"MultiInputLstmPolicy"``; ``lstm_hidden_size``, ``n_lstm_layers``, ``shared_lstm``,
    ``enable_critic_lstm`` in ``policy_kwargs``) plus the plastic keywords of
    :class:`~sb3_plastic.common.plastic_algorithm.PlasticAlgorithmMixin`: the isometry keywords
    (:class:`~sb3_plastic.config.IsometryConfig`) and the interventions FIRE (ICLR 2026, arXiv 2602.08040;
    ``fire_at``, ...), Continual Backprop (Dohare et al., 2024; ``replacement_rate``, ...), ReDo (Sokar et al.,
    2023; ``redo_period``, ...) and Shrink & Perturb (Ash & Adams, 2020; ``shrink_perturb``, ...).
    Default activations are sb3-contrib's (Tanh MLP, ReLU NatureCNN); ``isometry_mode="off", optimizer="adam"`` is
    exactly sb3-contrib's RecurrentPPO for every policy alias.

    What each mechanism does to the LSTM matrices (stacked gate blocks ``(4H, in)`` / ``(4H, H)``) is defined
    in :mod:`sb3_plastic.recurrent`: the isometry penalty and FIRE act on each gate block on its own;
    Continual Backprop and ReDo replace LSTM cells (fresh rows of the cell in all four gate blocks, zero outgoing
    weights in the recurrence and the layers after the LSTM) as well as units of the MLP layers after the LSTM;
    Shrink & Perturb acts on every LSTM parameter. ``activation`` sets the MLP activation; the LSTM keeps its gates.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpLstmPolicy": PlasticRecurrentActorCriticPolicy,
        "CnnLstmPolicy": PlasticRecurrentActorCriticCnnPolicy,
        "MultiInputLstmPolicy": PlasticRecurrentMultiInputActorCriticPolicy,
    }
