"""RawActions: an agent's raw continuous action reaches the env unclipped (Dohare et al.'s Slippery Ant runs)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco")

import sb3_plastic.envs  # noqa: F401  (registers the ids)


def test_raw_actions_reach_the_env_unclipped_and_only_the_control_cost_sees_them():
    """Dohare et al.'s PPO sent its raw Gaussian sample (gym 0.23 did not clip): MuJoCo clamps it to the ctrlrange
    for the dynamics, the control cost charges it whole. With ``raw_actions=True`` SB3's clipping to the declared
    space binds nowhere: an action of 3 moves the ant exactly as an action of 1 does and costs 9 times as much."""
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_plastic.envs import RawActions

    envs = []
    for raw in (True, False):
        env = gym.make("sb3_plastic/SlipperyAnt-v0", change_every=10_000, task_seed=0, raw_actions=raw,
                       include_cfrc_ext_in_observation=False)
        env.reset(seed=5)
        envs.append(env)
    wide, clipped = envs
    assert wide.action_space.high.max() == 1e6 and clipped.action_space.high.max() == 1.0
    _, _, _, _, big = wide.step(np.full(8, 3.0, dtype=np.float32))
    _, _, _, _, unit = clipped.step(np.full(8, 1.0, dtype=np.float32))
    assert np.array_equal(wide.unwrapped.data.qpos, clipped.unwrapped.data.qpos)
    assert big["reward_ctrl"] == pytest.approx(-0.5 * 8 * 9.0) and unit["reward_ctrl"] == pytest.approx(-0.5 * 8)
    assert wide.get_wrapper_attr("friction") == clipped.get_wrapper_attr("friction")
    # what an SB3 agent's env does with the action: clip to the declared space
    venv = make_vec_env("sb3_plastic/SlipperyAnt-v0", n_envs=1, seed=0, env_kwargs=dict(raw_actions=True))
    assert np.array_equal(np.clip(np.full(8, 3.0), venv.action_space.low, venv.action_space.high), np.full(8, 3.0))
    with pytest.raises(ValueError, match="RawActions needs a Box action space"):
        RawActions(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="bound must be a finite number at least as large"):
        RawActions(gym.make("Pendulum-v1"), bound=1.0)  # Pendulum's torque bound is 2
