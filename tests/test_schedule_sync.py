"""TaskScheduleSync checks that the copies of a vector env share one task schedule (change_every and task_seed)."""

from __future__ import annotations

import warnings

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_plastic.callbacks import TaskScheduleSync
from sb3_plastic.envs.bandit_envs import make_random_label_bandit


def _copies(*schedules: tuple[int, int]) -> DummyVecEnv:
    return DummyVecEnv([lambda ce=ce, ts=ts: make_random_label_bandit(change_every=ce, task_seed=ts)
                        for ce, ts in schedules])


def _learn(env: DummyVecEnv) -> list[str]:
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * env.num_envs, callback=TaskScheduleSync())
    return [str(w.message) for w in caught]


def test_copies_with_different_task_seeds_are_warned_about():
    messages = _learn(_copies((16, 0), (16, 5)))
    assert [m for m in messages if "different task_seed [0, 5]" in m and "lockstep" in m]


def test_copies_with_different_change_every_are_warned_about():
    messages = _learn(_copies((16, 0), (8, 0)))
    assert [m for m in messages if "different change_every [16, 8]" in m]


def test_copies_with_one_schedule_are_not_warned_about():
    messages = _learn(_copies((16, 3), (16, 3)))
    assert not [m for m in messages if "different" in m]


@pytest.mark.parametrize("n_envs", [1, 3])
def test_one_schedule_any_number_of_copies(n_envs):
    assert not [m for m in _learn(_copies(*[(16, 1)] * n_envs)) if "different" in m]


def test_plot_switch_every_is_documented_in_model_timesteps(capsys):
    """``plot --switch-every`` is compared with TensorBoard steps, i.e. model timesteps: a task lasts
    ``change_every * n_envs`` of them (the schedule's unit, see TaskScheduleSync), not ``change_every`` env steps."""
    import re

    from sb3_plastic import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["plot", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    (help_text,) = re.findall(r"--switch-every STEPS (.*?) --", text)
    assert "model timesteps per task (= change_every x n_envs)" in help_text
    assert "environment steps" not in help_text
