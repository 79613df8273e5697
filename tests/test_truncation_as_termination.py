"""TruncationAsTermination: a time limit's cut ends the episode as a terminal state (gym 0.23's single ``done``, as
Dohare et al.'s PPO stored it), so SB3 does not bootstrap it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_plastic.envs import TruncationAsTermination


class _Walk(gym.Env):
    """Reward 1 per step; terminates at step ``end`` (never if None); observation = the step count."""

    def __init__(self, end: Any = None) -> None:
        self.observation_space = spaces.Box(0, 100, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.end, self.t = end, 0

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.end is not None and self.t >= self.end, False, {"t": self.t}


def test_a_truncation_becomes_a_termination_and_nothing_else_changes():
    limited = gym.wrappers.TimeLimit(_Walk(), max_episode_steps=3)
    wrapped = TruncationAsTermination(gym.wrappers.TimeLimit(_Walk(), max_episode_steps=3))
    limited.reset(seed=0)
    wrapped.reset(seed=0)
    for t in range(1, 4):
        a, b = limited.step(0), wrapped.step(0)
        assert np.array_equal(a[0], b[0]) and a[1] == b[1] and a[4] == b[4]
        assert (a[2], a[3]) == (False, t == 3) and (b[2], b[3]) == (t == 3, False)
    # terminated and truncated at once: terminated, not truncated
    both = TruncationAsTermination(gym.wrappers.TimeLimit(_Walk(end=2), max_episode_steps=2))
    both.reset(seed=0)
    both.step(0)
    assert both.step(0)[2:4] == (True, False)


def test_sb3_bootstraps_the_cut_without_it_and_not_with_it():
    """SB3's PPO adds ``gamma * V(last observation)`` to the reward of a truncated episode's last step; wrapped, the
    rollout buffer keeps the env's reward there."""
    rewards = {}
    for wrap in (False, True):
        env = make_vec_env(lambda: gym.wrappers.TimeLimit(_Walk(), max_episode_steps=3), n_envs=1, seed=0,
                           wrapper_class=TruncationAsTermination if wrap else None)
        model = PPO("MlpPolicy", env, n_steps=6, batch_size=6, n_epochs=1, gamma=0.9, seed=0)
        model.learn(6)
        rewards[wrap] = model.rollout_buffer.rewards[:, 0].copy()
        starts = model.rollout_buffer.episode_starts[:, 0]
        assert list(starts) == [1, 0, 0, 1, 0, 0]
    np.testing.assert_array_equal(rewards[True], np.ones(6))
    bootstrapped = rewards[False]
    assert np.array_equal(bootstrapped[[0, 1, 3, 4]], np.ones(4))
    assert bootstrapped[2] != 1.0 and bootstrapped[5] != 1.0  # 1 + 0.9 * V(terminal observation)
