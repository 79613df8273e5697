"""Activation functions used by plastic networks.

``MaxMin`` is GroupSort with groups of two (Anil, Lucas & Grosse, 2019), the activation that makes
a network with orthogonal layers almost-everywhere isometric (Rosseau, Müller & Nowé, 2026,
"Preserving Plasticity in Continual Learning via Dynamical Isometry").
"""

from __future__ import annotations

import math
from typing import Any, Union

import torch as th
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {}


#: Integer dtype of the same width as each float dtype: MaxMin's fast path swaps values on their raw bits.
_SAME_WIDTH_INT: dict[th.dtype, th.dtype] = {
    th.float32: th.int32,
    th.float64: th.int64,
    th.float16: th.int16,
    th.bfloat16: th.int16,
}

#: MaxMin takes the bitwise path for inputs ``(N, C, *spatial)`` whose spatial size is at least this (an ``(N, F)``
#: input counts as spatial size 1) ...
BITWISE_MIN_PLANE = 16
#: ... and whose number of elements is at least this; other inputs take the gather path. Both paths give the same
#: bits; these bounds only choose the faster one (bench/results/step_cost/LOG.md, "MaxMin formulations": on one
#: CPU thread the bitwise path takes 0.4x the gather's time for ``(256, 16, 8, 8)``, but 2x for ``(256, 256)``,
#: whose pairs are adjacent elements that elementwise kernels cannot vectorise over).
BITWISE_MIN_NUMEL = 32768
#: ... and only on these devices: on an H200 the gather path took 0.27-0.50x the bitwise path's time on every shape
#: measured, conv feature maps at batch 256 included (bench/results/step_cost/gpu_2026-12-04, bench/maxmin_paths.py).
BITWISE_DEVICE_TYPES: tuple[str, ...] = ("cpu",)


