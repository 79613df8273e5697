"""sb3_plastic/Perturbed<Control>-v0: a fixed random observation offset per task (issue #14's classic-control setting).

The offset of task k is checked against an independent draw of the documented generator, the dynamics against the
unwrapped gymnasium env, and the copies of a vector env against each other."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs as plastic_envs
from sb3_plastic.envs.control_envs import ObservationPerturbation

LUNAR = "sb3_plastic/PerturbedLunarLander-v0"
BASES = {"sb3_plastic/PerturbedCartPole-v0": "CartPole-v1", "sb3_plastic/PerturbedAcrobot-v0": "Acrobot-v1",
         LUNAR: "LunarLander-v3"}


def _box2d() -> bool:
    try:
        import Box2D  # noqa: F401
        import pygame  # noqa: F401
    except ImportError:
        return False
    return True


NEEDS_BOX2D = pytest.mark.skipif(not _box2d(), reason="LunarLander needs the box2d extra (pip install -e '.[box2d]')")
IDS = ["sb3_plastic/PerturbedCartPole-v0", "sb3_plastic/PerturbedAcrobot-v0", pytest.param(LUNAR, marks=NEEDS_BOX2D)]


@pytest.mark.parametrize("env_id", IDS)
def test_registered_and_passes_the_env_checkers(env_id):
    assert env_id in plastic_envs.REGISTERED_IDS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gym_check_env(gym.make(env_id, change_every=3), skip_render_check=True)
        sb3_check_env(gym.make(env_id, change_every=3))


@pytest.mark.parametrize("env_id", IDS)
def test_observation_is_the_base_observation_plus_the_documented_offset(env_id):
    scale, task_seed, change_every = 0.7, 5, 4
    env = gym.make(env_id, change_every=change_every, task_seed=task_seed, scale=scale)
    base = gym.make(BASES[env_id])
    obs, info = env.reset(seed=11)
    base_obs, _ = base.reset(seed=11)
    assert info["task_id"] == 0 and np.allclose(obs, base_obs)  # task 0: unperturbed
    rng = np.random.default_rng(3)
    for n in range(25):
        action = int(rng.integers(base.action_space.n))
        obs, reward, terminated, truncated, info = env.step(action)
        base_obs, base_reward, base_terminated, base_truncated, _ = base.step(action)
        k = n // change_every
        expected = np.zeros(obs.shape) if k == 0 else np.random.default_rng(
            np.random.SeedSequence([task_seed, k])).normal(0.0, scale, size=obs.shape)
        assert info["task_id"] == k
        np.testing.assert_allclose(obs, base_obs.astype(np.float32) + expected.astype(np.float32), rtol=1e-6, atol=1e-6)
        assert (reward, terminated, truncated) == (base_reward, base_terminated, base_truncated)
        assert obs.dtype == np.float32 and env.observation_space.contains(obs)
        if terminated or truncated:
            break


def test_copies_share_the_offsets_and_task_seeds_differ():
    def offsets(task_seed):
        vec = make_vec_env("sb3_plastic/PerturbedCartPole-v0", n_envs=2, seed=0,
                           env_kwargs=dict(change_every=3, task_seed=task_seed))
        vec.reset()
        seen = []
        for _ in range(10):
            _, _, _, infos = vec.step(np.zeros(2, dtype=np.int64))
            assert infos[0]["task_id"] == infos[1]["task_id"]
            current = vec.get_attr("current_offset")
            assert np.array_equal(current[0], current[1])
            seen.append(current[0])
        vec.close()
        return np.array(seen)

    a, b = offsets(0), offsets(1)
    assert np.array_equal(a, offsets(0)) and not np.allclose(a[-1], b[-1])


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="scale must be a finite number > 0, got -1"):
        gym.make("sb3_plastic/PerturbedCartPole-v0", scale=-1.0)
    with pytest.raises(ValueError, match="change_every"):
        gym.make("sb3_plastic/PerturbedCartPole-v0", change_every=0)
    with pytest.raises(ValueError, match="needs a Box observation space"):
        ObservationPerturbation(gym.make("FrozenLake-v1"), change_every=5)
    with pytest.raises(ValueError, match="task_index must be >= 0"):
        ObservationPerturbation(gym.make("CartPole-v1"), 5).offset_for(-1)


@pytest.mark.parametrize("env_id", IDS)
def test_published_protocol_offsets_have_standard_deviation_two_and_episodes_stop_at_400(env_id):
    """TRAC / C-CHAIN's protocol: ``np.random.normal(0, 2)`` per dimension (numpy's scale is the standard deviation),
    no offset on task 0, episodes cut at 400 steps (CartPole-v1 would run to 500, LunarLander-v3 to 1 000)."""
    env = gym.make(env_id, change_every=100_000, task_seed=3, scale=2.0, max_episode_steps=400)
    wrapper = env.get_wrapper_attr("offset_for")
    assert not np.any(wrapper(0))
    for k in (1, 7):
        hand = np.random.default_rng(np.random.SeedSequence([3, k])).normal(size=env.observation_space.shape) * 2.0
        np.testing.assert_allclose(wrapper(k), hand.astype(np.float32), rtol=1e-6)
    draws = np.concatenate([wrapper(k) for k in range(1, 400)])
    assert 1.85 < draws.std() < 2.15 and abs(draws.mean()) < 0.15  # a standard deviation of 2, not a variance of 2
    assert env.spec.max_episode_steps == 400
    if env_id == LUNAR:
        return  # (no simple policy keeps the lander in the air for 400 steps)
    # CartPole balanced by a PD rule, Acrobot doing nothing: both would run past 400 steps (to 500) without the cut
    env.reset(seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        if env_id.endswith("CartPole-v0"):
            x, x_dot, theta, theta_dot = env.unwrapped.state
            action = int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)
        else:
            action = 1  # Acrobot: no torque
        _, _, terminated, truncated, _ = env.step(action)
        steps += 1
    assert steps == 400 and truncated and not terminated


def test_lunar_lander_without_box2d_names_the_extra(monkeypatch):
    import sb3_plastic.envs._deps as deps

    real = deps.importlib.import_module

    def fake(name, *args, **kwargs):
        if name == "Box2D":
            raise ImportError("No module named 'Box2D'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(deps.importlib, "import_module", fake)
    with pytest.raises(gym.error.DependencyNotInstalled, match=r"sb3-plastic\[box2d\]"):
        gym.make(LUNAR)
