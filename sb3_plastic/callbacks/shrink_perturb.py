"""Shrink & Perturb, in Ash & Adams' event form and in Dohare et al.'s continual form.

References:

* J. T. Ash, R. P. Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020
  (https://arxiv.org/abs/1910.08475): at each arrival of new data,
  ``theta <- lambda * theta + p * theta_fresh`` with ``theta_fresh`` a fresh draw of the network's
  initialisation (``lambda = 0.4``, ``p = 0.1`` in their experiments).
* S. Dohare, J. F. Hernandez-Garcia, Q. Lan, P. Rahman, A. R. Mahmood, R. S. Sutton, "Loss of
  plasticity in deep continual learning", Nature 632, 2024: the continual variant, L2 weight decay plus
  Gaussian noise ``N(0, sigma^2)`` added to every weight after each optimizer step. Their code
  (shibhansh/loss-of-plasticity) passes ``weight_decay`` to torch's Adam, i.e. the L2 gradient
  ``weight_decay * theta`` joins the gradient that Adam normalises (a weight with no task gradient then moves
  by ~``lr`` per step towards 0, measured: 0.05 -> ~6e-23 in 10k steps at wd 1e-4, lr 1e-3), and adds the noise
  after ``step()``. That is the default here (``weight_decay_mode="coupled"``); the decoupled shrink
  ``(1 - lr * wd) theta`` (AdamW-style, ~1e-7 per step at those settings, so practically no decay) is the
  explicit option ``weight_decay_mode="decoupled"``.

Both act on the weight and bias of every Linear / Conv2d layer of every online network (output heads
included, as in both papers) and on every parameter of its recurrent layers (RecurrentPPO's LSTMs: weights
and biases, the fresh draw from the LSTM's own initialisation, :mod:`sb3_plastic.recurrent`); other
parameters (PPO's ``log_std`` vector, SAC's entropy coefficient) are left alone. Normalisation layers with
running statistics (CrossQ's BatchRenorm) keep their scale and shift; after an event, which moves every
weight of the layer feeding them, their running statistics and warm-up counter restart
(:func:`~sb3_plastic.common.surgery.reset_norm_`, as after FIRE); the continual form leaves them to the
norm's own running averages.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch as th
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import nn
from torch.utils.hooks import RemovableHandle

from sb3_plastic.callbacks.base import (
    InterventionConfig,
    PlasticCallback,
    PrivateRNGMixin,
    TaskChangeWatch,
    announce_rewrite,
    private_seed,
    warn_ignored_options,
    warn_unreachable,
)
from sb3_plastic.callbacks.redo import LayerInit, default_layer_init, model_layer_init
from sb3_plastic.callbacks.schedule import expected_end_timesteps
from sb3_plastic.common.hooks import OutermostStepHooks
from sb3_plastic.common.surgery import find_networks, norms_fed_by, reset_norm_, sync_target
from sb3_plastic.optim import reset_optimizer_state
from sb3_plastic.recurrent import fresh_recurrent_parameters, recurrent_init_scheme

MODES = ("event", "continual")
#: How the continual form's L2 reaches the weights: in the gradient the optimizer sees (Dohare et al.'s code) or
#: as a decoupled shrink after the step.
WEIGHT_DECAY_MODES = ("coupled", "decoupled")

#: Ash & Adams (2020): shrink factor lambda and perturbation scale p.
DEFAULT_SHRINK = 0.4
DEFAULT_PERTURB = 0.1
#: Dohare et al. (2024), continual form (their permuted-MNIST / ImageNet settings): noise std and L2 strength.
DEFAULT_NOISE_STD = 1e-5
DEFAULT_WEIGHT_DECAY = 1e-4


# ---------------------------------------------------------------------------------------------------
# The operations
# ---------------------------------------------------------------------------------------------------
def _holds(optimizer: th.optim.Optimizer, param: th.Tensor) -> bool:
    return any(param is p for group in optimizer.param_groups for p in group["params"])


def _reset_state(touched: Sequence[th.Tensor], optimizers: Iterable[Optional[th.optim.Optimizer]]) -> None:
    """Drop the whole optimizer state of every touched tensor in each (distinct) optimizer that holds it."""
    for opt in {id(o): o for o in optimizers if o is not None}.values():
        for param in touched:
            if _holds(opt, param):
                reset_optimizer_state(opt, param)


@th.no_grad()
def shrink_perturb_(
    layers: Iterable[nn.Module],
    shrink: float = DEFAULT_SHRINK,
    perturb: float = DEFAULT_PERTURB,
    init: LayerInit = default_layer_init,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
) -> list[nn.Parameter]:
    """Ash & Adams' shrink & perturb, in place: ``theta <- shrink * theta + perturb * theta_fresh`` for the
    weight and bias of each layer, ``theta_fresh`` being a fresh draw of ``init`` (one draw per layer,
    weight then bias, in the order of ``layers``). Parameter objects are kept (optimizers and target-net
    polyak updates hold them by reference); the whole optimizer state of every touched tensor is dropped
    (Adam restarts its moments and bias correction for it).

    :param layers: Linear / Conv layers (each is processed once).
    :param shrink: ``lambda`` in (0, 1].
    :param perturb: ``p`` >= 0 (0: pure shrinking, nothing is drawn).
    :param init: the initialiser of ``theta_fresh`` (e.g. :func:`sb3_plastic.callbacks.redo.model_layer_init`).
    :param optimizers: optimizers whose state of the touched tensors is cleared.
    :return: the touched parameters.
    """
    _check_fraction("shrink", shrink)
    _check_nonneg("perturb", perturb)
    touched: list[nn.Parameter] = []
    seen: set[int] = set()
    for layer in layers:
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        bias = getattr(layer, "bias", None)
        fresh_w, fresh_b = init(layer) if perturb > 0 else (None, None)
        layer.weight.mul_(shrink)
        if fresh_w is not None:
            layer.weight.add_(fresh_w.to(layer.weight), alpha=perturb)
        touched.append(layer.weight)
        if bias is not None:
            bias.mul_(shrink)
            if fresh_b is not None:
                bias.add_(fresh_b.to(bias), alpha=perturb)
            touched.append(bias)
    _reset_state(touched, optimizers)
    return touched


@th.no_grad()
def shrink_perturb_recurrent_(
    modules: Iterable[nn.RNNBase],
    shrink: float = DEFAULT_SHRINK,
    perturb: float = DEFAULT_PERTURB,
    init: str = "default",
    gain: float = 1.0,
    optimizers: Iterable[Optional[th.optim.Optimizer]] = (),
) -> list[nn.Parameter]:
    """:func:`shrink_perturb_` for recurrent layers (``nn.LSTM``, ...): every weight and bias becomes
    ``shrink * theta + perturb * theta_fresh``, ``theta_fresh`` a fresh draw of the layer's initialisation
    (:func:`sb3_plastic.recurrent.fresh_recurrent_parameters` with ``init`` / ``gain``). In place; the whole
    optimizer state of every touched tensor is dropped.

    :return: the touched parameters.
    """
    _check_fraction("shrink", shrink)
    _check_nonneg("perturb", perturb)
    touched: list[nn.Parameter] = []
    for module in {id(m): m for m in modules}.values():
        fresh = fresh_recurrent_parameters(module, init, gain) if perturb > 0 else {}
        for name, param in module.named_parameters(recurse=False):
            param.mul_(shrink)
            if name in fresh:
                param.add_(fresh[name].to(param), alpha=perturb)
            touched.append(param)
    _reset_state(touched, optimizers)
    return touched


@th.no_grad()
def add_l2_gradient_(params: Sequence[th.Tensor], weight_decay: float) -> None:
    """The L2 gradient of ``weight_decay / 2 * ||theta||^2`` added in place to each tensor's ``.grad``:
    ``grad <- grad + weight_decay * theta``, the operation torch's Adam / SGD perform for ``weight_decay``
    (tensors whose ``.grad`` is ``None`` are skipped, as those optimizers skip them)."""
    for p in params:
        if p.grad is not None:
            p.grad.add_(p, alpha=float(weight_decay))


@th.no_grad()
def continual_shrink_perturb_(
    params: Sequence[th.Tensor],
    lr: float,
    weight_decay: float,
    noise_std: float,
    generator: Optional[th.Generator] = None,
) -> None:
    """The after-step part of the continual shrink & perturb, in place, on each tensor in order:

        theta <- (1 - lr * weight_decay) * theta + noise_std * eps,   eps ~ N(0, I),

    ``eps`` drawn from ``generator`` (on the tensors' device), or from torch's global generator when it is ``None``.

    With ``weight_decay > 0`` this is the decoupled form (``weight_decay_mode="decoupled"``, AdamW-style): for
    plain SGD it equals the L2 penalty of Dohare et al.'s SGD experiments, with Adam it bypasses the moments.
    The default coupled form calls it with ``weight_decay=0`` (noise only) after :func:`add_l2_gradient_`
    before the step.
    """
    factor = 1.0 - float(lr) * float(weight_decay)
    for p in params:
        if factor != 1.0:
            p.mul_(factor)
        if noise_std > 0:
            if generator is None:
                eps = th.randn_like(p)
            else:
                eps = th.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
            p.add_(eps, alpha=float(noise_std))


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value)


def _check_fraction(name: str, value: Any) -> None:
    if not (_is_number(value) and 0 < value <= 1):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


def _check_nonneg(name: str, value: Any) -> None:
    if not (_is_number(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_settings(
    mode: Optional[str],
    shrink: Any,
    perturb: Any,
    every: Any,
    on_task_change: Any,
    noise_std: Any,
    weight_decay: Any,
    weight_decay_mode: Any,
    names: dict[str, str],
    allow_off: bool = False,
) -> None:
    """Validate shrink & perturb settings; ``names`` maps each argument to the keyword the user typed.

    ``mode=None`` (off) is allowed only with ``allow_off`` (the config); settings that cannot act warn: any setting
    away from its default while the mode is off, the other form's settings, and a continual form with
    ``noise_std == weight_decay == 0``.
    """
    if mode is None and not allow_off:
        raise ValueError(f"Unknown {names['mode']} None; allowed: {list(MODES)}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"Unknown {names['mode']} {mode!r}; allowed: {list(MODES)}" + (" or None" if allow_off else ""))
    if weight_decay_mode not in WEIGHT_DECAY_MODES:
        raise ValueError(f"Unknown {names['weight_decay_mode']} {weight_decay_mode!r}; allowed: {list(WEIGHT_DECAY_MODES)}")
    _check_fraction(names["shrink"], shrink)
    _check_nonneg(names["perturb"], perturb)
    _check_nonneg(names["noise_std"], noise_std)
    _check_nonneg(names["weight_decay"], weight_decay)
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every <= 0):
        raise ValueError(f"{names['every']} must be None or an integer > 0 (env steps), got {every!r}")
    if not isinstance(on_task_change, (bool, np.bool_)):
        raise ValueError(f"{names['on_task_change']} must be True or False, got {on_task_change!r}")
    if mode == "event" and every is None and not on_task_change:
        raise ValueError(
            f"{names['mode']}='event' needs a trigger: set {names['every']} (env steps) and/or {names['on_task_change']}=True"
        )
    if mode == "continual" and (every is not None or on_task_change):
        raise ValueError(
            f"{names['every']} and {names['on_task_change']} only apply to {names['mode']}='event'; the continual "
            "form acts after every optimizer step"
        )
    values = {
        "shrink": (shrink, DEFAULT_SHRINK),
        "perturb": (perturb, DEFAULT_PERTURB),
        "every": (every, None),
        "on_task_change": (on_task_change, False),
        "noise_std": (noise_std, DEFAULT_NOISE_STD),
        "weight_decay": (weight_decay, DEFAULT_WEIGHT_DECAY),
        "weight_decay_mode": (weight_decay_mode, "coupled"),
    }

    def options(keys: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        return {names[k]: values[k] for k in keys}

    if mode is None:
        warn_ignored_options(
            options(list(values)), f"{names['mode']} is None (off); set {names['mode']}='event' or 'continual'", 4
        )
    elif mode == "event":
        warn_ignored_options(
            options(["noise_std", "weight_decay", "weight_decay_mode"]), f"they only apply to {names['mode']}='continual'", 4
        )
    else:
        warn_ignored_options(options(["shrink", "perturb"]), f"they only apply to {names['mode']}='event'", 4)
        if float(noise_std) == 0 and float(weight_decay) == 0:
            warnings.warn(
                f"{names['mode']}='continual' with {names['noise_std']}=0 and {names['weight_decay']}=0 changes nothing: "
                "no decay and no noise; set one of them > 0",
                stacklevel=4,
            )


_CALLBACK_NAMES = {
    k: k for k in ("mode", "shrink", "perturb", "every", "on_task_change", "noise_std", "weight_decay", "weight_decay_mode")
}
_CONFIG_NAMES = {
    "mode": "shrink_perturb",
    "shrink": "shrink_factor",
    "perturb": "perturb_scale",
    "every": "shrink_perturb_every",
    "on_task_change": "shrink_perturb_on_task_change",
    "noise_std": "perturb_noise_std",
    "weight_decay": "shrink_weight_decay",
    "weight_decay_mode": "shrink_weight_decay_mode",
}


#: The seed of a :class:`ShrinkPerturb` callback's private generator (:func:`~sb3_plastic.callbacks.base.private_seed`).
shrink_perturb_seed = private_seed


# ---------------------------------------------------------------------------------------------------
# The callback
# ---------------------------------------------------------------------------------------------------
class ShrinkPerturb(PrivateRNGMixin, PlasticCallback):
    """Shrink & Perturb as an SB3 callback for PPO, A2C, DQN, QR-DQN, SAC, TQC, CrossQ, TD3, DDPG, RecurrentPPO
    and MaskablePPO (plastic or not).

    ``mode="event"`` (Ash & Adams, 2020, "On Warm-Starting Neural Network Training"): at each new-data
    event, ``theta <- shrink * theta + perturb * theta_fresh`` on the weight and bias of every Linear /
    Conv2d layer of every online network (heads included), ``theta_fresh`` a fresh draw of the initialiser
    the model used (:func:`sb3_plastic.callbacks.redo.model_layer_init`). Values are written in place; the
    optimizer state of every touched tensor is dropped; every target network is then hard-synced to its
    online network (DQN, QR-DQN, SAC, TQC), since a shrunk online net and an old target would disagree for
    a whole target period; the other interventions of the ``learn()`` call are told
    (:func:`~sb3_plastic.callbacks.base.announce_rewrite`, as :class:`~sb3_plastic.callbacks.LayerReset` says).
    Events: every ``every`` env steps and/or when ``info["task_id"]`` changes
    (``on_task_change``). Off-policy algorithms apply an event at once (in ``_on_step``, between env
    steps, never inside ``train()``); on-policy algorithms apply it at the next rollout start, after the
    current rollout has been trained on with the network that collected it (an event still pending when
    ``learn()`` ends is applied at training end, also between rollouts, as FIRE does); a task that starts exactly
    with a rollout (a task length that is a multiple of the rollout) is acted on at that rollout's start, before the
    task's first step (:meth:`~sb3_plastic.callbacks.base.TaskChangeWatch.changed_before_rollout`). ``every`` counts env steps
    since the last event; a new run (``learn()`` starting at ``num_timesteps == 0``: ``reset_num_timesteps=True`` or
    a fresh model) restarts that count and drops a pending event, a resumed run (``reset_num_timesteps=False``)
    continues it. An ``every`` that cannot be reached within a ``learn()`` call warns at its start (as FIRE's).

    ``mode="continual"`` (Dohare et al., 2024, "Loss of plasticity in deep continual learning", Nature), as
    their code runs it, on the weight and bias of every Linear / Conv2d layer (and recurrent layer) a network
    optimizer trains, at every step of that optimizer (``register_step_pre_hook`` / ``register_step_post_hook``,
    installed at training start, removed at training end):

    * ``weight_decay_mode="coupled"`` (default): before the step, ``grad <- grad + weight_decay * theta``
      (:func:`add_l2_gradient_`), exactly what torch's ``Adam(weight_decay=...)`` of the reference does inside its
      step; Adam / AdamO's moments see the sum and normalise it. In SB3 the step hook runs after ``train()``'s
      ``clip_grad_norm_``, so the L2 term is not clipped, as with ``optimizer_kwargs=dict(weight_decay=wd)``
      (bit for bit the same run for PPO with torch's Adam; tested). After the step ``.grad`` is restored to what
      ``backward()`` and the clipping left. Then the noise: ``theta <- theta + noise_std * N(0, I)``.
    * ``weight_decay_mode="decoupled"``: after the step, ``theta <- (1 - lr * weight_decay) * theta + noise_std *
      N(0, I)`` with ``lr`` the param group's current learning rate (:func:`continual_shrink_perturb_`).

    Only steps taken while the policy is in training mode (inside ``train()``) act. An optimizer whose ``step``
    calls a hooked parent ``step`` (AdamO) runs the hooks twice; the callback acts once per step (outermost
    call). The entropy-coefficient optimizer of SAC / TQC is not a network optimizer and is left alone, as are
    parameters that are not layer parameters (PPO's ``log_std``; the reference's Adam decays every parameter it
    holds, its policies having no such vector in the experiments this form comes from). Target networks
    follow by their own schedule. Nothing besides the counters is stateful: save -> load carries the settings
    (as keywords of the plastic algorithms) and ``noise_steps``.

    Randomness: ``theta_fresh`` and the continual noise are drawn from the callback's private generators (one
    ``torch.Generator`` per device), seeded by :func:`shrink_perturb_seed` from the model's ``seed`` (SB3's
    ``seed=``; ``torch.initial_seed()`` without one) and the callback's state key, never from torch's global
    generator: the run's action sampling and every other draw stay those of the same-seed run without Shrink &
    Perturb (spectral regularisation does the same for its power-iteration vectors). The fresh initialisers
    (:func:`~sb3_plastic.callbacks.redo.model_layer_init`, :func:`~sb3_plastic.recurrent.fresh_recurrent_parameters`)
    draw with ``torch.nn.init``, i.e. the global generator, so an event runs them inside ``torch.random.fork_rng``
    (the CPU and, for a CUDA model, its device) with the global state set from the private generator and read back
    after: the global state is unchanged afterwards. The generators' states are kept in ``self.state["rng"]``
    (saved with the model), so a resumed run continues the same stream; a state saved on another device type (a CUDA
    generator's state on a CPU model) cannot be used there and that device's generator restarts from the seed.

    Logged: ``plasticity/shrink_perturb/events`` (event mode), ``plasticity/shrink_perturb/noise_steps``
    (continual mode); ``shrink_perturb_<name>`` with a ``name`` other than the keywords' ``"auto"``.
    Persistent (``self.state``): ``events``, ``pending``, ``steps_since_event``,
    ``task_ids`` (with ``task_changes``), ``noise_steps``, ``rng`` (``seed`` and the generators'
    ``states`` per device).

    :param mode: ``"event"`` or ``"continual"``.
    :param shrink: ``lambda`` in (0, 1] (event mode; Ash & Adams: 0.4).
    :param perturb: ``p`` >= 0 (event mode; Ash & Adams: 0.1).
    :param every: event every this many env steps (``model.num_timesteps``), or ``None``.
    :param on_task_change: event once per task switch, when the first env copy's ``info["task_id"]`` changes
        (:class:`~sb3_plastic.callbacks.base.TaskChangeWatch`; warns once per ``learn()`` when the env's infos
        have no ``task_id``).
    :param noise_std: ``sigma`` >= 0 of the continual noise (Dohare et al.: 1e-4 .. 1e-6; default 1e-5).
    :param weight_decay: L2 strength >= 0 of the continual shrink (Dohare et al.: 1e-5 .. 1e-4; default 1e-4).
    :param weight_decay_mode: ``"coupled"`` (default, the reference: L2 in the gradient the optimizer sees) or
        ``"decoupled"`` (``theta *= 1 - lr * weight_decay`` after the step).
    :param name: distinguishes two ShrinkPerturb callbacks on one model.
    :param verbose: SB3 verbosity (1: print a line per event).
    """

    edits_layers = True  # refused with a plasticity injection (PlasticCallback._refuse_with_injection)

    def __init__(
        self,
        mode: str = "event",
        shrink: float = DEFAULT_SHRINK,
        perturb: float = DEFAULT_PERTURB,
        every: Optional[int] = None,
        on_task_change: bool = False,
        noise_std: float = DEFAULT_NOISE_STD,
        weight_decay: float = DEFAULT_WEIGHT_DECAY,
        weight_decay_mode: str = "coupled",
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        _check_settings(
            mode, shrink, perturb, every, on_task_change, noise_std, weight_decay, weight_decay_mode, _CALLBACK_NAMES
        )
        self.mode = mode
        self.shrink = float(shrink)
        self.perturb = float(perturb)
        self.every = None if every is None else int(every)
        self.on_task_change = bool(on_task_change)
        self.noise_std = float(noise_std)
        self.weight_decay = float(weight_decay)
        self.weight_decay_mode = weight_decay_mode
        self._init: LayerInit = default_layer_init
        self._on_policy = False
        self._last_timesteps = 0
        self._handles: list[RemovableHandle] = []
        option = "ShrinkPerturb on_task_change=True (shrink_perturb_on_task_change)"
        self._task_watch = TaskChangeWatch(option, "shrink and perturb")

    @property
    def log_prefix(self) -> str:
        return self.log_group("shrink_perturb")

    # ------------------------------------------------------------------ lifecycle
    def _init_callback(self) -> None:
        super()._init_callback()
        self._init = model_layer_init(self.model)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        for key, value in (
            ("events", 0),
            ("pending", False),
            ("steps_since_event", 0),
            ("task_ids", None),
            ("noise_steps", 0),
        ):
            self.state.setdefault(key, value)
        self._bind_private_rng()
        if int(self.model.num_timesteps) == 0:
            # a new run (reset_num_timesteps=True or a fresh model): nothing of the last run's count is carried over
            self.state["steps_since_event"] = 0
            self.state["pending"] = False
        self._init = model_layer_init(self.model)
        self._on_policy = isinstance(self.model, OnPolicyAlgorithm)
        self._last_timesteps = self.model.num_timesteps
        self._task_watch.start()
        self._remove_hooks()
        if self.mode == "continual":
            self._install_hooks()
        elif self.every is not None:
            start = int(self.model.num_timesteps)
            due = start + self.every - int(self.state["steps_since_event"])
            warn_unreachable(
                f"ShrinkPerturb every={self.every} (shrink_perturb_every)",
                due,
                start,
                expected_end_timesteps(self.model),
                f"the next event is due at num_timesteps {due}",
                "shrink and perturb",
            )

    def _on_training_end(self) -> None:
        self._remove_hooks()
        if self.mode == "event" and self._on_policy and self.state.get("pending"):
            self.apply()  # due at the last step: between rollouts, as FIRE's pending fire

    def _on_rollout_end(self) -> None:
        if self.mode == "event" and self.on_task_change:
            steps = int(self.model.num_timesteps) - int(getattr(self.model, "_num_timesteps_at_start", 0))
            self._task_watch.warn_if_blind(steps)
        if self.mode == "continual":
            self.record(f"{self.log_prefix}/noise_steps", self.state["noise_steps"])

    # ------------------------------------------------------------------ continual form
    def _install_hooks(self) -> None:
        by_opt: dict[int, tuple[th.optim.Optimizer, set[int]]] = {}
        for spec in self.networks:
            if spec.optimizer is None:
                continue
            ids = {
                id(p) for layer in spec.weight_layers() for p in (layer.weight, getattr(layer, "bias", None)) if p is not None
            }
            ids.update(id(p) for module in spec.recurrent for p in module.parameters())
            entry = by_opt.setdefault(id(spec.optimizer), (spec.optimizer, set()))
            entry[1].update(ids)
        for opt, ids in by_opt.values():
            before, after = self._make_hooks(ids)
            hooks = OutermostStepHooks(opt, after, before=before, active=lambda: self.model.policy.training)
            self._handles += hooks.handles

    def _make_hooks(self, ids: set[int]) -> tuple[Any, Any]:
        """``(before, after)`` the outermost steps of an optimizer (:class:`OutermostStepHooks`: once per update
        while training), for its parameters whose ``id`` is in ``ids``."""
        coupled = self.weight_decay_mode == "coupled"
        task_grads: list[tuple[th.Tensor, th.Tensor]] = []  # (p.grad, its value before the L2 term)

        def before(optimizer: th.optim.Optimizer) -> None:
            if not coupled or self.weight_decay == 0:
                return
            params = [p for group in optimizer.param_groups for p in group["params"] if id(p) in ids]
            task_grads[:] = [(p.grad, p.grad.clone()) for p in params if p.grad is not None]
            # in place: AdamO recognises the gradient tensor it has already seen (coupled isometry mode)
            add_l2_gradient_(params, self.weight_decay)

        def after(optimizer: th.optim.Optimizer) -> None:
            with th.no_grad():
                for grad, task_grad in task_grads:
                    grad.copy_(task_grad)
            task_grads.clear()
            decay = 0.0 if coupled else self.weight_decay
            for group in optimizer.param_groups:
                params = [p for p in group["params"] if id(p) in ids]
                if params:
                    gen = self.generator(params[0].device) if self.noise_std > 0 else None
                    continual_shrink_perturb_(params, group["lr"], decay, self.noise_std, gen)
                    if gen is not None:
                        self._store_generator(params[0].device)
            self.state["noise_steps"] = int(self.state.get("noise_steps", 0)) + 1

        return before, after

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ event form
    def _on_step(self) -> bool:
        if self.mode != "event":
            return True
        trigger = False
        delta = self.model.num_timesteps - self._last_timesteps
        self._last_timesteps = self.model.num_timesteps
        if self.every is not None:
            self.state["steps_since_event"] = int(self.state.get("steps_since_event", 0)) + max(delta, 0)
            if self.state["steps_since_event"] >= self.every:
                self.state["steps_since_event"] %= self.every
                trigger = True
        if self.on_task_change and self._task_watch.changed(self.locals.get("infos"), self.state):
            trigger = True
        if trigger:
            if self._on_policy:
                self.state["pending"] = True
            else:
                self.apply()
        return True

    def _on_rollout_start(self) -> None:
        if self.mode == "event" and self.on_task_change and self._on_policy and \
                self._task_watch.changed_before_rollout(self.training_env, self.state):
            self.state["pending"] = True  # a task that starts with this rollout (TaskChangeWatch.changed_before_rollout)
        if self.mode == "event" and self._on_policy and self.state.get("pending"):
            self.apply()

    def apply(self) -> list[nn.Parameter]:
        """Apply one shrink & perturb event now (all online networks; optimizer state of the touched tensors
        cleared; targets re-synced). Returns the touched parameters."""
        networks = self.networks or find_networks(self.model)
        layers = list({id(m): m for spec in networks for m in spec.weight_layers()}.values())
        recurrent = [m for spec in networks for m in spec.recurrent]
        device = next((m.weight.device for m in layers), None) or th.device(self.model.device)
        with self._private_global_rng(device):  # theta_fresh from the private stream, the global one untouched
            touched = shrink_perturb_(layers, self.shrink, self.perturb, self._init, [spec.optimizer for spec in networks])
            if recurrent:
                init, gain = recurrent_init_scheme(self.model)
                touched += shrink_perturb_recurrent_(
                    recurrent, self.shrink, self.perturb, init, gain, [spec.optimizer for spec in networks]
                )
        for spec in networks:
            for norm in norms_fed_by(spec, layers):
                reset_norm_(norm)  # CrossQ's BatchRenorm: statistics of the old weights no longer apply
            sync_target(spec)
        announce_rewrite(self.model, touched, self)  # spectral vectors, C-CHAIN's previous network
        self.state["pending"] = False
        self.state["events"] = int(self.state.get("events", 0)) + 1
        self.record(f"{self.log_prefix}/events", self.state["events"])
        if self.verbose >= 1:
            print(f"Shrink & Perturb event {self.state['events']} at {self.model.num_timesteps} env steps")
        return touched


@dataclass
class ShrinkPerturbConfig(InterventionConfig):
    """Shrink & Perturb settings as top-level keywords of the plastic algorithms (and rl_zoo3 / optuna).

    :param shrink_perturb: ``None`` (off), ``"event"`` (Ash & Adams) or ``"continual"`` (Dohare et al.).
    :param shrink_factor: ``lambda`` in (0, 1] of the event form.
    :param perturb_scale: ``p`` >= 0 of the event form.
    :param shrink_perturb_every: event every this many env steps (event form).
    :param shrink_perturb_on_task_change: event when ``info["task_id"]`` changes (event form; warns when the env has
        no ``task_id``).
    :param perturb_noise_std: noise std >= 0 of the continual form.
    :param shrink_weight_decay: L2 weight decay >= 0 of the continual form.
    :param shrink_weight_decay_mode: ``"coupled"`` (default; Dohare et al.'s code: ``wd * theta`` joins the gradient
        the optimizer sees, as torch Adam's ``weight_decay``) or ``"decoupled"`` (``theta *= 1 - lr * wd`` after each
        step).

    Fields set away from their defaults while the mode is ``None`` warn (``UserWarning``: they cannot act), as do
    the other form's fields (``perturb_noise_std`` / ``shrink_weight_decay*`` with ``"event"``, ``shrink_factor`` /
    ``perturb_scale`` with ``"continual"``) and a continual form with no noise and no decay; with ``"event"`` at least
    one trigger is required, with ``"continual"`` none may be set (``ValueError``).
    """

    shrink_perturb: Optional[str] = None
    shrink_factor: float = DEFAULT_SHRINK
    perturb_scale: float = DEFAULT_PERTURB
    shrink_perturb_every: Optional[int] = None
    shrink_perturb_on_task_change: bool = False
    perturb_noise_std: float = DEFAULT_NOISE_STD
    shrink_weight_decay: float = DEFAULT_WEIGHT_DECAY
    shrink_weight_decay_mode: str = "coupled"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        if self.shrink_perturb is not None and not isinstance(self.shrink_perturb, str):
            raise ValueError(f"Unknown shrink_perturb {self.shrink_perturb!r}; allowed: {list(MODES)} or None")
        _check_settings(
            self.shrink_perturb,
            self.shrink_factor,
            self.perturb_scale,
            self.shrink_perturb_every,
            self.shrink_perturb_on_task_change,
            self.perturb_noise_std,
            self.shrink_weight_decay,
            self.shrink_weight_decay_mode,
            _CONFIG_NAMES,
            allow_off=True,
        )

    @property
    def enabled(self) -> bool:
        """Whether Shrink & Perturb is on."""
        return self.shrink_perturb is not None

    def make_callback(self) -> Optional[ShrinkPerturb]:
        """The :class:`ShrinkPerturb` callback for these settings, or ``None`` when it is off."""
        if not self.enabled:
            return None
        assert self.shrink_perturb is not None
        return ShrinkPerturb(
            mode=self.shrink_perturb,
            shrink=self.shrink_factor,
            perturb=self.perturb_scale,
            every=self.shrink_perturb_every,
            on_task_change=self.shrink_perturb_on_task_change,
            noise_std=self.perturb_noise_std,
            weight_decay=self.shrink_weight_decay,
            weight_decay_mode=self.shrink_weight_decay_mode,
        )



#: Names of the Shrink & Perturb keywords, in signature order.
SHRINK_PERTURB_KEYS: tuple[str, ...] = tuple(ShrinkPerturbConfig.__dataclass_fields__)