def _pair_halves(x: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """The first and the second feature of every pair along dim 1, as two views ``(N, C/2, ...)``."""
    first, second = x.unflatten(1, (x.shape[1] // 2, 2)).unbind(2)
    return first, second


def _under_torch_func() -> bool:
    """Whether a :mod:`torch.func` transform (``vmap``, ``grad``, ``vjp``, ``jvp``, ``jacrev``, ...) is active."""
    return th._C._functorch.peek_interpreter_stack() is not None


def _swap_pairs(x: th.Tensor, keep: th.Tensor) -> th.Tensor:
    """``(a, b) -> (a, b)`` where ``keep`` has all bits set, ``(b, a)`` where it is 0, on the raw bits of ``x``.

    ``d = (a ^ b) & keep`` is ``a ^ b`` for a kept pair and 0 for a swapped one, so ``b ^ d`` and ``a ^ d`` are
    the pair's first and second output: a bit-exact select for every value (NaN and infinities included). Under a
    :mod:`torch.func` transform the select is ``where`` (the same bits).
    """
    first, second = _pair_halves(x)
    if _under_torch_func():
        # the same select without raw bits: torch 2.11 has no batching rule for view(dtype), so a vmap through the
        # bit form (the monitor's NTK: vjp under vmap) raised there; where() copies each element as it is
        kept = keep != 0
        return th.stack((th.where(kept, first, second), th.where(kept, second, first)), dim=2).flatten(1, 2)
    a, b = first.view(keep.dtype), second.view(keep.dtype)
    d = (a ^ b) & keep
    return th.stack(((b ^ d).view(x.dtype), (a ^ d).view(x.dtype)), dim=2).flatten(1, 2)


class _SwapPairs(th.autograd.Function):
    """The permutation of MaxMin with its pattern held fixed: swap the pairs marked by ``keep == 0``.

    A swap of pairs is its own inverse and its own transpose, so the backward pass (``J^T g``), the forward-mode
    product (``J t``) and every higher derivative apply the same permutation again; written in torch ops and with
    ``generate_vmap_rule``, it supports ``torch.func`` (``vmap``, ``vjp``, ``jvp``, ``jacrev``, ``hessian``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: th.Tensor, keep: th.Tensor) -> th.Tensor:  # type: ignore[override]
        return _swap_pairs(x, keep)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[th.Tensor, th.Tensor], output: th.Tensor) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return _SwapPairs.apply(grad, keep), None

    @staticmethod
    def jvp(ctx: Any, tangent: th.Tensor, _keep_tangent: Any) -> th.Tensor:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return _SwapPairs.apply(tangent, keep)


def _takes_bitwise_path(x: th.Tensor) -> bool:
    # eager mode only: tracing, scripting, ONNX export and torch.compile see the plain gather form
    if th.jit.is_tracing() or th.jit.is_scripting() or th.onnx.is_in_onnx_export() or th.compiler.is_compiling():
        return False
    if x.device.type not in BITWISE_DEVICE_TYPES:
        return False
    if x.dtype not in _SAME_WIDTH_INT or x.numel() < BITWISE_MIN_NUMEL:
        return False
    return math.prod(x.shape[2:]) >= BITWISE_MIN_PLANE  # an (N, F) input has planes of 1


class MaxMin(nn.Module):
    """GroupSort-2 activation: ``(a, b) -> (max(a, b), min(a, b))`` for adjacent pairs of features.

    The pairs are taken along dimension 1, the feature dimension of ``(N, F)`` inputs and the channel
    dimension of ``(N, C, H, W)`` inputs (and of any ``(N, C, ...)`` input). The output has the same
    shape as the input: the map only permutes values inside each pair, so it preserves the norm of
    its input and of the gradient flowing back through it. Ties keep the pair's order; the gradient of each
    output flows, unchanged, to the input it came from.

    Two implementations give the same bits: one gather with the index of each pair's larger element (forward) and
    autograd's scatter (backward) for ``(N, F)`` and small inputs; for larger ``(N, C, *spatial)`` inputs a swap of
    the raw bits under a mask, whose backward is the same swap (:data:`BITWISE_MIN_PLANE`,
    :data:`BITWISE_MIN_NUMEL`; 1.5-2.9x faster on conv feature maps at batch 256 on CPU, bench/maxmin_paths.py). On a
    GPU every input takes the gather path, which was the faster there on every shape (:data:`BITWISE_DEVICE_TYPES`).

    :raises ValueError: when dimension 1 has an odd size, or the input has fewer than 2 dimensions.
    """

    def forward(self, x: th.Tensor) -> th.Tensor:
        if x.dim() < 2:
            raise ValueError(f"MaxMin expects an input of shape (N, F) or (N, C, ...), got shape {tuple(x.shape)}")
        width = x.shape[1]
        if width % 2 != 0:
            raise ValueError(
                f"MaxMin pairs adjacent features along dim 1, so that dimension must be even; got {width} "
                f"(input shape {tuple(x.shape)}). Use an even layer width / channel count."
            )
        if _takes_bitwise_path(x):
            first, second = _pair_halves(x.detach())
            # all bits set (-1) where the pair keeps its order (first >= second, or a NaN), 0 where it swaps
            keep = (second > first).to(_SAME_WIDTH_INT[x.dtype]).sub_(1)
            return _SwapPairs.apply(x, keep)
        pairs = x.unflatten(1, (width // 2, 2))
        # Index of the larger element of each pair first: one gather (forward) / scatter (backward) is
        # about 3x faster on CPU than maximum + minimum + stack. Ties keep the pair's order.
        swap = (pairs[:, :, 1:2] > pairs[:, :, 0:1]).long()
        return pairs.gather(2, th.cat((swap, 1 - swap), dim=2)).flatten(1, 2)

    def extra_repr(self) -> str:
        return "groups_of=2"


class CReLU(nn.Module):
    """Concatenated ReLU (Shang et al., 2016; for continual RL Abbas, Zhao, Modayil, White & Machado, CoLLAs 2023,
    "Loss of Plasticity in Continual Deep Reinforcement Learning"): ``x -> [relu(x), relu(-x)]`` along dimension 1 (the
    features of ``(N, F)``, the channels of ``(N, C, H, W)``), as Plasticine's ``CReLU4Linear`` / ``CReLU4Conv2d``.
    Each unit keeps a gradient for either sign of its input, so no unit can die.

    The output has twice the input's width (:attr:`doubles_width`). In the plastic networks the configured widths are
    the activation's *output* widths: each layer computes half of them (a layer of width ``w`` has ``w / 2`` units and
    feeds ``w`` features to the next layer), so every layer reads as many inputs as in the ReLU network of the same
    ``net_arch``; see :func:`sb3_plastic.networks.halve_for_doubling_` for the parameter counts.
    """

    #: the output has twice as many features as the input
    doubles_width = True

    def forward(self, x: th.Tensor) -> th.Tensor:
        return th.cat((th.relu(x), th.relu(-x)), dim=1)


class Fourier(nn.Module):
    """Deep Fourier features (Lewandowski, Schuurmans & Machado, 2024, "Plastic Learning with Deep Fourier Features",
    arXiv 2410.20634): ``x -> [sin(x), cos(x)]`` along dimension 1, as Plasticine's ``DFFLayer4Linear`` /
    ``DFFLayer4Conv2d`` (which writes ``cos(-x)``, the same). A sine / cosine pair of one pre-activation is locally
    linear in one of its two outputs wherever the other saturates, which is how the paper argues the network stays
    trainable. Doubles the width like :class:`CReLU`, with the same width convention.
    """

    #: the output has twice as many features as the input
    doubles_width = True

    def forward(self, x: th.Tensor) -> th.Tensor:
        return th.cat((th.sin(x), th.cos(x)), dim=1)


def doubles_width(activation: Union[type[nn.Module], nn.Module, None]) -> bool:
    """Whether an activation (class or module) outputs twice the features it reads (:class:`CReLU`, :class:`Fourier`)."""
    return bool(getattr(activation, "doubles_width", False))


ACTIVATIONS.update({"relu": nn.ReLU, "tanh": nn.Tanh, "maxmin": MaxMin, "crelu": CReLU, "fourier": Fourier})
ActivationName = str


def get_activation(name: Union[str, type[nn.Module]]) -> type[nn.Module]:
    """Resolve an activation name (``"relu"``, ``"maxmin"``, ``"tanh"``, ``"crelu"``, ``"fourier"``) to its ``nn.Module``
    class.

    A class is returned unchanged, so SB3-style ``activation_fn=nn.ReLU`` keeps working.

    :raises ValueError: for an unknown name.
    """
    if isinstance(name, type) and issubclass(name, nn.Module):
        return name
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; allowed: {sorted(ACTIVATIONS)} or an nn.Module class")
    return ACTIVATIONS[name.lower()]


def activation_name(cls: type[nn.Module]) -> str:
    """Inverse of :func:`get_activation` for the built-in activations (else the class name)."""
    for key, value in ACTIVATIONS.items():
        if value is cls:
            return key
    return cls.__name__
