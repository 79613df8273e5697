"""Task-switching Atari: ``sb3_plastic/SwitchingAtari-v0`` cycles through ALE games (needs the ``atari`` extra).

Every game is ``ALE/<Game>-v5`` (ale-py; Bellemare et al., 2013; v5 settings of Machado et al., 2018:
sticky actions with ``repeat_action_probability=0.25``) with ``full_action_space=True`` (the same
``Discrete(18)`` for every game) and ``frameskip=1``, wrapped in gymnasium's own ``AtariPreprocessing``
(frame skip 4 with max-pooling of the last two frames, up to 30 no-ops at reset, 84x84 grey) and
``FrameStackObservation(4)``: observations are ``(4, 84, 84)`` uint8, channels-first, so SB3's
``CnnPolicy`` (and :class:`~sb3_plastic.PlasticPPO` / :class:`~sb3_plastic.PlasticDQN` with
``"CnnPolicy"``) takes them unchanged. One env step is 4 frames. Rewards are not clipped (SB3's
``AtariWrapper`` would; clip with a wrapper of your own if you want it).

Task ``k`` plays ``games[k % len(games)]`` (default Breakout, Pong, SpaceInvaders) as documented in
:class:`~sb3_plastic.envs.wrappers.GameSwitchingEnv`: with the default ``at_episode_end=False`` the last
step of each game is returned with ``truncated=True`` and the step with 0-based index
``k * change_every`` is the first step of game ``k``. Default ``change_every=2_500_000`` env steps
(10M frames per game). ``info["game"]`` names the game in play.

The preprocessing is done: make vector envs with SB3's ``make_vec_env("sb3_plastic/SwitchingAtari-v0", n_envs=8)``,
not ``make_atari_env`` (its ``AtariWrapper`` would preprocess a second time) and without ``VecFrameStack``.
Atari wrappers that need the raw ALE env (SB3's ``AtariWrapper``, gymnasium's ``AtariPreprocessing``) fail on
it with an ``AttributeError`` that says so (:class:`PreprocessedAtariGames`). To clip rewards as
``AtariWrapper`` does: ``make_vec_env(..., wrapper_class=stable_baselines3.common.atari_wrappers.ClipRewardEnv)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Optional, Union

import gymnasium as gym

from sb3_plastic.envs._deps import check_games, require
from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import GameMux, GameSwitchingEnv

#: Default games of ``SwitchingAtari-v0``, in switching order.
ATARI_DEFAULT_GAMES = ("Breakout", "Pong", "SpaceInvaders")
#: Default ``change_every`` in env steps (4 frames each): 10M frames per game.
ATARI_CHANGE_EVERY = 2_500_000
#: ALE's full action set.
ATARI_N_ACTIONS = 18

_ENV_NAME = "sb3_plastic/SwitchingAtari-v0"


def _require_atari() -> None:
    require("ale_py", "atari", _ENV_NAME)
    require("cv2", "atari", _ENV_NAME)  # gymnasium's AtariPreprocessing resizes with OpenCV


def atari_games() -> list[str]:
    """The ALE game names (``ALE/<Game>-v5`` ids registered by ale-py)."""
    _require_atari()
    import ale_py

    gym.register_envs(ale_py)
    return sorted(env_id[4:-3] for env_id in gym.registry if env_id.startswith("ALE/") and env_id.endswith("-v5"))


def canonical_atari_game(name: Any) -> str:
    """Map ``"Breakout"``, ``"breakout"``, ``"space_invaders"`` or ``"ALE/SpaceInvaders-v5"`` to the ALE id name
    (``"SpaceInvaders"``); :raises ValueError: for an unknown game."""
    games = atari_games()
    if isinstance(name, str):
        key = name.split("/")[-1].split("-")[0].replace("_", "").lower()
        for game in games:
            if game.lower() == key:
                return game
    raise ValueError(f"unknown Atari game {name!r}; allowed: the ALE game names {games}")


def make_atari_game(
    game: str,
    render_mode: Optional[str] = None,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
    noop_max: int = 30,
    terminal_on_life_loss: bool = False,
    **ale_kwargs: Any,
) -> gym.Env:
    """One preprocessed full-action-set ALE game: ``ALE/<game>-v5`` + ``AtariPreprocessing`` + ``FrameStackObservation``.

    ``ale_kwargs`` go to the ALE env (e.g. ``repeat_action_probability``, ``mode``, ``difficulty``). The
    ALE env renders grey frames only (``obs_type="grayscale"``): ``AtariPreprocessing`` reads the screen
    from the emulator itself, so the observations are the same as with RGB frames, with less work.
    """
    _require_atari()
    game = canonical_atari_game(game)
    ale_kwargs.setdefault("obs_type", "grayscale")
    env = gym.make(f"ALE/{game}-v5", frameskip=1, full_action_space=True, render_mode=render_mode, **ale_kwargs)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False,
    )
    return gym.wrappers.FrameStackObservation(env, frame_stack)


#: Attributes of a raw ALE env that Atari preprocessing wrappers read from ``env.unwrapped``.
RAW_ALE_ATTRIBUTES = frozenset({"ale", "get_action_meanings"})


class PreprocessedAtariGames(GameMux):
    """The inner env of ``sb3_plastic/SwitchingAtari-v0``: a :class:`~sb3_plastic.envs.wrappers.GameMux` of
    preprocessed ALE games (see the module docstring).

    It is what ``env.unwrapped`` returns, and it is not an ALE env: asking it for a raw-ALE attribute
    (:data:`RAW_ALE_ATTRIBUTES`, which SB3's ``AtariWrapper`` / ``make_atari_env`` and gymnasium's
    ``AtariPreprocessing`` read) raises an ``AttributeError`` saying that the preprocessing is already applied
    and what to use instead. The ALE env of the game in play is ``env.unwrapped.current.unwrapped``.
    """

    def __getattr__(self, name: str) -> Any:
        # only called for attributes that normal lookup does not find
        if name in RAW_ALE_ATTRIBUTES:
            raise AttributeError(
                f"{_ENV_NAME} has no raw ALE attribute {name!r}: it already does the Atari preprocessing (each game is "
                "ALE/<Game>-v5 with frameskip=1 in gymnasium's AtariPreprocessing: frame skip 4 with max-pooling, up to "
                "30 no-op resets, 84x84 grey; then FrameStackObservation(4): observations (4, 84, 84) uint8), so an "
                "Atari wrapper such as SB3's make_atari_env / AtariWrapper or gymnasium's AtariPreprocessing would "
                f"preprocess twice. Use make_vec_env({_ENV_NAME!r}, n_envs=...) without VecFrameStack (to clip rewards: "
                "wrapper_class=stable_baselines3.common.atari_wrappers.ClipRewardEnv). The ALE env of the game in play "
                "is env.unwrapped.current.unwrapped."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class SwitchingAtariEnv(GameSwitchingEnv):
    """``sb3_plastic/SwitchingAtari-v0``: a :class:`~sb3_plastic.envs.wrappers.GameSwitchingEnv` of preprocessed
    ALE games whose inner env is a :class:`PreprocessedAtariGames` (built by :func:`make_switching_atari`)."""

    mux_class = PreprocessedAtariGames


def make_switching_atari(
    games: Union[Sequence[str], str] = ATARI_DEFAULT_GAMES,
    change_every: int = ATARI_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    render_mode: Optional[str] = None,
    **game_kwargs: Any,
) -> SwitchingAtariEnv:
    """``sb3_plastic/SwitchingAtari-v0``: cycle through ALE ``games``; ``game_kwargs`` go to :func:`make_atari_game`.

    :param games: ALE game names in switching order (repeats allowed; a single name is one game).
    :param change_every: task (game) length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps.
    """
    _require_atari()
    games = check_games(games, canonical_atari_game, "Atari")
    TaskSchedule(change_every, task_seed, at_episode_end)
    fns = [partial(make_atari_game, game, render_mode, **game_kwargs) for game in games]
    return SwitchingAtariEnv(fns, change_every, names=games, task_seed=task_seed, at_episode_end=at_episode_end)
