"""The task schedule follows the model: :class:`TaskScheduleSync`.

A piecewise-stationary env (:class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`) counts the
steps of its own env copy: ``change_every`` is a number of *env steps of each env copy*. The copies of an
SB3 vector env step in lockstep, so after ``num_timesteps`` model timesteps each of the ``n_envs`` copies
has taken ``num_timesteps // n_envs`` steps, and task ``k`` covers the model timesteps
``[k * change_every * n_envs, (k + 1) * change_every * n_envs)``: a task lasts ``change_every * n_envs``
model timesteps.

The model's ``num_timesteps`` is the clock; :class:`TaskScheduleSync` makes the env's counters agree with
it at the start of every ``learn()`` call. So save -> load -> ``learn(reset_num_timesteps=False)``
continues the task sequence where the saved model left it (a freshly made env would otherwise start again
at task 0), and a ``learn()`` call with ``reset_num_timesteps=True`` (SB3's default), which restarts
``num_timesteps`` at 0, restarts the task sequence at task 0 too. It also says how many tasks the call
will see and warns when a run will see fewer than two.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecEnv

from sb3_plastic.common.surgery import model_state


def expected_end_timesteps(model: BaseAlgorithm, total_timesteps: Optional[int] = None) -> int:
    """The ``num_timesteps`` at which the current ``learn()`` call will stop.

    SB3 stops at the first rollout boundary at or after ``total_timesteps`` (the absolute target, SB3's
    ``model._total_timesteps``): on-policy algorithms collect ``n_steps * n_envs`` timesteps per rollout,
    off-policy ones ``train_freq * n_envs`` (``train_freq`` in steps; in episodes the end is unknown and
    ``total_timesteps`` is returned).

    :param model: a model inside ``learn()`` (after SB3's ``_setup_learn``).
    :param total_timesteps: absolute target; default ``model._total_timesteps``.
    :return: the expected final ``num_timesteps``.
    """
    total = int(model._total_timesteps if total_timesteps is None else total_timesteps)
    start = int(model.num_timesteps)
    if total <= start:
        return start
    n_envs = int(model.n_envs)
    if isinstance(model, OnPolicyAlgorithm):
        chunk = int(model.n_steps) * n_envs
    else:
        train_freq = getattr(model, "train_freq", None)
        if train_freq is None or getattr(train_freq, "unit", None) != TrainFrequencyUnit.STEP:
            return total
        chunk = int(train_freq.frequency) * n_envs
    return start + math.ceil((total - start) / chunk) * chunk


def schedule_wrapper_class() -> type:
    """:class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper` (imported lazily)."""
    from sb3_plastic.envs.wrappers import PiecewiseStationaryWrapper

    return PiecewiseStationaryWrapper


def piecewise_stationary_copies(env: VecEnv) -> list[int]:
    """Indices of the copies of ``env`` wrapped in a :class:`~sb3_plastic.envs.PiecewiseStationaryWrapper`.

    SB3's vector-env wrappers (``VecNormalize``, ``VecFrameStack``, ``VecTransposeImage``, ``VecMonitor``, ...)
    forward ``env_is_wrapped`` to the vector env they wrap, and each copy's gymnasium wrapper chain is
    searched, so the wrapper is found under any of them.

    :param env: a vector env.
    :return: the copy indices (empty for a stationary env).
    """
    wrapped = env.env_is_wrapped(schedule_wrapper_class())
    return [i for i, flag in enumerate(wrapped) if flag]


def upcoming_task_infos(env: VecEnv) -> Optional[list[dict[str, Any]]]:
    """For each copy of ``env``, ``{"task_id": k}`` with ``k`` the task of its next step
    (:attr:`~sb3_plastic.envs.PiecewiseStationaryWrapper.next_task_id`; ``{}`` for a copy that is not
    piecewise-stationary), in the form of step infos; ``None`` when no copy is piecewise-stationary."""
    copies = piecewise_stationary_copies(env)
    if not copies:
        return None
    infos: list[dict[str, Any]] = [{} for _ in range(env.num_envs)]
    for i, task in zip(copies, env.get_attr("next_task_id", copies)):
        if task is not None:
            infos[i]["task_id"] = task
    return infos


def is_piecewise_stationary(env: Optional[VecEnv]) -> bool:
    """Whether some copy of the vector env ``env`` is piecewise-stationary (:func:`piecewise_stationary_copies`)."""
    return env is not None and bool(piecewise_stationary_copies(env))


class TaskScheduleSync(BaseCallback):
    """Make the task schedule of the training env follow the model's ``num_timesteps``.

    At the start of each ``learn()`` call (``_on_training_start``), for a training env whose copies are
    piecewise-stationary (:class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`, found through
    ``VecEnv.env_is_wrapped`` / ``get_attr`` / ``env_method``, so through VecNormalize, VecFrameStack and
    SubprocVecEnv too):

    1. **Sync.** Each copy should have taken ``num_timesteps // n_envs`` env steps. If a copy's counter
       differs (a loaded model with a fresh env, or a second ``learn()`` with ``reset_num_timesteps=True``,
       which sets ``num_timesteps`` to 0), every copy is positioned there with ``set_env_steps`` and the
       vector env is reset (unseeded), so that the first observation the model acts on belongs to the due
       task: ``model._last_obs`` (and VecNormalize's original observation) is replaced, and every copy
       starts a new episode. When the counters already agree (a plain continuation of the same run with the
       same env) nothing is touched.
    2. **Count.** The call runs from ``num_timesteps`` to :func:`expected_end_timesteps`; the tasks it sees
       are ``first .. last`` with ``task = (timestep // n_envs) // change_every``. Printed at
       ``verbose >= 1``. When a *run* (a call starting at ``num_timesteps == 0``) will see fewer than
       ``min_tasks`` tasks, a ``UserWarning`` gives the numbers and the unit: ``change_every`` counts env
       steps of each env copy, so with ``n_envs`` copies a task lasts ``n_envs * change_every`` model
       timesteps. (Continuation calls, e.g. a loop of ``learn(..., reset_num_timesteps=False)`` one task
       at a time, are not warned about.)

    With ``at_episode_end=True`` a change waits for the next episode start, so the counts are those of the
    schedule; the actual switches may come later by up to one episode.

    The plastic algorithms add this callback to every ``learn()`` on a piecewise-stationary env; with a
    plain SB3 model pass it yourself: ``model.learn(n, callback=TaskScheduleSync())``. The schedule follows
    ``num_timesteps`` only as long as ``n_envs`` stays the same (the model's ``n_envs`` at the last call is
    kept in its persistent state, ``model.plastic_state["TaskScheduleSync"]``; a change is warned about).

    Copies whose schedules differ (``change_every`` or ``task_seed``: the sequence of tasks) are warned about:
    every copy of a vector env must follow the same task sequence.

    :param min_tasks: warn when a run will see fewer tasks than this (>= 1).
    :param verbose: 1 prints the schedule of each call (and each sync).
    :raises ValueError: for a bad ``min_tasks``.
    """

    #: Key of the persistent state in ``model.plastic_state``.
    state_key = "TaskScheduleSync"

    def __init__(self, min_tasks: int = 2, verbose: int = 0) -> None:
        super().__init__(verbose)
        if isinstance(min_tasks, bool) or not isinstance(min_tasks, (int, np.integer)) or min_tasks < 1:
            raise ValueError(f"min_tasks must be an int >= 1, got {min_tasks!r}")
        self.min_tasks = int(min_tasks)
        self.state: dict[str, Any] = {}
        #: ``(first_task, last_task)`` this ``learn()`` call will see (``None`` for a stationary env).
        self.planned_tasks: Optional[tuple[int, int]] = None
        #: whether the last training start re-positioned the env copies.
        self.synced = False

    @property
    def n_tasks(self) -> int:
        """Number of tasks this ``learn()`` call will see (0 for a stationary env)."""
        if self.planned_tasks is None:
            return 0
        return self.planned_tasks[1] - self.planned_tasks[0] + 1

    def _on_training_start(self) -> None:
        self.planned_tasks = None
        self.synced = False
        self.state = model_state(self.model, self.state_key)
        env = self.model.get_env()
        if env is None:
            return
        indices = piecewise_stationary_copies(env)
        if not indices:
            return
        n_envs = int(env.num_envs)
        if len(indices) < n_envs:
            missing = [i for i in range(n_envs) if i not in indices]
            warnings.warn(
                f"TaskScheduleSync: env copies {missing} of {n_envs} are not piecewise-stationary; only the "
                "others follow num_timesteps",
                stacklevel=2,
            )
        schedules = env.get_attr("schedule", indices)
        change_every = int(schedules[0].change_every)
        if any(int(s.change_every) != change_every for s in schedules):
            warnings.warn(
                f"TaskScheduleSync: the env copies have different change_every {[s.change_every for s in schedules]}; "
                f"the counts below use copy {indices[0]}'s",
                stacklevel=2,
            )
        task_seeds = [int(s.task_seed) for s in schedules]
        if len(set(task_seeds)) > 1:
            warnings.warn(
                f"TaskScheduleSync: the env copies have different task_seed {task_seeds}: their task index k means "
                "a different task in each copy, so they do not switch in lockstep; build every copy with the same "
                "task_seed",
                stacklevel=2,
            )
        now = int(self.model.num_timesteps)
        previous_n_envs = self.state.get("n_envs")
        if previous_n_envs is not None and int(previous_n_envs) != n_envs and now > 0:
            warnings.warn(
                f"TaskScheduleSync: the model was trained with n_envs={previous_n_envs} and continues with "
                f"n_envs={n_envs}: a copy's step count num_timesteps // n_envs ({now} // {n_envs}) no longer matches "
                "the task the run had reached",
                stacklevel=2,
            )
        self.state["n_envs"] = n_envs

        # 1. sync
        target = now // n_envs
        steps = [int(s) for s in env.get_attr("env_steps", indices)]
        if any(s != target for s in steps):
            env.env_method("set_env_steps", target, indices=indices)
            self.model._last_obs = env.reset()  # type: ignore[assignment]
            self.model._last_episode_starts = np.ones((n_envs,), dtype=bool)
            normalize = self.model.get_vec_normalize_env()
            if normalize is not None:
                self.model._last_original_obs = normalize.get_original_obs()
            self.synced = True
            if self.verbose >= 1:
                print(
                    f"TaskScheduleSync: env copies moved from {sorted(set(steps))} to {target} env steps each "
                    f"(num_timesteps={now}, n_envs={n_envs}): task {target // change_every}"
                )

        # 2. count
        end = expected_end_timesteps(self.model)
        first = target // change_every
        last = max(end // n_envs - 1, target) // change_every
        self.planned_tasks = (first, last)
        per_task = change_every * n_envs
        if self.verbose >= 1:
            print(
                f"TaskScheduleSync: num_timesteps {now} -> {end}: tasks {first}..{last} ({last - first + 1}); "
                f"a task lasts change_every * n_envs = {change_every} * {n_envs} = {per_task} model timesteps"
            )
        if now == 0 and self.n_tasks < self.min_tasks:
            warnings.warn(
                f"This run will see {self.n_tasks} task(s) (tasks {first}..{last}) in {end} timesteps, fewer than "
                f"{self.min_tasks}: change_every counts env steps of each env copy; with n_envs={n_envs} a task "
                f"lasts n_envs*change_every = {n_envs}*{change_every} = {per_task} model timesteps. For "
                f"{self.min_tasks} tasks, train >= {self.min_tasks * per_task} timesteps or set change_every <= "
                f"{max(1, end // (self.min_tasks * n_envs))}",
                stacklevel=2,
            )

    def _on_step(self) -> bool:
        return True
