"""Configuration of the isometry machinery shared by every plastic algorithm and policy.

The dataclass fields are the plastic keywords of every plastic algorithm (``PlasticPPO``, ``PlasticDQN``, ``PlasticSAC``,
...) and of their policies; the same spelling is used in rl_zoo3 yaml files and optuna samplers.
Reference: Rosseau, Müller & Nowé (2026), "Preserving Plasticity in Continual Learning via Dynamical
Isometry".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

from sb3_plastic.activations import ACTIVATIONS
from sb3_plastic.isometry import check_side
from sb3_plastic.optim import coupled_interval_message

ISOMETRY_MODES = ("decoupled", "coupled", "off")
OPTIMIZERS = ("adamo", "adam", "adam_equal_betas", "trac")
LAYER_SELECTIONS = ("hidden", "all")
#: beta1 = beta2 used by ``optimizer="adam_equal_betas"`` unless ``optimizer_kwargs["betas"]`` says otherwise
#: (Dohare et al., 2024 use (0.99, 0.99) for PPO on Slippery Ant).
EQUAL_BETA = 0.99


#: ``isometry_interval="auto"``: resolved from the minibatch size by :func:`auto_isometry_interval`.
AUTO = "auto"
#: Samples per isometry step that ``"auto"`` aims at (``k * batch_size``).
AUTO_INTERVAL_SAMPLES = 1024
#: Largest interval ``"auto"`` picks.
AUTO_INTERVAL_MAX = 64


def auto_isometry_interval(batch_size: int) -> int:
    """The isometry interval ``"auto"`` gives for a minibatch of ``batch_size``: ``ceil(1024 / batch_size)``
    clipped to [1, 64], so the isometry step runs once per ~1024 minibatch samples.

    :raises ValueError: for a ``batch_size`` that is not a positive integer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer to resolve isometry_interval='auto', got {batch_size!r}")
    return max(1, min(AUTO_INTERVAL_MAX, -(-AUTO_INTERVAL_SAMPLES // batch_size)))


@dataclass
class IsometryConfig:
    """Plastic network and optimizer settings.

    :param activation: hidden activation of every hidden layer (CNN and MLP): ``"relu"``, ``"maxmin"``
        (GroupSort-2, isometric with orthogonal layers), ``"tanh"``, ``"crelu"`` (CReLU, Abbas et al., 2023) or
        ``"fourier"`` (deep Fourier features, Lewandowski et al., 2024); the last two output two features per unit and
        their layers keep half the units, the widths of ``net_arch`` being the activation's output widths
        (:func:`sb3_plastic.networks.halve_for_doubling_`). ``None`` (the default) is SB3's own
        activation for every part of the network: ``policy_kwargs["activation_fn"]`` if given, else the SB3 /
        sb3-contrib policy's default for the MLP (Tanh for PPO, RecurrentPPO and MaskablePPO; ReLU for DQN,
        QR-DQN, SAC, TQC and CrossQ), and ReLU in the CNN (SB3's ``NatureCNN``). So with the penalty off
        (``isometry_mode="off", optimizer="adam"``) every policy alias is SB3's network, bit for bit. Why the
        defaults follow SB3 rather than one plastic activation: an agent must first learn a stationary task as
        well as SB3 does, and for the PPO family SB3's choice is also the one the theory favours. Tanh with
        orthogonal weights can achieve dynamical isometry (all singular values of the input-output Jacobian
        near 1; Pennington, Schoenholz & Ganguli, 2017, "Resurrecting the sigmoid in deep learning through
        dynamical isometry: theory and practice"), on which the isometry paper builds; ReLU cannot (its
        Jacobian zeroes about half the directions, and orthogonal ReLU layers are norm-preserving only in
        expectation, with target scale ``s = 2``). Measured on sb3-contrib's masked identity performance test
        (seeds 32, 1, 2; mean of 20 masked evaluation episodes): PlasticMaskablePPO with ReLU + AdamO 66.6 /
        56.3 / 58.5, with Tanh + AdamO (the default now) 96.8 / 93.3 / 95.4, sb3-contrib's MaskablePPO 96.1 /
        93.1 / 95.5.
    :param isometry_coef: ``lambda`` >= 0 of the isometry penalty in its authors' convention,
        ``R(W) = 1/2 ||W^T W - t I||_F^2`` on the smaller Gram matrix (:mod:`sb3_plastic.isometry`; ``t = s``, or
        ``s * out / in`` for a tall layer with ``isometry_rect_scale``). The decoupled step per update is
        ``lr * lambda * grad R`` (``grad R = 2 W (W^T W - t I)``), so its strength scales with the learning rate and
        with the number of updates. **Convention change (issue #27):** before it ``R`` had no 1/2, so every ``lambda``
        written for the library before then is half of today's for the same penalty; the defaults below were doubled
        with the change (a default run trains bit for bit as before) and a model saved before it loads with its
        ``lambda`` doubled. All values in this paragraph are in today's convention. In our supervised probe
        (tests/test_supervised_plasticity.py) ``lr * lambda`` between 2e-4 and 2e-2 kept ReLU networks trainable. This
        dataclass's default is 0.02; the plastic algorithms take ``None`` as "the algorithm family's default"
        (``PlasticAlgorithmMixin.default_isometry_coef``): **0.02** for the PPO family (PPO, RecurrentPPO,
        MaskablePPO) and the DQN family (DQN, QR-DQN), **2e-3** for the SAC family (SAC, TQC, CrossQ). Both values
        were chosen so that the penalty does no harm on a stationary task (issue #12;
        bench/README.md, "Stationary do no harm", with the exact per-update step): PPO on CartPole-v1 (rl-zoo
        hyperparameters, 1e5 steps, 10 seeds) ends at 500 in both arms; PPO on MinAtar Breakout (3e5 steps, 40 paired
        seeds) 4.97 against SB3's 5.00 (difference -0.04, t CI [-0.23, +0.15], at the 5 % margin); MaskablePPO on
        sb3-contrib's masked identity test 94.2 against 94.2 (10 seeds); SAC on Pendulum-v1 (rl-zoo hyperparameters,
        1e4 steps, 20 seeds) at 2e-3 -144.4 against -143.6. SAC needs the smaller value: its critic must grow its
        weights to carry the return's scale (after 1e4 steps SB3's hidden critic layer has sigma_max ~34 and an RMS
        singular value ~3.8), and the penalty's gradient grows as ``sigma^3``, so at 0.02 it held that layer at
        sigma_max ~8 / RMS ~1.3 (seed 0), and 3 of 20 runs ended far below their SB3 twin (-285 vs -131, -236 vs -162,
        -470 vs -157) while the other 17 stayed within ~6 of it; at 2e-3 every run follows its SB3 twin
        (bench/README.md). With ``isometry_coef=0.2`` (an earlier default) PPO learned CartPole more slowly and lost
        on Breakout, and SAC lost on Pendulum (-685 vs -136). The defaults are therefore at the low end of the
        supervised probe's range: a continual task may want a larger value (the zoo_configs entries use 0.2); tune it
        with ``-optimize``.
    :param isometry_scale: target scale ``s`` > 0 (1 = orthogonal, the isometry paper's target; 2 is an option for
        ReLU). SB3 initialises PPO's hidden layers orthogonally with gain sqrt(2), so ``W^T W = 2 I`` at the start
        and the penalty with ``s = 1`` starts by pulling the singular values from sqrt(2) towards 1. At the default
        coefficient that pull is small against what learning does to the spectrum: on MinAtar Breakout (PPO, 3e5
        steps, seed 0) SB3's CNN layer ends with singular values 1.23 .. 2.17 (RMS 1.64) and the penalised one
        1.22 .. 2.12 (RMS 1.60); the penalty mainly tempers the largest singular value of the 1024 -> 128 layer
        (6.50 in SB3, 5.05 with the penalty). Matching the target to the initial scale (``isometry_scale=2``) was
        measured and did not do better on Breakout (bench/README.md, ablation ``scale2``), so ``s = 1`` stays.
    :param isometry_rect_scale: the authors' ``rect_scale``: for a tall weight ``(out, in)`` with ``out > in`` the
        target of ``W^T W`` is ``s * out / in`` (singular values ``sqrt(s * out / in)``, FIRE's scale of a tall layer
        at ``s = 1``) instead of ``s``. Off by default, as in the authors' training script (their port's function
        defaults to it; their script turned it off as "theoretically unmotivated": ``W^T W = I`` is reachable for a
        tall matrix without it). What "isometric" means for a tall layer, and how the penalty and FIRE agree on it:
        :mod:`sb3_plastic.isometry`. Measured under the continual protocol: bench/README.md ("The isometry penalty
        in its authors' convention").
    :param isometry_normalize: divide ``R`` of each weight (and its step) by the Gram matrix's size
        ``min(out, in)``, so that the strength does not grow with the width (the authors' optional
        ``normalize``; off by default as theirs).
    :param isometry_free_scale: this library's ablation (off; not in the authors' code): the target of each weight's
        Gram matrix is its own mean diagonal at every step, ``t = ||W||_F^2 / min(out, in)`` (the mean squared singular
        value), instead of ``s``. The penalty then evens out the singular values without holding their level: ``c Q``
        (``Q`` orthonormal) has ``R = 0`` for every ``c``, so the weights may grow as an unpenalised agent's do while
        keeping their shape (:mod:`sb3_plastic.isometry`). It tells whether what the penalty costs an agent comes from
        the hold on the weights' scale or on their shape (bench/README.md). ``isometry_scale`` keeps its other roles
        (the orthogonal init's gain, the monitor's ``dfi`` target: read its ``dfi_free`` keys for such a model);
        ``isometry_rect_scale`` has no effect with it, so the two together are refused.
    :param isometry_side: ``"both"`` (the penalty; the default) or this library's one-sided ablation (not in the
        authors' code): ``"floor"`` penalises only the squared singular values below the target (every direction of
        the layer kept alive, any of them free to grow), ``"ceiling"`` only those above it (the singular values capped,
        free to shrink); the two add up to the penalty. It tells which half of the penalty's hold costs an agent its
        learning speed (bench/README.md). Each weight's step then takes an ``eigh`` of its Gram matrix
        (:mod:`sb3_plastic.isometry`). Refused with ``isometry_free_scale`` (a moving target). A one-sided penalty
        may never act: a floor does nothing while no singular value lies below the target (plain PPO's feature layer
        on MinAtar, bench/README.md); :class:`~sb3_plastic.PlasticityMonitor`'s ``dfi_floor`` / ``dfi_ceiling`` keys
        show the part each side acts on (0: that side has nothing to do).
    :param isometry_mode: ``"decoupled"`` (AdamO: the penalty step bypasses Adam's moments),
        ``"coupled"`` (the ablation: plain Adam on ``loss + lambda R``; the penalty gradient joins the task
        gradient inside ``backward()``, so SB3's ``max_grad_norm`` clips them together, as SB3 would clip the
        gradient of that loss; :class:`sb3_plastic.optim.IsometryStepMixin`) or ``"off"`` (no penalty).
    :param isometry_layers: which weights are regularised: ``"hidden"`` (every Linear/Conv layer except
        output heads: action logits / mean, log_std, value, Q-values), ``"all"`` (every parameter with >= 2
        dims), or a list of ``fnmatch`` patterns over the policy's parameter names
        (e.g. ``["features_extractor.*", "mlp_extractor.*"]``).
    :param isometry_interval: ``1`` (the default): the exact AdamO of the paper, the isometry step at every
        update. ``k > 1`` or ``"auto"`` is a documented speed option of the decoupled mode only: the step every
        ``k`` updates with ``k`` times the step size (:class:`sb3_plastic.AdamO`). The step costs two matrix
        products of each weight's size per update, so relative to a minibatch's own forward/backward pass its
        cost grows as the batch shrinks (cost ratio per layer ~ ``in_features / (k * batch_size)``). The price is
        a first-order error, not ``O((k * lr * lambda)^2)``: the task's Adam steps move the weights by ~``lr``
        per update while the window reuses the gradient of ``R`` at its first weights, so each window's isometry
        displacement is off by a relative error linear in ``k`` that does not vanish with ``lambda`` (derivation:
        :mod:`sb3_plastic.optim`; measured 8-12 % at ``k = 32``, lr 1e-3), and AdamO's blow-up clamp cuts the
        ``k``-times step once ``k * lr * lambda`` is large, which weakens the average pull (its effect on the
        supervised probe and the continual grid: bench/README.md).
        ``"auto"`` resolves to :func:`auto_isometry_interval` of the algorithm's ``batch_size``:
        ``ceil(1024 / batch_size)`` clipped to [1, 64] (PPO / SAC with batch 256: 4; DQN with batch 32: 32), which
        keeps the isometry step's share of ``train()`` about the same whatever the batch size. With
        ``isometry_mode="coupled"`` only 1 is allowed (``ValueError``): coupled mode is plain Adam on
        ``loss + lambda R`` at every update, and an interval would feed Adam's second moment a ``k``-times spike.
    :param optimizer: ``"adamo"`` (:class:`sb3_plastic.AdamO`), ``"adam"`` (``torch.optim.Adam``, as SB3),
        ``"adam_equal_betas"`` (Adam with beta1 = beta2 = 0.99, Dohare et al. 2024) or ``"trac"`` (TRAC, Muppidi et al.,
        2024, :mod:`sb3_plastic.trac`: the parameter-free scale of Adam's displacement from the initial parameters;
        TRAC's own settings ``trac_betas``, ``trac_s_prev``, ``trac_eps`` go in ``optimizer_kwargs``). With ``"adam"``,
        ``"adam_equal_betas"`` and ``"trac"`` the penalty can only be ``"coupled"`` or ``"off"``. A
        ``policy_kwargs["optimizer_class"]`` (``AdamW``, SB3's ``RMSpropTFLike``, ``SGD``, ...) takes Adam's place with
        its own ``optimizer_kwargs``:
        with ``"adamo"`` it gets AdamO's decoupled isometry step on top of its own update, with ``"coupled"`` the
        penalty gradient is added to the gradient it sees (:func:`sb3_plastic.optim.with_isometry_step`), with
        ``optimizer="adam", isometry_mode="off"`` it is used exactly as SB3 builds it; ``"adam_equal_betas"``
        builds Adam itself and refuses one (``ValueError``); ``"trac"`` wraps it (TRAC's base optimizer).
    :param orthogonal_init: orthogonal initialisation of hidden layers with gain ``sqrt(isometry_scale)``
        (heads: SB3's gains for PPO, 1 otherwise). ``None``: on for MaxMin, off otherwise (SB3's own init).
    """

    activation: Optional[str] = None
    isometry_coef: float = 0.02
    isometry_scale: float = 1.0
    isometry_rect_scale: bool = False
    isometry_normalize: bool = False
    isometry_free_scale: bool = False
    isometry_side: str = "both"
    isometry_mode: str = "decoupled"
    isometry_layers: Union[str, list[str]] = "hidden"
    isometry_interval: Union[int, str] = 1
    optimizer: str = "adamo"
    orthogonal_init: Optional[bool] = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        bad_type = self.activation is not None and not isinstance(self.activation, str)
        if bad_type or (self.activation is not None and self.activation.lower() not in ACTIVATIONS):
            raise ValueError(f"Unknown activation {self.activation!r}; allowed: {sorted(ACTIVATIONS)} (or None)")
        if self.activation is not None:
            self.activation = self.activation.lower()
        for name in ("isometry_coef",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        scale = self.isometry_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"isometry_scale must be a finite number > 0, got {scale!r}")
        for name in ("isometry_rect_scale", "isometry_normalize", "isometry_free_scale"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.isometry_free_scale and self.isometry_rect_scale:
            raise ValueError(
                "isometry_free_scale=True takes each weight's own mean squared singular value as the target, so "
                "isometry_rect_scale=True would have no effect; set one of them, not both"
            )
        check_side(self.isometry_side, self.isometry_free_scale)
        if self.isometry_mode not in ISOMETRY_MODES:
            raise ValueError(f"Unknown isometry_mode {self.isometry_mode!r}; allowed: {list(ISOMETRY_MODES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {self.optimizer!r}; allowed: {list(OPTIMIZERS)}")
        if self.optimizer != "adamo" and self.isometry_mode == "decoupled":
            raise ValueError(
                f"isometry_mode='decoupled' is what AdamO does; with optimizer={self.optimizer!r} use "
                "isometry_mode='coupled' or 'off', or optimizer='adamo'"
            )
        layers = self.isometry_layers
        if isinstance(layers, str):
            if layers not in LAYER_SELECTIONS:
                raise ValueError(
                    f"Unknown isometry_layers {layers!r}; allowed: {list(LAYER_SELECTIONS)} or a list of fnmatch patterns"
                )
        elif not (isinstance(layers, (list, tuple)) and all(isinstance(p, str) for p in layers)):
            raise ValueError(f"isometry_layers must be 'hidden', 'all' or a list of patterns, got {layers!r}")
        else:
            self.isometry_layers = list(layers)
        interval = self.isometry_interval
        if interval != AUTO and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(f"isometry_interval must be an int >= 1 or {AUTO!r}, got {interval!r}")
        if self.isometry_mode == "coupled" and interval != 1:
            raise ValueError(coupled_interval_message(interval))
        if not (self.orthogonal_init is None or isinstance(self.orthogonal_init, bool)):  # not 0 / 1
            raise ValueError(f"orthogonal_init must be True, False or None, got {self.orthogonal_init!r}")

    @property
    def penalty_on(self) -> bool:
        """Whether any isometry penalty is applied."""
        return self.isometry_mode != "off" and self.isometry_coef > 0

    @property
    def use_orthogonal_init(self) -> bool:
        """Resolved ``orthogonal_init``."""
        return self.activation == "maxmin" if self.orthogonal_init is None else bool(self.orthogonal_init)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments (what the plastic policies accept)."""
        return asdict(self)


#: Names of the plastic keywords, in signature order.
ISOMETRY_KEYS: tuple[str, ...] = tuple(IsometryConfig.__dataclass_fields__)
