"""The task schedule follows the model's num_timesteps (TaskScheduleSync): resuming continues the sequence.

Reference in every test: an uninterrupted run, or the schedule's definition ``task = (t // n_envs) //
change_every`` for the model timestep ``t`` (copies step in lockstep, ``change_every`` counts the steps of
each copy).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, VecNormalize

import sb3_plastic
import sb3_plastic.envs
from sb3_plastic import PlasticDQN, PlasticPPO, TaskScheduleSync
from sb3_plastic.envs import ChannelPermutation

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
N_ENVS = 2
CHANGE_EVERY = 5  # env steps of each copy: a task lasts 10 model timesteps
PPO_KWARGS = dict(n_steps=4, batch_size=8, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")


class TaskRecorder(BaseCallback):
    """Records ``(num_timesteps, task ids of the copies)`` at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, tuple[Any, ...]]] = []

    def _on_step(self) -> bool:
        self.rows.append((int(self.num_timesteps), tuple(info.get("task_id") for info in self.locals["infos"])))
        return True


def _bandit(n_envs: int = N_ENVS, change_every: int = CHANGE_EVERY, **kwargs: Any):
    env_kwargs = dict(change_every=change_every, n_contexts=8, obs_dim=4, **kwargs)
    return make_vec_env(BANDIT, n_envs=n_envs, seed=0, env_kwargs=env_kwargs)


