"""The isometry penalty, its analytic gradient, deviation from isometry (DfI) and orthogonal init.

For a weight ``W`` of shape ``(out, in)`` (a convolution kernel is viewed as ``(out, in * kh * kw)``)
the penalty of Rosseau, Müller & Nowé (2026), in its authors' convention (the first author's PyTorch port,
Arosseau/nanochat-isometry ``nanochat/ortho_reg.py``, ported from the paper's JAX code ``isometry_lab/losses.py``),
is half the squared Frobenius distance of the smaller Gram matrix from its target,

    R(W) = 1/2 ||W^T W - t I||_F^2   if out >= in,      R(W) = 1/2 ||W W^T - t I||_F^2   otherwise,

with target ``t = s`` (``isometry_scale``, 1 by default; ``s = 2`` is an option for ReLU layers, "compensates
E[relu(x)^2] = sigma^2 / 2"). Its gradient is ``2 W (W^T W - t I)`` or ``2 (W W^T - t I) W``; no autograd is needed.
The 1/2 makes ``lambda`` "directly comparable to weight decay" (the port's words): ``lambda * R`` of a matrix near
its target has curvature ``~ 4 lambda sigma^2`` per singular value, as ``lambda / 2 ||W||^2`` has ``lambda``.

**Convention change (issue #27).** Before issue #27 this library had no 1/2 (``R = ||.||_F^2``, gradient
``4 W (W^T W - s I)``): every ``lambda`` written for the old code is half of today's for the same penalty. The
library's defaults were doubled with the change (``isometry_coef`` 0.02 for the PPO and DQN families, 2e-3 for SAC,
TQC and CrossQ, 0.2 for :class:`~sb3_plastic.AdamO` built directly), so a default run trains bit for bit as before,
and a model saved by the old code (format version 1, :data:`ISOMETRY_FORMAT`) loads with its ``isometry_coef``
doubled (:meth:`sb3_plastic.common.plastic_algorithm.PlasticAlgorithmMixin.load`,
:meth:`sb3_plastic.optim.IsometryStepMixin.load_state_dict`): the same effective penalty.

Two options of the authors' code (both off by default here):

* ``rect_scale=True`` (``isometry_rect_scale``): for a tall ``W`` (``out > in``) the target is ``t = s * out / in``
  ("accounts for signal norm propagation when orthogonalising the shorter dimension"); wide and square matrices keep
  ``t = s``. The port's function defaults to it, but its training script turned it off by default (commit
  6524a4a, "rect_scale is theoretically unmotivated for the isometry target (W^T W = I is already achievable for
  tall matrices without it)"), so every run its authors launch without the flag is without it; so is this
  library's default.
* ``normalize=True`` (``isometry_normalize``): ``R`` and its gradient divided by the Gram matrix's size
  ``min(out, in)``, so the strength does not grow with the layer's width (off in the port, as here).

One option of this library's own (an ablation, off by default; not in the authors' code):

* ``free_scale=True`` (``isometry_free_scale``): the target is the Gram matrix's own mean diagonal,
  ``t = ||W||_F^2 / min(out, in)`` (the mean squared singular value), at the current weights. ``R`` is then
  ``1/2 sum_i (sigma_i^2 - mean_j sigma_j^2)^2``: it penalises the spread of the squared singular values, not their
  level, so ``c Q`` (``Q`` orthonormal) has ``R = 0`` for every ``c`` and the weights may grow or shrink as the task
  asks while keeping their shape. The gradient is still ``2 W (Gram - t I)`` with ``t`` read off the weights: the
  derivative of ``R`` through ``t`` is ``-tr(Gram - t I) = 0`` at ``t = tr(Gram) / d``. It tests whether what the
  penalty costs an agent is the hold on the weights' scale or on their shape (bench/README.md). ``scale`` and
  ``rect_scale`` do not enter ``R`` with it (``scale`` still sets DfI's and the initialisation's scale).

And one more ablation of this library's own (off by default; not in the authors' code):

* ``side="floor"`` or ``"ceiling"`` (``isometry_side``; ``"both"``, the penalty itself, by default): only the squared
  singular values below the target (``floor``) or above it (``ceiling``) are penalised. With the Gram matrix's
  eigendecomposition ``Gram - t I = V diag(e) V^T`` (``e_i = sigma_i^2 - t``), the one-sided residual is
  ``V diag(min(e, 0)) V^T`` (floor) or ``V diag(max(e, 0)) V^T`` (ceiling), ``R = 1/2 sum_i min(e_i, 0)^2`` or
  ``1/2 sum_i max(e_i, 0)^2``, and the two sides add up to the penalty (``R_floor + R_ceiling = R``). The gradient
  keeps its form, ``2 W`` times the one-sided residual (``R`` is a spectral function of the Gram matrix, whose
  gradient is ``V diag(f'(lambda)) V^T``; equal eigenvalues give the same residual whichever eigenvectors ``eigh``
  returns, as ``f`` takes one value on them). A floor keeps every direction of the layer alive (no singular value
  below ``sqrt(t)``) and lets any of them grow; a ceiling caps them and lets them shrink. It tells which half of the
  penalty's hold costs an agent its learning speed (bench/README.md). The eigendecomposition costs a ``d x d``
  ``eigh`` per weight and step (``d = min(out, in)``). ``free_scale`` is refused with it: its target moves with the
  weights, and a one-sided penalty's derivative through that target is not zero.

**What "isometric" means for a tall layer** (the one place this library says it). A tall Linear weight
``(out, in)`` with ``out > in`` can at best be an isometry of its input space onto an ``in``-dimensional subspace of
the output: orthonormal columns, all ``in`` singular values ``sqrt(s)`` (``W^T W = s I``). That is the penalty's
default target, the polar factor FIRE computes before it scales it, and DfI's zero. With ``rect_scale`` the target
singular values are ``sqrt(s * out / in)``: the same as FIRE's reference scaling of a tall layer,
``sqrt(out / in)`` at ``s = 1`` (:func:`sb3_plastic.callbacks.fire.fire_scale`; FIRE's reference scales every
Linear weight by ``sqrt(out / in)``, the "spectral" scale ``||W||_op = sqrt(d_out / d_in)`` of muP / Muon, under
which the mean square per output unit equals the mean square per input unit). So ``isometry_rect_scale=True`` is the penalty
that keeps a tall layer where FIRE puts it; with the default the penalty pulls it back towards singular values
``sqrt(s)``. For a wide layer (``out < in``) the two differ whatever the option: the penalty's target is ``W W^T =
s I`` (singular values ``sqrt(s)``), FIRE's scale ``sqrt(out / in) < 1``.

Deviation from isometry (DfI), one definition everywhere (the diagnostics, the monitor, FIRE's logs), kept as it
was before issue #27 so that the logged ``.../dfi`` keys keep their meaning: the full squared Frobenius distance
with target ``s`` (1 unless the caller says otherwise), no 1/2, no ``rect_scale``, no normalisation, always on the
smaller Gram matrix: ``||W^T W - s I||_F^2`` for ``out >= in`` and ``||W W^T - s I||_F^2`` for a wide ``W``; that
is ``2 R(W)`` with the options off. FIRE's reference writes ``||W^T W - I||_F^2`` for every shape; for a wide
``W`` (``out < in``) that larger ``in x in`` Gram matrix has ``in - out`` extra zero eigenvalues, so it equals
this DfI plus the constant ``in - out`` (a floor no matrix can go below) and has the same gradient
(``W (W^T W - I) = (W W^T - I) W``). The smaller Gram matrix is chosen because its DfI is 0 exactly when ``W`` is
as isometric as its shape allows (orthonormal columns, or orthonormal rows for a wide ``W``: all ``min(out, in)``
singular values 1), so values of layers of different shapes are comparable and an orthogonally initialised
network reads 0; and it is (twice) what the penalty optimises at its default settings.

Stacked blocks (``blocks=k``): a recurrent layer stores several matrices in one tensor. PyTorch's
``nn.LSTM`` keeps the four gate matrices (input, forget, cell, output gates) of layer ``l`` stacked along
the rows of ``weight_ih_l{l}`` ``(4H, in)`` and ``weight_hh_l{l}`` ``(4H, H)`` (Hochreiter & Schmidhuber,
1997). Each gate is its own linear map followed by its own nonlinearity, so isometry is asked of each gate
matrix on its own: with ``blocks=k`` the weight ``(k*m, n)`` is viewed as ``k`` matrices ``(m, n)`` and
``R = sum_b R(W_b)``, the gradient is the per-block gradient stacked back. (The stacked ``(4H, in)``
matrix itself could be an isometry only if the four gate matrices were mutually orthogonal maps, which no gate
structure asks for.) ``rect_scale``, ``normalize`` and ``free_scale`` act on each block on its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch as th
from torch import nn

#: Version of the isometry convention saved with a plastic model: 1 = the penalty without the 1/2 (before issue
#: #27), 2 = the authors' convention ``R = 1/2 ||Gram - t I||_F^2`` with ``isometry_rect_scale`` and
#: ``isometry_normalize`` (and, since the thirty-seventh session, ``isometry_free_scale``, off when absent). A zip
#: without it is version 1.
ISOMETRY_FORMAT = 2

#: The values of ``isometry_side``: the whole penalty, or only the squared singular values below / above the target.
ISOMETRY_SIDES = ("both", "floor", "ceiling")

#: Layer types whose ``weight`` the isometry machinery understands.
WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _check_scale(scale: float) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"isometry_scale must be a finite number > 0, got {scale!r}")


def check_side(side: str, free_scale: bool = False) -> None:
    """Raise ``ValueError`` unless ``side`` is one of :data:`ISOMETRY_SIDES`, and for a one-sided penalty with
    ``free_scale`` (module docstring)."""
    if not isinstance(side, str) or side not in ISOMETRY_SIDES:
        raise ValueError(f"isometry_side must be one of {list(ISOMETRY_SIDES)}, got {side!r}")
    if side != "both" and free_scale:
        raise ValueError(
            f"isometry_side={side!r} takes a fixed target; isometry_free_scale=True moves the target with the weights "
            "(a one-sided penalty's gradient would then need its derivative through the target): set one of them"
        )


def one_sided(residual: th.Tensor, side: str) -> th.Tensor:
    """The one-sided part of a symmetric Gram residual ``Gram - t I`` (or a stack ``(k, d, d)`` of them):
    ``V diag(min(e, 0)) V^T`` for ``side="floor"``, ``V diag(max(e, 0)) V^T`` for ``"ceiling"`` (``e``, ``V`` from
    ``eigh``), the residual itself for ``"both"``. Computed without autograd (the caller differentiates, see
    :func:`isometry_penalty`), in float64 for a float32 residual and cast back."""
    if side == "both":
        return residual
    with th.no_grad():
        work = residual.detach()
        work = work.double() if work.dtype == th.float32 else work
        work = 0.5 * (work + work.mT)  # symmetric up to rounding already; eigh reads one triangle
        eigenvalues, vectors = th.linalg.eigh(work)
        clipped = eigenvalues.clamp(max=0.0) if side == "floor" else eigenvalues.clamp(min=0.0)
        return ((vectors * clipped.unsqueeze(-2)) @ vectors.mT).to(residual.dtype)


def as_matrix(weight: th.Tensor) -> th.Tensor:
    """View a Linear weight ``(out, in)`` or a conv kernel ``(out, in, *k)`` as a matrix ``(out, in*prod(k))``."""
    if weight.dim() < 2:
        raise ValueError(f"the isometry penalty needs a weight with >= 2 dims, got shape {tuple(weight.shape)}")
    return weight.reshape(weight.shape[0], -1)


def check_blocks(blocks: int, rows: int) -> None:
    """Raise ``ValueError`` unless ``blocks`` is an int >= 1 dividing the number of ``rows``."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks must be an int >= 1, got {blocks!r}")
    if rows % blocks:
        raise ValueError(f"blocks={blocks} does not divide the {rows} rows of the weight")


