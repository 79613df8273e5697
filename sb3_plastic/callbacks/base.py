"""Base class of the plasticity interventions: SB3 callbacks that work on any supported algorithm."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

from sb3_plastic.common.surgery import NetworkSpec, find_networks, model_state


@contextlib.contextmanager
def preserved_numpy_rng() -> Iterator[None]:
    """Run the block with numpy's global random state saved and restored afterwards.

    Probe batches are drawn with numpy's global generator (SB3's buffers sample with it); restoring it means a
    callback that only looks (or finds nothing to reset) leaves the run on the trajectory it would follow
    without the callback.
    """
    state = np.random.get_state()
    try:
        yield
    finally:
        np.random.set_state(state)


def warn_ignored_options(options: Mapping[str, tuple[Any, Any]], reason: str, stacklevel: int = 3) -> list[str]:
    """Warn that options set away from their default cannot act (an option that cannot act says so).

    :param options: ``keyword -> (value, default)``; those whose value differs from the default are named.
    :param reason: why they cannot act, e.g. ``"shrink_perturb is None (off)"``.
    :param stacklevel: passed to ``warnings.warn``.
    :return: the ``"keyword=value"`` texts warned about (empty: no warning).
    """
    changed = [f"{name}={value!r}" for name, (value, default) in options.items() if not _same(value, default)]
    if changed:
        verb = "is" if len(changed) == 1 else "are"
        warnings.warn(f"{', '.join(changed)} {verb} ignored: {reason}", stacklevel=stacklevel)
    return changed


def _same(value: Any, default: Any) -> bool:
    try:
        return value is default or bool(value == default)
    except (TypeError, ValueError, RuntimeError):  # e.g. an array: not a default value
        return False


class InterventionConfig:
    """Base of the intervention configs: dataclasses whose documented fields are the top-level keywords of the plastic
    algorithms (and rl_zoo3 yaml keys / optuna parameters). A config validates itself when built (:meth:`validate`
    raises ``ValueError`` naming the bad value and what is allowed) and makes its callback when :attr:`enabled`."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad value and what is allowed."""
        raise NotImplementedError

    @property
    def enabled(self) -> bool:
        """Whether the intervention is on."""
        raise NotImplementedError

    def make_callback(self) -> Optional[BaseCallback]:
        """The intervention's callback, or ``None`` when it is off."""
        raise NotImplementedError

    def to_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def changed_fields(config: Any, names: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """``name -> (value, default)`` of the dataclass fields ``names`` of ``config`` (for :func:`warn_ignored_options`)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return {name: (getattr(config, name), defaults[name]) for name in names}


def warn_unreachable(option: str, due: int, start: int, end: int, due_text: str, action: str, stacklevel: int = 3) -> bool:
    """Warn when a trigger set for this ``learn()`` call is due after its end, so it cannot act in it (shared by
    :class:`~sb3_plastic.callbacks.FIRE` and :class:`~sb3_plastic.callbacks.ShrinkPerturb`).

    :param option: the user-facing option, e.g. ``"FIRE every=1000 (fire_every)"``.
    :param due: the ``num_timesteps`` at which the trigger is next due.
    :param start: ``num_timesteps`` at the start of the call.
    :param end: the expected ``num_timesteps`` at its end (:func:`~sb3_plastic.callbacks.schedule.expected_end_timesteps`).
    :param due_text: how the due point is described, e.g. ``"the next multiple of 1000 is 1000"``.
    :param action: what the option would do (``"fire"``).
    :return: whether it warned.
    """
    if due <= end:
        return False
    warnings.warn(
        f"{option} is longer than this call: this learn() call runs num_timesteps {start} -> {end} and {due_text}, "
        f"so it does not {action} in this call",
        stacklevel=stacklevel,
    )
    return True


def iter_callbacks(callback: Any) -> Iterator[BaseCallback]:
    """Every callback in ``callback`` (a callback, a list / tuple of them or a ``CallbackList``), depth first, with the
    callbacks SB3's callbacks hold (``EvalCallback``'s ``callback_on_new_best`` / ``callback_after_eval``, an
    ``EveryNTimesteps``' ``callback``)."""
    if isinstance(callback, (list, tuple)):
        for item in callback:
            yield from iter_callbacks(item)
        return
    if not isinstance(callback, BaseCallback):
        return
    yield callback
    if isinstance(callback, CallbackList):
        yield from iter_callbacks(callback.callbacks)
    for attribute in ("callback", "callback_on_new_best", "callback_after_eval"):
        child = getattr(callback, attribute, None)
        if isinstance(child, BaseCallback) and child is not callback:
            yield from iter_callbacks(child)


def canonical_task_id(value: Any) -> Any:
    """A task id as it compares after SB3's save -> load (JSON when possible: tuples become lists, numpy
    scalars and 0-d tensors plain numbers), so that a reloaded id equals the one the env reports."""
    if isinstance(value, (list, tuple)):
        return [canonical_task_id(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


class TaskChangeWatch:
    """Sees task changes in the ``info["task_id"]`` of each env copy; shared by the interventions that act
    "on a task change" (:class:`~sb3_plastic.callbacks.FIRE`, :class:`~sb3_plastic.callbacks.ShrinkPerturb`,
    :class:`~sb3_plastic.callbacks.LayerReset`, :class:`~sb3_plastic.callbacks.PlasticityInjection`,
    :class:`~sb3_plastic.callbacks.ChurnReduction`'s coefficient restart).

    A copy switches when its ``task_id`` differs from the last one that copy reported (the first id seen only
    sets the baseline; infos without a ``task_id`` keep the copy's last id; an id may come back, A -> B -> A is
    two switches). The copies of a vector env run one task sequence, so their ``j``-th switches are the same task
    switch: :meth:`changed` reports it **once, at the first copy that makes it**. The copies of an
    ``at_episode_end=True`` env (or any copies not in lockstep) switch at their own episode ends, at different
    steps; the later copies' switches to a task already acted on report nothing (with copies in lockstep all
    switch at one step: one change). Per copy, the switches counted so far are ``state["task_changes"]``; the
    switches reported are the largest count; a copy that skipped a task (a long
    episode under ``at_episode_end``) counts one switch where the others count two, so it does not report again
    when it catches up. The last ids and the counts live in the caller's persistent state
    (``state["task_ids"]``), so they survive save -> load and a resumed run (whose schedule continues,
    :class:`~sb3_plastic.callbacks.TaskScheduleSync`) sees no change at its restart; a call with another number
    of copies starts a new baseline.

    An option that cannot act must say so: :meth:`warn_if_blind` warns once per ``learn()`` call when no
    info of the training env had a ``task_id`` (called at the end of the first rollout).

    :param option: the user-facing name of the option, for the warning (e.g. ``"FIRE on_task_change=True"``).
    :param action: what the option would do, for the warning (e.g. ``"fire"``).
    """

    def __init__(self, option: str, action: str) -> None:
        self.option = option
        self.action = action
        self.seen = False
        self._warned = False

    def start(self) -> None:
        """A new ``learn()`` call: forget whether a ``task_id`` was seen."""
        self.seen = False
        self._warned = False

    def changed(self, infos: Optional[Sequence[Any]], state: dict[str, Any]) -> bool:
        """Whether a task switch not reported yet happened in ``infos``: some env copy's ``task_id`` differs from
        its last one in ``state["task_ids"]`` and that copy has now made more switches than any copy before it
        (``state`` updated in place; see the class docstring)."""
        if not infos:
            return False
        ids = [canonical_task_id(info.get("task_id")) if isinstance(info, dict) else None for info in infos]
        self.seen = self.seen or any(i is not None for i in ids)
        previous = state.get("task_ids")
        counts = [0] * len(ids)  # a new baseline (first infos, or another number of copies)
        changed = False
        if previous is not None and len(previous) == len(ids):
            before = state.get("task_changes")
            if isinstance(before, list) and len(before) == len(ids):  # else a state saved before the counts
                counts = [int(c) for c in before]
            reported = max(counts)  # the switches already acted on: the most any copy has made
            counts = [c + (new is not None and old is not None and new != old) for c, old, new in zip(counts, previous, ids)]
            changed = max(counts) > reported
            ids = [old if new is None else new for old, new in zip(previous, ids)]
        state["task_ids"] = ids
        state["task_changes"] = counts
        return changed

    def changed_before_rollout(self, env: Any, state: dict[str, Any]) -> bool:
        """:meth:`changed` for the tasks the copies of the vector env ``env`` will run at their next step
        (:func:`~sb3_plastic.callbacks.schedule.upcoming_task_infos`), read at an on-policy rollout start: a task that
        starts exactly at the rollout boundary is in no step info yet (the env's next step switches), and an
        on-policy intervention that waited for it would act one rollout late, after the new task's first rollout had
        been collected and trained on by the old networks. Copies that are not piecewise-stationary report nothing
        here (their switches are seen in their infos, as before)."""
        from sb3_plastic.callbacks.schedule import upcoming_task_infos

        return env is not None and self.changed(upcoming_task_infos(env), state)

    def warn_if_blind(self, timesteps: int) -> None:
        """Warn (once per ``learn()`` call) when no ``task_id`` was seen in the first ``timesteps`` timesteps."""
        if self.seen or self._warned:
            return
        self._warned = True
        warnings.warn(
            f"{self.option} but no info of the training env had a 'task_id' in the first {timesteps} timesteps of "
            f"this learn() call: it cannot see a task change and will not {self.action} on one. Use a "
            "piecewise-stationary env (sb3_plastic.envs) or put info['task_id'] in your env's step infos",
            stacklevel=3,
        )


#: the attribute plasticity injection sets on each output layer that carries injected branches
INJECTION_SOURCES_ATTR = "_injection_sources"

#: the PlasticCallbacks of each model's current ``learn()`` call (weak references, tagged with SB3's ``start_time``
#: of the call, so that callbacks of an earlier call do not count)
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def announce_rewrite(
    model: Any, params: Sequence[th.Tensor], source: Optional[BaseCallback] = None, *, redrawn: bool = False
) -> None:
    """Tell the other plastic callbacks of ``model``'s current ``learn()`` call that ``params`` were rewritten in place
    outside an optimizer step (a :class:`~sb3_plastic.callbacks.LayerReset` re-draw, a
    :class:`~sb3_plastic.callbacks.FIRE` polar factor, a :class:`~sb3_plastic.callbacks.ShrinkPerturb` event): each
    gets :meth:`PlasticCallback._on_parameters_rewritten`, so that state it derived from the old values (a spectral
    regulariser's power-iteration vectors, C-CHAIN's previous network) does not silently outlive them.

    :param model: the SB3 model whose parameters were rewritten.
    :param params: the rewritten tensors.
    :param source: the callback that rewrote them (not told).
    :param redrawn: whether whole layers were re-drawn from their initialiser (their units are new units: Continual
        Backprop restarts their statistics), not transformed.
    """
    start = getattr(model, "start_time", None)
    for ref, t in list(_ACTIVE.get(model, [])):
        callback = ref()
        if callback is not None and callback is not source and t == start:
            callback._on_parameters_rewritten(params, redrawn=redrawn)


def has_injected_branches(model: Any) -> bool:
    """Whether a plasticity injection has added branches to ``model``'s policy."""
    return any(hasattr(m, INJECTION_SOURCES_ATTR) for m in model.policy.modules())


class PlasticCallback(BaseCallback):
    """An SB3 ``BaseCallback`` that knows the model's networks and keeps persistent state on the model.

    * ``self.networks``: :func:`sb3_plastic.common.surgery.find_networks` of the model, refreshed at each
      training start (a loaded model has new modules and optimizers).
    * ``self.state``: a dict stored in ``model.plastic_state[self.state_key]`` (a
      :class:`~sb3_plastic.common.surgery.PlasticStateStore`); SB3's ``save`` pickles it
      with the model and ``load`` restores it, so counters and statistics survive save -> load -> learn
      when the same callback (same ``name``) is passed to ``learn`` again.
    * :meth:`record`: logs under ``plasticity/<key>`` through SB3's logger.

    :param name: distinguishes two callbacks of the same class on one model (part of ``state_key``).
    :param verbose: SB3 verbosity.
    """

    #: this intervention edits the network's layers in place (re-initialises, shrinks or replaces units): after a
    #: plasticity injection those edits would reach the frozen old head, which never trains again, and miss the
    #: injected branch, so the two are refused together (:meth:`_refuse_with_injection`)
    edits_layers: ClassVar[bool] = False
    #: this intervention adds plasticity-injection branches
    injects_layers: ClassVar[bool] = False

    def __init__(self, name: Optional[str] = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.name = name
        self.networks: list[NetworkSpec] = []
        self.state: dict[str, Any] = {}

    @property
    def state_key(self) -> str:
        """Key of this callback's persistent state on the model."""
        return type(self).__name__ if self.name is None else f"{type(self).__name__}:{self.name}"

    def _init_callback(self) -> None:
        self.networks = find_networks(self.model)
        self.state = model_state(self.model, self.state_key)

    def _on_training_start(self) -> None:
        # learn() may be called on a freshly loaded model: rebind to its modules and state.
        self.networks = find_networks(self.model)
        self.state = model_state(self.model, self.state_key)
        self._refuse_with_injection()

    def _refuse_with_injection(self) -> None:
        """Register this callback as active in the model's current ``learn()`` and raise ``ValueError`` when a layer
        editing intervention (:attr:`edits_layers`) meets a plasticity injection in it, or a model that carries
        injected branches already (a loaded one)."""
        start = getattr(self.model, "start_time", None)
        active = [(ref, t) for ref, t in _ACTIVE.get(self.model, []) if ref() not in (None, self) and t == start]
        _ACTIVE[self.model] = [*active, (weakref.ref(self), start)]
        others = [ref() for ref, _ in active]
        clash = None
        if self.edits_layers:
            injector = next((o for o in others if o.injects_layers), None)
            if injector is not None:
                clash = f"{type(self).__name__} and {type(injector).__name__} are both passed to learn()"
            elif has_injected_branches(self.model):
                clash = f"{type(self).__name__} is passed to learn() on a model that carries injected branches"
        elif self.injects_layers:
            editor = next((o for o in others if o.edits_layers), None)
            if editor is not None:
                clash = f"{type(self).__name__} and {type(editor).__name__} are both passed to learn()"
        if clash is not None:
            raise ValueError(
                f"{clash}: a plasticity injection freezes the old head and adds a trainable branch beside it; an "
                "intervention that edits layers in place (LayerReset, FIRE, ShrinkPerturb, ContinualBackprop, ReDo) "
                "would re-initialise or shrink the frozen layers, which never train again, and not touch the branch. "
                "Use one of the two on a model (penalties such as L2Init, WeightClipping or spectral / Parseval "
                "regularisation combine with an injection)")

    def _on_step(self) -> bool:
        return True

    def _on_parameters_rewritten(self, params: Sequence[th.Tensor], redrawn: bool = False) -> None:
        """Another intervention of the same ``learn()`` call rewrote ``params`` in place outside an optimizer step
        (:func:`announce_rewrite`; ``redrawn``: whole layers got a new draw of their initialiser). Nothing by default;
        callbacks that keep state derived from parameter values override it."""

    def log_group(self, group: str) -> str:
        """The first part of this callback's log keys: ``group`` (e.g. ``"fire"``) for an unnamed callback and for
        the one an algorithm's keywords build (named ``"auto"``), ``<group>_<name>`` for a named one, so that two
        named callbacks of one class on one model log apart (``plasticity/layer_reset_policy/count`` beside
        ``plasticity/layer_reset_value/count``)."""
        return group if self.name in (None, "auto") else f"{group}_{self.name}"

    def record(self, key: str, value: Any) -> None:
        """``logger.record("plasticity/<key>", value)`` for TensorBoard / CSV / JSON.

        Kept out of the stdout table and text log: SB3 truncates keys there to 36 characters and raises
        when two per-layer keys truncate to the same text.
        """
        self.logger.record(f"plasticity/{key}", value, exclude=("stdout", "log"))

    @property
    def gradient_steps(self) -> int:
        """Gradient updates done so far by the model (SB3's ``_n_updates``; PPO counts epochs)."""
        return int(getattr(self.model, "_n_updates", 0))


def private_seed(model_seed: Optional[int], key: str) -> int:
    """The seed of a callback's private generator (:class:`PrivateRNGMixin`): derived (``numpy.random.SeedSequence``)
    from the model's ``seed`` (``torch.initial_seed()`` when the model has none) and the callback's state key, so it
    differs from the stream SB3 seeds torch with and between two callbacks on one model."""
    base = int(th.initial_seed() if model_seed is None else model_seed) % 2**63
    return int(np.random.SeedSequence([base, zlib.crc32(key.encode())]).generate_state(1)[0])


class PrivateRNGMixin:
    """Private random numbers for a :class:`PlasticCallback` that draws (a fresh initialisation, noise): one
    ``torch.Generator`` per device, seeded by :func:`private_seed` from the model's ``seed`` and the callback's state
    key, never torch's global generator, so the run's action sampling and every other draw stay those of the
    same-seed run without the callback. Initialisers that draw with ``torch.nn.init`` (the global generator) run
    inside :meth:`_private_global_rng`, which sets the global state from the private generator and reads it back
    after (the global state is unchanged afterwards). The generators' states are kept in ``self.state["rng"]``
    (``seed`` and ``states`` per device, saved with the model), so a resumed run continues the same stream; a state
    saved on another device type cannot be used there and that device's generator restarts from the seed.

    Call :meth:`_bind_private_rng` at training start (after the state is bound). Used by
    :class:`~sb3_plastic.callbacks.ShrinkPerturb`, :class:`~sb3_plastic.callbacks.LayerReset` and
    :class:`~sb3_plastic.callbacks.PlasticityInjection`.
    """

    model: Any
    state: dict[str, Any]
    state_key: str

    def _bind_private_rng(self) -> None:
        """Create ``self.state["rng"]`` if absent and forget the generators built so far (a loaded model brings its
        own states)."""
        if not isinstance(self.state.get("rng"), dict):
            seed = private_seed(getattr(self.model, "seed", None), self.state_key)
            self.state["rng"] = {"seed": seed, "states": {}}
        self._generators: dict[str, th.Generator] = {}

    def generator(self, device: Union[str, th.device]) -> th.Generator:
        """The private generator of ``device``, restored from ``self.state["rng"]``."""
        device = th.device(device)
        key = str(device)
        generators = self.__dict__.setdefault("_generators", {})
        gen = generators.get(key)
        if gen is None:
            rng = self.state.get("rng")
            if not isinstance(rng, dict):
                rng = self.state["rng"] = {"seed": private_seed(getattr(self.model, "seed", None), self.state_key)}
            gen = th.Generator(device=device)
            saved = rng.setdefault("states", {}).get(key)
            try:
                if saved is None:
                    raise ValueError
                gen.set_state(saved.cpu())
            except (ValueError, RuntimeError, TypeError):
                gen.manual_seed(int(rng["seed"]))
            generators[key] = gen
        return gen

    def _store_generator(self, device: th.device) -> None:
        self.state["rng"]["states"][str(device)] = self._generators[str(device)].get_state()

    @contextlib.contextmanager
    def _private_global_rng(self, device: th.device) -> Iterator[None]:
        """Run the block with torch's global generators (CPU, and ``device`` if it is a CUDA device) set from the
        private ones, whose states advance by what the block drew; the global states are restored afterwards."""
        cpu = th.device("cpu")
        cuda = device if device.type == "cuda" else None
        if cuda is not None and cuda.index is None:
            cuda = th.device("cuda", th.cuda.current_device())
        with th.random.fork_rng(devices=[] if cuda is None else [cuda.index]):
            th.random.set_rng_state(self.generator(cpu).get_state())
            if cuda is not None:
                th.cuda.set_rng_state(self.generator(cuda).get_state(), cuda)
            yield
            self.generator(cpu).set_state(th.random.get_rng_state())
            self._store_generator(cpu)
            if cuda is not None:
                self.generator(cuda).set_state(th.cuda.get_rng_state(cuda))
                self._store_generator(cuda)
