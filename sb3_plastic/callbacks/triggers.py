"""When a one-shot intervention acts: at a point of the run, every N timesteps, or at a task change.

:class:`TriggeredIntervention` is the trigger machinery shared by the interventions that rewrite the networks now and
then (:class:`~sb3_plastic.callbacks.FIRE`, :class:`~sb3_plastic.callbacks.LayerReset`,
:class:`~sb3_plastic.callbacks.PlasticityInjection`): the triggers ``at`` / ``every`` / ``on_task_change``, their
persistent state (a run's planned point survives save -> load), the warnings of a trigger that cannot act, and the
rule that an on-policy algorithm is rewritten only between a ``train()`` and the next rollout. A subclass says what
one event does (:meth:`TriggeredIntervention._act`) and how its options are spelt in messages (:attr:`title`,
:attr:`keyword_prefix`, :attr:`action`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, Union

from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_plastic.callbacks.base import PlasticCallback, TaskChangeWatch, warn_unreachable
from sb3_plastic.callbacks.schedule import expected_end_timesteps

#: ``at`` left unset: the subclass's default point (FIRE: the midpoint when no other trigger is given).
UNSET: Any = object()


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (numpy integers included) and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int_at_least(name: str, value: Any, low: int) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int >= ``low``."""
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_at(name: str, value: Any) -> None:
    """An ``at`` trigger: ``None``, a float fraction in (0, 1) of the ``learn()`` call, or an int timestep >= 1."""
    if value is None:
        return
    if is_int(value):
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


def check_every(name: str, value: Any) -> None:
    """An ``every`` trigger: ``None`` or an int >= 1."""
    if value is not None:
        check_int_at_least(name, value, 1)