def as_blocks(weight: th.Tensor, blocks: int) -> th.Tensor:
    """View the matrix view ``(k*m, n)`` of ``weight`` as ``k`` stacked blocks ``(k, m, n)`` (a view, no copy).

    :param weight: a weight with >= 2 dims (see :func:`as_matrix`).
    :param blocks: ``k`` >= 1, must divide ``weight.shape[0]`` (an LSTM weight has 4 gate blocks).
    """
    w = as_matrix(weight)
    check_blocks(blocks, w.shape[0])
    return w.reshape(blocks, w.shape[0] // blocks, w.shape[1])


def isometry_target(rows: int, cols: int, scale: float = 1.0, rect_scale: bool = False) -> float:
    """The target ``t`` of the Gram matrix of a ``(rows, cols)`` matrix: ``scale``, times ``rows / cols`` for a tall
    matrix (``rows > cols``) with ``rect_scale`` (the authors' rect scale, see the module docstring)."""
    return scale * rows / cols if rect_scale and rows > cols else scale


def gram_residual(
    weight: th.Tensor, scale: float = 1.0, blocks: int = 1, rect_scale: bool = False, free_scale: bool = False
) -> th.Tensor:
    """``W^T W - t I`` (tall or square ``W``) or ``W W^T - t I`` (wide ``W``), on the matrix view of ``weight``;
    ``t`` is :func:`isometry_target`, or with ``free_scale`` the Gram matrix's mean diagonal (per block).

    With ``blocks=k > 1``: the residuals of the ``k`` row blocks, stacked ``(k, d, d)`` (see :func:`as_blocks`).
    """
    w = as_matrix(weight) if blocks == 1 else as_blocks(weight, blocks)
    rows, cols = w.shape[-2:]
    gram = w.mT @ w if rows >= cols else w @ w.mT
    eye = th.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    if free_scale:
        return gram - gram.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * eye
    return gram - isometry_target(rows, cols, scale, rect_scale) * eye


def isometry_penalty(
    weight: th.Tensor, scale: float = 1.0, blocks: int = 1, rect_scale: bool = False, normalize: bool = False,
    free_scale: bool = False, side: str = "both",
) -> th.Tensor:
    """The isometry penalty ``R(W) = 1/2 ||Gram(W) - t I||_F^2`` (a scalar tensor, differentiable) on the smaller Gram
    matrix, in the authors' convention (module docstring).

    :param weight: a weight with >= 2 dims (a conv kernel is viewed as ``(out, in * kh * kw)``).
    :param scale: target scale ``s`` > 0.
    :param blocks: ``k``: the sum of ``R`` over ``k`` stacked row blocks (an LSTM weight: its gate matrices).
    :param rect_scale: for a tall matrix (``out > in``) the target ``s * out / in`` instead of ``s``.
    :param normalize: divide by the Gram matrix's size ``min(out, in)`` (per block).
    :param free_scale: the target is the Gram matrix's mean diagonal (module docstring): ``R`` penalises the spread
        of the squared singular values, not their level.
    :param side: ``"both"`` (the penalty), ``"floor"`` or ``"ceiling"``: only the squared singular values below /
        above the target (module docstring).
    """
    _check_scale(scale)
    check_side(side, free_scale)
    residual = gram_residual(weight, scale, blocks, rect_scale, free_scale)
    if side == "both":
        penalty = 0.5 * residual.square().sum()
    else:
        # C = the one-sided residual (no autograd): <residual, C> = sum_i e_i f(e_i) = ||C||^2, so this has the value
        # 1/2 ||C||^2 and the gradient of <residual, C> with C held, 2 W C: the exact gradient (module docstring)
        part = one_sided(residual, side)
        penalty = (residual * part).sum() - 0.5 * part.square().sum()
    return penalty / residual.shape[-1] if normalize else penalty


def isometry_penalty_grad(
    weight: th.Tensor, scale: float = 1.0, blocks: int = 1, rect_scale: bool = False, normalize: bool = False,
    free_scale: bool = False, side: str = "both",
) -> th.Tensor:
    """Analytic gradient of :func:`isometry_penalty` with respect to ``weight`` (same shape as ``weight``):
    ``2 W (W^T W - t I)`` for a tall or square matrix, ``2 (W W^T - t I) W`` for a wide one (``/ min(out, in)`` with
    ``normalize``; with ``free_scale`` ``t`` is the Gram matrix's mean diagonal, and this is still the exact
    gradient; with ``side`` ``"floor"`` / ``"ceiling"`` the residual is its one-sided part, :func:`one_sided`)."""
    _check_scale(scale)
    check_side(side, free_scale)
    w = as_matrix(weight) if blocks == 1 else as_blocks(weight, blocks)
    residual = one_sided(gram_residual(weight, scale, blocks, rect_scale, free_scale), side)
    factor = 2.0 / residual.shape[-1] if normalize else 2.0
    grad = factor * (w @ residual) if w.shape[-2] >= w.shape[-1] else factor * (residual @ w)
    return grad.reshape(weight.shape)


def deviation_from_isometry(weight: th.Tensor, scale: float = 1.0, blocks: int = 1, free_scale: bool = False) -> float:
    """DfI of one weight: ``||Gram(W) - s I||_F^2`` on the smaller Gram matrix, no 1/2 (``2 R(W)`` with the options
    off; the definition is unchanged by issue #27, see the module docstring), as a Python float (summed over
    ``blocks``).

    With ``free_scale`` the target is the Gram matrix's own mean diagonal (``scale`` is not used): the scale-free DfI
    ``sum_i (sigma_i^2 - mean_j sigma_j^2)^2``, twice the penalty of ``isometry_free_scale``. It is 0 for every
    ``c Q`` (``Q`` orthonormal), so it reads the spread of the singular values apart from their level."""
    _check_scale(scale)
    with th.no_grad():
        residual = gram_residual(weight.detach().float(), scale, blocks, free_scale=free_scale)
        return float(residual.square().sum())


def deviation_from_isometry_sides(weight: th.Tensor, scale: float = 1.0, blocks: int = 1) -> tuple[float, float]:
    """The DfI of one weight split at its target: ``(floor, ceiling)`` with ``floor = sum_i min(e_i, 0)^2`` and
    ``ceiling = sum_i max(e_i, 0)^2``, ``e_i = sigma_i^2 - s`` over the ``min(out, in)`` singular values (per block,
    summed over ``blocks``): the eigenvalues of the smaller Gram matrix's residual, computed in float64 with
    ``eigvalsh``. ``floor + ceiling`` is :func:`deviation_from_isometry` (up to rounding); each is twice the one-sided
    penalty of ``isometry_side="floor"`` / ``"ceiling"`` (module docstring) at the default options (no
    ``rect_scale``). A ``floor`` of 0 means no singular value lies below ``sqrt(s)``: a floor-only penalty on this
    weight does not act. Non-finite weights give ``(nan, nan)``."""
    _check_scale(scale)
    with th.no_grad():
        w = weight.detach().double()
        if not bool(th.isfinite(w).all()):
            return math.nan, math.nan
        return split_at_target(th.linalg.eigvalsh(gram_residual(w, scale, blocks)), 0.0)


def split_at_target(eigenvalues: th.Tensor, target: float) -> tuple[float, float]:
    """``(sum min(e, 0)^2, sum max(e, 0)^2)`` with ``e = eigenvalues - target``: the DfI's parts below and above its
    target from the eigenvalues of a Gram matrix (:func:`deviation_from_isometry_sides`)."""
    e = eigenvalues - target
    return float(e.clamp(max=0.0).square().sum()), float(e.clamp(min=0.0).square().sum())


def weight_layers(module: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """``(name, layer)`` for every Linear / Conv layer inside ``module``, in registration order."""
    for name, layer in module.named_modules():
        if isinstance(layer, WEIGHT_LAYERS):
            yield name, layer


def dfi_per_layer(module: nn.Module, scale: float = 1.0) -> dict[str, float]:
    """Deviation from isometry (:func:`deviation_from_isometry`) of every Linear / Conv layer of ``module``, keyed by
    layer name.

    Recurrent layers (``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``) add one entry per weight matrix, keyed
    ``<layer>.<parameter>`` (``lstm_actor.weight_ih_l0``, ...): the sum over its gate blocks
    (:func:`sb3_plastic.recurrent.recurrent_weights`).
    """
    from sb3_plastic.recurrent import recurrent_weights

    _check_scale(scale)
    out = {name: deviation_from_isometry(layer.weight, scale) for name, layer in weight_layers(module)}
    for name, layer in module.named_modules():
        if isinstance(layer, nn.RNNBase):
            for pname, param, blocks in recurrent_weights(layer):
                out[f"{name}.{pname}" if name else pname] = deviation_from_isometry(param, scale, blocks)
    return out


def orthogonal_init_(layer: nn.Module, gain: float = 1.0) -> nn.Module:
    """Orthogonal weight (``torch.nn.init.orthogonal_`` on the matrix view) and zero bias, in place."""
    if not isinstance(layer, WEIGHT_LAYERS):
        raise TypeError(f"orthogonal_init_ expects one of {[c.__name__ for c in WEIGHT_LAYERS]}, got {type(layer).__name__}")
    with th.no_grad():
        nn.init.orthogonal_(layer.weight, gain=gain)
        if layer.bias is not None:
            layer.bias.zero_()
    return layer


def orthogonal_init_network_(module: nn.Module, gain: float = 1.0, exclude: Iterable[nn.Module] = ()) -> list[str]:
    """Orthogonally initialise every Linear / Conv layer of ``module`` except those in ``exclude``.

    :return: the names of the layers that were initialised.
    """
    skipped = {id(m) for m in exclude}
    done = []
    for name, layer in weight_layers(module):
        if id(layer) not in skipped:
            orthogonal_init_(layer, gain)
            done.append(name)
    return done
