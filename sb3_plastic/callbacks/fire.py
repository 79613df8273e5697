"""FIRE: replace every weight matrix by its (scaled) polar factor, as an SB3 callback.

FIRE (ICLR 2026, arXiv 2602.08040) restores plasticity at a training midpoint or a task switch by
moving each weight matrix ``W`` to the closest orthogonal matrix in Frobenius norm, its polar factor
``W (W^T W)^(-1/2) = U V^T`` (``W = U S V^T``). The polar factor is computed by Newton–Schulz iteration
exactly as in the reference implementation (isaac7778/FIRE, ``vision/interventions/fire.py``):

* the iteration runs on a tall matrix (a wide ``W`` is transposed, and transposed back at the end),
  in fp32 (or the weight's precision if it is higher);
* ``X <- X / ||X||_F`` (all singular values in (0, 1]);
* 10 iterations of the cubic map ``X <- 1.5 X - 0.5 X (X^T X)``, which sends every singular value in
  (0, sqrt(3)) to 1. After the Frobenius normalisation a singular value ``sigma`` grows by about 1.5x per
  iteration while it is small, so 10 iterations converge to ``U V^T`` (relative error < 1e-5) when
  ``sigma_min(W) / ||W||_F`` is above roughly 1/60; directions with smaller singular values stay short.
  This is the reference's behaviour and is kept on purpose. (Muon's quintic bf16 iteration converges to
  ``U S' V^T`` with ``S'`` roughly in [0.7, 1.2], not to an isometry, and is not used.)
* a Conv2d kernel ``(out, in, kh, kw)`` is orthogonalised per spatial tap: each ``W[:, :, i, j]`` gets its
  own polar factor;
* the result is multiplied by the reference's scale (see :func:`fire_scale`):
  ``sqrt(out / in)`` for a Linear weight, ``sqrt(out / in) / (kh * kw)`` for a Conv2d kernel, with
  ``in = weight.shape[1]`` (input features, or input channels per group: *not* ``in * kh * kw``);
* biases are left as they are.

With that scaling a Linear weight's singular values all become ``sqrt(out / in)`` (an exact isometry only
for square layers; it is the "spectral" scale of muP/Muon, ``||W||_op = sqrt(d_out / d_in)``, that the
reference's SAC code calls ``scaler_type="muon"``, its default). The SAC reference (JAX, flax kernels of
shape ``(in, out)``) uses the same ``sqrt(d_out / d_in)`` for Dense layers; the vision reference adds the
``1 / (kh * kw)`` factor for convolutions. The DQN reference (cleanrl ``apply_fire``) applies the conv
rule to its convolutions but resets its Linear layers to their initial values; here every selected layer,
Linear or Conv2d, gets the polar factor.

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
import numbers
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch as th
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import nn

from sb3_plastic.callbacks.base import PlasticCallback, TaskChangeWatch
from sb3_plastic.callbacks.schedule import expected_end_timesteps
from sb3_plastic.common.surgery import norms_fed_by, reset_norm_, sync_target
from sb3_plastic.isometry import as_blocks, deviation_from_isometry
from sb3_plastic.optim import reset_optimizer_state
from sb3_plastic.recurrent import recurrent_weights

#: Layer types FIRE rewrites (as the reference: Linear and Conv2d).
FIRE_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
#: Allowed values of ``layers`` / ``fire_layers``.
FIRE_LAYER_SELECTIONS = ("all", "hidden")
#: Coefficients of the reference's cubic Newton–Schulz map ``X <- a X + b X (X^T X)``.
NS_COEFFICIENTS = (1.5, -0.5)

_UNSET: Any = object()


# ----------------------------------------------------------------------------------------------------------
# The orthogonalisation
# ----------------------------------------------------------------------------------------------------------


def newton_schulz_polar(matrix: th.Tensor, iterations: int = 10) -> th.Tensor:
    """Polar factor ``U V^T`` of a matrix (or of each matrix of a batch ``(..., m, n)``) by Newton–Schulz.

    Reference settings of FIRE (arXiv 2602.08040): a wide matrix is transposed, ``X <- X / ||X||_F``, then
    ``iterations`` steps of ``X <- 1.5 X - 0.5 X (X^T X)``, in fp32 (float64 input stays float64). No
    scaling is applied here (see :func:`fire_weight`). A zero matrix maps to zero.

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


