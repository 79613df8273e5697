"""A contextual bandit whose rewarded actions are re-drawn every task: random-label memorisation as RL.

``sb3_plastic/RandomLabelBandit-v0`` is the reinforcement-learning form of the random-label memorisation
probe of the loss-of-plasticity literature (Lyle et al., 2023, "Understanding plasticity in neural
networks"; Dohare et al., 2024, Nature; Kumar et al., 2021 for the capacity argument): a fixed set of
``n_contexts`` random observation vectors, one rewarded action per context, and every ``change_every``
env steps a new task re-draws the rewarded action of every context at random. Nothing carries over from
one task to the next except what the network has become, so an agent that needs more and more data (or
never gets there) to reach the same accuracy on task ``k`` as on task 0 has lost plasticity: every task
is statistically the same, and task 0 is the fresh-agent reference of a warm-start test.

It is cheap (a step is an array lookup), so plain agents lose plasticity on it within CPU-minutes; see
``bench/continual.py``. It is a bandit, not a sequential control problem: actions do not change the next
observation.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_plastic.envs.wrappers import PiecewiseStationaryWrapper


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class ContextualBandit(gym.Env):
    """A stationary contextual bandit over a fixed set of Gaussian contexts.

    Each step shows one of ``n_contexts`` fixed observation vectors (drawn once from N(0, 1) with
    ``context_seed``; the same for every env copy and every task), chosen uniformly by the env's own
    generator; the reward is 1 when the action equals that context's label, else 0. An episode is
    ``episode_length`` steps (it ends with ``terminated=True``), so its return is the number of correct
    actions and ``return / episode_length`` the accuracy.

    :param n_contexts: number of distinct observations (the "training set" size).
    :param obs_dim: dimension of the observation vectors.
    :param n_actions: number of actions (the "classes").
    :param episode_length: steps per episode.
    :param context_seed: seed of the observation vectors.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        n_contexts: int = 256,
        obs_dim: int = 32,
        n_actions: int = 8,
        episode_length: int = 16,
        context_seed: int = 0,
    ) -> None:
        super().__init__()
        self.n_contexts = _positive_int(n_contexts, "n_contexts")
        self.obs_dim = _positive_int(obs_dim, "obs_dim")
        n_actions = _positive_int(n_actions, "n_actions")
        if n_actions < 2:
            raise ValueError(f"n_actions must be >= 2, got {n_actions!r}")
        self.episode_length = _positive_int(episode_length, "episode_length")
        if isinstance(context_seed, bool) or not isinstance(context_seed, (int, np.integer)) or context_seed < 0:
            raise ValueError(f"context_seed must be a non-negative integer, got {context_seed!r}")
        rng = np.random.default_rng(np.random.SeedSequence([int(context_seed), 0x5EED]))
        self.contexts = rng.standard_normal((self.n_contexts, self.obs_dim)).astype(np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.action_space = spaces.Discrete(n_actions)
        #: the rewarded action of every context (task 0's labels until a task sets them)
        self.labels = rng.integers(0, n_actions, self.n_contexts)
        self._context = 0
        self._t = 0

    def set_labels(self, labels: np.ndarray) -> None:
        """Replace the rewarded action of every context (shape ``(n_contexts,)``, values in the action space)."""
        labels = np.asarray(labels)
        n_actions = int(self.action_space.n)
        if labels.shape != (self.n_contexts,) or labels.min() < 0 or labels.max() >= n_actions:
            raise ValueError(
                f"labels must have shape ({self.n_contexts},) and values in [0, {n_actions}), got shape {labels.shape}"
            )
        self.labels = labels.astype(np.int64)

    def _observe(self) -> np.ndarray:
        self._context = int(self.np_random.integers(self.n_contexts))
        return self.contexts[self._context].copy()

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        reward = 1.0 if int(action) == self.labels[self._context] else 0.0
        self._t += 1
        terminated = self._t >= self.episode_length
        return self._observe(), reward, terminated, False, {}


class RandomLabelBandit(PiecewiseStationaryWrapper):
    """:class:`ContextualBandit` whose labels are re-drawn uniformly at random for every task.

    Task ``k``'s labels come from ``schedule.rng(k)`` (so every copy of a vector env agrees, and task 0 is
    random too); the contexts never change. See :class:`~sb3_plastic.envs.wrappers.PiecewiseStationaryWrapper`
    for when a change takes effect and the ``info`` entries.
    """

    def apply_task(self, task_index: int, rng: np.random.Generator) -> None:
        bandit = self.env.unwrapped
        assert isinstance(bandit, ContextualBandit)
        bandit.set_labels(rng.integers(0, int(bandit.action_space.n), bandit.n_contexts))
        return None


def make_random_label_bandit(
    change_every: int = 2_000,
    task_seed: int = 0,
    at_episode_end: bool = False,
    n_contexts: int = 256,
    obs_dim: int = 32,
    n_actions: int = 8,
    episode_length: int = 16,
    context_seed: int = 0,
) -> RandomLabelBandit:
    """``sb3_plastic/RandomLabelBandit-v0``: labels re-drawn every ``change_every`` env steps of each copy.

    :param change_every: task length in env steps of each env copy; a task lasts ``change_every * n_envs`` model timesteps.
    :param task_seed: seed of the label sequence (shared by the copies of a vector env).
    :param at_episode_end: postpone each change to the next episode start.
    :param n_contexts: see :class:`ContextualBandit` (also for the parameters below).
    :param obs_dim: dimension of the observations.
    :param n_actions: number of actions.
    :param episode_length: steps per episode.
    :param context_seed: seed of the observation vectors.
    """
    env = ContextualBandit(n_contexts, obs_dim, n_actions, episode_length, context_seed)
    return RandomLabelBandit(env, change_every, task_seed=task_seed, at_episode_end=at_episode_end)
