"""A Slippery MuJoCo env survives the bench's checkpoint (bench/run_checkpoint.py pickles the vector env with
cloudpickle) with the task's friction, its episode in progress and its generator.

Before the fix, gymnasium's MuJoCo env was rebuilt from its constructor arguments on unpickling: the model came back
with the XML's friction (1.0 for Ant) while ``SlipperyFriction`` and ``info["friction"]`` still reported the task's,
until the next task switch; the episode restarted from the initial pose and the generator was unseeded. Five of the ten
tasks of ``slippery_ant_dohare``'s plain seed 0 (resumed 8 times) ran most of their steps at friction 1.0 that way.
"""

from __future__ import annotations

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco")

import sb3_plastic.envs  # noqa: F401  (registers the ids)


@pytest.mark.parametrize("env_id", ["sb3_plastic/SlipperyAnt-v0", "sb3_plastic/SlipperyHalfCheetah-v0"])
def test_friction_survives_a_pickle_round_trip(env_id):
    env = gym.make(env_id, change_every=100_000, task_seed=0)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(20):
        env.step(env.action_space.sample())
    copy = cloudpickle.loads(cloudpickle.dumps(env))
    friction = copy.get_wrapper_attr("friction")
    assert friction == env.get_wrapper_attr("friction")
    assert np.all(copy.unwrapped.model.geom_friction[:, 0] == friction)
    copy.reset()  # no task switch here: the friction in force must still be the task's
    assert np.all(copy.unwrapped.model.geom_friction[:, 0] == friction)


@pytest.mark.parametrize("env_id", ["sb3_plastic/SlipperyAnt-v0", "sb3_plastic/SlipperyHalfCheetah-v0"])
def test_pickled_env_continues_the_episode_and_generator_exactly(env_id):
    env = gym.make(env_id, change_every=300, task_seed=1)  # the run crosses a task switch after the round trip
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (1200, *env.action_space.shape)).astype(np.float32)
    for t in range(150):
        env.step(actions[t])
    copy = cloudpickle.loads(cloudpickle.dumps(env))
    for t in range(150, 1200):
        o1, r1, te1, tr1, i1 = env.step(actions[t])
        o2, r2, te2, tr2, i2 = copy.step(actions[t])
        assert np.array_equal(o1, o2) and r1 == r2 and (te1, tr1) == (te2, tr2), f"diverged at step {t}"
        assert i1["friction"] == i2["friction"] and i1["task_id"] == i2["task_id"]
        if te1 or tr1:
            o1, _ = env.reset()
            o2, _ = copy.reset()  # reset noise from the env's generator: must be the same draw
            assert np.array_equal(o1, o2)


def test_the_bench_checkpoint_of_a_vector_env_keeps_every_copys_friction(continual):
    """Through the bench's own checkpoint functions, on a DummyVecEnv of two copies past a task switch."""
    from stable_baselines3.common.env_util import make_vec_env

    dumps_env, loads_env = continual.run_checkpoint.dumps_env, continual.run_checkpoint.loads_env

    venv = make_vec_env("sb3_plastic/SlipperyAnt-v0", n_envs=2, seed=0,
                        env_kwargs=dict(change_every=60, task_seed=4, at_episode_end=False))
    venv.reset()
    rng = np.random.default_rng(1)
    for _ in range(80):  # task 1 from step 60 on
        venv.step(rng.uniform(-1, 1, (2, *venv.action_space.shape)).astype(np.float32))
    copy = loads_env(dumps_env(venv))
    for original, restored in zip(venv.envs, copy.envs):
        friction = original.get_wrapper_attr("friction")
        assert restored.get_wrapper_attr("friction") == friction
        assert np.all(restored.unwrapped.model.geom_friction[:, 0] == friction)
        assert np.array_equal(restored.unwrapped.data.qpos, original.unwrapped.data.qpos)