def fire_weight(weight: th.Tensor, iterations: int = 10, scaled: bool = True, blocks: int = 1) -> th.Tensor:
    """FIRE's image of one weight (a new tensor; ``weight`` is not modified).

    A Linear weight ``(out, in)`` is replaced by its Newton–Schulz polar factor; a Conv2d kernel
    ``(out, in, kh, kw)`` by the polar factor of each spatial tap ``W[:, :, i, j]``. With ``scaled=True``
    (the reference) the result is multiplied by :func:`fire_scale`; ``scaled=False`` gives the plain polar
    factor (the SAC reference's ``scaler_type="ortho_init"``).

    :param weight: a 2-d or 4-d weight tensor.
    :param iterations: Newton–Schulz steps (the reference uses 10).
    :param scaled: apply the reference scaling ``sqrt(out/in)`` (``/ (kh*kw)`` for convolutions).
    :param blocks: a 2-d weight ``(k*m, n)`` made of ``k`` stacked matrices (an LSTM's gate blocks, ``k = 4``):
        each block ``(m, n)`` gets its own polar factor and the Linear scale ``sqrt(m / n)``.
    """
    if blocks != 1:
        if weight.dim() != 2:
            raise ValueError(f"blocks={blocks} needs a 2-d weight, got shape {tuple(weight.shape)}")
        stacked = as_blocks(weight, blocks)
        result = newton_schulz_polar(stacked, iterations)
        if scaled:
            result = result * fire_scale(stacked.shape[1:])
        return result.reshape(weight.shape)
    if weight.dim() == 2:
        result = newton_schulz_polar(weight, iterations)
    elif weight.dim() == 4:
        taps = weight.permute(2, 3, 0, 1)  # (kh, kw, out, in): one matrix per spatial tap
        result = newton_schulz_polar(taps, iterations).permute(2, 3, 0, 1).contiguous()
    else:
        raise ValueError(f"FIRE handles Linear (2-d) and Conv2d (4-d) weights, got shape {tuple(weight.shape)}")
    if scaled:
        result = result * fire_scale(weight.shape)
    return result


