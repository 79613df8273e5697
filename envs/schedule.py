"""Piecewise-stationary task schedules counted in environment steps.

A :class:`TaskSchedule` cuts the life of one environment copy into tasks of ``change_every`` env
steps each and gives every task a random generator that depends on ``(task_seed, task_index)`` only.
It holds no state: the step counting lives in
:class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`, once per env copy.

The unit is the env steps of *each env copy* (an env can only count its own steps). With a vector env of
``n_envs`` copies, after ``num_timesteps`` model timesteps every copy has taken ``num_timesteps // n_envs``
steps, so a task lasts ``change_every * n_envs`` model timesteps and task ``k`` covers ``num_timesteps`` in
``[k * change_every * n_envs, (k + 1) * change_every * n_envs)``. Training keeps the copies on that clock
(:class:`~sb3_plastic.callbacks.TaskScheduleSync`): a resumed run continues the task sequence, and a
``learn()`` with ``reset_num_timesteps=True`` restarts it at task 0.

Since the copies of an SB3 vector env step in lockstep and the task parameters come from
``(task_seed, task_index)`` alone, every copy of a vector env sees the same task sequence, whatever seed
each copy was reset with.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np


def check_change_every(change_every: object, name: str = "change_every") -> int:
    """Return ``change_every`` as an ``int`` > 0 (an integral float such as ``2e6`` is accepted).

    :raises ValueError: for zero, negative, non-integral or non-numeric values (and booleans).
    """
    if isinstance(change_every, bool) or not isinstance(change_every, numbers.Real):
        raise ValueError(f"{name} must be a positive integer number of env steps, got {change_every!r}")
    if isinstance(change_every, numbers.Integral):
        value = int(change_every)
    else:
        as_float = float(change_every)
        if not as_float.is_integer():
            raise ValueError(f"{name} must be a positive integer number of env steps, got {change_every!r}")
        value = int(as_float)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer number of env steps (>= 1), got {change_every!r}")
    return value


def check_at_episode_end(at_episode_end: object) -> bool:
    """Return ``at_episode_end`` as a ``bool``; :raises ValueError: for anything but True / False (a string such as
    ``"False"`` would otherwise count as True)."""
    if not isinstance(at_episode_end, (bool, np.bool_)):
        raise ValueError(f"at_episode_end must be True or False, got {at_episode_end!r}")
    return bool(at_episode_end)


def check_task_seed(task_seed: object) -> int:
    """Return ``task_seed`` as a non-negative ``int``; :raises ValueError: otherwise."""
    if isinstance(task_seed, bool) or not isinstance(task_seed, numbers.Integral) or int(task_seed) < 0:
        raise ValueError(f"task_seed must be a non-negative integer, got {task_seed!r}")
    return int(task_seed)


@dataclass(frozen=True)
class TaskSchedule:
    """A piecewise-stationary schedule: task ``k`` covers env steps ``[k * change_every, (k + 1) * change_every)``.

    Steps are counted per env copy (``step()`` calls since the copy was created; resets do not count
    and never rewind the count). Where exactly a change takes effect:

    * ``at_episode_end=False`` (immediate): the ``step()`` call with 0-based index ``n`` runs under task
      ``task_index(n) = n // change_every``. So the first step after ``k * change_every`` steps (the
      step with index ``k * change_every``) is the first step of task ``k``: the task is switched at the
      start of that call, before the action is executed, and the transition, the observation it returns
      and its ``info["task_id"]`` all belong to task ``k``.
    * ``at_episode_end=True``: the task is only switched in ``reset()``: the episode that starts with a
      ``reset()`` called after ``n`` steps runs entirely under task ``task_index(n)``. So task ``k``
      starts with the first episode that begins at or after ``k * change_every`` steps; an episode longer
      than ``change_every`` steps makes the copy skip the tasks that started and ended inside it (never
      with the intended ``change_every`` >> episode length).

    In both modes ``reset()`` applies ``task_index(n)``, so the first episode runs under task 0, and a
    ``reset(seed=...)`` sets ``n`` back to 0 (a seeded reset reproduces a fresh env, task sequence included).

    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (a vector env's
        copies step in lockstep; :class:`~sb3_plastic.callbacks.TaskScheduleSync` keeps them on the model's
        ``num_timesteps``) (> 0).
    :param task_seed: seed of the task sequence, shared by all copies of a vector env (>= 0).
    :param at_episode_end: postpone each change to the next episode start (see above).
    """

    change_every: int
    task_seed: int = 0
    at_episode_end: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "change_every", check_change_every(self.change_every))
        object.__setattr__(self, "task_seed", check_task_seed(self.task_seed))
        object.__setattr__(self, "at_episode_end", check_at_episode_end(self.at_episode_end))

    def task_index(self, step: int) -> int:
        """The task due after ``step`` env steps: ``step // change_every``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return int(step) // self.change_every

    def task_start(self, task_index: int) -> int:
        """The first step index due to task ``task_index``: ``task_index * change_every``."""
        return int(task_index) * self.change_every

    def rng(self, task_index: int) -> np.random.Generator:
        """A fresh generator that depends only on ``(task_seed, task_index)`` (``np.random.SeedSequence``)."""
        if task_index < 0:
            raise ValueError(f"task_index must be >= 0, got {task_index}")
        return np.random.default_rng(np.random.SeedSequence([self.task_seed, int(task_index)]))
