"""Parseval regularisation (Chung, Cherif, Meger & Precup, NeurIPS 2024, "Parseval Regularization for Continual
Reinforcement Learning", https://arxiv.org/abs/2412.07224).

The loss gets ``lambda * sum_l ||W_l W_l^T - s I||_F^2`` over the hidden layers of the policy and value networks (every
Linear / Conv2d layer but the output layers; a conv kernel as its ``(out, in * kh * kw)`` matrix), which keeps the rows
of each weight matrix orthogonal with squared norm ``s`` (a Parseval tight frame).

**Its relation to this library's coupled isometry mode.** ``isometry_mode="coupled"`` adds ``isometry_coef * grad R(W)``
with the authors' ``R(W) = 1/2 ||W^T W - s I||_F^2`` (tall ``W``) or ``1/2 ||W W^T - s I||_F^2`` (wide ``W``; issue #27's
convention, ``isometry_rect_scale`` off) to the gradient inside ``backward()``. For a tall ``W`` (``out > in``),
``||W W^T - s I||_F^2 = ||W^T W - s I||_F^2 + (out - in) s^2``: the two differ by a constant, so their gradients are the
same, and Parseval's gradient ``4 (W W^T - s I) W`` is twice ``grad R`` (:func:`sb3_plastic.isometry.isometry_penalty_grad`).
Parseval regularisation with ``(lambda, s)`` on Adam is therefore, gradient for gradient, ``isometry_mode="coupled",
isometry_coef=2 * lambda, isometry_scale=s, optimizer="adam"`` with ``isometry_layers="hidden"`` (tested: the same run).
What differs is the packaging: :class:`ParsevalRegularisation` is a callback that works on any SB3 model and optimizer
(TRAC, a user's optimizer_class) and reports the Parseval value, while the isometry mode is a property of the plastic
policy's AdamO. The isometry paper's own method is the *decoupled* step (AdamO), which Parseval regularisation is not.

The reference implementation here is Plasticine's (RLE-Foundation/Plasticine ``*_pr.py``, ``ParsevalLinear``): the same
penalty added to PPO's loss with ``lambda = 1e-3``, ``s = 1``, the defaults here. Deviations: Plasticine regularises only
the last Linear layer of the encoder; the paper (and this callback, ``layers="hidden"``) every layer but the output
layers. The paper's relaxations (learnable diagonal layers after the regularised layers, input scaling, Parseval on
subgroups of units) are ablations of its analysis, not part of the method whose results it reports; they are not
offered.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch as th
from torch import nn

from sb3_plastic.callbacks.base import InterventionConfig, changed_fields, warn_ignored_options
from sb3_plastic.callbacks.plasticity_injection import weight_layers_with_branches
from sb3_plastic.callbacks.regularisers import GradientPenalty, _check_coef
from sb3_plastic.isometry import as_matrix, isometry_penalty_grad

#: Plasticine's defaults (``parseval_lambda``, ``parseval_s``).
DEFAULT_PARSEVAL_COEF = 1e-3
DEFAULT_PARSEVAL_SCALE = 1.0
#: ``layers``: every layer but the output layers, or every Linear / Conv2d layer.
PARSEVAL_LAYERS = ("hidden", "all")


def parseval_penalty(weight: th.Tensor, scale: float = DEFAULT_PARSEVAL_SCALE) -> th.Tensor:
    """``||W W^T - s I||_F^2`` of a Linear weight or of a conv kernel's ``(out, in * kh * kw)`` matrix."""
    w = as_matrix(weight)
    return (w @ w.T - scale * th.eye(w.shape[0], dtype=w.dtype, device=w.device)).square().sum()


def parseval_penalty_grad(weight: th.Tensor, scale: float = DEFAULT_PARSEVAL_SCALE) -> th.Tensor:
    """``grad ||W W^T - s I||_F^2 = 4 (W W^T - s I) W``, for every shape twice the isometry penalty's gradient in its
    authors' convention (see the module docstring)."""
    return 2.0 * isometry_penalty_grad(weight, scale)


