"""Building blocks for non-stationary environments (stable API: other sb3-plastic envs and users build on it).

* :class:`PiecewiseStationaryWrapper`: counts the env steps of one env copy, switches the task when the
  :class:`~sb3_plastic.envs.schedule.TaskSchedule` says so and calls the hook
  :meth:`~PiecewiseStationaryWrapper.apply_task`; adds ``info["task_id"]`` and ``info["task_step"]`` to
  every ``step()`` and ``reset()`` info (never to the observation).
* :class:`ChannelPermutation`: permutes the observation channels anew for every task (identity for task 0).
* :class:`PhysicsParameterSchedule`: samples physical parameters per task and writes them into the env.
* :class:`GameSwitchingEnv`: cycles through a list of envs ("games") with one fixed observation and
  action space, switching at episode boundaries.
* :class:`PadChannels` / :class:`PadActions`: bring games to a common observation / action space.
* :class:`RawActions`: lets an agent's raw continuous action reach the env unclipped.
* :class:`TruncationAsTermination`: an episode cut by a time limit ends as a terminal state.

Example, a user's own permuted env, every copy of the vector env switching in lockstep::

    from sb3_plastic.envs import ChannelPermutation
    env = ChannelPermutation(gym.make("MinAtar/Breakout-v0"), change_every=100_000, task_seed=0)
"""

from __future__ import annotations

import numbers
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_plastic.envs.schedule import TaskSchedule

ObsType = Any
ActType = Any


