"""The torch hooks the plastic interventions are built on, each implemented once.

* :func:`add_to_grad_hook`: add something to a parameter's gradient inside ``backward()``, once its gradient is
  complete (a post-accumulate-grad hook), so that whatever runs between ``backward()`` and ``optimizer.step()``
  (SB3's ``clip_grad_norm_``) sees the sum, exactly as if the loss had included the penalty. Used by the coupled
  isometry penalty of :class:`~sb3_plastic.optim.AdamO` (owned by the optimizer) and by
  :class:`~sb3_plastic.callbacks.regularisers.GradientPenalty` (L2-init, spectral regularisation).
* :class:`OutermostStepHooks`: act once before / after each outermost ``optimizer.step()``. torch fires an
  optimizer's step hooks from every hooked ``step`` in its class hierarchy, so a ``step`` calling a hooked parent
  ``step`` (AdamO's calls ``Adam.step`` once any plain ``Adam`` exists) would run them twice per update; a depth
  counter keeps one call per update. Used by Shrink & Perturb (continual form), Continual Backprop,
  Normalize-and-Project, weight clipping and ReDo's step counter. **Order:** torch runs an optimizer's post-step hooks
  in the order they were registered, i.e. the order in which the callbacks start training (their order in the
  ``CallbackList``; the keyword interventions come after the user's callbacks, in the order of
  :func:`~sb3_plastic.common.plastic_algorithm.intervention_config_classes`: CBP, Shrink & Perturb, NaP, then weight
  clipping). Where two of them rewrite the same weights after a step, the later one has the last word: with NaP and
  weight clipping by keyword the clip bound holds after every step and a projected layer's norm may sit below its
  target; a hand-built ``[WeightClipping(), NormalizeAndProject()]`` keeps the norm and may leave entries beyond the
  bound.
* :class:`AfterZeroGrad`: act right after each ``optimizer.zero_grad()``, i.e. right before the task loss's
  ``backward()``: an extra loss with its own forward pass (C-CHAIN's churn reduction on another batch) puts its
  gradient into ``.grad`` there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch as th
from torch.utils.hooks import RemovableHandle


def add_to_grad_hook(
    param: th.Tensor,
    add: Callable[[th.Tensor, th.Tensor], None],
    active: Optional[Callable[[], bool]] = None,
) -> RemovableHandle:
    """Register a post-accumulate-grad hook on ``param`` that calls ``add(param, param.grad)`` under ``no_grad``
    inside every ``backward()`` that reaches ``param``, once its gradient is complete; ``add`` changes the gradient
    in place. Nothing is called when ``param.grad`` is ``None`` or ``active()`` is false.

    :param param: a leaf tensor that requires grad.
    :param add: ``add(param, grad)``, e.g. ``grad.add_(coef * grad_R(param))``.
    :param active: ``None`` (always) or a predicate checked at each call (e.g. "the policy is in training mode").
    :return: the hook's handle (``remove()`` uninstalls it).
    """

    def hook(tensor: th.Tensor) -> None:
        if tensor.grad is None or (active is not None and not active()):
            return
        with th.no_grad():
            add(tensor, tensor.grad)

    return param.register_post_accumulate_grad_hook(hook)


def parameter_count(optimizer: th.optim.Optimizer) -> int:
    """How many tensors ``optimizer`` trains: a change between two steps means parameters joined it (a plasticity
    injection's new branch), so a callback that bound the optimizer's tensors binds them again."""
    return sum(len(group["params"]) for group in optimizer.param_groups)


class OutermostStepHooks:
    """Step pre / post hooks on ``optimizer`` that call ``before(optimizer)`` before and ``after(optimizer)`` after
    each outermost ``optimizer.step()``, while ``active()`` (see the module docstring for why the depth count).

    :param optimizer: the optimizer whose steps to follow.
    :param after: called after each outermost step (``None``: nothing).
    :param before: called before each outermost step (``None``: nothing).
    :param active: ``None`` (always) or a predicate checked before each call of ``before`` / ``after``.
    """

    def __init__(
        self,
        optimizer: th.optim.Optimizer,
        after: Optional[Callable[[th.optim.Optimizer], None]] = None,
        before: Optional[Callable[[th.optim.Optimizer], None]] = None,
        active: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.after = after
        self.before = before
        self.active = active
        #: how many hooked ``step`` calls are running now
        self.depth = 0
        #: the two hook handles (pre, post)
        self.handles: list[RemovableHandle] = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]

    def _is_active(self) -> bool:
        return self.active is None or self.active()

    def _pre(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.depth += 1
        if self.depth == 1 and self.before is not None and self._is_active():
            self.before(optimizer)

    def _post(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.after is not None and self._is_active():
            self.after(optimizer)

    def reset(self) -> None:
        """Forget the depth count (recovery from a ``step`` that raised between the two hooks)."""
        self.depth = 0

    def remove(self) -> None:
        """Uninstall both hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


class AfterZeroGrad:
    """Call ``fn(optimizer)`` right after each ``optimizer.zero_grad()``, while ``active()``: the place to put the
    gradient of an extra loss into ``.grad`` so that the task loss's ``backward()`` accumulates onto it, exactly as if
    the extra loss had been added to the task loss before ``backward()`` (SB3's ``clip_grad_norm_`` then clips the sum).
    SB3's ``train()`` methods call ``zero_grad()`` right before each ``backward()`` (PPO, A2C, MaskablePPO per minibatch;
    DQN, QR-DQN per update; SAC, TQC, TD3 per critic / actor update). Used by
    :class:`~sb3_plastic.callbacks.ChurnReduction` (C-CHAIN), whose loss needs its own forward pass on another batch.

    The optimizer's ``zero_grad`` is wrapped through an instance attribute (the class is untouched; SB3 saves the
    optimizer's ``state_dict``, never the object); :meth:`remove` restores it. ``fn`` should fill ``.grad`` with
    ``torch.autograd.grad`` rather than ``backward()``: a ``backward()`` would fire the post-accumulate-grad hooks
    (:func:`add_to_grad_hook`) once more, and their penalties would be counted twice.

    :param optimizer: the optimizer to follow.
    :param fn: called with the optimizer after each ``zero_grad()``.
    :param active: ``None`` (always) or a predicate checked before each call.
    """

    def __init__(
        self,
        optimizer: th.optim.Optimizer,
        fn: Callable[[th.optim.Optimizer], None],
        active: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.optimizer = optimizer
        self.removed = False
        inner = optimizer.zero_grad

        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            if not self.removed and (active is None or active()):
                fn(optimizer)
            return out

        self._inner = inner
        self._wrapper = zero_grad
        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]

    def remove(self) -> None:
        """Stop calling ``fn``; restore the optimizer's ``zero_grad`` when this wrapper is still the outermost one (a
        wrapper installed later keeps calling through this one, which now only forwards)."""
        self.removed = True
        if self.optimizer.__dict__.get("zero_grad") is self._wrapper:
            if getattr(self._inner, "__self__", None) is self.optimizer:  # the class's own method: drop the attribute
                del self.optimizer.zero_grad
            else:
                self.optimizer.zero_grad = self._inner  # type: ignore[method-assign]
