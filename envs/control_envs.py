"""Classic control with a new fixed random perturbation of the observation every task.

``sb3_plastic/PerturbedCartPole-v0``, ``sb3_plastic/PerturbedAcrobot-v0`` and ``sb3_plastic/PerturbedLunarLander-v0``
(``LunarLander-v3``, the ``box2d`` extra): the continual Gym-control setting of the TRAC paper (Muppidi, Zhang & Yang,
2024, "Fast TRAC: a parameter-free optimizer for lifelong RL") and of C-CHAIN (Tang et al., ICML 2025):
the dynamics and rewards stay those of the gymnasium env; every task ``k >= 1`` adds its own fixed random offset
``b_k ~ N(0, scale^2 I)`` to every observation (task 0 is the unperturbed env, as task 0 of the channel-permuted envs
is unpermuted). The agent has to re-map its inputs at each change while the control problem stays the same, so a
fresh agent on task ``k`` learns as fast as on task 0: what a continually trained agent reaches below that is lost
plasticity. ``b_k`` depends on ``(task_seed, k)`` only, so every copy of a vector env sees the same sequence.

Their protocol (TRAC's ``main.ipynb``, C-CHAIN's ``crl_gym_classic_control/``): ``scale=2`` (``np.random.normal(0, 2)``,
a standard deviation of 2), episodes cut at 400 steps (``gym.make(id, max_episode_steps=400)``), 10 tasks. Their
offsets come from numpy's global generator seeded with the run's seed; these come from ``(task_seed, k)``, the same
distribution, other draws.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_plastic.envs._deps import require
from sb3_plastic.envs.schedule import TaskSchedule
from sb3_plastic.envs.wrappers import PiecewiseStationaryWrapper

#: default task length (env steps of each copy)
CONTROL_CHANGE_EVERY = 50_000
#: gymnasium control envs that need an sb3-plastic extra: base id -> (modules, extra); gymnasium's Box2D envs import
#: pygame as well as Box2D
CONTROL_EXTRAS = {"LunarLander-v3": (("Box2D", "pygame"), "box2d")}


class ObservationPerturbation(PiecewiseStationaryWrapper):
    """Add a fixed random offset ``b_k ~ N(0, scale^2 I)`` to every observation of task ``k`` (``b_0 = 0``).

    ``b_k`` is the first draw of ``schedule.rng(k).normal(0, scale, shape)``; :meth:`offset_for` gives it for any
    task and ``current_offset`` holds the one in force. The observation space becomes unbounded (a Gaussian
    offset has no bound), float32, of the wrapped shape. Tasks switch as documented in
    :class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`.

    :param env: env with a ``Box`` observation space.
    :param change_every: task length in env steps of each env copy;
        a task lasts ``change_every * n_envs`` model timesteps (> 0).
    :param task_seed: seed of the offset sequence (>= 0).
    :param at_episode_end: postpone each new offset to the next ``reset()``.
    :param scale: standard deviation of the offsets (> 0).
    """

    def __init__(
        self, env: gym.Env, change_every: int, task_seed: int = 0, at_episode_end: bool = False, scale: float = 1.0
    ) -> None:
        space = env.observation_space
        if not isinstance(space, spaces.Box):
            raise ValueError(f"ObservationPerturbation needs a Box observation space, got {space}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        super().__init__(env, change_every, task_seed, at_episode_end)
        self.scale = float(scale)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=space.shape, dtype=np.float32)
        self.current_offset = np.zeros(space.shape, dtype=np.float32)

    def offset_for(self, task_index: int) -> np.ndarray:
        """The observation offset of task ``task_index`` (see the class docstring)."""
        if task_index < 0:
            raise ValueError(f"task_index must be >= 0, got {task_index}")
        if task_index == 0:
            return np.zeros(self.observation_space.shape, dtype=np.float32)
        rng = self.schedule.rng(task_index)
        return rng.normal(0.0, self.scale, size=self.observation_space.shape).astype(np.float32)

    def apply_task(self, task_index: int, rng: np.random.Generator) -> dict[str, Any]:
        self.current_offset = self.offset_for(task_index)
        return {}

    def observation(self, observation: Any) -> np.ndarray:
        return (np.asarray(observation, dtype=np.float32) + self.current_offset).astype(np.float32)


def make_perturbed_control(
    base: str,
    change_every: int = CONTROL_CHANGE_EVERY,
    task_seed: int = 0,
    at_episode_end: bool = False,
    scale: float = 1.0,
    **base_kwargs: Any,
) -> ObservationPerturbation:
    """``sb3_plastic/Perturbed<Name>-v0``: the gymnasium env ``base`` with a new observation offset every task.

    :param base: the gymnasium id of the control env (``CartPole-v1``, ``Acrobot-v1``, ``LunarLander-v3`` for the
        registered ids).
    :param change_every: task length in env steps of each env copy; a task lasts ``change_every * n_envs`` model
        timesteps.
    :param task_seed: seed of the offset sequence (shared by the copies of a vector env).
    :param at_episode_end: postpone each change to the next episode start.
    :param scale: standard deviation of the offsets (see :class:`ObservationPerturbation`).
    :param base_kwargs: passed to ``gym.make(base)``.
    :raises gymnasium.error.DependencyNotInstalled: naming the extra when ``base`` needs one that is missing
        (:data:`CONTROL_EXTRAS`).
    """
    TaskSchedule(change_every, task_seed, at_episode_end)  # validate before building
    modules, extra = CONTROL_EXTRAS.get(base, ((), ""))
    for module in modules:
        require(module, extra, f"Perturbed {base}")
    return ObservationPerturbation(gym.make(base, **base_kwargs), change_every, task_seed, at_episode_end, scale)