class PiecewiseStationaryWrapper(gym.Wrapper):
    """Base wrapper of a piecewise-stationary environment: the task changes every ``change_every`` env steps.

    Counts the ``step()`` calls of this env copy (``env_steps``; unseeded resets never rewind it) and switches
    the task exactly as documented in :class:`~sb3_plastic.envs.schedule.TaskSchedule`:

    * immediate (``at_episode_end=False``): the step with 0-based index ``n = k * change_every`` (the first
      step after ``k * change_every`` steps) switches to task ``k`` at the start of the call, before the
      action reaches the wrapped env; that step's transition, observation and info belong to task ``k``.
    * ``at_episode_end=True``: only ``reset()`` switches; the episode started by a ``reset()`` after ``n``
      steps runs under task ``n // change_every``. With ``change_every`` shorter than an episode a switch can
      skip tasks; the first such switch is warned about.

    Every ``reset()`` applies the due task ``env_steps // change_every`` first (task 0 at the first reset).
    A ``reset(seed=...)`` starts the copy afresh: ``env_steps`` goes back to 0 and task 0 is applied, so a
    seeded reset reproduces a newly made env exactly, task sequence included (SB3 vector envs pass a seed
    only to the first reset; their automatic resets at episode ends never rewind the count).
    Subclasses with :attr:`switch_only_at_reset` (game switching) never switch inside an episode: in
    immediate mode they end the last step of every task (``env_steps`` reaching ``k * change_every``) with
    ``truncated=True`` instead, so that the next ``reset()`` starts task ``k`` and the step with index
    ``k * change_every`` is again the first step of task ``k``.

    Every info dict gets ``info["task_id"]`` (the task index ``k``) and ``info["task_step"]`` (env steps
    taken under the current task, counting this one; 0 in a ``reset()`` info that starts a task), plus the
    entries returned by :meth:`apply_task` for the current task. The observation never shows the task.

    Subclasses override :meth:`apply_task` (called once per task switch, before the wrapped env's
    ``step``/``reset`` of that call) and, to transform observations, :meth:`observation`.

    :meth:`pin_task` fixes the task of this copy whatever its step count (an evaluation env follows the
    training env's task this way: :class:`~sb3_plastic.callbacks.ContinualEvalCallback`).

    :param env: the env to make non-stationary.
    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param task_seed: seed of the task sequence, the same for every copy of a vector env (>= 0).
    :param at_episode_end: postpone each change to the next ``reset()``.
    """

    #: Never switch inside an episode (truncate at the end of a task in immediate mode instead).
    switch_only_at_reset: ClassVar[bool] = False

    def __init__(self, env: gym.Env, change_every: int, task_seed: int = 0, at_episode_end: bool = False) -> None:
        super().__init__(env)
        self.schedule = TaskSchedule(change_every, task_seed, at_episode_end)
        self._switch_in_step = not (self.schedule.at_episode_end or self.switch_only_at_reset)
        self._truncate_at_change = self.switch_only_at_reset and not self.schedule.at_episode_end
        self._env_steps = 0
        self._task_id: Optional[int] = None
        self._task_start = 0
        self._next_change = 0  # env_steps at which the next task is due
        self._task_info: dict[str, Any] = {}
        self._change_every = self.schedule.change_every
        self._pinned: Optional[int] = None  # pin_task(): the task this copy runs whatever its step count
        self._resumed = False  # set_env_steps() positioned the copy: the next switch restores the task's start
        self._from_pin = False  # pin_task() changed the pin: the next switch may jump over tasks by design
        self._warned_skip = False  # a switch that skipped tasks (at_episode_end) was warned about
        # hot path: the bound step of the env that actually steps (GameSwitchingEnv points it at the game in
        # play), and whether observation() must run (subclasses may turn it off while it is the identity)
        self._inner_step = env.step
        self._transform_obs = type(self).observation is not PiecewiseStationaryWrapper.observation
        self._extras = self._transform_obs  # True when task info entries or observation() must run

    # ------------------------------------------------------------------ hooks
    def apply_task(self, task_index: int, rng: np.random.Generator) -> Optional[dict[str, Any]]:
        """Make task ``task_index`` the current task; override in subclasses.

        :param task_index: the new task ``k`` (tasks may be skipped when ``at_episode_end=True``).
        :param rng: ``schedule.rng(k)``, a generator that depends only on ``(task_seed, k)``: draw the
            task's parameters from it (never from the env's own generator) so every copy agrees.
        :return: optional entries added to every info dict while the task lasts (e.g. ``{"friction": f}``).
        """
        return None

    def observation(self, observation: ObsType) -> ObsType:
        """Transform an observation of the wrapped env (identity here; override in subclasses)."""
        return observation

    # ------------------------------------------------------------------ state
    @property
    def env_steps(self) -> int:
        """Number of ``step()`` calls of this env copy so far."""
        return self._env_steps

    @property
    def task_id(self) -> Optional[int]:
        """Index of the current task (``None`` before the first ``reset()``)."""
        return self._task_id

    @property
    def next_task_id(self) -> Optional[int]:
        """Index of the task this copy's next ``step()`` runs: the current one, or the task a switch due at that step
        starts (immediate mode; a pinned task too). ``None`` before the first ``reset()``. An on-policy intervention
        told of task switches reads it at each rollout start, so that a switch on a rollout boundary is acted on
        before that rollout (:meth:`sb3_plastic.callbacks.base.TaskChangeWatch.changed_before_rollout`)."""
        if self._task_id is None or not self._switch_in_step or self._env_steps < self._next_change:
            return self._task_id
        return self._pinned if self._pinned is not None else self._env_steps // self._change_every

    @property
    def task_step(self) -> int:
        """Env steps taken under the current task."""
        return self._env_steps - self._task_start

    @property
    def pinned_task(self) -> Optional[int]:
        """The task set by :meth:`pin_task` (``None``: the copy follows its own step count)."""
        return self._pinned

    def _switch(self, task_index: int) -> None:
        # every switch goes through here (subclasses' inlined steps included): a pinned task overrides the due one
        if self._pinned is not None:
            task_index = self._pinned
        elif (self._task_id is not None and task_index > self._task_id + 1 and not self._resumed
              and not self._from_pin and not self._warned_skip):
            self._warned_skip = True  # a jump of set_env_steps() or of a pin is not a skip
            warnings.warn(
                f"{type(self).__name__}: at_episode_end=True and change_every={self._change_every} is shorter than an "
                f"episode: the reset after {self._env_steps} env steps goes from task {self._task_id} to task "
                f"{task_index}, skipping task(s) {self._task_id + 1}..{task_index - 1} (warned once); make change_every "
                "longer than an episode or use at_episode_end=False",
                stacklevel=3,
            )
        self._from_pin = False
        extra = self.apply_task(task_index, self.schedule.rng(task_index))
        self._task_info = dict(extra) if extra else {}
        self._extras = bool(self._task_info) or self._transform_obs
        self._task_id = task_index
        if self._resumed and self._pinned is None:
            # the first switch after set_env_steps(): the task started at its scheduled step, as in the uninterrupted
            # run (immediate mode exactly; with at_episode_end the uninterrupted run started it at the first reset
            # at or after that step, less than one episode later)
            self._task_start = min(self._env_steps, task_index * self._change_every)
        else:
            self._task_start = self._env_steps
        self._resumed = False
        if self._pinned is not None:
            self._next_change = sys.maxsize  # a pinned copy never switches on its own
        else:
            self._next_change = (task_index + 1) * self.schedule.change_every

    def pin_task(self, task_index: Optional[int]) -> None:
        """Run task ``task_index`` regardless of this copy's step count, until unpinned (``None``).

        The pinned task takes effect where a scheduled switch would: at the next ``step()`` in immediate mode,
        at the next ``reset()`` with ``at_episode_end=True``, and for :attr:`switch_only_at_reset` wrappers (game
        switching) the current episode's next step is returned with ``truncated=True`` so that the next
        ``reset()`` starts it. While pinned, ``env_steps`` keeps counting but never switches the task, a seeded
        ``reset()`` and :meth:`set_env_steps` keep the pin, and ``info["task_id"]`` reports the pinned task.
        ``pin_task(None)`` returns the copy to its own schedule (task ``env_steps // change_every``, applied the
        same way). Evaluation envs are pinned to the training env's task by
        :class:`~sb3_plastic.callbacks.ContinualEvalCallback`; with a vector env:
        ``vec_env.env_method("pin_task", k)``.

        :param task_index: the task to run (an integer >= 0), or ``None`` to unpin.
        """
        if task_index is not None and (
            isinstance(task_index, bool) or not isinstance(task_index, numbers.Integral) or task_index < 0
        ):
            raise ValueError(f"task_index must be a non-negative integer or None, got {task_index!r}")
        self._pinned = None if task_index is None else int(task_index)
        self._from_pin = True
        if self._task_id is None:
            return  # not started yet: the next reset() applies the pinned (or due) task
        wanted = self._pinned if self._pinned is not None else self._env_steps // self._change_every
        if wanted != self._task_id:
            self._next_change = 0  # switch at the next opportunity (step in immediate mode, else reset)
        elif self._pinned is not None:
            self._next_change = sys.maxsize
        else:
            self._next_change = (self._task_id + 1) * self._change_every

    # ------------------------------------------------------------------ gym API
    def set_env_steps(self, env_steps: int) -> None:
        """Position the schedule after ``env_steps`` steps (e.g. to resume a run); the next unseeded ``reset()``
        applies task ``k = env_steps // change_every`` (a seeded one would rewind to 0). ``task_step`` then counts
        from the task's scheduled start ``k * change_every``, as in a run that took those steps (with
        ``at_episode_end=True`` that run started task ``k`` at its first reset at or after that step, so there
        ``task_step`` may exceed the uninterrupted run's by less than one episode; a pinned task counts from the
        reset that applies it).
        With a vector env: ``vec_env.env_method("set_env_steps", n)`` then ``vec_env.reset()``."""
        if isinstance(env_steps, bool) or not isinstance(env_steps, numbers.Integral) or env_steps < 0:
            raise ValueError(f"env_steps must be a non-negative integer, got {env_steps!r}")
        self._env_steps = int(env_steps)
        self._task_id = None
        self._resumed = True

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None) -> tuple[ObsType, dict[str, Any]]:
        if seed is not None:  # a seeded reset starts this copy afresh, task sequence included
            self._env_steps = 0
            self._task_id = None
            self._resumed = False
        if self._task_id is None or self._env_steps >= self._next_change:
            self._switch(self._env_steps // self._change_every)
        obs, info = self.env.reset(seed=seed, options=options)
        info["task_id"] = self._task_id
        info["task_step"] = self._env_steps - self._task_start
        if self._extras:
            if self._task_info:
                info.update(self._task_info)
            if self._transform_obs:
                obs = self.observation(obs)
        return obs, info

    def step(self, action: ActType) -> tuple[ObsType, SupportsFloat, bool, bool, dict[str, Any]]:
        # kept lean: a MinAtar step costs ~4 us of CPU, so every attribute access here shows in the steps/s
        n = self._env_steps
        if n >= self._next_change and self._switch_in_step:
            self._switch(n // self._change_every)
        obs, reward, terminated, truncated, info = self._inner_step(action)
        self._env_steps = n = n + 1
        if n >= self._next_change and self._truncate_at_change:
            truncated = True
        info["task_id"] = self._task_id
        info["task_step"] = n - self._task_start
        if self._extras:
            if self._task_info:
                info.update(self._task_info)
            if self._transform_obs:
                obs = self.observation(obs)
        return obs, reward, terminated, truncated, info


class ChannelPermutation(PiecewiseStationaryWrapper):
    """Permute the channels of a ``Box`` observation, anew for every task; task 0 is unpermuted.

    The observation of task ``k`` is ``np.take(obs, perm_k, axis=axis)``: output channel ``c`` is input
    channel ``perm_k[c]``. ``perm_0`` is the identity; for ``k >= 1``, ``perm_k`` is the first draw of
    ``schedule.rng(k).permutation(n_channels)`` that differs from ``perm_{k-1}`` (redrawn from the same
    generator until it does), so consecutive tasks always differ. The permutation depends only on
    ``(task_seed, k, n_channels)``: :meth:`permutation_for` gives it for any task, and
    ``current_permutation`` holds the one in force. Tasks switch as documented in
    :class:`PiecewiseStationaryWrapper` (immediately by default: the step with index ``k * change_every``
    returns the first observation permuted by ``perm_k``).

    Fast path: when ``env`` is an unwrapped env with a method ``set_channel_permutation(perm)`` and an
    attribute ``channel_axis`` equal to ``axis`` (as :class:`~sb3_plastic.envs.minatar_envs.MinAtarEnv`
    has), the permutation is handed to the env, which then emits permuted observations itself
    (``perm=None``: identity) and this wrapper copies nothing.

    Used for the channel-permuted MinAtar benchmark of Rosseau, Müller & Nowé (2026).

    :param env: env with a ``Box`` observation space of at least 2 channels along ``axis``.
    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param task_seed: seed of the permutation sequence (>= 0).
    :param at_episode_end: postpone each new permutation to the next ``reset()``.
    :param axis: the channel axis (-1: channels-last, as MinAtar's ``(10, 10, C)``).
    """

    def __init__(
        self, env: gym.Env, change_every: int, task_seed: int = 0, at_episode_end: bool = False, axis: int = -1
    ) -> None:
        space = env.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) == 0:
            raise ValueError(f"ChannelPermutation needs a Box observation space with a channel axis, got {space}")
        if not -len(space.shape) <= axis < len(space.shape):
            raise ValueError(f"axis={axis} is out of range for observations of shape {space.shape}")
        self.axis = axis % len(space.shape)
        self.n_channels = int(space.shape[self.axis])
        if self.n_channels < 2:
            raise ValueError(f"ChannelPermutation needs >= 2 channels along axis {axis}, got shape {space.shape}")
        super().__init__(env, change_every, task_seed, at_episode_end)
        # Every permutation of the channels must stay inside the space: use per-position bounds that hold
        # for all channels (identical to the original bounds when they are the same for every channel).
        if not (np.all(space.low == space.low.min(axis=self.axis, keepdims=True))
                and np.all(space.high == space.high.max(axis=self.axis, keepdims=True))):
            low = np.broadcast_to(space.low.min(axis=self.axis, keepdims=True), space.shape)
            high = np.broadcast_to(space.high.max(axis=self.axis, keepdims=True), space.shape)
            self.observation_space = spaces.Box(low=low, high=high, shape=space.shape, dtype=space.dtype)
        self._perms: list[np.ndarray] = [np.arange(self.n_channels)]
        self.current_permutation: np.ndarray = self._perms[0]
        self._perm: Optional[np.ndarray] = None  # None while the identity is in force
        native_axis = getattr(env, "channel_axis", None)
        self._native = (env is env.unwrapped and callable(getattr(env, "set_channel_permutation", None))
                        and native_axis is not None and native_axis % len(space.shape) == self.axis)
        self._transform_obs = False

    def permutation_for(self, task_index: int) -> np.ndarray:
        """The channel permutation of task ``task_index`` (a copy; see the class docstring)."""
        if task_index < 0:
            raise ValueError(f"task_index must be >= 0, got {task_index}")
        while len(self._perms) <= task_index:
            self._draw_next(self.schedule.rng(len(self._perms)))
        return self._perms[task_index].copy()

    def _draw_next(self, rng: np.random.Generator) -> None:
        """Append ``perm_k`` for ``k = len(self._perms)``, drawn from ``rng = schedule.rng(k)`` (fresh)."""
        previous = self._perms[-1]
        perm = rng.permutation(self.n_channels)
        while np.array_equal(perm, previous):
            perm = rng.permutation(self.n_channels)
        self._perms.append(perm)

    def apply_task(self, task_index: int, rng: np.random.Generator) -> None:
        if task_index == len(self._perms):  # the next new task (the usual case): rng is schedule.rng(task_index), unused
            self._draw_next(rng)
        perm = self.permutation_for(task_index)
        self.current_permutation = perm
        self._perm = None if np.array_equal(perm, self._perms[0]) else perm
        if self._native:
            self.env.set_channel_permutation(self._perm)
        else:
            self._transform_obs = self._perm is not None
        return None  # (_switch recomputes _extras after this)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        if self._perm is None:
            return observation
        return observation.take(self._perm, axis=self.axis)


class PhysicsParameterSchedule(PiecewiseStationaryWrapper):
    """Draw physical parameters anew for every task and write them into the env.

    For each task ``k``: ``params = sample_parameters(schedule.rng(k))`` (a ``dict`` of names to values),
    then ``apply_parameters(params)`` writes them into the env, and every info dict carries the
    ``params`` entries while the task lasts. Give ``sample_fn(rng) -> dict`` and ``apply_fn(unwrapped_env,
    params)`` or override :meth:`sample_parameters` / :meth:`apply_parameters` in a subclass (as
    :class:`~sb3_plastic.envs.mujoco_envs.SlipperyFriction` does). Changes take effect as documented in
    :class:`PiecewiseStationaryWrapper`; the default ``at_episode_end=True`` changes physics only
    between episodes.

    :param env: the env whose physics changes.
    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param sample_fn: ``rng -> dict`` of parameters of one task.
    :param apply_fn: ``(env.unwrapped, params) -> None`` writes them into the simulator.
    :param task_seed: seed of the parameter sequence (>= 0).
    :param at_episode_end: change only at the next ``reset()`` (default) or immediately.
    """

    def __init__(
        self,
        env: gym.Env,
        change_every: int,
        sample_fn: Optional[Callable[[np.random.Generator], dict[str, Any]]] = None,
        apply_fn: Optional[Callable[[gym.Env, dict[str, Any]], None]] = None,
        task_seed: int = 0,
        at_episode_end: bool = True,
    ) -> None:
        super().__init__(env, change_every, task_seed, at_episode_end)
        self._sample_fn = sample_fn
        self._apply_fn = apply_fn
        self.parameters: dict[str, Any] = {}

    def sample_parameters(self, rng: np.random.Generator) -> dict[str, Any]:
        """The parameters of one task, drawn from the task's generator."""
        if self._sample_fn is None:
            raise NotImplementedError("give sample_fn or override sample_parameters")
        return dict(self._sample_fn(rng))

    def apply_parameters(self, parameters: dict[str, Any]) -> None:
        """Write ``parameters`` into the simulator."""
        if self._apply_fn is None:
            raise NotImplementedError("give apply_fn or override apply_parameters")
        self._apply_fn(self.env.unwrapped, parameters)

    def apply_task(self, task_index: int, rng: np.random.Generator) -> dict[str, Any]:
        parameters = self.sample_parameters(rng)
        self.apply_parameters(parameters)
        self.parameters = parameters
        return parameters

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling writes the parameters in force into the simulator again: simulators that pickle by rebuilding
        themselves from their constructor arguments (gymnasium's MuJoCo envs, through ``EzPickle``) come back with
        their default physics, which would otherwise stay until the next task switch while ``info`` still reported
        the task's parameters."""
        self.__dict__.update(state)
        if self.parameters:
            self.apply_parameters(self.parameters)


class TruncateIdleEpisode(gym.Wrapper):
    """Truncate an episode once it has run ``max_steps`` steps with a return still below ``min_return``.

    C-CHAIN's continual MinAtar code (Tang et al., 2025, ``crl_minatar/crl_run_double_dqn.py``) leaves a MinAtar
    Seaquest episode after 1 000 steps whose return is below 0.1 ("Seaquest never done case"), in training and in
    evaluation; this is that rule as a wrapper (``truncated=True``, so SB3 bootstraps from the last state, and the
    episode's statistics reach the ``Monitor`` inside which it sits). With non-negative rewards the return cannot
    fall, so an episode is cut at step ``max_steps`` or never.

    :param env: the env.
    :param max_steps: steps after which an idle episode is cut (>= 1).
    :param min_return: an episode whose return is below this after ``max_steps`` steps is idle.
    """

    def __init__(self, env: gym.Env, max_steps: int = 1000, min_return: float = 0.1) -> None:
        super().__init__(env)
        if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        self.max_steps = int(max_steps)
        self.min_return = float(min_return)
        self._steps = 0
        self._return = 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._steps, self._return = 0, 0.0
        return self.env.reset(**kwargs)

    def step(self, action: ActType) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        self._return += float(reward)
        if not (terminated or truncated) and self._steps >= self.max_steps and self._return < self.min_return:
            truncated = True
        return obs, reward, terminated, truncated, info


class PadChannels(gym.ObservationWrapper):
    """Zero-pad a ``Box`` observation along its channel axis to ``n_channels`` channels.

    The padded channels come after the env's own; their bounds are ``[0, 0]`` widened to the space's
    overall bounds, so all games padded to the same size share one space when their bounds agree.

    :param env: env with a ``Box`` observation space.
    :param n_channels: channels after padding (>= the env's).
    :param axis: the channel axis (-1: channels-last).
    """

    def __init__(self, env: gym.Env, n_channels: int, axis: int = -1) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) == 0:
            raise ValueError(f"PadChannels needs a Box observation space with a channel axis, got {space}")
        self.axis = axis % len(space.shape)
        have = int(space.shape[self.axis])
        if n_channels < have:
            raise ValueError(f"n_channels={n_channels} is smaller than the env's {have} channels")
        shape = list(space.shape)
        shape[self.axis] = n_channels
        low = np.full(shape, min(space.low.min(), 0), dtype=space.dtype)
        high = np.full(shape, max(space.high.max(), 0), dtype=space.dtype)
        self.observation_space = spaces.Box(low=low, high=high, dtype=space.dtype)
        self._shape = tuple(shape)
        self._dtype = space.dtype
        self._slices = tuple(slice(0, have) if i == self.axis else slice(None) for i in range(len(shape)))

    def observation(self, observation: np.ndarray) -> np.ndarray:
        out = np.zeros(self._shape, dtype=self._dtype)
        out[self._slices] = observation
        return out


class PadActions(gym.ActionWrapper):
    """Widen a ``Discrete(n)`` action space to ``Discrete(n_actions)``; the extra actions act as ``fallback``.

    :param env: env with a ``Discrete`` action space.
    :param n_actions: actions after padding (>= n).
    :param fallback: the env action that the padded actions ``n, ..., n_actions - 1`` perform (default:
        the first action, usually a no-op).
    """

    def __init__(self, env: gym.Env, n_actions: int, fallback: Optional[int] = None) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Discrete):
            raise ValueError(f"PadActions needs a Discrete action space, got {space}")
        if n_actions < space.n:
            raise ValueError(f"n_actions={n_actions} is smaller than the env's {space.n} actions")
        self._start = int(space.start)
        self._n = int(space.n)
        self.fallback = self._start if fallback is None else int(fallback)
        if not space.contains(self.fallback):
            raise ValueError(f"fallback={fallback} is not an action of {space}")
        self.action_space = spaces.Discrete(n_actions, start=self._start)

    def action(self, action: ActType) -> int:
        action = int(action)
        return action if action < self._start + self._n else self.fallback


