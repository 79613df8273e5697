"""PlasticCrossQ: sb3-contrib's CrossQ (BatchRenorm networks, no target network) with plastic policies and AdamO."""

from __future__ import annotations

from typing import ClassVar

from sb3_contrib import CrossQ
from stable_baselines3.common.policies import BasePolicy

from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.contrib_policies import PlasticCrossQPolicy


class PlasticCrossQ(PlasticAlgorithmMixin, CrossQ):
    """CrossQ (Bhatt, Palenicek, Belousov, Argus, Amiranashvili, Brox & Peters, 2024, "CrossQ: Batch
    Normalization in Deep Reinforcement Learning for Greater Sample Efficiency and Simplicity", ICLR) with
    isometry-preserving networks (Rosseau, Müller & Nowé, 2026, "Preserving Plasticity in Continual Learning
    via Dynamical Isometry").

    Same constructor as ``sb3_contrib.CrossQ`` plus the plastic keywords of
    :class:`~sb3_plastic.config.IsometryConfig` and the intervention keywords. Actor and critics each use
    AdamO (with CrossQ's ``betas=(0.5, 0.999)``); the entropy coefficient keeps Adam. Only ``"MlpPolicy"``
    exists, as in sb3-contrib. ``isometry_mode="off", optimizer="adam"`` (ReLU, CrossQ's default activation)
    is exactly sb3-contrib's CrossQ.

    What plasticity means for the BatchRenorm layers (``Linear -> activation -> BatchRenorm -> Linear``; one
    more BatchRenorm normalises the input):

    * Isometry (penalty, AdamO's decoupled step, orthogonal init): Linear weights only. BatchRenorm has a
      per-feature scale and shift, not a matrix; they stay in AdamO's group without the penalty.
    * Continual Backprop and ReDo replace hidden units; feature ``j`` of the BatchRenorm after unit ``j`` is
      reset with the unit (running mean 0, running variance 1, scale 1, shift 0, optimizer moments of that
      scale / shift entry zeroed), so a fresh unit is not normalised with the statistics of the unit it
      replaces; the layer's warm-up counter and the other features are left alone. Continual Backprop keeps
      the network output at the mean activation: the consumers read the BatchRenorm output, so the replaced
      unit's mean contribution is taken through the BatchRenorm's running-statistics map before the next
      bias absorbs it, and the contribution utility weighs ``mean|h_j|`` by the feature's normalisation gain
      ``|scale_j| / sqrt(var_j + eps)`` (what the next layer actually receives from unit ``j``, up to the
      constant shift). Dormancy (ReDo) and ``mean|h_j|`` are measured on the activation output, before the
      BatchRenorm: a dead ReLU unit is dead however it is normalised afterwards.
    * FIRE and a Shrink & Perturb event rewrite every weight of a layer, which changes the distribution of
      all its units at once: the running statistics of the BatchRenorm it feeds restart (mean 0, variance 1)
      and so does its warm-up counter, so BatchRenorm normalises with batch statistics again until the
      running statistics have re-converged, exactly as at the start of training. Scale and shift are kept
      (FIRE leaves biases alone). The input BatchRenorm is never touched. Evaluation-mode forwards (acting)
      use the restarted running statistics, which re-converge within about ``1 / batch_norm_momentum``
      updates. The continual form of Shrink & Perturb (small decay and noise every step) leaves the
      statistics to BatchRenorm's own running averages.
    """

    #: the SAC family's default ``isometry_coef`` (``None``): 2e-3, see ``IsometryConfig.isometry_coef``
    default_isometry_coef: ClassVar[float] = 2e-3
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": PlasticCrossQPolicy,
    }