def _expected(rows: list[tuple[int, tuple[Any, ...]]], n_envs: int = N_ENVS, change_every: int = CHANGE_EVERY) -> list:
    # the step reported at num_timesteps t is the copies' step with 0-based index t // n_envs - 1
    return [(t, (((t // n_envs) - 1) // change_every,) * n_envs) for t, _ in rows]


def test_save_load_continue_sees_the_uninterrupted_task_sequence(tmp_path):
    total, half = 48, 24  # the split falls inside task 2 (model timesteps 20..29)
    whole = TaskRecorder()
    PlasticPPO("MlpPolicy", _bandit(), **PPO_KWARGS).learn(total, callback=whole)
    assert whole.rows == _expected(whole.rows)
    assert {ids[0] for _, ids in whole.rows} == {0, 1, 2, 3, 4}

    first, second = TaskRecorder(), TaskRecorder()
    model = PlasticPPO("MlpPolicy", _bandit(), **PPO_KWARGS)
    model.learn(half, callback=first)
    model.save(tmp_path / "half.zip")
    loaded = PlasticPPO.load(tmp_path / "half.zip", env=_bandit(), device="cpu")
    loaded.learn(total - half, callback=second, reset_num_timesteps=False)
    assert loaded.num_timesteps == total
    assert first.rows + second.rows == whole.rows


def test_plain_sb3_model_with_the_callback_and_first_observation_of_the_due_task(tmp_path):
    """A plain SB3 PPO resumes the sequence with TaskScheduleSync passed by hand, and the first observation it
    acts on after the resume is already of the due task (a channel-permuted env shows the task in the obs)."""

    class Ramp(gym.Env):
        metadata: ClassVar[dict] = {"render_modes": []}
        observation_space = spaces.Box(0.0, 10.0, (4,), np.float32)
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.arange(4, dtype=np.float32), {}

        def step(self, action):
            return np.arange(4, dtype=np.float32), 0.0, False, False, {}

    def make():
        return ChannelPermutation(Ramp(), change_every=CHANGE_EVERY, task_seed=3)

    class FirstObs(TaskRecorder):
        def _on_step(self) -> bool:
            if not self.rows:
                self.first_obs = self.locals["obs_tensor"].numpy().copy()
            return super()._on_step()

    kwargs = dict(n_steps=4, batch_size=8, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")
    model = PPO("MlpPolicy", DummyVecEnv([make] * N_ENVS), **kwargs)
    model.learn(24, callback=TaskScheduleSync())
    model.save(tmp_path / "plain.zip")
    loaded = PPO.load(tmp_path / "plain.zip", env=DummyVecEnv([make] * N_ENVS), device="cpu")
    recorder = FirstObs()
    loaded.learn(16, callback=[TaskScheduleSync(), recorder], reset_num_timesteps=False)
    assert recorder.rows == _expected(recorder.rows)
    due = (24 // N_ENVS) // CHANGE_EVERY  # task 2
    perm = make().permutation_for(due)
    assert not np.array_equal(perm, np.arange(4))
    np.testing.assert_array_equal(recorder.first_obs, np.tile(np.arange(4, dtype=np.float32)[perm], (N_ENVS, 1)))


def test_second_learn_with_reset_num_timesteps_restarts_at_task_zero():
    model = PlasticPPO("MlpPolicy", _bandit(), **PPO_KWARGS)
    model.learn(24)
    recorder = TaskRecorder()
    model.learn(16, callback=recorder)  # reset_num_timesteps=True: num_timesteps and the schedule restart
    assert recorder.rows == _expected(recorder.rows)
    assert recorder.rows[0] == (2, (0, 0))


def test_continuation_with_the_same_env_is_not_reset():
    """learn(reset_num_timesteps=False) on the env the model was trained with: counters agree, no reset."""
    model = PlasticPPO("MlpPolicy", _bandit(), **PPO_KWARGS)
    model.learn(24)
    last_obs = model._last_obs.copy()
    sync = TaskScheduleSync()
    model.learn(8, callback=sync, reset_num_timesteps=False)
    assert not sync.synced
    assert sync.planned_tasks == (2, 3)  # timesteps 24 -> 32: copy steps 12..15, tasks 2 and 3
    assert last_obs.shape == model._last_obs.shape


def test_off_policy_resume(tmp_path):
    kwargs = dict(learning_starts=0, train_freq=2, batch_size=8, buffer_size=100, policy_kwargs=dict(net_arch=[8]),
                  seed=0, device="cpu")
    whole = TaskRecorder()
    PlasticDQN("MlpPolicy", _bandit(), **kwargs).learn(40, callback=whole)
    model = PlasticDQN("MlpPolicy", _bandit(), **kwargs)
    first, second = TaskRecorder(), TaskRecorder()
    model.learn(24, callback=first)
    model.save(tmp_path / "dqn.zip")
    loaded = PlasticDQN.load(tmp_path / "dqn.zip", env=_bandit(), device="cpu")
    loaded.learn(16, callback=second, reset_num_timesteps=False)
    assert first.rows + second.rows == whole.rows == _expected(whole.rows)


def test_resume_through_subproc_vecnormalize_and_framestack(tmp_path):
    def venv():
        env = SubprocVecEnv([lambda: gym.make(BANDIT, change_every=CHANGE_EVERY, n_contexts=8, obs_dim=4)] * N_ENVS,
                            start_method="fork")
        return VecFrameStack(VecNormalize(env), n_stack=2)

    model = PlasticPPO("MlpPolicy", venv(), **PPO_KWARGS)
    model.learn(24)
    model.save(tmp_path / "m.zip")
    model.get_env().close()
    env = venv()
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=env, device="cpu")
    recorder = TaskRecorder()
    loaded.learn(16, callback=recorder, reset_num_timesteps=False)
    assert recorder.rows == _expected(recorder.rows)
    np.testing.assert_array_equal(loaded._last_original_obs.shape, (N_ENVS, 4))
    env.close()


def test_fewer_than_two_tasks_warns_with_the_unit():
    model = PlasticPPO("MlpPolicy", _bandit(n_envs=4, change_every=10), **PPO_KWARGS)
    with pytest.warns(UserWarning) as record:
        model.learn(32)  # 8 steps per copy < change_every=10: one task
    text = " ".join(str(w.message) for w in record if "task" in str(w.message))
    assert "1 task(s)" in text and "n_envs=4" in text and "4*10 = 40 model timesteps" in text
    assert "env steps of each env copy" in text
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        PlasticPPO("MlpPolicy", _bandit(n_envs=4, change_every=10), **PPO_KWARGS).learn(80)  # 2 tasks: quiet
    assert not [w for w in record if "task(s)" in str(w.message)]


def test_verbose_prints_the_task_count(capsys):
    sync = TaskScheduleSync(verbose=1)
    model = PPO("MlpPolicy", _bandit(n_envs=3, change_every=4), n_steps=4, batch_size=12, n_epochs=1,
                policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")
    recorder = TaskRecorder()
    model.learn(36, callback=[sync, recorder])
    assert sync.planned_tasks == (0, 2) and sync.n_tasks == 3
    assert {ids[0] for _, ids in recorder.rows} == {0, 1, 2}  # what the copies actually did
    out = capsys.readouterr().out
    assert "tasks 0..2 (3)" in out and "4 * 3 = 12 model timesteps" in out


def test_stationary_env_is_left_alone_and_bad_min_tasks_raises():
    sync = TaskScheduleSync()
    PPO("MlpPolicy", "CartPole-v1", n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(8, callback=sync)
    assert sync.planned_tasks is None and sync.n_tasks == 0 and not sync.synced
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="min_tasks"):
            TaskScheduleSync(min_tasks=bad)


def test_exported():
    assert sb3_plastic.TaskScheduleSync is sb3_plastic.callbacks.TaskScheduleSync


def test_zoo_continued_training_of_a_plain_model_follows_the_schedule(tmp_path):
    """``sb3-plastic train -i`` hands rl_zoo3 a ContinuedTraining: reset_num_timesteps=False, and a plain SB3 model
    on a continual env gets the TaskScheduleSync the plastic algorithms add themselves."""
    from sb3_plastic.zoo import ContinuedTraining

    model = PPO("MlpPolicy", _bandit(), **PPO_KWARGS)
    model.learn(24)
    model.save(tmp_path / "plain.zip")
    loaded = PPO.load(tmp_path / "plain.zip", env=_bandit(), device="cpu")
    recorder = TaskRecorder()
    continued = ContinuedTraining(loaded)
    continued.learn(16, callback=[recorder])
    assert loaded.num_timesteps == 40 and continued.num_timesteps == 40
    assert recorder.rows == _expected(recorder.rows) and recorder.rows[0] == (26, (2, 2))
