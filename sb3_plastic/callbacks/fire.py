"""FIRE: replace every weight matrix by its (scaled) polar factor, as an SB3 callback.

FIRE (ICLR 2026, arXiv 2602.08040) restores plasticity at a training midpoint or a task switch by
moving each weight matrix ``W`` to the closest orthogonal matrix in Frobenius norm, its polar factor
``W (W^T W)^(-1/2) = U V^T`` (``W = U S V^T``).

The polar factor (default, ``iterations=None``): ``U V^T`` from ``torch.linalg.svd`` in float64 on the
layer's device (:func:`polar_factor`), cast back to the weight's dtype. FIRE runs once (or once per task),
so the cost is negligible next to training (measured on one CPU thread: 2-10 ms for the NatureCNN's conv
layers and a 256 x 256 weight, 0.42 s for its 512 x 3136 linear layer; a whole call on the PPO CNN 0.57 s, 0.008 % of
a 1M-step run, ``bench/README.md``). This is what the paper defines.
The reference implementation (isaac7778/FIRE, ``vision/interventions/fire.py``) approximates it with
Newton–Schulz: a wide matrix is transposed, ``X <- X / ||X||_F`` (all singular values in (0, 1]), then 10
iterations of the cubic map ``X <- 1.5 X - 0.5 X (X^T X)`` in fp32. After the Frobenius normalisation a
singular value ``sigma`` grows only by about 1.5x per iteration while it is small, so 10 iterations reach
``U V^T`` only when ``sigma_min(W) / ||W||_F`` is above roughly 1/60. Tall, wide and conv-tap matrices of SB3's
default initialisation are (errors < 3e-6), square hidden layers are not: measured 18 % relative error
against ``U V^T`` on a default-initialised ``nn.Linear(64, 64)`` (DQN, PPO), 22 % on (128, 128) and 26 % on
(256, 256) (SAC), their smallest singular values left far below 1. ``iterations=10`` (``fire_iterations=10``)
reproduces the reference exactly (:func:`newton_schulz_polar`). (Muon's quintic bf16 iteration converges to
``U S' V^T`` with ``S'`` roughly in [0.7, 1.2], not to an isometry, and is not offered.)

Rank-deficient matrices: the polar factor is unique only for full rank. For a matrix of rank ``r`` the
result is ``U V^T`` of the thin SVD: on the range of ``W`` it is ``W``'s polar factor (``Q v_i = u_i`` for
``sigma_i > 0``), and the null directions are completed by the SVD's orthonormal singular vectors, so the
result is still an exact isometry (``Q^T Q = I`` for tall ``Q``), the nearest one to ``W``; which completion
is picked is up to the SVD routine (arbitrary but deterministic on one device). Tiny positive singular values are
no special case: they map to 1 as the definition says (the directions of singular values near float32's
resolution are themselves numerically arbitrary). The all-zero matrix has no direction to keep and stays zero,
as under the reference's iteration. The reference's Newton–Schulz instead leaves null and tiny directions short
(a partial isometry in the limit).

Shapes and scale:

* a Conv2d kernel ``(out, in, kh, kw)`` is orthogonalised per spatial tap: each ``W[:, :, i, j]`` gets its
  own polar factor (the reference's rule);
* hidden layers are multiplied by the reference's scale (see :func:`fire_scale`):
  ``sqrt(out / in)`` for a Linear weight, ``sqrt(out / in) / (kh * kw)`` for a Conv2d kernel, with
  ``in = weight.shape[1]`` (input features, or input channels per group: *not* ``in * kh * kw``);
* output heads (``layers="all"``) keep their initialisation's scale by default (``head_scale="init"``,
  :func:`init_scale`): the polar factor times the RMS singular value of the layer's initialiser (SB3's PPO:
  0.01 for the action head, 1 for the value head; PyTorch's default init of DQN / SAC heads:
  ``sqrt(out / (3 min(out, in)))``, ~0.58). ``head_scale="reference"`` gives heads the hidden-layer scale
  ``sqrt(out / in)`` as the reference code does; for PPO's 0.01-gain action head that is ~0.18-0.25 times the
  polar factor, i.e. logits 18-25x the fresh head's and a far less uniform policy right after FIRE. Measured on
  the continual bandit grid (``bench/README.md``, "FIRE with the true polar factor"; PPO [128, 128], 12 tasks,
  3 seeds, last-half reward): FIRE at every task change 0.898 with init-scale heads vs 0.886 with the
  reference's (higher in every seed; the reference FIRE with 10 Newton–Schulz steps: 0.881); a single FIRE at
  the midpoint does not separate the two (0.436 vs 0.454, the sign changing across seeds);
* biases are left as they are.

With that scaling a Linear weight's singular values all become ``sqrt(out / in)`` (an exact isometry only
for square layers; for a tall layer it is the target of the isometry penalty with ``isometry_rect_scale=True``, the
one place that says what "isometric" means for a tall layer being :mod:`sb3_plastic.isometry`; it is the
"spectral" scale of muP/Muon, ``||W||_op = sqrt(d_out / d_in)``, that the reference's SAC code calls
``scaler_type="muon"``, its default). The SAC reference (JAX, flax kernels of shape ``(in, out)``) uses the same
``sqrt(d_out / d_in)`` for Dense layers; the vision reference adds the ``1 / (kh * kw)`` factor for convolutions.
The DQN reference (cleanrl ``apply_fire``) applies the conv rule to its convolutions but resets its Linear layers
to their initial values; here every selected layer, Linear or Conv2d, gets the polar factor.

Recurrent layers (sb3-contrib's RecurrentPPO LSTMs, Hochreiter & Schmidhuber, 1997): the gate matrices stacked
in ``weight_ih_l*`` ``(4H, in)`` and ``weight_hh_l*`` ``(4H, H)`` are orthogonalised gate block by gate block,
each ``(H, in)`` / ``(H, H)`` block scaled like a Linear layer (``sqrt(H / in)``; the recurrent blocks become
orthogonal); biases untouched (see :mod:`sb3_plastic.recurrent`). An LSTM is a hidden layer: ``layers="hidden"``
rewrites it too.

Which layers: every Linear / Conv2d, output heads included, by default (``layers="all"``) because that is
what the references do (the vision ``fire()`` loops over every ``nn.Linear``/``nn.Conv2d`` including the
classifier; the SAC code projects every ``Dense`` layer including the policy-mean, log-std and Q heads).
``layers="hidden"`` leaves the output heads (action logits / mean, log_std, value, Q-values) alone.

The callback also does what the public code leaves to chance in an SB3 setting: it writes in place (the
Parameter objects, which optimizers and target-network Polyak updates hold by position, are kept), drops
the optimizer state (Adam moments and step count) of every weight it rewrote (the vision and SAC
references start fresh optimizers; the SAC one also re-initialises the entropy temperature, which is left
alone here, as are biases and their optimizer state), hard-syncs every target network (DQN, QR-DQN, SAC,
TQC), and for on-policy algorithms (PPO, A2C) fires only between a ``train()`` and the next rollout, so
that a rollout is never collected by two different policies (stale log-probs would break PPO's clipped
ratio).

Normalisation layers with running statistics after a rewritten hidden layer (CrossQ's ``Linear -> ReLU ->
BatchRenorm``, :attr:`~sb3_plastic.common.surgery.HiddenLayer.norm`) are restarted
(:func:`~sb3_plastic.common.surgery.reset_norm_`: running mean 0, variance 1, warm-up counter 0; scale and
shift kept, like biases): the new weights change the distribution of every unit at once, and BatchRenorm
must not normalise them with the old statistics. It normalises with batch statistics again until its
warm-up has passed, as at the start of training. A norm in front of the first layer (CrossQ's input
normalisation) is left alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch as th
from torch import nn

from sb3_plastic.callbacks.base import InterventionConfig, announce_rewrite, changed_fields, warn_ignored_options
from sb3_plastic.callbacks.redo import layer_init_scheme
from sb3_plastic.callbacks.triggers import (
    UNSET,
    TriggeredIntervention,
    check_at,
    check_bool,
    check_every,
    check_int_at_least,
    is_int,
)
from sb3_plastic.common.surgery import norms_fed_by, reset_norm_, sync_target
from sb3_plastic.isometry import as_blocks, deviation_from_isometry
from sb3_plastic.optim import reset_optimizer_state
from sb3_plastic.recurrent import recurrent_weights

#: Layer types FIRE rewrites (as the reference: Linear and Conv2d).
FIRE_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
#: Allowed values of ``layers`` / ``fire_layers``.
FIRE_LAYER_SELECTIONS = ("all", "hidden")
#: Allowed values of ``head_scale`` / ``fire_head_scale``.
FIRE_HEAD_SCALES = ("init", "reference")
#: Coefficients of the reference's cubic Newton–Schulz map ``X <- a X + b X (X^T X)``.
NS_COEFFICIENTS = (1.5, -0.5)
#: Newton–Schulz steps of the reference implementation (``iterations=REFERENCE_ITERATIONS`` reproduces it).
REFERENCE_ITERATIONS = 10

# ----------------------------------------------------------------------------------------------------------
# The orthogonalisation
# ----------------------------------------------------------------------------------------------------------


def polar_factor(matrix: th.Tensor) -> th.Tensor:
    """The polar factor ``U V^T`` of a matrix (or of each matrix of a batch ``(..., m, n)``), by SVD.

    ``torch.linalg.svd`` (thin) in float64 on the matrix's device (MPS, which has no float64, computes on the
    CPU), cast back to the input's dtype. Rank-deficient input: ``U V^T`` of the SVD, an exact isometry that
    equals the polar factor on the matrix's range (null directions completed by the SVD's singular vectors,
    see the module docstring); the all-zero matrix maps to zero. No scaling is applied (see
    :func:`fire_weight`).

    :param matrix: a ``(m, n)`` tensor or a batch ``(..., m, n)``; not modified.
    :return: a new tensor of the input's shape, dtype and device.
    """
    if matrix.dim() < 2:
        raise ValueError(f"polar_factor needs a matrix (>= 2 dims), got shape {tuple(matrix.shape)}")
    device = th.device("cpu") if matrix.device.type == "mps" else matrix.device
    x = matrix.detach().to(device=device, dtype=th.float64)
    u, _, vh = th.linalg.svd(x, full_matrices=False)
    q = u @ vh
    zero = (x == 0).flatten(-2).all(dim=-1)
    if bool(zero.any()):
        q = th.where(zero[..., None, None], th.zeros_like(q), q)
    return q.to(device=matrix.device, dtype=matrix.dtype).contiguous()


def newton_schulz_polar(matrix: th.Tensor, iterations: int = REFERENCE_ITERATIONS) -> th.Tensor:
    """The reference's Newton–Schulz approximation of the polar factor ``U V^T`` of a matrix (or of each
    matrix of a batch ``(..., m, n)``).

    Reference settings of FIRE (arXiv 2602.08040, isaac7778/FIRE): a wide matrix is transposed,
    ``X <- X / ||X||_F``, then ``iterations`` steps of ``X <- 1.5 X - 0.5 X (X^T X)``, in fp32 (float64 input
    stays float64). Small singular values grow ~1.5x per step, so 10 steps leave square default-initialised
    layers 18-26 % away from ``U V^T`` (module docstring); :func:`polar_factor` is exact. No scaling is
    applied here (see :func:`fire_weight`). A zero matrix maps to zero.

    :param matrix: a ``(m, n)`` tensor or a batch ``(..., m, n)``; not modified.
    :param iterations: number of Newton–Schulz steps (>= 1; the reference uses 10).
    :return: a new tensor of the input's shape and dtype.
    """
    _check_int_at_least("iterations", iterations, 1)
    if matrix.dim() < 2:
        raise ValueError(f"newton_schulz_polar needs a matrix (>= 2 dims), got shape {tuple(matrix.shape)}")
    compute_dtype = th.promote_types(matrix.dtype, th.float32)
    x = matrix.detach().to(compute_dtype)
    wide = x.shape[-1] > x.shape[-2]
    if wide:
        x = x.mT
    norm = th.linalg.matrix_norm(x, ord="fro", keepdim=True)
    x = x / norm.clamp_min(th.finfo(compute_dtype).tiny)
    a, b = NS_COEFFICIENTS
    for _ in range(iterations):
        x = a * x + b * (x @ (x.mT @ x))
    if wide:
        x = x.mT
    return x.to(matrix.dtype).contiguous()


def fire_scale(weight_shape: Union[th.Size, tuple[int, ...]]) -> float:
    """The reference's scale of the orthogonalised weight.

    ``sqrt(out / in)`` for a Linear weight ``(out, in)``; ``sqrt(out / in) / (kh * kw)`` for a Conv2d kernel
    ``(out, in, kh, kw)``, where ``in = shape[1]`` is the number of input channels (per group) — exactly
    ``np.sqrt(w.shape[0] / w.shape[1]) / kernel_size`` of isaac7778/FIRE ``vision/interventions/fire.py``.
    """
    shape = tuple(weight_shape)
    if len(shape) == 2:
        return math.sqrt(shape[0] / shape[1])
    if len(shape) == 4:
        return math.sqrt(shape[0] / shape[1]) / (shape[2] * shape[3])
    raise ValueError(f"FIRE handles Linear (2-d) and Conv2d (4-d) weights, got shape {shape}")


def init_scale(model: Any, layer: nn.Module) -> float:
    """The scale of a layer's initialisation in FIRE's terms: the RMS singular value of a fresh draw (in
    expectation), per spatial tap for a Conv2d kernel, so that ``init_scale * polar factor`` has the Frobenius
    norm of a freshly initialised layer. Used for output heads with ``head_scale="init"``.

    The initialiser is the model's (:func:`sb3_plastic.callbacks.redo.layer_init_scheme`): orthogonal with gain
    ``g`` on the ``(out, in * kh * kw)`` view (SB3's ``ortho_init``, plastic policies): ``g`` for a Linear layer,
    ``g * sqrt(min(out, in k) / (k min(out, in)))`` per tap of a ``k = kh * kw`` kernel; PyTorch's default
    (Kaiming-uniform, ``a = sqrt(5)``, entries ``U(-b, b)`` with ``b = 1 / sqrt(fan_in)``, variance
    ``1 / (3 fan_in)``): ``E||W||_F^2 = out / 3``, so ``sqrt(out / (3 k min(out, in)))``. Nothing is drawn.

    :param model: the SB3 algorithm (or policy) the layer belongs to.
    :param layer: a Linear / Conv2d layer of it.
    """
    shape = tuple(layer.weight.shape)
    if len(shape) not in (2, 4):
        raise ValueError(f"init_scale handles Linear (2-d) and Conv2d (4-d) weights, got shape {shape}")
    out, fan = shape[0], shape[1]
    taps = shape[2] * shape[3] if len(shape) == 4 else 1
    kind, gain = layer_init_scheme(model)(layer)
    if kind == "orthogonal":
        square_norm = gain**2 * min(out, fan * taps)
    else:
        square_norm = out / 3.0
    return math.sqrt(square_norm / (taps * min(out, fan)))


def fire_weight(
    weight: th.Tensor,
    iterations: Optional[int] = None,
    scaled: bool = True,
    blocks: int = 1,
    scale: Optional[float] = None,
) -> th.Tensor:
    """FIRE's image of one weight (a new tensor; ``weight`` is not modified).

    A Linear weight ``(out, in)`` is replaced by its polar factor; a Conv2d kernel ``(out, in, kh, kw)`` by
    the polar factor of each spatial tap ``W[:, :, i, j]``. With ``scaled=True`` (the reference) the result is
    multiplied by :func:`fire_scale`; ``scaled=False`` gives the plain polar factor (the SAC reference's
    ``scaler_type="ortho_init"``).

    :param weight: a 2-d or 4-d weight tensor.
    :param iterations: ``None`` (default): the exact polar factor (:func:`polar_factor`, SVD); an int ``k``:
        ``k`` Newton–Schulz steps (:func:`newton_schulz_polar`; 10 reproduces the reference implementation).
    :param scaled: apply the reference scaling ``sqrt(out/in)`` (``/ (kh*kw)`` for convolutions).
    :param blocks: a 2-d weight ``(k*m, n)`` made of ``k`` stacked matrices (an LSTM's gate blocks, ``k = 4``):
        each block ``(m, n)`` gets its own polar factor and the Linear scale ``sqrt(m / n)``.
    :param scale: multiply by this instead of the reference scale (e.g. :func:`init_scale` for a head);
        ignored when ``scaled=False``.
    """
    _check_iterations("iterations", iterations)

    def polar(x: th.Tensor) -> th.Tensor:
        return polar_factor(x) if iterations is None else newton_schulz_polar(x, iterations)

    if blocks != 1:
        if weight.dim() != 2:
            raise ValueError(f"blocks={blocks} needs a 2-d weight, got shape {tuple(weight.shape)}")
        stacked = as_blocks(weight, blocks)
        result = polar(stacked)
        if scaled:
            result = result * (fire_scale(stacked.shape[1:]) if scale is None else scale)
        return result.reshape(weight.shape)
    if weight.dim() == 2:
        result = polar(weight)
    elif weight.dim() == 4:
        taps = weight.permute(2, 3, 0, 1)  # (kh, kw, out, in): one matrix per spatial tap
        result = polar(taps).permute(2, 3, 0, 1).contiguous()
    else:
        raise ValueError(f"FIRE handles Linear (2-d) and Conv2d (4-d) weights, got shape {tuple(weight.shape)}")
    if scaled:
        result = result * (fire_scale(weight.shape) if scale is None else scale)
    return result


def fire_(
    module_or_layers: Union[nn.Module, Iterable[nn.Module]],
    iterations: Optional[int] = None,
    scaled: bool = True,
    scales: Optional[Mapping[nn.Module, float]] = None,
) -> list[nn.Module]:
    """Apply FIRE in place to every Linear / Conv2d weight of a module (or to the given layers).

    Weights are overwritten with ``param.copy_`` under ``torch.no_grad()``: the Parameter objects stay the
    same, so optimizers and target-network updates that hold them keep working. Biases are untouched.
    Optimizer state and target networks are *not* handled here (the :class:`FIRE` callback does that).
    A recurrent layer (``nn.LSTM``, ...) has each weight matrix rewritten gate block by gate block
    (:func:`fire_weight` with ``blocks``; see :func:`sb3_plastic.recurrent.recurrent_weights`).

    :param module_or_layers: a module (all its Linear / Conv2d / recurrent layers, itself included) or an
        iterable of such layers.
    :param iterations: ``None``: the exact polar factor (SVD); an int: that many Newton–Schulz steps (10: the
        reference implementation). See :func:`fire_weight`.
    :param scaled: apply the reference scaling (see :func:`fire_weight`).
    :param scales: layers whose result is multiplied by the given scale instead of the reference's (FIRE's
        output heads with ``head_scale="init"``).
    :return: the layers that were rewritten, each once, in order.
    """
    if isinstance(module_or_layers, nn.Module):
        candidates = [m for m in module_or_layers.modules() if isinstance(m, (*FIRE_LAYER_TYPES, nn.RNNBase))]
    else:
        candidates = list(module_or_layers)
        for layer in candidates:
            if not isinstance(layer, (*FIRE_LAYER_TYPES, nn.RNNBase)):
                raise TypeError(f"fire_ rewrites nn.Linear / nn.Conv2d / recurrent layers, got {type(layer).__name__}")
    done: list[nn.Module] = []
    seen: set[int] = set()
    with th.no_grad():
        for layer in candidates:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            for weight, blocks in fire_weights(layer):
                scale = None if scales is None else scales.get(layer)
                weight.copy_(fire_weight(weight, iterations, scaled, blocks, scale))
            done.append(layer)
    return done


def fire_weights(layer: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """``(weight, blocks)`` of every matrix FIRE rewrites in a layer: ``(layer.weight, 1)`` for a Linear /
    Conv2d, each weight matrix of a recurrent layer with its gate-block count."""
    if isinstance(layer, nn.RNNBase):
        return [(param, blocks) for _, param, blocks in recurrent_weights(layer)]
    return [(layer.weight, 1)]


# ----------------------------------------------------------------------------------------------------------
# Argument checks (shared by FIRE and FIREConfig so that both name the keyword the user typed)
# ----------------------------------------------------------------------------------------------------------


_is_int = is_int
_check_int_at_least = check_int_at_least
_check_at = check_at
_check_every = check_every
_check_bool = check_bool


def _check_layers(name: str, value: Any) -> None:
    if value not in FIRE_LAYER_SELECTIONS:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {list(FIRE_LAYER_SELECTIONS)}")


def _check_iterations(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise ValueError(
            f"{name} must be None (the exact polar factor) or an int >= 1 of Newton–Schulz steps "
            f"({REFERENCE_ITERATIONS}: the reference implementation), got {value!r}"
        )


def _check_head_scale(name: str, value: Any) -> None:
    if value not in FIRE_HEAD_SCALES:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {list(FIRE_HEAD_SCALES)}")


# ----------------------------------------------------------------------------------------------------------
# The callback
# ----------------------------------------------------------------------------------------------------------


class FIRE(TriggeredIntervention):
    """FIRE as an SB3 callback (ICLR 2026, arXiv 2602.08040): orthogonalise the weights at chosen moments.

    When it fires, every selected Linear / Conv2d weight of every online network (PPO/A2C: the policy;
    DQN: ``q_net``; QR-DQN: ``quantile_net``; SAC/TQC: actor and critic) is replaced in place by
    :func:`fire_weight` (the polar factor, hidden layers scaled as the reference, heads keeping their
    initialisation's scale by default; see the module docstring); the
    optimizer state of each rewritten weight is dropped (Adam/AdamO moments and step count; biases keep
    theirs); every target network is hard-synced to its online network; the other interventions of the ``learn()``
    call are told (:func:`~sb3_plastic.callbacks.base.announce_rewrite`, as :class:`~sb3_plastic.callbacks.LayerReset`
    says). Off-policy algorithms fire in
    ``_on_step`` (between gradient steps). On-policy algorithms (``OnPolicyAlgorithm``: PPO, A2C, ...) only
    note in ``_on_step`` that a fire is due and perform it in ``_on_rollout_start``, i.e. after the previous
    rollout's ``train()`` and before the next rollout's first action: the next rollout is collected by the
    new weights and its stored log-probs and values stay consistent. A fire still pending when ``learn()``
    ends (the call ended first) is performed in ``_on_training_end``, which is also between rollouts.
    Several triggers due at once give one fire.

    Triggers:

    * ``at`` float in (0, 1): a fraction of a training *run*. A run starts with a ``learn()`` call that
      starts from ``num_timesteps == 0`` (SB3's default ``reset_num_timesteps=True``, or a fresh model) and
      continues through later calls with ``reset_num_timesteps=False``. At the first call of a run the
      point ``T = start + round(at * total_timesteps)`` (absolute ``num_timesteps``) is fixed and stored in
      the model; FIRE fires once, at the first step with ``num_timesteps >= T``. Continuation calls (e.g.
      save -> load -> ``learn(..., reset_num_timesteps=False)``) keep that point: a model saved after the
      fire does not fire again, a model saved before it fires at ``T``. Each ``learn()`` call with
      ``reset_num_timesteps=True`` is a new run and fires at its own midpoint. (A FIRE first attached in a
      continuation call plans its point from that call; to fire once in every call of a continual loop
      use ``on_task_change``, ``every``, or a different ``name`` per call.) So with ``learn()`` in chunks
      (``learn(N)`` then ``learn(N, reset_num_timesteps=False)`` ...) ``at=0.5`` fires in the middle of the
      *first* chunk, not of the whole sequence of chunks: pass the whole budget to the first call, or use an int
      ``at``. With ``verbose >= 1`` the planned point is printed when it is fixed.
    * ``at`` int >= 1: at the first step with ``num_timesteps >= at``, once per run (a point already
      passed when a run's plan is made does not fire).
    * ``every`` N: whenever ``num_timesteps`` passes a multiple of N (``N, 2N, ...`` on SB3's
      ``num_timesteps`` axis; on-policy fires are coalesced to the next rollout boundary, so several
      multiples passed within one rollout give one fire).
    * ``on_task_change``: once per task switch, when the first env copy's ``info["task_id"]`` differs from the
      last one seen for that copy (copies that switch later, as ``at_episode_end=True`` copies do at their own
      episode ends, do not fire again for it: :class:`~sb3_plastic.callbacks.base.TaskChangeWatch`;
      the first value seen only sets the baseline; the last ids are kept in the model's state, so a task
      change between two ``learn()`` calls or across save -> load is seen too). A resumed run (load ->
      ``learn(..., reset_num_timesteps=False)``) continues the task sequence
      (:class:`~sb3_plastic.callbacks.TaskScheduleSync`, added by the plastic algorithms), so it fires where
      the uninterrupted run fires and not at the resume; a new run (``reset_num_timesteps=True``) restarts the
      schedule at task 0, which is a task change when the model was on another task.

    A trigger that cannot act warns (``UserWarning``) instead of doing nothing silently: ``at`` due after the
    end of the ``learn()`` call (the end is the rollout boundary at or after ``total_timesteps``), an int
    ``at`` already passed when the run's plan is made, ``every`` with no multiple inside the call (each at
    training start), and ``on_task_change`` when no info of the first rollout has a ``task_id`` (once).

    Persistent state (``self.state``, saved with the model, see :class:`PlasticCallback`): ``count``,
    ``timesteps`` (the ``num_timesteps`` of every fire), ``reasons``, ``run``, ``at_point``, ``at_done``,
    ``every_done``, ``task_ids`` (with ``task_changes``), ``pending``.

    Logged (``plasticity/fire/...``): ``dfi_before`` and ``dfi_after`` (sum over the rewritten layers of
    the deviation from isometry ``DfI = ||Gram - I||_F^2`` with ``s = 1``,
    :func:`sb3_plastic.isometry.deviation_from_isometry`: on the smaller Gram matrix, zero for any semi-orthogonal
    ``W`` of any shape; what keeps ``dfi_after`` above zero is FIRE's scale, not the shape: a Linear layer ends at
    singular values ``sqrt(out / in)``, so ``DfI = min(out, in) * (out / in - 1)^2``, zero only for a square one (a
    tall layer there sits exactly at the target of the isometry penalty with ``isometry_rect_scale=True``, see
    :mod:`sb3_plastic.isometry`, "What isometric means for a tall layer"); a Conv2d kernel
    (per-tap polar factors times ``sqrt(out / in) / (kh * kw)``) is no isometry of its ``(out, in * kh * kw)``
    view even when ``out = in`` (25.3 for a 32 -> 32 3x3 kernel), and output heads at ``head_scale="init"``
    keep their init scale), ``seconds`` (the surgery: orthogonalisation, optimizer reset and target sync) and
    ``count``; ``fire_<name>`` with a ``name``, so two named FIRE callbacks on one model log apart.

    :param at: see above. Default: 0.5 (the midpoint) when neither ``every`` nor ``on_task_change`` is
        given, else ``None``.
    :param every: fire every ``every`` env steps (``num_timesteps`` counts steps of all envs), or ``None``.
    :param on_task_change: fire when ``info["task_id"]`` changes.
    :param iterations: ``None`` (default): the exact polar factor ``U V^T`` (SVD, :func:`polar_factor`); an int
        ``k``: ``k`` Newton–Schulz steps instead (``10`` reproduces the reference implementation exactly,
        including its 18-26 % error on square hidden layers).
    :param layers: ``"all"`` (every Linear / Conv2d, heads included: the reference's choice, default) or
        ``"hidden"`` (output heads left alone).
    :param head_scale: with ``layers="all"``, the scale of a rewritten output head: ``"init"`` (default) the
        RMS singular value of the layer's initialiser (:func:`init_scale`; SB3 PPO's action head 0.01, value head
        1), ``"reference"`` the hidden-layer scale ``sqrt(out / in)`` of the reference code.
    :param name: distinguishes several FIRE callbacks on one model (separate persistent state).
    :param verbose: 1 prints a line per fire.
    :raises ValueError: for a bad trigger, ``iterations``, ``layers`` or ``head_scale``, or when no trigger is set.
    """

    edits_layers = True  # refused with a plasticity injection (PlasticCallback._refuse_with_injection)

    title = "FIRE"
    keyword_prefix = "fire"
    action = "fire"

    def __init__(
        self,
        at: Optional[Union[float, int]] = UNSET,
        every: Optional[int] = None,
        on_task_change: bool = False,
        iterations: Optional[int] = None,
        layers: str = "all",
        head_scale: str = "init",
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        if at is UNSET:
            at = 0.5 if every is None and not on_task_change else None
        _check_iterations("iterations", iterations)
        _check_layers("layers", layers)
        _check_head_scale("head_scale", head_scale)
        super().__init__(at=at, every=every, on_task_change=on_task_change, name=name, verbose=verbose)
        self.iterations = iterations
        self.layers = layers
        self.head_scale = head_scale

    # -- state -------------------------------------------------------------------------------------------

    @property
    def fire_count(self) -> int:
        """Fires performed on this model so far (persistent)."""
        return self.event_count

    @property
    def fired_at(self) -> list[int]:
        """``num_timesteps`` at each fire (persistent)."""
        return self.event_timesteps

    def _act(self, reasons: list[str]) -> None:
        self._fire(reasons)

    # -- the surgery -------------------------------------------------------------------------------------

    def selected_layers(self) -> list[nn.Module]:
        """The layers FIRE rewrites, over all online networks, each once."""
        chosen: dict[int, nn.Module] = {}
        for spec in self.networks:
            heads = {id(h) for h in spec.heads()}
            for layer in spec.weight_layers():
                if not isinstance(layer, FIRE_LAYER_TYPES):
                    continue
                if self.layers == "hidden" and id(layer) in heads:
                    continue
                chosen.setdefault(id(layer), layer)
            for layer in spec.recurrent:  # recurrent layers are hidden layers
                chosen.setdefault(id(layer), layer)
        return list(chosen.values())

    def _head_ids(self) -> set[int]:
        return {id(h) for spec in self.networks for h in spec.heads()}

    def layer_scale(self, layer: nn.Module) -> float:
        """The scale FIRE gives a Linear / Conv2d layer's polar factor: :func:`init_scale` for an output head
        with ``head_scale="init"``, else the reference's :func:`fire_scale`."""
        if self.head_scale == "init" and id(layer) in self._head_ids():
            return init_scale(self.model, layer)
        return fire_scale(layer.weight.shape)

    def _fire(self, reasons: list[str]) -> None:
        layers = self.selected_layers()
        weights = [pair for layer in layers for pair in fire_weights(layer)]
        dfi_before = sum(deviation_from_isometry(w, blocks=b) for w, b in weights)
        start = time.perf_counter()
        heads = self._head_ids() if self.head_scale == "init" else set()
        scales = {layer: init_scale(self.model, layer) for layer in layers if id(layer) in heads}
        fire_(layers, self.iterations, scales=scales)
        optimizers: dict[int, th.optim.Optimizer] = {}
        for spec in self.networks:
            if spec.optimizer is not None:
                optimizers.setdefault(id(spec.optimizer), spec.optimizer)
        for optimizer in optimizers.values():
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            for weight, _ in weights:
                if id(weight) in held:
                    reset_optimizer_state(optimizer, weight)
        for spec in self.networks:
            for norm in norms_fed_by(spec, layers):
                reset_norm_(norm)  # CrossQ's BatchRenorm: statistics of the old weights no longer apply
            sync_target(spec)
        seconds = time.perf_counter() - start
        announce_rewrite(self.model, [w for w, _ in weights], self)  # spectral vectors, C-CHAIN's previous network
        dfi_after = sum(deviation_from_isometry(w, blocks=b) for w, b in weights)

        now = int(self.model.num_timesteps)
        count = self._count_event(reasons)
        self.record(f"{self.log_group('fire')}/dfi_before", dfi_before)
        self.record(f"{self.log_group('fire')}/dfi_after", dfi_after)
        self.record(f"{self.log_group('fire')}/seconds", seconds)
        self.record(f"{self.log_group('fire')}/count", count)
        if self.verbose >= 1:
            print(
                f"FIRE #{count} at num_timesteps={now} ({'+'.join(reasons)}): {len(layers)} layers, "
                f"DfI {dfi_before:.4g} -> {dfi_after:.4g}, {seconds * 1e3:.1f} ms"
            )


# ----------------------------------------------------------------------------------------------------------
# Top-level keywords of the plastic algorithms
# ----------------------------------------------------------------------------------------------------------


@dataclass
class FIREConfig(InterventionConfig):
    """FIRE settings as top-level keywords of ``PlasticPPO`` / ``PlasticDQN`` / ``PlasticSAC`` (and rl_zoo3
    yaml / optuna samplers). FIRE (ICLR 2026, arXiv 2602.08040); see :class:`FIRE` for the semantics.

    :param fire_at: float in (0, 1): fraction of the training run started by ``learn()`` (fires once per run,
        kept across save -> load -> ``learn(reset_num_timesteps=False)``; the fraction is of the first call's
        ``total_timesteps``, so with ``learn()`` in chunks it fires inside the first chunk); int >= 1: an absolute
        ``num_timesteps`` (warns when it is already passed or after the end of the ``learn()`` call); ``None``: off.
    :param fire_every: fire every N env steps (multiples of N on ``num_timesteps``; warns when no multiple falls
        inside the ``learn()`` call); ``None``: off.
    :param fire_on_task_change: fire when any env's ``info["task_id"]`` changes (warns when the env's infos have
        no ``task_id``).
    :param fire_iterations: ``None`` (default): the exact polar factor (SVD); an int: that many Newton–Schulz
        steps instead (10 reproduces the reference implementation).
    :param fire_layers: ``"all"`` (every Linear / Conv2d including output heads, as the reference does; the
        default) or ``"hidden"`` (output heads untouched).
    :param fire_head_scale: ``"init"`` (default: rewritten heads keep their initialisation's scale) or
        ``"reference"`` (heads scaled ``sqrt(out / in)`` like hidden layers, as the reference code).

    ``fire_iterations`` / ``fire_layers`` / ``fire_head_scale`` set away from their defaults without a trigger warn
    (``UserWarning``): FIRE is off and they cannot act.
    """

    fire_at: Optional[Union[float, int]] = None
    fire_every: Optional[int] = None
    fire_on_task_change: bool = False
    fire_iterations: Optional[int] = None
    fire_layers: str = "all"
    fire_head_scale: str = "init"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        _check_at("fire_at", self.fire_at)
        _check_every("fire_every", self.fire_every)
        _check_bool("fire_on_task_change", self.fire_on_task_change)
        _check_iterations("fire_iterations", self.fire_iterations)
        _check_layers("fire_layers", self.fire_layers)
        _check_head_scale("fire_head_scale", self.fire_head_scale)
        if not self.enabled:
            warn_ignored_options(
                changed_fields(self, ("fire_iterations", "fire_layers", "fire_head_scale")),
                "no FIRE trigger is set (fire_at, fire_every, fire_on_task_change), so FIRE is off",
                stacklevel=4,
            )

    @property
    def enabled(self) -> bool:
        """Whether any trigger is set."""
        return self.fire_at is not None or self.fire_every is not None or self.fire_on_task_change

    def make_callback(self, name: Optional[str] = "config", verbose: int = 0) -> FIRE:
        """The :class:`FIRE` callback for these settings.

        :param name: state name of the callback; the default ``"config"`` keeps its persistent state apart
            from a ``FIRE()`` the user passes to ``learn()`` (which uses ``name=None``).
        :param verbose: SB3 verbosity.
        :raises ValueError: if no trigger is set (check :attr:`enabled` first).
        """
        self.validate()
        if not self.enabled:
            raise ValueError("FIREConfig has no trigger: set fire_at, fire_every or fire_on_task_change")
        return FIRE(
            at=self.fire_at,
            every=self.fire_every,
            on_task_change=self.fire_on_task_change,
            iterations=self.fire_iterations,
            layers=self.fire_layers,
            head_scale=self.fire_head_scale,
            name=name,
            verbose=verbose,
        )