def check_bool(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


class TriggeredIntervention(PlasticCallback):
    """A callback that acts on the networks at chosen moments (see the module docstring).

    Off-policy algorithms act in ``_on_step`` (between gradient steps). On-policy algorithms (``OnPolicyAlgorithm``:
    PPO, A2C, ...) only note in ``_on_step`` that an event is due and act in ``_on_rollout_start``, i.e. after the
    previous rollout's ``train()`` and before the next rollout's first action: the next rollout is collected by the
    new weights and its stored log-probs and values stay consistent. An event still pending when ``learn()`` ends is
    performed in ``_on_training_end``, also between rollouts. Several triggers due at once give one event.

    Triggers:

    * ``at`` float in (0, 1): a fraction of a training *run*. A run starts with a ``learn()`` call that starts from
      ``num_timesteps == 0`` (SB3's default ``reset_num_timesteps=True``, or a fresh model) and continues through
      later calls with ``reset_num_timesteps=False``. At the first call of a run the point
      ``T = start + round(at * total_timesteps)`` (absolute ``num_timesteps``) is fixed and stored in the model; the
      event happens once, at the first step with ``num_timesteps >= T``. Continuation calls (save -> load ->
      ``learn(..., reset_num_timesteps=False)``) keep that point. With ``learn()`` in chunks the fraction is of the
      *first* chunk.
    * ``at`` int >= 1: at the first step with ``num_timesteps >= at``, once per run (a point already passed when a
      run's plan is made does not act).
    * ``every`` N: whenever ``num_timesteps`` passes a multiple of N (on-policy events are coalesced to the next
      rollout boundary).
    * ``on_task_change``: once per task switch, at the first env copy whose ``info["task_id"]`` differs from the
      last one seen for that copy; copies that switch later (``at_episode_end=True``: each at its own episode end)
      do not act again for the same switch (:class:`~sb3_plastic.callbacks.base.TaskChangeWatch`; the last ids
      are kept in the model's state). On-policy, a switch inside a rollout acts at the next rollout start; a task
      that starts exactly with a rollout (a task length that is a multiple of the rollout, as in TRAC's and
      C-CHAIN's protocols) acts at that rollout's start, before the task's first step, read from the env's
      :attr:`~sb3_plastic.envs.PiecewiseStationaryWrapper.next_task_id` (``TaskChangeWatch.changed_before_rollout``),
      so the task's first rollout is collected by the rewritten networks.

    A trigger that cannot act warns (``UserWarning``): ``at`` due after the end of the ``learn()`` call, an int
    ``at`` already passed, ``every`` with no multiple inside the call, ``on_task_change`` when no info of the first
    rollout has a ``task_id``.

    Persistent state (``self.state``): ``count``, ``timesteps`` (the ``num_timesteps`` of every event), ``reasons``,
    ``run``, ``at_spec``, ``at_point``, ``at_done``, ``every_spec``, ``every_done``, ``task_ids`` (with ``task_changes``:
    :class:`~sb3_plastic.callbacks.base.TaskChangeWatch`), ``pending``.

    :param at: see above (``None``: off).
    :param every: act every ``every`` timesteps, or ``None``.
    :param on_task_change: act when ``info["task_id"]`` changes.
    :param name: distinguishes several callbacks of one class on one model (separate persistent state).
    :param verbose: SB3 verbosity.
    :raises ValueError: for a bad trigger, or when no trigger is set.
    """

    #: the intervention's name in messages (``"FIRE"``)
    title = "intervention"
    #: prefix of the keywords of the plastic algorithms (``"fire"``: ``fire_at``, ``fire_every``, ...)
    keyword_prefix = "intervention"
    #: what one event does, as a verb (``"fire"``)
    action = "act"

    def __init__(
        self,
        at: Optional[Union[float, int]] = None,
        every: Optional[int] = None,
        on_task_change: bool = False,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        check_at("at", at)
        check_every("every", every)
        check_bool("on_task_change", on_task_change)
        if at is None and every is None and not on_task_change:
            raise ValueError(
                f"{self.title} needs a trigger: set at (fraction in (0, 1) or int timestep), every, or on_task_change"
            )
        self.at = at
        self.every = every
        self.on_task_change = on_task_change
        self._on_policy = False
        self._task_watch = TaskChangeWatch(self._option("on_task_change", True), self.action)
        self._at_skipped = False

    def _option(self, key: str, value: Any) -> str:
        """The option as the user may have typed it: ``"FIRE at=0.5 (fire_at)"``."""
        return f"{self.title} {key}={value!r} ({self.keyword_prefix}_{key})"

    # -- what one event does ----------------------------------------------------------------------------

    def _act(self, reasons: list[str]) -> None:
        """Perform one event now (``reasons``: the triggers that are due, e.g. ``["task_change"]``); the subclass's
        work. Call :meth:`_count_event` from it."""
        raise NotImplementedError

    def _count_event(self, reasons: list[str]) -> int:
        """Record one event in the persistent state (count, timestep, reasons; nothing pending any more); returns the
        new count."""
        s = self.state
        s["count"] += 1
        s["timesteps"].append(int(self.model.num_timesteps))
        s["reasons"].append("+".join(reasons))
        s["pending"] = []
        return int(s["count"])

    # -- state -------------------------------------------------------------------------------------------

    @property
    def event_count(self) -> int:
        """Events performed on this model so far (persistent)."""
        return int(self.state.get("count", 0))

    @property
    def event_timesteps(self) -> list[int]:
        """``num_timesteps`` at each event (persistent)."""
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
        at_key = None if self.at is None else f"{'int' if is_int(self.at) else 'float'}:{self.at!r}"
        if new_run or s["at_spec"] != at_key:
            s["at_spec"] = at_key
            s["at_done"] = False
            if self.at is None:
                s["at_point"] = None
            elif is_int(self.at):
                s["at_point"] = int(self.at)
                s["at_done"] = now >= int(self.at) and now > 0
                self._at_skipped = s["at_done"]
            else:
                # _total_timesteps is the absolute end of this learn() call (SB3 adds num_timesteps to it
                # when reset_num_timesteps=False)
                span = int(self.model._total_timesteps) - now
                s["at_point"] = now + max(1, round(float(self.at) * span))
            if self.verbose >= 1 and s["at_point"] is not None and not s["at_done"]:
                meaning = (
                    f"a fraction of the run that starts at num_timesteps {now} and ends at {int(self.model._total_timesteps)} "
                    "(this learn() call's total_timesteps); with learn() in chunks it falls inside the first chunk"
                    if not is_int(self.at)
                    else "an absolute num_timesteps"
                )
                print(f"{self.title} at={self.at!r} planned at num_timesteps {s['at_point']} ({meaning})")
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
        """Warn when a trigger set for this call cannot act in it (``at`` past the call's end or already passed,
        ``every`` longer than the call): such an intervention would otherwise do nothing and say nothing."""
        s = self.state
        start = int(self.model.num_timesteps)
        end = expected_end_timesteps(self.model)
        span = f"this learn() call runs num_timesteps {start} -> {end}"
        if s["at_point"] is not None and not s["at_done"] and s["at_point"] > end:
            warnings.warn(
                f"{self._option('at', self.at)} is due at num_timesteps {s['at_point']}, beyond the end of this run: "
                f"{span}, so it does not {self.action} in this call (only in a later learn(..., reset_num_timesteps=False))",
                stacklevel=2,
            )
        elif self._at_skipped:
            warnings.warn(
                f"{self._option('at', self.at)} has already passed: {span}; an int at is an absolute num_timesteps "
                f"(use a float in (0, 1) for a fraction of the call), so it does not {self.action} in this run",
                stacklevel=2,
            )
        if self.every:
            due = (s["every_done"] + 1) * self.every
            warn_unreachable(
                f"{self.title} every={self.every} ({self.keyword_prefix}_every)",
                due,
                start,
                end,
                f"the next multiple of {self.every} is {due}",
                self.action,
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
        if self.on_task_change and self._task_watch.changed(self.locals.get("infos"), self.state):
            reasons.append("task_change")
        return reasons

    def _on_step(self) -> bool:
        reasons = self._due()
        if reasons:
            if self._on_policy:
                self.state["pending"].extend(r for r in reasons if r not in self.state["pending"])
            else:
                self._act(reasons)
        return True

    def _on_rollout_start(self) -> None:
        if self._on_policy and self.on_task_change and \
                self._task_watch.changed_before_rollout(self.training_env, self.state):
            if "task_change" not in self.state["pending"]:
                self.state["pending"].append("task_change")  # a task that starts with this rollout
        if self.state["pending"]:
            self._act(list(self.state["pending"]))

    def _on_rollout_end(self) -> None:
        if self.on_task_change:
            steps = int(self.model.num_timesteps) - int(getattr(self.model, "_num_timesteps_at_start", 0))
            self._task_watch.warn_if_blind(steps)

    def _on_training_end(self) -> None:
        if self.state["pending"]:
            self._act(list(self.state["pending"]))