class ParsevalRegularisation(GradientPenalty):
    """Parseval regularisation as an SB3 callback (Chung et al., 2024; see the module docstring for its relation to
    ``isometry_mode="coupled"`` and the deviations): ``coef * grad ||W W^T - s I||_F^2`` joins the gradient of every
    regularised weight inside ``backward()`` (before SB3's gradient clipping, exactly as if the loss included it), on PPO,
    A2C, RecurrentPPO, MaskablePPO, DQN, QR-DQN, SAC, TQC, CrossQ and TD3, plain or plastic. Biases, output layers
    (with ``layers="hidden"``) and LSTM matrices are not regularised; a plasticity injection's trainable branch is,
    from its first update.

    Logged: ``plasticity/parseval/penalty`` (the sum of ``||W W^T - s I||_F^2``, without the coefficient) at each rollout
    end (``parseval_<name>`` with a ``name``). No persistent state.

    :param coef: ``lambda`` >= 0 (Plasticine's default 1e-3).
    :param scale: ``s`` > 0 (default 1).
    :param layers: ``"hidden"`` (every Linear / Conv2d layer but the output layers) or ``"all"``.
    :param name: distinguishes several callbacks on one model.
    :param verbose: SB3 verbosity.
    """

    def __init__(self, coef: float = DEFAULT_PARSEVAL_COEF, scale: float = DEFAULT_PARSEVAL_SCALE,
                 layers: str = "hidden", name: Optional[str] = None, verbose: int = 0) -> None:
        super().__init__(coef, name=name, verbose=verbose)
        _check_scale("scale", scale)
        _check_layers("layers", layers)
        self.scale = float(scale)
        self.layers = layers

    def weights(self) -> list[tuple[str, nn.Parameter]]:
        """``(name, weight)`` of every regularised matrix, each once."""
        chosen: dict[int, tuple[str, nn.Parameter]] = {}
        for spec in self.networks:
            names = {id(m): n for n, m in spec.module.named_modules()}
            for layer, is_head in weight_layers_with_branches(spec):
                if self.layers == "hidden" and is_head:
                    continue
                name = f"{spec.name}:{spec.layer_names.get(id(layer)) or names.get(id(layer), '?')}"
                chosen.setdefault(id(layer.weight), (name, layer.weight))
        return list(chosen.values())

    def _regularised(self) -> Iterator[tuple[str, nn.Parameter]]:
        yield from self.weights()

    def _penalty_grad(self, key: str, param: th.Tensor) -> th.Tensor:
        return self.coef * parseval_penalty_grad(param.detach(), self.scale)

    def penalty(self) -> float:
        """The current ``sum ||W W^T - s I||_F^2`` over the regularised weights (without the coefficient)."""
        with th.no_grad():
            return float(sum(parseval_penalty(w.detach().float(), self.scale) for _, w in self.weights()))

    def _on_rollout_end(self) -> None:
        super()._on_rollout_end()
        self.record(f"{self.log_group('parseval')}/penalty", self.penalty())


def _check_scale(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_layers(name: str, value: Any) -> None:
    if value not in PARSEVAL_LAYERS:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {list(PARSEVAL_LAYERS)}")


@dataclass
class ParsevalConfig(InterventionConfig):
    """Parseval regularisation as top-level keywords of the plastic algorithms; see :class:`ParsevalRegularisation`.

    :param parseval_coef: ``lambda`` >= 0; 0 (default): off (Plasticine's value: 1e-3).
    :param parseval_scale: ``s`` > 0 (default 1).
    :param parseval_layers: ``"hidden"`` (default) or ``"all"``.

    ``parseval_scale`` / ``parseval_layers`` set while ``parseval_coef`` is 0 warn.
    """

    parseval_coef: float = 0.0
    parseval_scale: float = DEFAULT_PARSEVAL_SCALE
    parseval_layers: str = "hidden"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        _check_coef("parseval_coef", self.parseval_coef)
        _check_scale("parseval_scale", self.parseval_scale)
        _check_layers("parseval_layers", self.parseval_layers)
        if not self.enabled:
            warn_ignored_options(changed_fields(self, ("parseval_scale", "parseval_layers")),
                                 "parseval_coef is 0 (Parseval regularisation off)", stacklevel=4)

    @property
    def enabled(self) -> bool:
        """Whether the penalty is on."""
        return self.parseval_coef > 0

    def make_callback(self) -> Optional[ParsevalRegularisation]:
        """The :class:`ParsevalRegularisation` callback, or ``None`` when it is off."""
        if not self.enabled:
            return None
        return ParsevalRegularisation(self.parseval_coef, self.parseval_scale, self.parseval_layers)