def fire_(
    module_or_layers: Union[nn.Module, Iterable[nn.Module]],
    iterations: int = 10,
    scaled: bool = True,
) -> list[nn.Module]:
    """Apply FIRE in place to every Linear / Conv2d weight of a module (or to the given layers).

    Weights are overwritten with ``param.copy_`` under ``torch.no_grad()``: the Parameter objects stay the
    same, so optimizers and target-network updates that hold them keep working. Biases are untouched.
    Optimizer state and target networks are *not* handled here (the :class:`FIRE` callback does that).
    A recurrent layer (``nn.LSTM``, ...) has each weight matrix rewritten gate block by gate block
    (:func:`fire_weight` with ``blocks``; see :func:`sb3_plastic.recurrent.recurrent_weights`).

    :param module_or_layers: a module (all its Linear / Conv2d / recurrent layers, itself included) or an
        iterable of such layers.
    :param iterations: Newton–Schulz steps.
    :param scaled: apply the reference scaling (see :func:`fire_weight`).
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
                weight.copy_(fire_weight(weight, iterations, scaled, blocks))
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


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int_at_least(name: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_at(name: str, value: Any) -> None:
    if value is None:
        return
    if _is_int(value):
        if value < 1:
            raise ValueError(
                f"{name} must be a float fraction in (0, 1) of the learn() call or an int timestep >= 1, got {value!r}"
            )
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if math.isfinite(value) and 0.0 < value < 1.0:
            return
        raise ValueError(
            f"{name}={value!r} is outside (0, 1): a float {name} is a fraction of the learn() call's total_timesteps "
            f"(exclusive bounds); use an int for an absolute num_timesteps"
        )
    raise ValueError(f"{name} must be a float fraction in (0, 1), an int timestep >= 1 or None, got {value!r}")


def _check_every(name: str, value: Any) -> None:
    if value is not None:
        _check_int_at_least(name, value, 1)


def _check_layers(name: str, value: Any) -> None:
    if value not in FIRE_LAYER_SELECTIONS:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {list(FIRE_LAYER_SELECTIONS)}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


# ----------------------------------------------------------------------------------------------------------
# The callback
# ----------------------------------------------------------------------------------------------------------


class FIRE(PlasticCallback):
    """FIRE as an SB3 callback (ICLR 2026, arXiv 2602.08040): orthogonalise the weights at chosen moments.

    When it fires, every selected Linear / Conv2d weight of every online network (PPO/A2C: the policy;
    DQN: ``q_net``; QR-DQN: ``quantile_net``; SAC/TQC: actor and critic) is replaced in place by
    :func:`fire_weight` (reference Newton–Schulz polar factor and scaling, see the module docstring); the
    optimizer state of each rewritten weight is dropped (Adam/AdamO moments and step count; biases keep
    theirs); every target network is hard-synced to its online network. Off-policy algorithms fire in
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
      use ``on_task_change``, ``every``, or a different ``name`` per call.)
    * ``at`` int >= 1: at the first step with ``num_timesteps >= at``, once per run (a point already
      passed when a run's plan is made does not fire).
    * ``every`` N: whenever ``num_timesteps`` passes a multiple of N (``N, 2N, ...`` on SB3's
      ``num_timesteps`` axis; on-policy fires are coalesced to the next rollout boundary, so several
      multiples passed within one rollout give one fire).
    * ``on_task_change``: when any env's ``info["task_id"]`` differs from the last one seen for that env
      (the first value seen only sets the baseline; the last ids are kept in the model's state, so a task
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
    ``every_done``, ``task_ids``, ``pending``.

    Logged (``plasticity/fire/...``): ``dfi_before`` and ``dfi_after`` (sum over the rewritten layers of
    the deviation from isometry ``R(W)`` with ``s = 1``, :func:`sb3_plastic.isometry.deviation_from_isometry`;
    with the reference scaling a non-square Linear ends at singular values ``sqrt(out/in)``, so
    ``dfi_after`` is zero only for square layers), ``seconds`` (the surgery: orthogonalisation, optimizer
    reset and target sync) and ``count``.

    :param at: see above. Default: 0.5 (the midpoint) when neither ``every`` nor ``on_task_change`` is
        given, else ``None``.
    :param every: fire every ``every`` env steps (``num_timesteps`` counts steps of all envs), or ``None``.
    :param on_task_change: fire when ``info["task_id"]`` changes.
    :param iterations: Newton–Schulz steps (reference: 10).
    :param layers: ``"all"`` (every Linear / Conv2d, heads included: the reference's choice, default) or
        ``"hidden"`` (output heads left alone).
    :param name: distinguishes several FIRE callbacks on one model (separate persistent state).
    :param verbose: 1 prints a line per fire.
    :raises ValueError: for a bad trigger, ``iterations`` or ``layers``, or when no trigger is set.
    """

    def __init__(
        self,
        at: Optional[Union[float, int]] = _UNSET,
        every: Optional[int] = None,
        on_task_change: bool = False,
        iterations: int = 10,
        layers: str = "all",
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        if at is _UNSET:
            at = 0.5 if every is None and not on_task_change else None
        _check_at("at", at)
        _check_every("every", every)
        _check_bool("on_task_change", on_task_change)
        _check_int_at_least("iterations", iterations, 1)
        _check_layers("layers", layers)
        if at is None and every is None and not on_task_change:
            raise ValueError("FIRE needs a trigger: set at (fraction in (0, 1) or int timestep), every, or on_task_change")
        self.at = at
        self.every = every
        self.on_task_change = on_task_change
        self.iterations = iterations
        self.layers = layers
        self._on_policy = False
        self._task_watch = TaskChangeWatch("FIRE on_task_change=True (fire_on_task_change)", "fire")
        self._at_skipped = False

    # -- state -------------------------------------------------------------------------------------------

    @property
    def fire_count(self) -> int:
        """Fires performed on this model so far (persistent)."""
        return int(self.state.get("count", 0))

    @property
    def fired_at(self) -> list[int]:
        """``num_timesteps`` at each fire (persistent)."""
        return list(self.state.get("timesteps", []))

    def _init_state(self) -> None:
        s = self.state
        s.setdefault("count", 0)
        s.setdefault("timesteps", [])
        s.setdefault("reasons", [])
        s.setdefault("run", 0)
        s.setdefault("at_spec", None)
        s.setdefault("at_point", None)
        s.setdefault("at_done", False)
        s.setdefault("every_spec", None)
        s.setdefault("every_done", 0)
        s.setdefault("task_ids", None)
        s.setdefault("pending", [])

    def _plan_run(self) -> None:
        """Fix the trigger points of this run (see the class docstring for the semantics)."""
        s = self.state
        now = int(self.model.num_timesteps)
        self._at_skipped = False  # an int ``at`` already passed when this run's plan is made
        new_run = now == 0 or s["run"] == 0
        if new_run:
            s["run"] += 1
        # a string: SB3's save stores the model's attributes as JSON when it can (tuples come back as lists)
        at_key = None if self.at is None else f"{'int' if _is_int(self.at) else 'float'}:{self.at!r}"
        if new_run or s["at_spec"] != at_key:
            s["at_spec"] = at_key
            s["at_done"] = False
            if self.at is None:
                s["at_point"] = None
            elif _is_int(self.at):
                s["at_point"] = int(self.at)
                s["at_done"] = now >= int(self.at) and now > 0
                self._at_skipped = s["at_done"]
            else:
                # _total_timesteps is the absolute end of this learn() call (SB3 adds num_timesteps to it
                # when reset_num_timesteps=False)
                span = int(self.model._total_timesteps) - now
                s["at_point"] = now + max(1, round(float(self.at) * span))
        if new_run or s["every_spec"] != self.every:
            s["every_spec"] = self.every
            s["every_done"] = now // self.every if self.every else 0

    def _init_callback(self) -> None:
        super()._init_callback()
        self._init_state()

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._init_state()
        self._on_policy = isinstance(self.model, OnPolicyAlgorithm)
        self._plan_run()
        self._warn_unreachable()
        self._task_watch.start()

    def _warn_unreachable(self) -> None:
        """Warn when a trigger set for this call cannot fire in it (``at`` past the call's end or already
        passed, ``every`` longer than the call): such a FIRE would otherwise do nothing and say nothing."""
        s = self.state
        start = int(self.model.num_timesteps)
        end = expected_end_timesteps(self.model)
        span = f"this learn() call runs num_timesteps {start} -> {end}"
        if s["at_point"] is not None and not s["at_done"] and s["at_point"] > end:
            warnings.warn(
                f"FIRE at={self.at!r} (fire_at) is due at num_timesteps {s['at_point']}, beyond the end of this run: "
                f"{span}, so it does not fire in this call (only in a later learn(..., reset_num_timesteps=False))",
                stacklevel=2,
            )
        elif self._at_skipped:
            warnings.warn(
                f"FIRE at={self.at!r} (fire_at) has already passed: {span}; an int at is an absolute num_timesteps "
                f"(use a float in (0, 1) for a fraction of the call), so it does not fire in this run",
                stacklevel=2,
            )
        if self.every and end // self.every <= s["every_done"]:
            warnings.warn(
                f"FIRE every={self.every} (fire_every) is longer than this call: {span} and the next multiple of "
                f"{self.every} is {(s['every_done'] + 1) * self.every}, so it does not fire in this call",
                stacklevel=2,
            )

    # -- triggers ----------------------------------------------------------------------------------------

    def _due(self) -> list[str]:
        s = self.state
        now = int(self.model.num_timesteps)
        reasons: list[str] = []
        if s["at_point"] is not None and not s["at_done"] and now >= s["at_point"]:
            s["at_done"] = True
            reasons.append(f"at={self.at}")
        if self.every:
            k = now // self.every
            if k > s["every_done"]:
                s["every_done"] = k
                reasons.append(f"every={self.every}")
        if self.on_task_change:
            changed = self._task_changed()
            if changed:
                reasons.append("task_change")
        return reasons

    def _task_changed(self) -> bool:
        return self._task_watch.changed(self.locals.get("infos"), self.state)

    def _on_step(self) -> bool:
        reasons = self._due()
        if reasons:
            if self._on_policy:
                self.state["pending"].extend(r for r in reasons if r not in self.state["pending"])
            else:
                self._fire(reasons)
        return True

    def _on_rollout_start(self) -> None:
        if self.state["pending"]:
            self._fire(list(self.state["pending"]))

    def _on_rollout_end(self) -> None:
        if self.on_task_change:
            steps = int(self.model.num_timesteps) - int(getattr(self.model, "_num_timesteps_at_start", 0))
            self._task_watch.warn_if_blind(steps)

    def _on_training_end(self) -> None:
        if self.state["pending"]:
            self._fire(list(self.state["pending"]))

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

    def _fire(self, reasons: list[str]) -> None:
        layers = self.selected_layers()
        weights = [pair for layer in layers for pair in fire_weights(layer)]
        dfi_before = sum(deviation_from_isometry(w, blocks=b) for w, b in weights)
        start = time.perf_counter()
        fire_(layers, self.iterations)
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
        dfi_after = sum(deviation_from_isometry(w, blocks=b) for w, b in weights)

        s = self.state
        now = int(self.model.num_timesteps)
        s["count"] += 1
        s["timesteps"].append(now)
        s["reasons"].append("+".join(reasons))
        s["pending"] = []
        self.record("fire/dfi_before", dfi_before)
        self.record("fire/dfi_after", dfi_after)
        self.record("fire/seconds", seconds)
        self.record("fire/count", s["count"])
        if self.verbose >= 1:
            print(
                f"FIRE #{s['count']} at num_timesteps={now} ({'+'.join(reasons)}): {len(layers)} layers, "
                f"DfI {dfi_before:.4g} -> {dfi_after:.4g}, {seconds * 1e3:.1f} ms"
            )


# ----------------------------------------------------------------------------------------------------------
# Top-level keywords of the plastic algorithms
# ----------------------------------------------------------------------------------------------------------


@dataclass
class FIREConfig:
    """FIRE settings as top-level keywords of ``PlasticPPO`` / ``PlasticDQN`` / ``PlasticSAC`` (and rl_zoo3
    yaml / optuna samplers). FIRE (ICLR 2026, arXiv 2602.08040); see :class:`FIRE` for the semantics.

    :param fire_at: float in (0, 1): fraction of the training run started by ``learn()`` (fires once per run,
        kept across save -> load -> ``learn(reset_num_timesteps=False)``); int >= 1: an absolute
        ``num_timesteps`` (warns when it is already passed or after the end of the ``learn()`` call); ``None``: off.
    :param fire_every: fire every N env steps (multiples of N on ``num_timesteps``; warns when no multiple falls
        inside the ``learn()`` call); ``None``: off.
    :param fire_on_task_change: fire when any env's ``info["task_id"]`` changes (warns when the env's infos have
        no ``task_id``).
    :param fire_iterations: Newton–Schulz steps (reference: 10).
    :param fire_layers: ``"all"`` (every Linear / Conv2d including output heads, as the reference does; the
        default) or ``"hidden"`` (output heads untouched).
    """

    fire_at: Optional[Union[float, int]] = None
    fire_every: Optional[int] = None
    fire_on_task_change: bool = False
    fire_iterations: int = 10
    fire_layers: str = "all"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        _check_at("fire_at", self.fire_at)
        _check_every("fire_every", self.fire_every)
        _check_bool("fire_on_task_change", self.fire_on_task_change)
        _check_int_at_least("fire_iterations", self.fire_iterations, 1)
        _check_layers("fire_layers", self.fire_layers)

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
            name=name,
            verbose=verbose,
        )
