"""AdamO: Adam with a decoupled isometry step (Rosseau, Müller & Nowé, 2026).

AdamO does to the isometry penalty what AdamW does to weight decay: the Adam moments ``m, v`` see
only the task gradient, and the penalty acts through its own step,

    theta <- theta - lr * m_hat / (sqrt(v_hat) + eps) - lr * lambda * grad R(theta),

where ``R`` is :func:`sb3_plastic.isometry.isometry_penalty` (the authors' convention ``1/2 ||Gram - t I||_F^2``,
gradient ``2 W (W^T W - t I)``; before issue #27 it had no 1/2, so an old ``lambda`` is half of today's for the
same step) and ``lambda = isometry_coef``. ``lr`` is the param group's current learning rate, i.e. SB3's scheduled
one (SB3 writes ``lr`` into every group before each ``train()``), as in the authors' port (``base lr * schedule``).
Mixing ``lambda * grad R`` into the gradient (``isometry_mode="coupled"``) lets Adam's second moment
rescale the penalty; that ablation is kept so users can compare. Coupled mode is exactly Adam on the gradient
of ``loss + lambda * R`` as SB3 computes it: the penalty gradient enters ``p.grad`` inside ``backward()``
(a post-accumulate-grad hook on each regularised weight, :func:`sb3_plastic.common.hooks.add_to_grad_hook`, the
mechanism of :class:`~sb3_plastic.callbacks.regularisers.GradientPenalty`, here owned by the optimizer), so SB3's
``clip_grad_norm_`` between ``backward()`` and ``step()`` clips the sum; it enters at every step
(``isometry_interval`` must be 1 there).

``isometry_interval=k`` (decoupled mode; default 1, the exact AdamO step at every update) applies
``k * lr * lambda * grad R(W_t)`` once every ``k`` steps in place of ``lr * lambda * grad R(W_{t+j})`` at each
step ``j = 0 .. k-1`` of the window. Its error is first order, not ``O((k * lr * lambda)^2)``: that bound counts
only the penalty's own motion (``lr * lambda`` per step), but the task's Adam steps move each weight by about
``lr`` per update (Adam's normalised step), far faster. With ``V`` the weights' motion per update,
``grad R(W_{t+j}) - grad R(W_t) ~ j * H V`` (``H`` the Hessian of ``R``), so the window's displacement is off by
``lr * lambda * H V * k (k - 1) / 2`` against ``k * lr * lambda * grad R``: a relative error
``(k - 1) / 2 * ||H V|| / ||grad R||``, linear in the window length and independent of ``lambda`` as long as the
task's motion dominates. Measured by ``bench/isometry_interval.py`` (bench/README.md: random-label memorisation,
MLP 64-128-128-10, lr 3e-4 .. 3e-3): ~0.3 % of the window's displacement per update of window length, 7-12 % at
``k = 32`` for ``lambda`` 0.01 .. 1 (27 % at lr 3e-3, ``lambda`` 1), ~equal for ``lambda`` 0.01 and 0.1 (those
``lambda`` in the convention before issue #27: 0.02 .. 2 in today's).
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Optional, Union

import torch as th
from torch.utils.weak import WeakIdKeyDictionary

from sb3_plastic.adam_restart import AdamRestartMixin, mark_restarted_, supports_restart
from sb3_plastic.common.hooks import add_to_grad_hook
from sb3_plastic.isometry import as_blocks, as_matrix, check_side, isometry_penalty_grad, isometry_target, one_sided

ISOMETRY_MODES = ("decoupled", "coupled")

#: The decoupled isometry step ``W <- W - c W (W^T W - t I)``, ``c = 2 lr lambda`` (``/ min(out, in)`` with
#: ``isometry_normalize``), is clamped per tensor so that ``c * max(sigma_max(W)^2, t) <= 1/2``. ``sigma_max^2`` is
#: bounded from above by the largest absolute row sum of the Gram matrix, which costs no SVD. Below the bound the
#: cubic map ``sigma <- sigma - c sigma (sigma^2 - t)`` moves every singular value towards ``sqrt(t)`` without
#: diverging, and (``c t <= 1/2``) a singular value below ``sqrt(t)`` does not jump past it; above it the step
#: could diverge. (The ``t`` in the bound matters for a large target, ``isometry_rect_scale`` on a very tall layer;
#: for ``t <= sigma_max^2`` it is the clamp of the library before issue #27.)
MAX_ISOMETRY_STEP = 0.5


def _check_nonneg(name: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_group(group: dict[str, Any]) -> None:
    _check_nonneg("isometry_coef", group["isometry_coef"])
    for key in ("isometry_rect_scale", "isometry_normalize", "isometry_free_scale"):
        if not isinstance(group.get(key, False), bool):
            raise ValueError(f"{key} must be True or False, got {group[key]!r}")
    if group.get("isometry_free_scale", False) and group.get("isometry_rect_scale", False):
        raise ValueError(
            "isometry_free_scale=True takes each weight's own mean squared singular value as the target, so "
            "isometry_rect_scale=True would have no effect; set one of them, not both"
        )
    check_side(group.get("isometry_side", "both"), group.get("isometry_free_scale", False))
    scale = group["isometry_scale"]
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"isometry_scale must be a finite number > 0, got {scale!r}")
    interval = group.get("isometry_interval", 1)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"isometry_interval must be an int >= 1, got {interval!r}")
    if group["isometry_mode"] not in ISOMETRY_MODES:
        raise ValueError(f"Unknown isometry_mode {group['isometry_mode']!r} for AdamO; allowed: {list(ISOMETRY_MODES)}")
    if group["isometry_mode"] == "coupled" and interval != 1:
        raise ValueError(coupled_interval_message(interval))
    blocks = group.get("isometry_blocks", 1)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"isometry_blocks must be an int >= 1, got {blocks!r}")
    if blocks > 1:
        for p in group["params"]:
            if p.dim() >= 2 and p.shape[0] % blocks:
                raise ValueError(
                    f"isometry_blocks={blocks} does not divide the {p.shape[0]} rows of a parameter of shape {tuple(p.shape)}"
                )


def _step_target(gram: th.Tensor, rows: int, cols: int, group: dict[str, Any]) -> Union[float, th.Tensor]:
    """The target ``t`` of the Gram matrix (or matrices, ``(k, d, d)``) of the group's decoupled step: the group's
    :func:`~sb3_plastic.isometry.isometry_target`, or with ``isometry_free_scale`` the Gram matrix's mean diagonal (a
    0-d tensor, ``(k,)`` for blocks), read before the step changes anything."""
    if group.get("isometry_free_scale", False):
        return gram.diagonal(dim1=-2, dim2=-1).mean(-1)
    return isometry_target(rows, cols, group["isometry_scale"], group.get("isometry_rect_scale", False))


def _gradient_factor(group: dict[str, Any], gram_dim: int) -> float:
    """The factor of ``W (W^T W - t I)`` in the gradient of ``R``: 2, or ``2 / gram_dim`` with ``isometry_normalize``."""
    return 2.0 / gram_dim if group.get("isometry_normalize", False) else 2.0


def upgrade_isometry_groups(state_dict: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict in today's isometry convention: every saved param group with isometry settings but
    without ``isometry_rect_scale`` (saved before issue #27, when ``R`` had no 1/2) gets ``isometry_coef`` doubled and
    ``isometry_rect_scale=False``, ``isometry_normalize=False``. Other state dicts are returned unchanged (a copy of
    the upgraded groups otherwise; the input is not modified)."""
    groups = state_dict.get("param_groups", [])
    if not any("isometry_mode" in g and "isometry_rect_scale" not in g for g in groups):
        return state_dict
    upgraded = []
    for group in groups:
        if "isometry_mode" in group and "isometry_rect_scale" not in group:
            group = {**group, "isometry_coef": 2 * group["isometry_coef"], "isometry_rect_scale": False,
                     "isometry_normalize": False}
        upgraded.append(group)
    return {**state_dict, "param_groups": upgraded}