class RawActions(gym.Wrapper):
    """Declare a wide ``Box`` action space, so that an agent's raw continuous action reaches the env unclipped.

    SB3 clips a ``Box`` action to the env's action space before ``step()``. An env that clamps the action for its
    dynamics (MuJoCo's ``ctrlrange``) but computes reward terms from the action it is given (the control cost of
    gymnasium's Ant and HalfCheetah) then charges the clipped action, so an action outside the bounds costs nothing
    more than the bound. Dohare et al.'s PPO (shibhansh/loss-of-plasticity, gym 0.23, which did not clip) sent the
    raw Gaussian sample: its agents paid the control cost of every sample. This wrapper gives that behaviour to an SB3
    agent: the dynamics are unchanged (the env still clamps), the reward terms see the raw action.

    :param env: an env with a ``Box`` action space.
    :param bound: the declared space is ``[-bound, bound]`` per dimension (SB3 needs finite bounds; the default
        ``1e6`` never binds a Gaussian policy).
    """

    def __init__(self, env: gym.Env, bound: float = 1e6) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Box):
            raise ValueError(f"RawActions needs a Box action space, got {space}")
        if not (isinstance(bound, numbers.Real) and not isinstance(bound, bool) and np.isfinite(bound)
                and bound >= float(np.max(np.abs(np.concatenate([space.low.ravel(), space.high.ravel()]))))):
            raise ValueError(f"bound must be a finite number at least as large as the env's own bounds "
                             f"(|low|, |high| <= {float(np.max(np.abs(space.high)))}), got {bound!r}")
        self.action_space = spaces.Box(-float(bound), float(bound), shape=space.shape, dtype=space.dtype)


