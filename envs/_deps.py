"""Helpers: clear errors for missing optional extras (raised at make time, never at import) and game lists."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

from gymnasium.error import DependencyNotInstalled


def require(module: str, extra: str, env_name: str) -> None:
    """Import ``module`` or raise ``DependencyNotInstalled`` naming the sb3-plastic extra that provides it.

    :param module: the module to import (e.g. "mujoco", "ale_py", "cv2").
    :param extra: the sb3-plastic extra that installs it (e.g. "mujoco", "atari").
    :param env_name: the environment that needs it, for the message.
    """
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise DependencyNotInstalled(
            f"{env_name} needs the optional dependency {module!r}, which is not installed: "
            f"pip install 'sb3-plastic[{extra}]'"
        ) from exc


def check_games(games: Any, canonical: Callable[[Any], str], kind: str) -> list[str]:
    """Validate a list of game names (a single string is one game) and map each through ``canonical``.

    A list naming one game only (``"breakout"``, ``["breakout", "breakout"]``) is allowed but warned about: the
    env then never changes game, so it is not task-switching (its tasks differ only in their seeds).

    :raises ValueError: for an empty list, a non-list or an unknown game (raised by ``canonical``).
    """
    if isinstance(games, str):
        games = [games]
    try:
        games = list(games)
    except TypeError:
        raise ValueError(f"games must be a list of {kind} game names, got {games!r}") from None
    if not games:
        raise ValueError(f"games must name at least one {kind} game, got an empty list")
    games = [canonical(game) for game in games]
    if len(set(games)) == 1:
        warnings.warn(
            f"Switching{kind} with only one game ({games[0]!r}) in games={games}: the env never changes game, so it "
            "is not task-switching; give at least two different games",
            stacklevel=3,
        )
    return games
