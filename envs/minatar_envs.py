"""Channel-permuted and task-switching MinAtar (Young & Tian, 2019; package ``minatar``).

The continual MinAtar benchmarks of Rosseau, Müller & Nowé (2026): a MinAtar game whose observation
channels are permuted anew every ``change_every`` steps, and a cycle through several MinAtar games.

* ``sb3_plastic/PermutedMinAtar-<Game>-v0`` (Game in Asterix, Breakout, Freeway, Seaquest,
  SpaceInvaders): :class:`~sb3_plastic.envs.wrappers.ChannelPermutation` over the game, channels-last
  ``(10, 10, C)`` bool observations, ``Discrete(6)`` (MinAtar's full action set, as ``MinAtar/<Game>-v0``).
  Task 0 is unpermuted; the step with 0-based index ``k * change_every`` is the first of permutation
  ``k`` (default ``change_every=500_000``).
* ``sb3_plastic/SwitchingMinAtar-v0``: :class:`~sb3_plastic.envs.wrappers.GameSwitchingEnv` over
  ``games`` (default all five, in the order of :data:`MINATAR_GAMES`), observations zero-padded to
  ``(10, 10, 10)`` bool (a game's own channels first), ``Discrete(6)`` for every game;
  ``info["game"]`` names the game in play. Default ``change_every=500_000`` steps per game; the last
  step of each game is returned with ``truncated=True`` so the next game starts at exactly
  ``k * change_every`` steps (or pass ``at_episode_end=True`` to switch at the next episode end).

The paper runs 20 cycles (1.2 billion env steps in all); ``change_every`` is ours to set, and the
defaults are sized for single-machine SB3 runs. Other keywords (``sticky_action_prob=0.1``,
``difficulty_ramping=True``) go to ``minatar.Environment``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Optional, Union

import gymnasium as gym
import numpy as np
from minatar.gym import BaseEnv

from sb3_plastic.envs._deps import check_games
from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import ChannelPermutation, GameSwitchingEnv, TruncateIdleEpisode

#: The MinAtar games (``minatar`` module names), in the default switching order.
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
#: CamelCase names used in the gymnasium ids.
MINATAR_ID_NAMES = {"asterix": "Asterix", "breakout": "Breakout", "freeway": "Freeway", "seaquest": "Seaquest",
                    "space_invaders": "SpaceInvaders"}
#: The largest channel count of a MinAtar game (Seaquest): switching observations are padded to it.
MINATAR_MAX_CHANNELS = 10
#: MinAtar's full action set (n, l, u, r, d, f), the same for every game.
MINATAR_N_ACTIONS = 6
#: Default ``change_every`` (env steps) of the permuted and switching MinAtar envs.
MINATAR_CHANGE_EVERY = 500_000


def canonical_minatar_game(name: Any) -> str:
    """Map ``"Breakout"``, ``"breakout"``, ``"space_invaders"``, ``"SpaceInvaders"`` or ``"MinAtar/Breakout-v0"``
    to the ``minatar`` module name; :raises ValueError: for an unknown game."""
    if isinstance(name, str):
        key = name.split("/")[-1].split("-")[0].replace("_", "").lower()
        for game in MINATAR_GAMES:
            if game.replace("_", "") == key:
                return game
    raise ValueError(f"unknown MinAtar game {name!r}; allowed: {list(MINATAR_GAMES)} (or {list(MINATAR_ID_NAMES.values())})")


class MinAtarEnv(BaseEnv):
    """``minatar.gym.BaseEnv`` (the env of the ``MinAtar/<Game>-v0`` ids) with gymnasium-conform seeding, float
    rewards, optional zero-padding of the channels and a native channel permutation.

    * ``reset(seed=...)`` also seeds ``np_random`` as gymnasium requires; the game is seeded exactly as
      the base class does, so the same seed gives the same trajectory as ``gym.make("MinAtar/<Game>-v0")``.
    * Rewards are Python floats (some games return numpy integers, which SB3's env checker refuses).
    * ``n_channels``: observations ``(10, 10, n_channels)`` with the game's own channels first and zeros after.
    * :meth:`set_channel_permutation`: observations with permuted channels.

    Both are done for free where the game names its channels in a ``channels`` dict that its ``state()``
    indexes (every game of minatar 1.0.15): the dict is remapped (padding channels become names no
    object uses). Otherwise each observation is padded / permuted with numpy (same result).

    :param game: a MinAtar game (any spelling accepted by :func:`canonical_minatar_game`).
    :param use_minimal_action_set: ``False`` (default): the full 6-action set.
    :param n_channels: pad the observation to this many channels (default: the game's own count).
    :param native_channels: ``False``: always pad / permute with numpy (a reference for tests).
    :param kwargs: ``sticky_action_prob`` (0.1), ``difficulty_ramping`` (True) of ``minatar.Environment``.
    """

    #: the axis that :meth:`set_channel_permutation` permutes (channels-last)
    channel_axis = 2

    def __init__(
        self,
        game: str,
        render_mode: Optional[str] = None,
        use_minimal_action_set: bool = False,
        n_channels: Optional[int] = None,
        native_channels: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(canonical_minatar_game(game), render_mode=render_mode,
                         use_minimal_action_set=use_minimal_action_set, **kwargs)
        inner = self.game.env
        self.game_channels = int(self.game.state_shape()[2])
        self.n_channels = self.game_channels if n_channels is None else int(n_channels)
        if self.n_channels < self.game_channels:
            raise ValueError(f"n_channels={n_channels} is smaller than the {self.game_channels} channels of {game!r}")
        channels = getattr(inner, "channels", None)
        self._native = (native_channels and isinstance(channels, dict)
                        and sorted(channels.values()) == list(range(self.game_channels)))
        if self._native:
            # padding channels: names that no game object uses, after the game's own channels
            self._layout = {**channels, **{f"_sb3_plastic_pad{i}": i for i in range(self.game_channels, self.n_channels)}}
            inner.channels = dict(self._layout)
        self._perm: Optional[np.ndarray] = None
        self._numpy_path = not self._native and self.n_channels != self.game_channels
        # hot path: the game's own act (sticky actions) and its inner env's state() (skipping the one-line
        # forwarding method ``Environment.state``; the inner env object is never replaced, seeding included)
        self._act = self.game.act
        self._state = inner.state
        self._reset_game = inner.reset
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(10, 10, self.n_channels), dtype=bool)

    def set_channel_permutation(self, perm: Optional[np.ndarray]) -> None:
        """From now on emit ``np.take(obs, perm, axis=-1)`` (output channel ``c`` = channel ``perm[c]``);
        ``None``: no permutation. ``perm`` permutes all ``n_channels`` channels, padding included."""
        if perm is not None:
            perm = np.asarray(perm)
            if sorted(perm.tolist()) != list(range(self.n_channels)):
                raise ValueError(f"perm must be a permutation of range({self.n_channels}), got {perm}")
        self._perm = perm
        if self._native:
            inverse = np.argsort(perm) if perm is not None else np.arange(self.n_channels)
            self.game.env.channels = {name: int(inverse[index]) for name, index in self._layout.items()}
        else:
            self._numpy_path = self.n_channels != self.game_channels or perm is not None

    def _numpy_transform(self, state: np.ndarray) -> np.ndarray:
        """Pad / permute an observation with numpy (games without a ``channels`` dict)."""
        if self.n_channels != self.game_channels:
            padded = np.zeros((*state.shape[:2], self.n_channels), dtype=state.dtype)
            padded[..., : self.game_channels] = state
            state = padded
        if self._perm is not None:
            state = state.take(self._perm, axis=-1)
        return state

    def _observe(self) -> np.ndarray:
        state = self._state()
        return self._numpy_transform(state) if self._numpy_path else state

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        # kept lean (a MinAtar step is a few us of CPU): bound methods, no extra call frames
        reward, done = self._act(self.action_set[action])
        if self.render_mode == "human":
            self.render()
        state = self._state()
        if self._numpy_path:
            state = self._numpy_transform(state)
        # the games' terminal flags are Python bools already; some rewards are numpy integers
        return state, float(reward), done, False, {}

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            gym.Env.reset(self, seed=seed)  # seeds np_random (nothing else to do without a seed)
            self.game.seed(seed)
        self._reset_game()
        if self.render_mode == "human":
            self.render()
        state = self._state()
        return (self._numpy_transform(state) if self._numpy_path else state), {}


class PermutedMinAtar(ChannelPermutation):
    """:class:`~sb3_plastic.envs.wrappers.ChannelPermutation` over a :class:`MinAtarEnv` whose channels it
    permutes natively, with the wrapped env's step fused into this wrapper's ``step()``.

    Same schedule, permutations, observations, rewards and infos as ``ChannelPermutation(MinAtarEnv(game))``
    (the task switch, ``reset()``, ``set_env_steps()`` and the permutation draw are the base classes'); only
    the per-step call chain is shorter: ``step()`` runs the game's ``act`` / ``state`` itself instead of
    calling ``MinAtarEnv.step`` (one Python call frame and one info dict less per step).
    :func:`make_permuted_minatar` uses it whenever that is exact (native channels, no ``"human"`` rendering).
    """

    def __init__(self, env: MinAtarEnv, change_every: int, task_seed: int = 0, at_episode_end: bool = False) -> None:
        super().__init__(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end, axis=-1)
        if not (self._native and env._native and env.render_mode != "human"
                and not self._truncate_at_change):
            raise ValueError("PermutedMinAtar needs a MinAtarEnv with native channels and no 'human' rendering")
        self._act = env._act
        self._state = env._state
        self._action_set = env.action_set

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        # = PiecewiseStationaryWrapper.step over MinAtarEnv.step, inlined (no task info entries, no observation
        # transform, no truncation at task ends: see __init__)
        n = self._env_steps
        if n >= self._next_change and self._switch_in_step:
            self._switch(n // self._change_every)
        reward, terminated = self._act(self._action_set[action])
        self._env_steps = n = n + 1
        return self._state(), float(reward), terminated, False, {"task_id": self._task_id, "task_step": n - self._task_start}


def make_permuted_minatar(
    game: str,
    change_every: int = MINATAR_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    render_mode: Optional[str] = None,
    use_minimal_action_set: bool = False,
    **minatar_kwargs: Any,
) -> ChannelPermutation:
    """``sb3_plastic/PermutedMinAtar-<Game>-v0``: a MinAtar game with channels permuted anew every task.

    The observation of task ``k`` is ``np.take(base_obs, perm_k, axis=-1)`` with ``perm_k`` as documented in
    :class:`~sb3_plastic.envs.wrappers.ChannelPermutation` (task 0: identity).

    :param change_every: task length in env steps of each env copy; a task lasts ``change_every * n_envs`` model timesteps.
    """
    game = canonical_minatar_game(game)
    TaskSchedule(change_every, task_seed, at_episode_end)  # validate before building
    env = MinAtarEnv(game, render_mode=render_mode, use_minimal_action_set=use_minimal_action_set, **minatar_kwargs)
    if env._native and render_mode != "human":  # the lean step (same behaviour, fewer calls per step)
        return PermutedMinAtar(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end)
    return ChannelPermutation(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end, axis=-1)


def _padded_minatar_game(game: str, render_mode: Optional[str], minatar_kwargs: dict[str, Any],
                         idle_episode_steps: Optional[int] = None) -> gym.Env:
    env = MinAtarEnv(game, render_mode=render_mode, use_minimal_action_set=False, n_channels=MINATAR_MAX_CHANNELS,
                     **minatar_kwargs)
    return env if idle_episode_steps is None else TruncateIdleEpisode(env, max_steps=idle_episode_steps)


def make_switching_minatar(
    games: Union[Sequence[str], str] = MINATAR_GAMES,
    change_every: int = MINATAR_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    render_mode: Optional[str] = None,
    idle_episode_steps: Optional[int] = None,
    **minatar_kwargs: Any,
) -> GameSwitchingEnv:
    """``sb3_plastic/SwitchingMinAtar-v0``: cycle through ``games`` (task ``k`` plays ``games[k % len(games)]``).

    :param games: MinAtar games in switching order (repeats allowed; a single name is one game).
    :param change_every: task (game) length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps.
    :param idle_episode_steps: ``None`` (default) or ``n``: an episode of any game that has run ``n`` steps with a
        return below 0.1 is truncated (:class:`~sb3_plastic.envs.wrappers.TruncateIdleEpisode`; C-CHAIN's continual
        MinAtar uses 1 000, for Seaquest episodes that never end).
    """
    games = check_games(games, canonical_minatar_game, "MinAtar")
    TaskSchedule(change_every, task_seed, at_episode_end)
    if idle_episode_steps is not None:
        try:
            TruncateIdleEpisode(gym.Env(), max_steps=idle_episode_steps)  # validate before building
        except ValueError as exc:  # the wrapper names its own keyword, max_steps
            raise ValueError(f"idle_episode_steps={idle_episode_steps!r}: {exc} (or None: no cut)") from None
    fns = [partial(_padded_minatar_game, game, render_mode, minatar_kwargs, idle_episode_steps) for game in games]
    return GameSwitchingEnv(fns, change_every, names=games, task_seed=task_seed, at_episode_end=at_episode_end)

