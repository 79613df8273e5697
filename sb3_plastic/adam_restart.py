"""Per-element restart of Adam for the entries of replaced units (Continual Backprop, ReDo).

A unit reset zeroes Adam's moments ``m, v`` of the replaced rows / columns. torch's Adam keeps one step count
``t`` per tensor, so after the reset those entries would still be bias-corrected with ``1 - beta^t ~ 1``: their
first update is ``(1 - beta1) / sqrt(1 - beta2)`` (3.2x at betas (0.9, 0.999)) times a fresh entry's, and still
about twice as large hundreds of steps later. Dohare et al.'s AdamGnT (Nature 2024, ``lop/algos/gnt.py``) keeps a
step per element and zeroes it for replaced features; the ReDo reference (Sokar et al., ICML 2023) zeroes the step.
Here a reset entry gets its own step count ``t_i`` and is updated exactly as a freshly initialised Adam entry:

    theta_i <- theta_i - lr * (m_i / (1 - beta1^t_i)) / (sqrt(v_i / (1 - beta2^t_i)) + eps)

(``v_i``: ``max_exp_avg_sq`` with ``amsgrad``), the moments ``m_i, v_i`` being Adam's own, restarted from zero.

How: :class:`AdamRestartMixin` sits in front of ``torch.optim.Adam`` (or a subclass: AdamW, AdamO, a class of
:func:`sb3_plastic.optim.with_isometry_step`). Its ``step`` runs the optimizer's own step untouched, then, for
tensors that hold restarted entries only, replaces the update torch applied to those entries by the fresh-entry
update above (the difference of the two, computed from Adam's state after the step; the weight decay and every
other part of the update are unchanged, since they do not depend on the bias correction). Entries never reset are
not touched: without a reset the optimizer is bit-identical to the class it extends. :func:`enable_restart`
turns an existing optimizer into its restart class in place (same object, same state: what the callbacks do with
the optimizer SB3 built); :func:`sb3_plastic.optim.reset_optimizer_state` with ``index`` does it and marks the
reset entries.

The per-element steps live in the optimizer state, ``state[param]["restart_step"]`` (:data:`RESTART_KEY`), a
tensor of the parameter's shape: ``-1`` for entries that follow the tensor's step, ``t_i >= 0`` for restarted
entries. It is saved and loaded with ``optimizer.state_dict()`` (SB3's save / load of the model); torch casts it
to the parameter's dtype on load, which counts exactly up to 2^24 steps for float32 (the counts stay below a few
ten thousand: see :data:`RESTART_DONE`). An optimizer rebuilt from a state dict as plain Adam (SB3's load) needs
:func:`enable_restart` again before its next step (ContinualBackprop and ReDo call it at training start). Once
``beta1^t_i`` and ``beta2^t_i`` are both below :data:`RESTART_DONE` the entry's bias correction equals the tensor's
to float precision; the entry is then an ordinary entry again, and the state is dropped when no entry restarts.

Not supported: optimizers without Adam's update (RMSprop, SGD: no bias correction, zeroing their buffers already
gives a fresh entry; NAdam, RAdam, Adamax: their own bias corrections, not restarted), complex parameters, and
CUDA-graph capture (the correction reads the step count on the host).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Optional

import torch as th

#: Optimizer-state key of the per-element steps of restarted entries (-1: the entry follows the tensor's step).
RESTART_KEY = "restart_step"
#: An entry whose ``beta1^t_i`` and ``beta2^t_i`` are both below this is done restarting.
RESTART_DONE = 1e-12
#: Steps of a tensor between two checks for entries that are done restarting (each check reads the device).
DONE_CHECK_EVERY = 256


def _base_step(optimizer: th.optim.Optimizer) -> Callable[..., Any]:
    """The ``step`` of the class after :class:`AdamRestartMixin` in the optimizer's MRO, without torch's hook
    wrapper (the hooks run once, around the outermost ``step``)."""
    mro = type(optimizer).__mro__
    step = mro[mro.index(AdamRestartMixin) + 1].step
    return step.__wrapped__ if getattr(step, "hooked", False) else step  # type: ignore[attr-defined]


class AdamRestartMixin:
    """Adam with per-element restarts of reset entries (see :mod:`sb3_plastic.adam_restart`).

    Mixed in front of ``torch.optim.Adam`` or a subclass of it; the optimizer's arguments, state and update are
    its base class's. Mark entries with :func:`sb3_plastic.optim.reset_optimizer_state` (``index=...``).
    """

    param_groups: list[dict[str, Any]]
    state: Any

    @th.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        """The base optimizer's step, then the fresh-entry update for restarted entries."""
        before = {
            id(p): float(self.state[p]["step"])
            for group in self.param_groups
            for p in group["params"]
            if RESTART_KEY in self.state.get(p, ())
        }
        loss = _base_step(self)(self, closure)  # type: ignore[arg-type]
        if before:
            for group in self.param_groups:
                for p in group["params"]:
                    state = self.state.get(p, {})
                    # a tensor without a gradient was not stepped (its step count did not move)
                    if id(p) in before and float(state["step"]) > before[id(p)]:
                        _restart_update_(p, state, group)
        return loss


