"""Gymnasium adapter for Octax (CHIP-8 arcade games in JAX), and its channel-permuted / game-switching variants.

Octax (Radji, Michel & Piteau, 2025, "Octax: Accelerated CHIP-8 Arcade Environments for Reinforcement
Learning in JAX", arXiv 2510.01764; PyPI ``octax``) ships its games only behind a functional, gymnax-style
JAX API (``state, obs, info = env.reset(key)``; ``state, obs, r, term, trunc, info = env.step(state, a)``).
Rosseau, Müller & Nowé (2026) use Octax, next to MinAtar, for their continual RL benchmarks (channel
permutations and task switching). This module wraps it for Gymnasium / Stable-Baselines3:

* ``sb3_plastic/Octax-<Game>-v0``: :class:`OctaxEnv`, one game.
* ``sb3_plastic/PermutedOctax-<Game>-v0``: :func:`make_permuted_octax`, the game under a
  :class:`~sb3_plastic.envs.wrappers.ChannelPermutation` of its frame channels (axis 0).
* ``sb3_plastic/SwitchingOctax-v0``: :func:`make_switching_octax`, a
  :class:`~sb3_plastic.envs.wrappers.GameSwitchingEnv` over several games with one common action space.

``<Game>`` is the CamelCase name of an Octax game (:data:`OCTAX_ID_NAMES`, e.g. ``Brix``, ``VerticalBrix``,
``SpaceFlight3``). Call :func:`register_octax_envs` to register the ids; registering never imports JAX, and
neither does importing this module: ``octax`` (and so ``jax``) is imported when an env is made. Without it
an :class:`OctaxNotInstalled` error (an ``ImportError``) names the extra: ``pip install 'sb3-plastic[octax]'``.

**Observations.** Octax observes the CHIP-8 display (64 x 32 monochrome pixels) of the ``frame_skip``
(default 4) frames emulated during one agent step, oldest first. The adapter returns them channels-first as
``(frame_skip, 32, 64)`` = (frames, height, width) (Octax itself yields ``(frame_skip, 64, 32)``, x before y;
its gymnax wrapper transposes the same way). After ``reset()`` the first ``frame_skip - 1`` frames are zeros.
``obs_dtype="bool"`` (default, Octax's own dtype): ``Box(0, 1, (4, 32, 64), bool)``; ``obs_dtype="uint8"``:
pixels 0/255 in ``Box(0, 255, (4, 32, 64), uint8)``, an SB3 image space (SB3 divides by 255). Both work with
``PlasticPPO("CnnPolicy", ...)``, whose :class:`~sb3_plastic.networks.PlasticCNN` picks its small (MinAtar)
CNN for 32-pixel-high frames (SB3's own NatureCNN needs >= 36 x 36 and refuses them).

**Actions.** Each game uses a few CHIP-8 keys (:data:`OCTAX_ACTION_KEYS`): native action ``i <
len(keys)`` presses ``keys[i]`` for the whole step, the last native action ``len(keys)`` is a no-op (Octax's
convention). With ``action_keys=K`` the action space becomes ``Discrete(len(K) + 1)``: action ``i < len(K)``
presses key ``K[i]`` if the game uses it and is a no-op otherwise; action ``len(K)`` is a no-op.

**Episodes.** ``terminated`` is the game's own game-over test; ``truncated`` comes after ``max_steps``
agent steps (Octax's ``max_num_steps_per_episodes``, default 4500 = 5 minutes of play at 60 frames/s). The
reward is the change of the game's score (Octax reads it from a CHIP-8 register). ``info["score"]`` is the
score.

**Seeding.** ``reset(seed=s)`` starts from ``jax.random.PRNGKey(s)`` (seeds >= 2**32 are first hashed with
``np.random.SeedSequence``), the key Octax's own ``env.reset`` would take, so trajectories equal Octax's;
a ``reset()`` without a seed draws the key from ``self.np_random``. The key only feeds the CHIP-8 random
instruction: every episode of a game starts from the same screen.

**Speed.** Every :class:`OctaxEnv` of a game (and configuration) in a process shares one emulator and one
pair of jitted functions (start-up 1-10 s and compilation ~2-5 s per game on CPU, paid on first use), so
the copies of a vector env compile once. A step emulates ``frame_skip`` frames (44 CHIP-8 instructions by
default) in one JAX call: on one CPU core about 1 200-2 000 steps/s for a single env
(``bench/octax_speed.py``), 20-70x slower than MinAtar; ``jax.vmap`` over 64 copies gains under 2x on CPU.
Practical on CPU for tests and short runs (10^5-10^6 steps); the paper-scale runs need Octax's own
vectorised JAX training on an accelerator.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, ClassVar, Optional, SupportsFloat, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import DependencyNotInstalled

from sb3_plastic.envs._deps import check_games
from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import ChannelPermutation, GameSwitchingEnv, PadActions

#: The games of ``octax`` 0.1.1 (its module / ``create_environment`` names; a trailing number is a level).
#: ``cavern4a``/``cavern4b`` are left out: Octax ships their ROMs but ``create_environment`` cannot load them.
OCTAX_GAMES: tuple[str, ...] = (
    "airplane", "blinky", "brix", "deep", "filter", "flight_runner", "missile", "pong", "rocket", "shooting_stars",
    "spacejam", "squash", "submarine", "tank", "tetris", "ufo", "vertical_brix", "wipe_off", "worm",
    *(f"cavern{i}" for i in (1, 2, 3, 5, 6)),
    *(f"space_flight{i}" for i in range(1, 11)),
    *(f"target_shooter{i}" for i in (1, 2, 3)),
)
#: CamelCase names used in the gymnasium ids (``vertical_brix`` -> ``VerticalBrix``, ``space_flight3`` -> ``SpaceFlight3``).
OCTAX_ID_NAMES: dict[str, str] = {game: "".join(part.capitalize() for part in game.split("_")) for game in OCTAX_GAMES}
#: The CHIP-8 keys each game uses, in the order of its native actions (``octax`` 0.1.1; documentation
#: only: :class:`OctaxEnv` reads them from ``octax`` itself). The extra last native action is a no-op.
OCTAX_ACTION_KEYS: dict[str, tuple[int, ...]] = {
    "airplane": (8,), "blinky": (3, 6, 7, 8), "brix": (4, 6), "deep": (7, 8, 9), "filter": (4, 6),
    "flight_runner": (5, 7, 8, 9), "missile": (8,), "pong": (1, 4), "rocket": (15,), "shooting_stars": (2, 8, 4, 6),
    "spacejam": (5, 8, 7, 9), "squash": (1, 4), "submarine": (5,), "tank": (2, 4, 5, 6, 8), "tetris": (4, 5, 6, 7),
    "ufo": (4, 5, 6), "vertical_brix": (1, 4), "wipe_off": (4, 6), "worm": (2, 8, 4, 6),
    **{f"cavern{i}": (2, 4, 6, 8) for i in (1, 2, 3, 5, 6)},
    **{f"space_flight{i}": (1, 4) for i in range(1, 11)},
    **{f"target_shooter{i}": (5, 7, 8, 9, 6) for i in (1, 2, 3)},
}
#: Height and width of the CHIP-8 display.
OCTAX_SCREEN = (32, 64)
#: Default games of ``SwitchingOctax-v0`` (a paddle game, a reaction game, a puzzle), in switching order.
OCTAX_SWITCHING_GAMES: tuple[str, ...] = ("brix", "pong", "tetris")
#: Default ``change_every`` (env steps) of the permuted and switching Octax envs (as for MinAtar).
OCTAX_CHANGE_EVERY = 500_000
#: Action modes of :func:`make_switching_octax`.
OCTAX_ACTION_MODES = ("union", "padded")

_SEED_LIMIT = 2**32  # jax.random.PRNGKey silently truncates larger seeds


class OctaxNotInstalled(DependencyNotInstalled, ImportError):
    """``octax`` (or ``jax``) is missing: ``pip install 'sb3-plastic[octax]'``.

    Both an ``ImportError`` and gymnasium's ``DependencyNotInstalled``.
    """


def _import_octax() -> tuple[Any, Any, Any]:
    """Import ``jax``, ``jax.numpy`` and ``octax.environments``, or raise :class:`OctaxNotInstalled`."""
    try:
        import jax
        import jax.numpy as jnp
        import octax.environments as octax_envs
    except ImportError as exc:
        raise OctaxNotInstalled(
            f"the Octax environments need the optional dependency 'octax' (CHIP-8 games in JAX), which could not be "
            f"imported ({exc}): pip install 'sb3-plastic[octax]' (a CPU jax is enough)"
        ) from exc
    return jax, jnp, octax_envs


def canonical_octax_game(name: Any) -> str:
    """Map ``"brix"``, ``"Brix"``, ``"vertical_brix"``, ``"VerticalBrix"``, ``"space-flight3"`` or an id such as
    ``"sb3_plastic/Octax-Brix-v0"`` to the Octax game name; :raises ValueError: for an unknown game."""
    if isinstance(name, str):
        key = name.split("/")[-1]
        parts = key.split("-")
        if len(parts) >= 2 and parts[0].lower() in ("octax", "permutedoctax"):
            key = parts[1]
        elif len(parts) == 3 and re.fullmatch(r"v\d+", parts[-1]):
            key = parts[0]
        key = key.replace("_", "").replace("-", "").lower()
        for game in OCTAX_GAMES:
            if game.replace("_", "") == key:
                return game
    raise ValueError(f"unknown Octax game {name!r}; allowed: {list(OCTAX_GAMES)} (or the CamelCase names of the ids)")


# ---------------------------------------------------------------------------------------------- emulator cache
class _OctaxGame:
    """One Octax game configuration: the ``octax`` env and its jitted reset / step, shared by all adapters."""

    def __init__(self, game: str, frame_skip: int, max_steps: int, uint8: bool, octax_kwargs: dict[str, Any]) -> None:
        jax, jnp, octax_envs = _import_octax()
        self.jax = jax
        with _quiet_jax():
            self.env, self.metadata = octax_envs.create_environment(
                game, frame_skip=frame_skip, max_num_steps_per_episodes=max_steps, **octax_kwargs
            )
        self.keys: tuple[int, ...] = tuple(int(k) for k in np.asarray(self.env.action_set))
        self.n_native = len(self.keys) + 1  # the last native action is the no-op
        env = self.env

        def to_obs(frames: Any) -> Any:
            frames = jnp.swapaxes(frames, 1, 2)  # (frame_skip, 64, 32) x-major -> (frame_skip, 32, 64)
            return frames.astype(jnp.uint8) * jnp.uint8(255) if uint8 else frames

        def reset(key: Any) -> tuple[Any, tuple[Any, Any]]:
            state, frames, info = env.reset(key)
            return state, (to_obs(frames), info["score"])

        def step(state: Any, action: Any) -> tuple[Any, tuple[Any, Any]]:
            state, frames, reward, terminated, truncated, info = env.step(state, action)
            # one float32 vector instead of four jax scalars: a single transfer (~1 us instead of ~60 us)
            scalars = jnp.stack([jnp.asarray(x, jnp.float32) for x in (reward, terminated, truncated, info["score"])])
            return state, (to_obs(frames), scalars)

        self._reset = jax.jit(reset)
        self._step = jax.jit(step)
        self._compiled = False

    def _warm_up(self, key: Any) -> None:
        # First calls trace and compile; octax triggers harmless dtype FutureWarnings from jax while tracing.
        with _quiet_jax():
            state, _ = self._reset(key)
            state, _ = self._step(state, np.int32(self.n_native - 1))
            self._step(state, np.int32(self.n_native - 1))  # stepped states have the same signature: no recompile
        self._compiled = True

    def reset(self, key: Any) -> tuple[Any, np.ndarray, float]:
        """Reset: ``state, obs, score`` (obs a writable NumPy copy, not a read-only view of jax's buffer)."""
        if not self._compiled:
            self._warm_up(key)
        state, (obs, score) = self._reset(key)
        return state, np.array(obs), float(score)

    def step(self, state: Any, action: np.int32) -> tuple[Any, np.ndarray, float, bool, bool, float]:
        """One step: ``state, obs, reward, terminated, truncated, score`` (obs a writable NumPy copy)."""
        state, (obs, scalars) = self._step(state, action)
        reward, terminated, truncated, score = np.asarray(scalars).tolist()
        return state, np.array(obs), reward, terminated != 0.0, truncated != 0.0, score


_GAMES: dict[tuple[Any, ...], _OctaxGame] = {}


@contextmanager
def _quiet_jax() -> Iterator[None]:
    """Silence the dtype ``FutureWarning`` s that jax raises while tracing octax's emulator (harmless in jax 0.10)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="scatter inputs have incompatible types", category=FutureWarning)
        yield


def _octax_game(game: str, frame_skip: int, max_steps: int, uint8: bool, octax_kwargs: dict[str, Any]) -> _OctaxGame:
    """The shared :class:`_OctaxGame` of a configuration (built on first request)."""
    try:
        key: Optional[tuple[Any, ...]] = (game, frame_skip, max_steps, uint8, tuple(sorted(octax_kwargs.items())))
        hash(key)
    except TypeError:  # unhashable keyword values: no sharing
        key = None
    if key is not None and key in _GAMES:
        return _GAMES[key]
    built = _OctaxGame(game, frame_skip, max_steps, uint8, octax_kwargs)
    if key is not None:
        _GAMES[key] = built
    return built


# ---------------------------------------------------------------------------------------------- the adapter
class OctaxEnv(gym.Env):
    """One Octax game as a Gymnasium env (``sb3_plastic/Octax-<Game>-v0``); see the module docstring.

    Octax: Radji, Michel & Piteau (2025), arXiv 2510.01764; used for continual RL by Rosseau, Müller & Nowé (2026).

    :param game: an Octax game (:data:`OCTAX_GAMES`, any spelling accepted by :func:`canonical_octax_game`).
    :param frame_skip: emulated frames per agent step, also the number of channels of the observation.
    :param max_steps: agent steps before ``truncated=True`` (Octax's ``max_num_steps_per_episodes``). Named so
        that ``gym.make``'s own ``max_episode_steps`` (an extra ``TimeLimit``) stays distinct.
    :param obs_dtype: ``"bool"`` (pixels False/True) or ``"uint8"`` (pixels 0/255, an SB3 image space).
    :param action_keys: optional CHIP-8 keys (0-15) defining a common ``Discrete(len(action_keys) + 1)``
        action space (keys the game does not use, and the last action, are no-ops); default: the game's own.
    :param render_mode: ``None`` or ``"rgb_array"`` (the display scaled by ``render_scale``, ``(256, 512, 3)`` uint8).
    :param render_scale: pixel size of the rendered display.
    :param color_scheme: Octax colour scheme of the rendering ("classic", "octax", "amber", "white", "blue", "retro").
    :param device: optional JAX platform to run the emulator on (e.g. ``"cpu"`` on a machine with a GPU jax);
        default: JAX's default device.
    :param octax_kwargs: other keywords of Octax's ``OctaxEnv`` (``instruction_frequency``, ``fps``,
        ``disable_delay``, ...).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(
        self,
        game: str = "brix",
        frame_skip: int = 4,
        max_steps: int = 4500,
        obs_dtype: str = "bool",
        action_keys: Optional[Sequence[int]] = None,
        render_mode: Optional[str] = None,
        render_scale: int = 8,
        color_scheme: str = "classic",
        device: Optional[str] = None,
        **octax_kwargs: Any,
    ) -> None:
        self.game = canonical_octax_game(game)
        if isinstance(frame_skip, bool) or not isinstance(frame_skip, (int, np.integer)) or frame_skip < 1:
            raise ValueError(f"frame_skip must be a positive integer, got {frame_skip!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if obs_dtype not in ("bool", "uint8"):
            raise ValueError(f"obs_dtype must be 'bool' or 'uint8', got {obs_dtype!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.frame_skip, self.max_steps, self.obs_dtype = int(frame_skip), int(max_steps), obs_dtype
        self.render_mode, self.render_scale, self.color_scheme = render_mode, int(render_scale), color_scheme

        self._game = _octax_game(self.game, self.frame_skip, self.max_steps, obs_dtype == "uint8", dict(octax_kwargs))
        jax = self._game.jax
        self._jax = jax
        self._device = jax.devices(device)[0] if device is not None else None

        #: The CHIP-8 keys of the game's native actions (the native no-op is action ``len(game_keys)``).
        self.game_keys: tuple[int, ...] = self._game.keys
        noop = len(self.game_keys)
        if action_keys is None:
            self.action_keys: tuple[int, ...] = self.game_keys
            table = np.arange(noop + 1)
        else:
            self.action_keys = tuple(int(k) for k in action_keys)
            if len(set(self.action_keys)) != len(self.action_keys) or any(not 0 <= k <= 15 for k in self.action_keys):
                raise ValueError(f"action_keys must be distinct CHIP-8 keys in 0..15, got {list(action_keys)}")
            native = {key: i for i, key in enumerate(self.game_keys)}
            table = np.array([native.get(key, noop) for key in self.action_keys] + [noop])
        #: ``action_table[a]`` is the native Octax action that action ``a`` performs.
        self.action_table: np.ndarray = table.astype(np.int32)
        self.action_space = spaces.Discrete(len(self.action_table))

        shape = (self.frame_skip, *OCTAX_SCREEN)
        if obs_dtype == "uint8":
            self.observation_space = spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        else:
            self.observation_space = spaces.Box(0, 1, shape=shape, dtype=np.bool_)
        self._state: Any = None

    @property
    def title(self) -> str:
        """The game's title in Octax's metadata."""
        return str(self._game.metadata.get("title", self.game))

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            key_seed = int(self.np_random.integers(_SEED_LIMIT))
        elif seed >= _SEED_LIMIT:
            key_seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
        else:
            key_seed = int(seed)
        key = self._jax.random.PRNGKey(key_seed)
        if self._device is not None:
            key = self._jax.device_put(key, self._device)
        self._state, obs, score = self._game.reset(key)
        return obs, {"score": score}

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._state is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        a = int(action)
        if not 0 <= a < len(self.action_table):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self._state, obs, reward, terminated, truncated, score = self._game.step(self._state, self.action_table[a])
        return obs, reward, terminated, truncated, {"score": score}

    def render(self) -> Optional[np.ndarray]:
        if self.render_mode != "rgb_array":
            return None
        from octax.rendering import chip8_display_to_rgb, create_color_scheme

        on, off = create_color_scheme(self.color_scheme)
        if self._state is None:
            display = np.zeros(OCTAX_SCREEN[::-1], dtype=bool)
        else:
            display = self._state.display
        return np.asarray(chip8_display_to_rgb(display, scale=self.render_scale, on_color=on, off_color=off), dtype=np.uint8)

    def __repr__(self) -> str:
        return f"<OctaxEnv game={self.game!r} obs={self.observation_space.shape} actions={self.action_space.n}>"


# ---------------------------------------------------------------------------------------------- variants
def make_permuted_octax(
    game: str,
    change_every: int = OCTAX_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    **octax_kwargs: Any,
) -> ChannelPermutation:
    """``sb3_plastic/PermutedOctax-<Game>-v0``: an Octax game whose observation channels are permuted anew every task.

    The channels of an Octax observation are its ``frame_skip`` frames, so a permutation shuffles their
    temporal order. The observation of task ``k`` is ``np.take(base_obs, perm_k, axis=0)``, ``perm_k`` as
    documented in :class:`~sb3_plastic.envs.wrappers.ChannelPermutation` (task 0: identity; consecutive
    permutations differ; with the default 4 frames there are 24 of them). The step with 0-based index
    ``k * change_every`` is the first of permutation ``k`` (default ``change_every=500_000``), or, with
    ``at_episode_end=True``, the first episode started after it.

    :param game: an Octax game.
    :param change_every: task (permutation) length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param task_seed: seed of the permutation sequence, shared by all copies of a vector env (>= 0).
    :param at_episode_end: postpone each new permutation to the next ``reset()``.
    :param octax_kwargs: keywords of :class:`OctaxEnv`.
    """
    game = canonical_octax_game(game)
    TaskSchedule(change_every, task_seed, at_episode_end)  # validate before building
    env = OctaxEnv(game, **octax_kwargs)
    return ChannelPermutation(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end, axis=0)


def _switching_game(
    game: str, action_mode: str, action_keys: Sequence[int], n_actions: int, kwargs: dict[str, Any]
) -> gym.Env:
    if action_mode == "union":
        return OctaxEnv(game, action_keys=action_keys, **kwargs)
    env = OctaxEnv(game, **kwargs)
    return PadActions(env, n_actions, fallback=len(env.game_keys))  # the padded actions are the native no-op


def make_switching_octax(
    games: Union[Sequence[str], str] = OCTAX_SWITCHING_GAMES,
    change_every: int = OCTAX_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    action_mode: str = "union",
    **octax_kwargs: Any,
) -> GameSwitchingEnv:
    """``sb3_plastic/SwitchingOctax-v0``: cycle through Octax ``games`` (task ``k`` plays ``games[k % len(games)]``).

    Every game has the same observation space, ``(frame_skip, 32, 64)``. The action space is the same for
    every game too, one of:

    * ``action_mode="union"`` (default): one action per CHIP-8 key used by any of the games (sorted by key),
      plus a final no-op: ``Discrete(len(keys) + 1)``. An action presses the same physical key in every game;
      a key that the current game does not use acts as the no-op. Default games: keys (1, 4, 5, 6, 7), 6 actions.
    * ``action_mode="padded"``: every game's native actions padded to the largest native action count
      ``n`` (:class:`~sb3_plastic.envs.wrappers.PadActions`): action ``i`` is the game's ``i``-th native
      action; the game's own no-op and every padded action ``>= len(game keys)`` are no-ops. Smaller, but the
      same action index means different keys in different games.

    Games change between episodes only: the last step of each task is returned with ``truncated=True``
    (or, with ``at_episode_end=True``, the game changes at the next episode end); ``info["game"]`` names the
    game in play (see :class:`~sb3_plastic.envs.wrappers.GameSwitchingEnv`).

    :param games: Octax games in switching order (repeats allowed; a single name is one game).
    :param change_every: task (game) length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param task_seed: seed of the task sequence (>= 0).
    :param at_episode_end: switch at the next episode end instead of truncating the current episode.
    :param action_mode: "union" or "padded" (above).
    :param octax_kwargs: keywords of :class:`OctaxEnv` (except ``action_keys``), the same for every game.
    """
    games = check_games(games, canonical_octax_game, "Octax")
    TaskSchedule(change_every, task_seed, at_episode_end)
    if action_mode not in OCTAX_ACTION_MODES:
        raise ValueError(f"action_mode must be one of {list(OCTAX_ACTION_MODES)}, got {action_mode!r}")
    if "action_keys" in octax_kwargs:
        raise ValueError("make_switching_octax sets action_keys itself (see action_mode)")
    _import_octax()  # fail early with the extra's name
    keys_of = {game: _octax_game_keys(game, octax_kwargs) for game in dict.fromkeys(games)}
    union = tuple(sorted({key for keys in keys_of.values() for key in keys}))
    n_actions = max(len(keys) for keys in keys_of.values()) + 1
    fns = [partial(_switching_game, game, action_mode, union, n_actions, dict(octax_kwargs)) for game in games]
    return GameSwitchingEnv(fns, change_every, names=games, task_seed=task_seed, at_episode_end=at_episode_end)


def _octax_game_keys(game: str, octax_kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The CHIP-8 keys of ``game`` as ``octax`` defines them (builds, and caches, the game's emulator)."""
    return OctaxEnv(game, **octax_kwargs).game_keys


# ---------------------------------------------------------------------------------------------- registration
def octax_env_ids() -> list[str]:
    """Every gymnasium id of this module, in registration order."""
    names = [OCTAX_ID_NAMES[game] for game in OCTAX_GAMES]
    return (
        [f"sb3_plastic/Octax-{name}-v0" for name in names]
        + [f"sb3_plastic/PermutedOctax-{name}-v0" for name in names]
        + ["sb3_plastic/SwitchingOctax-v0"]
    )


def register_octax_envs() -> list[str]:
    """Register the Octax ids in gymnasium's registry (idempotent; imports neither ``octax`` nor ``jax``).

    ``sb3_plastic/Octax-<Game>-v0`` (:class:`OctaxEnv`), ``sb3_plastic/PermutedOctax-<Game>-v0``
    (:func:`make_permuted_octax`) for every game of :data:`OCTAX_GAMES`, and ``sb3_plastic/SwitchingOctax-v0``
    (:func:`make_switching_octax`). Keywords given to ``gym.make`` reach these callables.

    :return: the ids (all of them, registered now or before).
    """
    module = __name__
    for game in OCTAX_GAMES:
        name = OCTAX_ID_NAMES[game]
        _register(f"sb3_plastic/Octax-{name}-v0", f"{module}:OctaxEnv", {"game": game})
        _register(f"sb3_plastic/PermutedOctax-{name}-v0", f"{module}:make_permuted_octax", {"game": game})
    _register("sb3_plastic/SwitchingOctax-v0", f"{module}:make_switching_octax", {})
    return octax_env_ids()


def _register(env_id: str, entry_point: str, kwargs: dict[str, Any]) -> None:
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs)