def coupled_interval_message(interval: Any) -> str:
    """The error for an ``isometry_interval`` other than 1 in coupled mode (shared with the config)."""
    return (
        f"isometry_mode='coupled' needs isometry_interval=1, got isometry_interval={interval!r}: coupled mode is plain "
        "Adam on loss + lambda * R at every step, and an interval would add k * lambda * grad R once every k steps "
        "(a k-times spike in Adam's second moment). Use isometry_interval=1, or isometry_mode='decoupled' (AdamO), "
        "where the interval is a speed option"
    )


#: ``param -> (hook handle, weakref to its optimizer)``: a weight's coupled-penalty hook belongs to the newest
#: isometry optimizer built over it (a plastic policy rebuilds SB3's optimizer with its own param groups).
_COUPLED_HOOKS: Any = WeakIdKeyDictionary()


def _coupled_hook(owner: Any, param: th.Tensor, grad: th.Tensor) -> None:
    optimizer = owner()  # a weak reference: the hook on a weight does not keep its optimizer alive
    if optimizer is not None:
        optimizer._add_coupled_gradient(param, grad)


def reset_optimizer_state(
    optimizer: th.optim.Optimizer,
    param: th.Tensor,
    index: Optional[Union[th.Tensor, Iterable[int]]] = None,
    dim: int = 0,
) -> None:
    """Zero the optimizer state that belongs to ``param`` (whole tensor, or chosen rows / columns).

    Works for any torch optimizer whose per-parameter state tensors have the parameter's shape
    (Adam, AdamW, AdamO, RMSprop, SGD with momentum, ...).

    :param optimizer: the optimizer holding the state.
    :param param: the parameter (must be one of the optimizer's parameters).
    :param index: ``None`` drops the whole state of ``param`` (Adam then restarts its step count and
        bias correction for it); otherwise the indices (or a boolean mask) along ``dim`` whose
        moments are set to zero. For Adam and its subclasses (AdamW, AdamO) those entries also restart their
        step count: from their next step on they are updated exactly as the entries of a freshly initialised
        Adam (per-element bias correction, as Dohare et al.'s AdamGnT and the ReDo reference do; the optimizer
        gets :class:`~sb3_plastic.adam_restart.AdamRestartMixin` in place, see :mod:`sb3_plastic.adam_restart`).
        Optimizers without bias correction (RMSprop, SGD with momentum) start a zeroed buffer exactly as a
        fresh one; NAdam, RAdam and Adamax keep their tensor's step count.
    :param dim: the dimension ``index`` refers to: 0 = rows / output units, 1 = columns / input units.
    """
    if not any(param is p for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("reset_optimizer_state: the tensor is not a parameter of this optimizer")
    if param not in optimizer.state:
        return
    if index is None:
        del optimizer.state[param]
        return
    if not -param.dim() <= dim < param.dim():
        raise ValueError(f"dim={dim} is out of range for a parameter of shape {tuple(param.shape)}")
    idx = th.as_tensor(index, device=param.device) if not isinstance(index, th.Tensor) else index.to(param.device)
    if idx.dtype == th.bool:
        idx = idx.nonzero().flatten()
    idx = idx.long()
    for value in optimizer.state[param].values():
        if isinstance(value, th.Tensor) and value.shape == param.shape:
            value.index_fill_(dim, idx, 0.0)
    if supports_restart(optimizer):
        mark_restarted_(optimizer, param, idx, dim)


class IsometryStepMixin:
    """The isometry step of AdamO (Rosseau, Müller & Nowé, 2026) around any torch optimizer's own ``step``.

    Mixed in front of a ``torch.optim.Optimizer`` subclass (:class:`AdamO` is it on ``torch.optim.Adam``;
    :func:`with_isometry_step` builds it for any other optimizer class). Every param group carries
    ``isometry_coef``, ``isometry_scale``, ``isometry_mode`` (``"decoupled"`` / ``"coupled"``),
    ``isometry_interval``, ``isometry_rect_scale``, ``isometry_normalize``, ``isometry_free_scale``,
    ``isometry_side`` and optionally ``isometry_blocks``; the
    update rule, the blow-up clamp and the state entries (``isometry_count``, ``isometry_step``) are the ones
    described in :class:`AdamO`, with the base optimizer's update in place of Adam's.

    Coupled mode: every regularised weight of a coupled group carries a post-accumulate-grad hook that adds
    ``lambda * grad R(W)`` to ``W.grad`` inside ``backward()`` (see the module docstring: gradient clipping
    between ``backward()`` and ``step()`` then clips the sum). ``step()`` adds it itself to a gradient the hook
    has not seen (a ``.grad`` assigned by hand, or a group switched to coupled after construction). Every
    ``backward()`` that reaches the weight adds the penalty once, as differentiating ``loss + lambda * R`` in each
    of them would. The hooks belong to the newest isometry optimizer built over a weight (an older one over the
    same weight stops adding); they are set up again after ``load_state_dict`` and read the param group's
    current ``isometry_coef`` / ``isometry_scale`` at every call.
    """

    param_groups: list[dict[str, Any]]
    state: Any
    defaults: dict[str, Any]

    def _init_isometry(
        self,
        isometry_coef: float,
        isometry_scale: float,
        isometry_mode: str,
        isometry_interval: int,
        isometry_rect_scale: bool = False,
        isometry_normalize: bool = False,
        isometry_free_scale: bool = False,
        isometry_side: str = "both",
    ) -> None:
        """Give every param group the isometry settings it does not set itself, and validate them."""
        settings = dict(
            isometry_coef=isometry_coef,
            isometry_scale=isometry_scale,
            isometry_mode=isometry_mode,
            isometry_interval=isometry_interval,
            isometry_rect_scale=isometry_rect_scale,
            isometry_normalize=isometry_normalize,
            isometry_free_scale=isometry_free_scale,
            isometry_side=isometry_side,
        )
        for group in self.param_groups:
            for key, value in settings.items():
                group.setdefault(key, value)
            _check_group(group)
        self.defaults.update(settings)
        self._register_coupled_hooks()

    def _register_coupled_hooks(self) -> None:
        """Take over the coupled-penalty hook of every weight of this optimizer: install one on the weights of
        coupled groups, remove another optimizer's hook from every weight this optimizer holds."""
        self._coupled_groups: dict[int, dict[str, Any]] = {}
        self._coupled_seen: dict[int, Any] = {}
        me = weakref.ref(self)
        for group in self.param_groups:
            coupled = group.get("isometry_mode") == "coupled"
            for p in group["params"]:
                held = _COUPLED_HOOKS.get(p)
                if held is not None and held[1]() is not self:
                    held[0].remove()
                    del _COUPLED_HOOKS[p]
                    held = None
                if not (coupled and p.dim() >= 2 and p.requires_grad):
                    if held is not None:
                        held[0].remove()
                        del _COUPLED_HOOKS[p]
                    continue
                self._coupled_groups[id(p)] = group
                if held is None:
                    handle = add_to_grad_hook(p, functools.partial(_coupled_hook, me))
                    _COUPLED_HOOKS[p] = (handle, me)

    def _add_coupled_gradient(self, param: th.Tensor, grad: th.Tensor) -> None:
        """The hook's work (inside ``backward()``, under ``no_grad``): ``grad += lambda * grad R(param)`` for a weight
        of a coupled group, remembered so that ``step()`` does not add it again."""
        group = getattr(self, "_coupled_groups", {}).get(id(param))
        if group is None or group.get("isometry_mode") != "coupled":
            return
        if not self.is_regularised(param, group):
            return
        grad.add_(self._coupled_gradient(param, group).to(grad.dtype))
        self._coupled_seen[id(param)] = weakref.ref(grad)

    @staticmethod
    def _coupled_gradient(param: th.Tensor, group: dict[str, Any]) -> th.Tensor:
        """``lambda * grad R(W)`` (per gate block with ``isometry_blocks``), at the current weights."""
        blocks = group.get("isometry_blocks", 1)
        grad = isometry_penalty_grad(
            param.detach(),
            group["isometry_scale"],
            blocks,
            rect_scale=group.get("isometry_rect_scale", False),
            normalize=group.get("isometry_normalize", False),
            free_scale=group.get("isometry_free_scale", False),
            side=group.get("isometry_side", "both"),
        )
        return group["isometry_coef"] * grad

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        if all("isometry_mode" in group for group in self.param_groups):  # load_state_dict, copy.deepcopy
            self._register_coupled_hooks()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict``, also from the one-group layout of an SB3 checkpoint, and from
        the isometry convention before issue #27.

        A saved param group with isometry settings but without ``isometry_rect_scale`` was saved by the library
        before issue #27 (format 1, :data:`sb3_plastic.isometry.ISOMETRY_FORMAT`), when the penalty had no 1/2: its
        ``isometry_coef`` is doubled (the same effective penalty in today's convention) and it gets
        ``isometry_rect_scale=False``, ``isometry_normalize=False``.

        A plastic policy splits the parameters SB3's optimizer holds in one group into isometry groups (the
        regularised weights, the rest with ``isometry_coef=0``) and keeps SB3's order in ``flat_param_order``. A
        state dict without isometry settings and with one group over exactly those parameters (what
        ``stable_baselines3`` saves, loaded by ``model.set_parameters``) is mapped onto these groups: every
        parameter's state (Adam's moments and step) goes to the same parameter, every group takes the loaded
        group's hyperparameters (``lr``, ``betas``, ...) and keeps its own ``isometry_*`` settings. A one-group state
        over twice those parameters is what DQN saved before SB3 2.4 (its optimizer also held the target network's
        parameters, after the online ones): as SB3's ``load`` does for it, the target network's entries are dropped
        (with SB3's warning, which also covers ``set_parameters``).
        """
        super().load_state_dict(self._from_one_group_layout(upgrade_isometry_groups(state_dict)))  # type: ignore[misc]

    def _from_one_group_layout(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        order = getattr(self, "flat_param_order", None)
        saved = state_dict.get("param_groups", [])
        if order is None or len(saved) == len(self.param_groups) or any("isometry_mode" in g for g in saved):
            return state_dict  # the optimizer's own layout (or an unknown one: torch's checks apply)
        ours = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in saved for i in group["params"]]
        if len(saved) == 1 and len(saved_ids) == 2 * len(order) == 2 * len(ours):
            warnings.warn(
                f"The optimizer state holds {len(saved_ids)} parameters, twice the {len(order)} this optimizer trains: "
                "you are probably loading a DQN model saved with SB3 < 2.4.0, whose optimizer also held the target "
                "network's parameters; their entries are dropped (as SB3's load does) and the online parameters keep "
                "their Adam moments. Save the model again to avoid this warning.",
                UserWarning,
                stacklevel=3,
            )
            saved_ids = saved_ids[: len(order)]
        if len(saved) != 1 or len(saved_ids) != len(order) or len(ours) != len(order):
            raise ValueError(
                f"cannot load an optimizer state with {len(saved)} param group(s) over {len(saved_ids)} parameters "
                f"into {type(self).__name__} with {len(self.param_groups)} groups over {len(ours)}: only the "
                f"one-group layout of an SB3 optimizer over the same {len(order)} parameters is mapped"
            )
        position = {id(p): j for j, p in enumerate(ours)}
        new_index = {saved_ids[k]: position[id(p)] for k, p in enumerate(order)}
        hyper = {k: v for k, v in saved[0].items() if k != "params"}
        groups = []
        start = 0
        for group in self.param_groups:
            own = {k: v for k, v in group.items() if k.startswith("isometry_")}
            groups.append({**hyper, **own, "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        state = {new_index[k]: v for k, v in state_dict["state"].items() if k in new_index}
        return {"state": state, "param_groups": groups}

    def _isometry_base_step(self) -> Callable[..., Any]:
        """The ``step`` of the torch optimizer class this mixin sits on (the next class in the MRO)."""
        mro = type(self).__mro__
        base = mro[mro.index(IsometryStepMixin) + 1]
        return base.step  # type: ignore[attr-defined]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if "isometry_mode" in self.param_groups[-1]:  # defaults exist (not called from Adam.__init__)
            try:
                _check_group(self.param_groups[-1])
            except ValueError:
                self.param_groups.pop()
                raise
            self._register_coupled_hooks()

    @staticmethod
    def is_regularised(param: th.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``param`` receives the isometry step: >= 2 dims in a group with ``isometry_coef > 0``."""
        return group["isometry_coef"] > 0 and param.dim() >= 2

    @th.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        """One step: the isometry update computed at the pre-step weights, the base optimizer's own step (which
        sees only the task gradient in decoupled mode), then the decoupled isometry update."""
        loss = None
        if closure is not None:
            with th.enable_grad():
                loss = closure()
        pending: list[tuple[th.Tensor, th.Tensor, th.Tensor]] = []
        counted: list[tuple[th.Tensor, int]] = []
        coupled_groups = getattr(self, "_coupled_groups", {})
        seen = getattr(self, "_coupled_seen", {})
        reregister = False
        for group in self.param_groups:
            _check_group(group)
            interval = group["isometry_interval"]
            for p in group["params"]:
                if p.grad is None or not self.is_regularised(p, group):
                    continue
                state = self.state.get(p, {})
                count = int(state["isometry_count"]) if "isometry_count" in state else 0
                # written after the base step: Adam, RMSprop, ... initialise a state only while it is empty
                counted.append((p, count + 1))
                if group["isometry_mode"] == "coupled":
                    added = seen.pop(id(p), None)
                    if added is None or added() is not p.grad:  # the hook has not seen this gradient
                        p.grad.add_(self._coupled_gradient(p, group).to(p.grad.dtype))
                    reregister = reregister or coupled_groups.get(id(p)) is not group
                    continue
                if count % interval:
                    continue
                blocks = group.get("isometry_blocks", 1)
                if blocks > 1:
                    update, step = self._block_isometry_update(p, group, blocks)
                    pending.append((p, update, step))
                    continue
                pending.append((p, *self._isometry_update(p, group)))
        # torch wraps every optimizer class's ``step`` to run step hooks; calling the wrapped base step from
        # here would run the hooks registered on this optimizer twice per step.
        base_step = self._isometry_base_step()
        if getattr(base_step, "hooked", False):
            base_step = base_step.__wrapped__  # type: ignore[attr-defined]
        base_step(self)
        for p, update, step in pending:
            p.sub_(update)
            last = self.state[p].get("isometry_step")
            if isinstance(last, th.Tensor) and (last.shape, last.dtype, last.device) == (step.shape, step.dtype, step.device):
                # in place: a new tensor at every step would make a torch.compile'd step recompile at every step
                # (its guards hold the state's tensors), and fall back to eager at the recompile limit
                last.copy_(step)
            else:
                self.state[p]["isometry_step"] = step.detach()
        for p, count in counted:
            self.state[p]["isometry_count"] = count
        if reregister:  # a group switched to coupled after construction: hooks from the next backward on
            self._register_coupled_hooks()
        return loss

    @staticmethod
    def _isometry_update(p: th.Tensor, group: dict[str, Any]) -> tuple[th.Tensor, th.Tensor]:
        """The decoupled isometry update of one weight and its clamped step: ``(update, step)``."""
        # Gradient of R at the current (pre-step) parameters, as in the update rule above; the Gram
        # matrix is computed once for the gradient and for the blow-up bound.
        w = as_matrix(p)
        rows, cols = w.shape
        tall = rows >= cols
        gram = w.T @ w if tall else w @ w.T
        target = _step_target(gram, rows, cols, group)
        bound = gram.abs().sum(dim=1).max().clamp_min(target)
        gram.diagonal().sub_(target)
        gram = one_sided(gram, group.get("isometry_side", "both"))
        factor = _gradient_factor(group, min(rows, cols))
        limit = float(group["lr"]) * group["isometry_coef"] * group["isometry_interval"]
        step = th.clamp(MAX_ISOMETRY_STEP / (factor * bound), max=limit)
        # fold factor * step into the small Gram residual: the full-size product is the update itself
        gram.mul_(factor * step)
        return (w @ gram if tall else gram @ w).view_as(p), step

    @staticmethod
    def _block_isometry_update(p: th.Tensor, group: dict[str, Any], blocks: int) -> tuple[th.Tensor, th.Tensor]:
        """The decoupled isometry update of a weight made of ``blocks`` stacked matrices, each with its own Gram
        matrix and clamp: ``(update, per-block step)``."""
        w = as_blocks(p, blocks)
        rows, cols = w.shape[-2:]
        tall = rows >= cols
        gram = w.mT @ w if tall else w @ w.mT
        target = _step_target(gram, rows, cols, group)
        if isinstance(target, th.Tensor):  # one target per block
            bound = th.maximum(gram.abs().sum(dim=-1).amax(dim=-1), target)
            gram.diagonal(dim1=-2, dim2=-1).sub_(target.unsqueeze(-1))
        else:
            bound = gram.abs().sum(dim=-1).amax(dim=-1).clamp_min(target)
            gram.diagonal(dim1=-2, dim2=-1).sub_(target)
        gram = one_sided(gram, group.get("isometry_side", "both"))
        factor = _gradient_factor(group, min(rows, cols))
        limit = float(group["lr"]) * group["isometry_coef"] * group["isometry_interval"]
        step = th.clamp(MAX_ISOMETRY_STEP / (factor * bound), max=limit)
        gram.mul_(factor * step.view(-1, 1, 1))
        return (w @ gram if tall else gram @ w).view_as(p), step

    def reset_state(
        self, param: th.Tensor, index: Optional[Union[th.Tensor, Iterable[int]]] = None, dim: int = 0
    ) -> None:
        """Zero the moments of ``param`` (whole tensor, or rows ``dim=0`` / columns ``dim=1``).

        See :func:`reset_optimizer_state`.
        """
        reset_optimizer_state(self, param, index, dim)


class AdamO(IsometryStepMixin, AdamRestartMixin, th.optim.Adam):
    """Adam with a decoupled isometry step ("AdamO", Rosseau, Müller & Nowé, 2026).

    :param params: parameters or param groups. A group may set its own ``isometry_coef``,
        ``isometry_scale`` and ``isometry_mode``; the plastic policies put output heads in a group
        with ``isometry_coef=0``. A group may also set ``isometry_blocks=k`` (default 1): each of its weights
        ``(k*m, n)`` is ``k`` stacked matrices ``(m, n)`` (an LSTM's four gate blocks: ``k = 4``), penalised and
        clamped block by block (:func:`sb3_plastic.isometry.isometry_penalty` with ``blocks=k``).
    :param lr: learning rate ``eta`` (SB3 overwrites it on every ``train()`` through its schedule).
    :param betas: Adam's ``(beta1, beta2)``.
    :param eps: Adam's epsilon.
    :param weight_decay: decoupled (AdamW-style) weight decay on every parameter of the group.
    :param isometry_coef: ``lambda`` >= 0 of ``R = 1/2 ||Gram - t I||_F^2`` (the authors' convention; default 0.2, the
        0.1 of the library before issue #27, which had no 1/2). Every parameter with >= 2 dimensions in a group with
        ``isometry_coef > 0`` is regularised; 0 makes AdamO step for step equal to ``torch.optim.Adam``.
    :param isometry_scale: target scale ``s`` > 0 of ``W^T W`` (1: orthogonal; 2 is an option for ReLU).
    :param isometry_rect_scale: for a tall weight ``(out, in)``, ``out > in``, the target ``s * out / in`` (the
        authors' ``rect_scale``; off by default as in their training script, see :mod:`sb3_plastic.isometry`).
    :param isometry_normalize: divide ``R`` (and its step) by the Gram matrix's size ``min(out, in)`` (off by
        default, as the authors').
    :param isometry_free_scale: the target ``t`` is each weight's own mean squared singular value at the step
        (``||W||_F^2 / min(out, in)``): the step evens out the singular values without pulling their level to ``s``
        (this library's ablation, off; :mod:`sb3_plastic.isometry`).
    :param isometry_side: ``"both"`` (the penalty) or this library's one-sided ablation: ``"floor"`` penalises only
        the squared singular values below the target, ``"ceiling"`` only those above it (an ``eigh`` of each Gram
        matrix per step; :mod:`sb3_plastic.isometry`). Refused with ``isometry_free_scale``.
    :param isometry_mode: ``"decoupled"`` (AdamO proper) or ``"coupled"``: plain Adam on ``loss + lambda R``
        (the ablation): ``lambda * grad R`` joins ``p.grad`` inside ``backward()``, so gradient clipping before
        ``step()`` clips the sum (see :class:`IsometryStepMixin`), at every step.
    :param isometry_interval: decoupled mode only (coupled mode needs 1: ``ValueError`` otherwise). Default 1:
        the exact AdamO update, the isometry step at every step. ``k > 1`` is a speed option: the step every
        ``k`` optimizer steps of a tensor with ``k`` times the step size (the same average pull). The step costs
        two matrix products of the weight's size, more than a small minibatch's forward/backward pass for wide
        layers (see bench/README.md). It is not free in accuracy: the error is first order, linear in ``k`` and
        not vanishing with ``lambda`` (derivation in the module docstring; measured: 8-12 % of the isometry
        displacement of a 32-step window at lr 1e-3, bench/README.md). And the blow-up clamp below acts on the
        ``k``-times step: once ``k * lr * lambda > MAX_ISOMETRY_STEP / (2 * bound)`` the amortised step is cut,
        so its average pull falls below the exact one (measured on the permuted-digits probe at ``k = 32``: 12.5 %
        of the intended pull for ReLU, 2.6 % for MaxMin; the exact step there is never clamped).
    :param amsgrad: as in ``torch.optim.Adam``.
    :param kwargs: other ``torch.optim.Adam`` keywords (``foreach``, ``fused``, ``maximize``, ...).

    Blow-up guard: the decoupled step size ``lr * lambda`` is clamped per tensor to
    ``MAX_ISOMETRY_STEP / (f * bound)`` (so ``f * step * max(sigma_max^2, t) <= 1/2``, ``f = 2`` or ``2 / min(out, in)``
    with ``isometry_normalize``) where ``bound >= max(sigma_max(W)^2, t)`` (largest absolute row sum of the
    Gram matrix, at least the target ``t``); the authors' port has no clamp. The value used at the last step is kept
    in ``state[p]["isometry_step"]`` (one value per block, shape ``(k,)``, in a group with ``isometry_blocks=k > 1``).
    In coupled mode no clamp applies (Adam normalises the summed gradient). A parameter whose ``.grad`` is ``None`` gets
    neither the Adam step nor the isometry step (as AdamW skips its weight decay).

    ``torch.compile(optimizer.step)`` works: the state tensors are updated in place, so the compiled step is
    compiled once, and once more when the step count turns dynamic. On CPU, compiling a whole training step
    slowed the small networks measured and sped up NatureCNN PPO (bench/README.md, issue #16).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        isometry_coef: float = 0.2,
        isometry_scale: float = 1.0,
        isometry_mode: str = "decoupled",
        isometry_interval: int = 1,
        isometry_rect_scale: bool = False,
        isometry_normalize: bool = False,
        isometry_free_scale: bool = False,
        isometry_side: str = "both",
        amsgrad: bool = False,
        **kwargs: Any,
    ) -> None:
        _check_nonneg("weight_decay", weight_decay)
        if "decoupled_weight_decay" in kwargs:
            raise ValueError("AdamO's weight decay is always decoupled; do not pass decoupled_weight_decay")
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            decoupled_weight_decay=True,
            **kwargs,
        )
        self._init_isometry(
            isometry_coef, isometry_scale, isometry_mode, isometry_interval, isometry_rect_scale, isometry_normalize,
            isometry_free_scale, isometry_side,
        )


@functools.cache
def with_isometry_step(optimizer_class: type[th.optim.Optimizer]) -> type[th.optim.Optimizer]:
    """``optimizer_class`` with AdamO's isometry step (Rosseau, Müller & Nowé, 2026) on top of its own update.

    This is what a plastic policy builds when ``policy_kwargs`` name an ``optimizer_class`` (``AdamW``,
    SB3's ``RMSpropTFLike``, ``SGD``, ...) while the isometry penalty is on: the optimizer keeps its own update
    and its own keywords (``optimizer_kwargs``), and the penalty acts exactly as in :class:`AdamO`:
    ``isometry_mode="decoupled"`` applies ``-lr * lambda * grad R(W)`` after the optimizer's step, outside its
    state (moments, square averages, momentum buffers), with AdamO's clamp; ``"coupled"`` adds
    ``lambda * grad R(W)`` to the gradient the optimizer sees. The returned class takes the optimizer's own
    arguments plus ``isometry_coef`` (default 0.2, as :class:`AdamO`), ``isometry_scale``, ``isometry_mode``,
    ``isometry_interval``, ``isometry_rect_scale``, ``isometry_normalize``, ``isometry_free_scale`` and
    ``isometry_side``; param
    groups may set them (and ``isometry_blocks``) as in :class:`AdamO`. A class that already has the step
    (:class:`AdamO`, a class returned here) is returned unchanged; the same class is returned for the same
    ``optimizer_class``.

    :param optimizer_class: a subclass of ``torch.optim.Optimizer`` whose ``step`` works without a closure.
    :raises ValueError: for anything else (``torch.optim.LBFGS`` needs a closure on every step).
    """
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, th.optim.Optimizer)):
        raise ValueError(f"optimizer_class must be a subclass of torch.optim.Optimizer, got {optimizer_class!r}")
    if issubclass(optimizer_class, IsometryStepMixin):
        return optimizer_class
    if issubclass(optimizer_class, th.optim.LBFGS):
        raise ValueError(
            f"optimizer_class={optimizer_class.__name__} re-evaluates the loss through a closure on every step, which "
            "SB3 never passes; use an optimizer whose step needs no closure (Adam, AdamW, RMSprop, SGD, ...)"
        )

    def __init__(
        self: Any,
        params: Iterable[Any],
        *args: Any,
        isometry_coef: float = 0.2,
        isometry_scale: float = 1.0,
        isometry_mode: str = "decoupled",
        isometry_interval: int = 1,
        isometry_rect_scale: bool = False,
        isometry_normalize: bool = False,
        isometry_free_scale: bool = False,
        isometry_side: str = "both",
        **kwargs: Any,
    ) -> None:
        optimizer_class.__init__(self, params, *args, **kwargs)
        self._init_isometry(
            isometry_coef, isometry_scale, isometry_mode, isometry_interval, isometry_rect_scale, isometry_normalize,
            isometry_free_scale, isometry_side,
        )

    name = f"{optimizer_class.__name__}WithIsometry"
    base = f"{optimizer_class.__module__}.{optimizer_class.__qualname__}"
    doc = f"``{base}`` with AdamO's isometry step (see :func:`with_isometry_step`)."
    cls = type(name, (IsometryStepMixin, optimizer_class), {"__init__": __init__, "__doc__": doc, "__module__": __name__})
    cls.__qualname__ = name
    return cls