def _restart_update_(param: th.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
    """Replace the update Adam just applied to the restarted entries of ``param`` by a fresh entry's."""
    marks = state[RESTART_KEY]
    if marks.device != param.device or marks.dtype != param.dtype:
        marks = state[RESTART_KEY] = marks.to(device=param.device, dtype=param.dtype)
    restarted = marks >= 0
    marks.add_(restarted.to(marks.dtype))  # the restarted entries took one more step
    beta1, beta2 = (float(b) for b in group["betas"])
    lr, eps = float(group["lr"]), float(group["eps"])
    t = float(state["step"])
    m = state["exp_avg"]
    v = state["max_exp_avg_sq"] if group.get("amsgrad", False) else state["exp_avg_sq"]
    root_v = v.sqrt()
    # what torch applied (one step count for the tensor) and what a fresh entry takes (its own count)
    applied = m / (root_v / math.sqrt(1.0 - beta2**t) + eps) * (lr / (1.0 - beta1**t))
    t_i = th.where(restarted, marks, th.ones_like(marks))
    fresh = m / (root_v / (1.0 - th.pow(beta2, t_i)).sqrt() + eps) * (lr / (1.0 - th.pow(beta1, t_i)))
    param.add_(th.where(restarted, applied - fresh, th.zeros_like(fresh)))
    if int(t) % DONE_CHECK_EVERY == 0:
        worst = max(beta1, beta2)
        done_after = math.log(RESTART_DONE) / math.log(worst) if 0.0 < worst < 1.0 else 0.0
        marks.masked_fill_(restarted & (marks >= done_after), -1.0)
        if not bool((marks >= 0).any()):
            del state[RESTART_KEY]


@functools.cache
def restart_class(optimizer_class: type[th.optim.Optimizer]) -> type[th.optim.Optimizer]:
    """``optimizer_class`` (``torch.optim.Adam`` or a subclass) with :class:`AdamRestartMixin` in front; a class
    that already has it is returned unchanged, the same class for the same ``optimizer_class``.

    :raises ValueError: for an optimizer class without Adam's update.
    """
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, th.optim.Adam)):
        name = getattr(optimizer_class, "__name__", repr(optimizer_class))
        raise ValueError(f"per-element Adam restarts need torch.optim.Adam or a subclass of it (AdamW, AdamO), got {name}")
    if issubclass(optimizer_class, AdamRestartMixin):
        return optimizer_class
    name = f"{optimizer_class.__name__}WithRestart"
    doc = f"``{optimizer_class.__qualname__}`` with per-element restarts (:mod:`sb3_plastic.adam_restart`)."
    cls = type(name, (AdamRestartMixin, optimizer_class), {"__doc__": doc, "__module__": __name__})
    cls.__qualname__ = name
    # torch wraps ``step`` to run the step hooks when a class is first instantiated; this class is only ever
    # assigned to existing optimizers, so it gets the wrapper here
    cls.step = th.optim.Optimizer.profile_hook_step(AdamRestartMixin.step)  # type: ignore[method-assign]
    cls.step.hooked = True  # type: ignore[attr-defined]
    return cls


def supports_restart(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer`` has Adam's update (``torch.optim.Adam`` or a subclass), i.e. can restart entries."""
    return isinstance(optimizer, th.optim.Adam)


def enable_restart(optimizer: th.optim.Optimizer) -> th.optim.Optimizer:
    """Give an Adam optimizer per-element restarts, in place: its class becomes :func:`restart_class` of its
    class (the same object: SB3's ``policy.optimizer`` and the state, hooks and param groups are kept exactly).
    Until an entry is reset, its steps are bit-identical to before.

    :param optimizer: ``torch.optim.Adam`` or a subclass (AdamW, AdamO).
    :return: ``optimizer``.
    :raises ValueError: for an optimizer without Adam's update.
    """
    if not isinstance(optimizer, AdamRestartMixin):
        optimizer.__class__ = restart_class(type(optimizer))
    return optimizer


def mark_restarted_(optimizer: th.optim.Optimizer, param: th.Tensor, index: th.Tensor, dim: int) -> None:
    """Restart the entries ``index`` along ``dim`` of ``param``: their per-element step becomes 0 (Adam's moments
    are zeroed by :func:`sb3_plastic.optim.reset_optimizer_state`, which calls this). Enables the restart class.

    :raises ValueError: for complex parameters.
    """
    if param.is_complex():
        raise ValueError("per-element Adam restarts do not support complex parameters")
    enable_restart(optimizer)
    state = optimizer.state[param]
    if RESTART_KEY not in state:
        state[RESTART_KEY] = th.full_like(param, -1.0, memory_format=th.preserve_format)
    state[RESTART_KEY].index_fill_(dim, index, 0.0)
