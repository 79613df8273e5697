"""The isometry penalty, its analytic gradient, deviation from isometry (DfI) and orthogonal init.

For a weight ``W`` of shape ``(out, in)`` (a convolution kernel is viewed as ``(out, in * kh * kw)``)
the penalty of Rosseau, Müller & Nowé (2026) is

    R(W) = ||W^T W - s I||_F^2   if out >= in,      R(W) = ||W W^T - s I||_F^2   otherwise,

with target scale ``s`` (1 by default; ``s = 2`` is an option for ReLU layers). Its gradient is
``4 W (W^T W - s I)`` or ``4 (W W^T - s I) W``; no autograd is needed.

Deviation from isometry (DfI), one definition everywhere (the diagnostics, the monitor, FIRE's logs): the
penalty with ``s = 1``, always on the smaller Gram matrix, ``||W^T W - I||_F^2`` for ``out >= in`` and
``||W W^T - I||_F^2`` for a wide ``W``. FIRE's reference writes ``||W^T W - I||_F^2`` for every shape; for a wide
``W`` (``out < in``) that larger ``in x in`` Gram matrix has ``in - out`` extra zero eigenvalues, so it equals
this DfI plus the constant ``in - out`` (a floor no matrix can go below) and has the same gradient
(``W (W^T W - I) = (W W^T - I) W``). The smaller Gram matrix is chosen because its DfI is 0 exactly when ``W`` is
as isometric as its shape allows (orthonormal columns, or orthonormal rows for a wide ``W``: all ``min(out, in)``
singular values 1), so values of layers of different shapes are comparable and an orthogonally initialised
network reads 0; and it is what the penalty optimises, so the logged DfI is the regulariser's own objective.

Stacked blocks (``blocks=k``): a recurrent layer stores several matrices in one tensor. PyTorch's
``nn.LSTM`` keeps the four gate matrices (input, forget, cell, output gates) of layer ``l`` stacked along
the rows of ``weight_ih_l{l}`` ``(4H, in)`` and ``weight_hh_l{l}`` ``(4H, H)`` (Hochreiter & Schmidhuber,
1997). Each gate is its own linear map followed by its own nonlinearity, so isometry is asked of each gate
matrix on its own: with ``blocks=k`` the weight ``(k*m, n)`` is viewed as ``k`` matrices ``(m, n)`` and
``R = sum_b R(W_b)``, the gradient is the per-block gradient stacked back. (The stacked ``(4H, in)``
matrix itself could be an isometry only if the four gates were mutually orthogonal maps, which no gate
structure asks for.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch as th
from torch import nn

#: Layer types whose ``weight`` the isometry machinery understands.
WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _check_scale(scale: float) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"isometry_scale must be a finite number > 0, got {scale!r}")


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


def gram_residual(weight: th.Tensor, scale: float = 1.0, blocks: int = 1) -> th.Tensor:
    """``W^T W - s I`` (tall or square ``W``) or ``W W^T - s I`` (wide ``W``), on the matrix view of ``weight``.

    With ``blocks=k > 1``: the residuals of the ``k`` row blocks, stacked ``(k, d, d)`` (see :func:`as_blocks`).
    """
    w = as_matrix(weight) if blocks == 1 else as_blocks(weight, blocks)
    gram = w.mT @ w if w.shape[-2] >= w.shape[-1] else w @ w.mT
    return gram - scale * th.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)


def isometry_penalty(weight: th.Tensor, scale: float = 1.0, blocks: int = 1) -> th.Tensor:
    """The isometry penalty ``R(W)`` (a scalar tensor, differentiable); with ``blocks=k`` the sum of ``R`` over
    the ``k`` stacked row blocks (an LSTM weight: its gate matrices)."""
    _check_scale(scale)
    return gram_residual(weight, scale, blocks).square().sum()


def isometry_penalty_grad(weight: th.Tensor, scale: float = 1.0, blocks: int = 1) -> th.Tensor:
    """Analytic gradient of :func:`isometry_penalty` with respect to ``weight`` (same shape as ``weight``)."""
    _check_scale(scale)
    w = as_matrix(weight) if blocks == 1 else as_blocks(weight, blocks)
    residual = gram_residual(weight, scale, blocks)
    grad = 4.0 * (w @ residual) if w.shape[-2] >= w.shape[-1] else 4.0 * (residual @ w)
    return grad.reshape(weight.shape)


def deviation_from_isometry(weight: th.Tensor, scale: float = 1.0, blocks: int = 1) -> float:
    """DfI of one weight: ``R(W)`` (the smaller Gram matrix, see the module docstring) with target scale
    ``scale`` as a Python float (summed over ``blocks``)."""
    with th.no_grad():
        return float(isometry_penalty(weight.detach().float(), scale, blocks))


def weight_layers(module: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """``(name, layer)`` for every Linear / Conv layer inside ``module``, in registration order."""
    for name, layer in module.named_modules():
        if isinstance(layer, WEIGHT_LAYERS):
            yield name, layer


def dfi_per_layer(module: nn.Module, scale: float = 1.0) -> dict[str, float]:
    """Deviation from isometry ``R(W)`` of every Linear / Conv layer of ``module``, keyed by layer name.

    Recurrent layers (``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``) add one entry per weight matrix, keyed
    ``<layer>.<parameter>`` (``lstm_actor.weight_ih_l0``, ...): the sum of ``R`` over its gate blocks
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
