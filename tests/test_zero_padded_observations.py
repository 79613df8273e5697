"""ZeroPaddedObservations and ``observation_zeros`` of the Slippery envs: gym 0.23's Ant-v3 on mujoco-py 2.x observed
84 contact-force entries that were always 0 (111 observations), so Dohare et al.'s networks had 111 inputs and their
LeCun bound sqrt(3 / 111) on the first layer; padding Ant-v5's 27 observations with 84 zeros gives that network."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic.envs import ZeroPaddedObservations


class _Box(gym.Env):
    observation_space = spaces.Box(-2.0, 3.0, shape=(3,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([1.0, -1.5, 2.5], dtype=np.float32), {}

    def step(self, action):
        return np.full(3, float(action), dtype=np.float32), 1.0, False, False, {"a": action}


def test_zeros_are_appended_and_declared():
    env = ZeroPaddedObservations(_Box(), 4)
    inf = np.inf
    assert env.observation_space == spaces.Box(np.array([-2, -2, -2, -inf, -inf, -inf, -inf], np.float32),
                                               np.array([3, 3, 3, inf, inf, inf, inf], np.float32), dtype=np.float32)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.tolist() == [1.0, -1.5, 2.5, 0, 0, 0, 0]
    obs, reward, terminated, truncated, info = env.step(1)
    assert obs.tolist() == [1, 1, 1, 0, 0, 0, 0] and (reward, terminated, truncated, info) == (1.0, False, False, {"a": 1})
    assert env.observation_space.contains(obs)
    assert pickle.loads(pickle.dumps(env)).observation(np.ones(3, np.float32)).tolist() == [1, 1, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "84", None])
def test_bad_counts_name_the_value(bad):
    with pytest.raises(ValueError, match=f"zeros must be an int >= 0, got {bad!r}"):
        ZeroPaddedObservations(_Box(), bad)
    with pytest.raises(ValueError, match="flat Box"):
        ZeroPaddedObservations(gym.make("FrozenLake-v1"), 2)


def test_slippery_ant_pads_its_27_observations_to_his_111():
    pytest.importorskip("mujoco")
    import warnings

    kwargs = dict(change_every=10_000, task_seed=0, include_cfrc_ext_in_observation=False, contact_cost_weight=0.0)
    plain = gym.make("sb3_plastic/SlipperyAnt-v0", **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's env checker has nothing to say about the padded space
        padded = gym.make("sb3_plastic/SlipperyAnt-v0", observation_zeros=84, **kwargs)
        padded.reset(seed=0)
    assert plain.observation_space.shape == (27,) and padded.observation_space.shape == (111,)
    a, _ = plain.reset(seed=3)
    b, _ = padded.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert np.array_equal(b[:27], a) and not b[27:].any()
        action = rng.uniform(-1, 1, size=8)
        a, ra, *_ = plain.step(action)
        b, rb, *_ = padded.step(action)
        assert ra == rb
    with pytest.raises(ValueError, match="observation_zeros must be an int >= 0, got -3"):
        gym.make("sb3_plastic/SlipperyAnt-v0", observation_zeros=-3)