class ZeroPaddedObservations(gym.ObservationWrapper):
    """Append ``zeros`` entries that are always 0 to a flat ``Box`` observation (declared unbounded, as gym's
    ``Ant-v3`` declared its contact forces; bounds ``[0, 0]`` would trip gymnasium's env checker).

    A network sized from the observation then has as many inputs as one built on an env that observed that many dead
    entries. Dohare et al.'s Slippery Ant (shibhansh/loss-of-plasticity, gym 0.23's ``Ant-v3`` on mujoco-py 2.1)
    observed 27 positions and velocities and 84 contact forces that MuJoCo 2 no longer computes (always 0,
    openai/gym#1541): their policy and value networks had 111 inputs, so their LeCun bound on the first layer, and on
    Continual Backprop's new first-layer units, was ``sqrt(3 / 111)``. ``Ant-v5`` without its contact forces (27
    observations) padded with 84 zeros gives that network; the zero inputs change no output and get no gradient, as
    theirs.

    :param env: an env with a flat (1-D) ``Box`` observation space.
    :param zeros: the number of zeros appended (>= 0).
    """

    def __init__(self, env: gym.Env, zeros: int) -> None:
        if isinstance(zeros, bool) or not isinstance(zeros, (int, np.integer)) or zeros < 0:
            raise ValueError(f"zeros must be an int >= 0, got {zeros!r}")
        space = env.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"ZeroPaddedObservations needs a flat Box observation space, got {space}")
        super().__init__(env)
        self.zeros = int(zeros)
        pad = np.full(self.zeros, np.inf, dtype=space.dtype)
        self.observation_space = spaces.Box(np.concatenate([space.low, -pad]), np.concatenate([space.high, pad]),
                                            dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.concatenate([observation, np.zeros(self.zeros, dtype=observation.dtype)])


class TruncationAsTermination(gym.Wrapper):
    """Report an episode cut by a time limit (``truncated``) as terminated: the agent learns the cut as a terminal
    state and does not bootstrap there.

    gymnasium separates the two ends (Pardo et al., 2018, "Time Limits in Reinforcement Learning") and SB3 bootstraps
    a truncated episode with the value of its last observation. Code written for gym < 0.26 saw one ``done`` for
    both: Dohare et al.'s PPO (shibhansh/loss-of-plasticity, ``lop/rl/run_ppo.py``, gym 0.23) stored ``done`` at Ant's
    1000-step limit as a terminal state. This wrapper gives that behaviour to an SB3 agent, for a faithful replication;
    it is not a better target. Wrap it outside the time limit (``gym.make`` adds the registered limit outermost, so
    wrap what ``gym.make`` returns, e.g. ``make_vec_env(..., wrapper_class=TruncationAsTermination)``). Rewards,
    observations and infos are unchanged; an episode that terminates and is truncated at once stays terminated.

    :param env: the env, time limit included.
    """

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, bool(terminated or truncated), False, info


class GameMux(gym.Env):
    """The inner env of :class:`GameSwitchingEnv`: forwards to the selected game (all games kept alive).

    Seeding: ``reset(seed=s)`` seeds game ``i`` with ``SeedSequence([s, i])`` at that game's next reset,
    so a run is reproducible from one seed whichever game is current; a game first reset without any
    seed gets one drawn from this env's ``np_random``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array", "human"]}

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], names: Optional[Sequence[str]] = None) -> None:
        env_fns = list(env_fns)
        if not env_fns:
            raise ValueError("GameSwitchingEnv needs at least one game, got an empty list")
        if names is not None and len(names) != len(env_fns):
            raise ValueError(f"got {len(names)} names for {len(env_fns)} games")
        self.games: list[gym.Env] = []
        for i, fn in enumerate(env_fns):
            game = fn()
            if i == 0:
                self.observation_space = game.observation_space
                self.action_space = game.action_space
            name = names[i] if names is not None else _env_name(game)
            for what, have, want in (("observation", game.observation_space, self.observation_space),
                                     ("action", game.action_space, self.action_space)):
                if have != want:
                    for g in self.games:
                        g.close()
                    game.close()
                    raise ValueError(f"game {i} ({name}) has {what} space {have}, game 0 has {want}: all games must share it")
            self.games.append(game)
        self.names: list[str] = [str(n) for n in names] if names is not None else [_env_name(g) for g in self.games]
        self.render_mode = self.games[0].render_mode
        self.index = 0
        self.current = self.games[0]
        self._pending_seeds: list[Optional[int]] = [None] * len(self.games)
        self._seeded = [False] * len(self.games)

    def select(self, index: int) -> None:
        """Make game ``index`` current (only between episodes: its next call must be ``reset()``)."""
        self.index = index
        self.current = self.games[index]

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None) -> tuple[ObsType, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._pending_seeds = [int(np.random.SeedSequence([seed, i]).generate_state(1)[0]) for i in range(len(self.games))]
        i = self.index
        game_seed, self._pending_seeds[i] = self._pending_seeds[i], None
        if game_seed is None and not self._seeded[i]:
            game_seed = int(self.np_random.integers(2**31 - 1))
        self._seeded[i] = True
        return self.current.reset(seed=game_seed, options=options)

    def step(self, action: ActType) -> tuple[ObsType, SupportsFloat, bool, bool, dict[str, Any]]:
        return self.current.step(action)

    def render(self) -> Any:
        return self.current.render()

    def close(self) -> None:
        for game in self.games:
            game.close()
        super().close()


def _env_name(env: gym.Env) -> str:
    spec = env.spec
    return spec.id if spec is not None else type(env.unwrapped).__name__


class GameSwitchingEnv(PiecewiseStationaryWrapper):
    """Cycle through a list of games with one fixed observation and action space.

    Task ``k`` plays game ``k % len(games)`` (in the given order; ``task_seed`` does not affect the
    order, only the per-game seeds). Games change only between episodes: with the default
    ``at_episode_end=False`` the last step of every task is returned with ``truncated=True`` so that the
    step with index ``k * change_every`` is the first step of game ``k``'s first episode (see
    :class:`PiecewiseStationaryWrapper`); with ``at_episode_end=True`` the game changes at the first
    ``reset()`` at or after ``k * change_every`` steps. Every info carries ``info["game"]``, the name of
    the game in play. All games stay alive, each keeping its own generator (see :class:`GameMux`).

    Used for the task-switching MinAtar benchmark of Rosseau, Müller & Nowé (2026).

    :param env_fns: one constructor per game; every game must have the same observation and action
        space (wrap games in :class:`PadChannels` / :class:`PadActions` to get there).
    :param change_every: task (game) length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param names: game names for ``info["game"]`` (default: the envs' spec ids or class names).
    :param task_seed: seed of the task sequence (>= 0).
    :param at_episode_end: switch at the next episode end instead of truncating the current episode.
    """

    switch_only_at_reset: ClassVar[bool] = True
    #: The inner env class (a subclass of :class:`GameMux` may add env-specific behaviour, e.g. error messages).
    mux_class: ClassVar[type[GameMux]] = GameMux

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        change_every: int,
        names: Optional[Sequence[str]] = None,
        task_seed: int = 0,
        at_episode_end: bool = False,
    ) -> None:
        super().__init__(self.mux_class(env_fns, names), change_every, task_seed, at_episode_end)

    @property
    def games(self) -> list[str]:
        """The game names, in switching order."""
        return list(self.env.names)

    @property
    def current_game(self) -> str:
        """The game in play."""
        return self.env.names[self.env.index]

    def apply_task(self, task_index: int, rng: np.random.Generator) -> dict[str, Any]:
        mux: GameMux = self.env
        index = task_index % len(mux.games)
        mux.select(index)
        self._inner_step = mux.current.step  # step the game directly (GameMux.step would forward to it)
        return {"game": mux.names[index]}
