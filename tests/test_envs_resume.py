"""``info["task_step"]`` after a resume equals the uninterrupted run's (``set_env_steps`` / ``TaskScheduleSync``)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_plastic.callbacks import TaskScheduleSync
from sb3_plastic.envs import ChannelPermutation, GameSwitchingEnv
from sb3_plastic.envs.minatar_envs import make_permuted_minatar

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
CHANGE_EVERY = 48  # a resume after 64 steps of each copy falls inside task 1 (steps 48 .. 95)


class _Infos(BaseCallback):
    """Records ``(task_id, task_step)`` of every training step of every copy."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def _on_step(self) -> bool:
        self.seen.extend((info["task_id"], info["task_step"]) for info in self.locals["infos"])
        return True


def _bandit(seed: int = 0):
    return make_vec_env(BANDIT, n_envs=2, seed=seed, env_kwargs={"change_every": CHANGE_EVERY})


def test_task_step_after_load_and_resume_equals_the_uninterrupted_run(tmp_path):
    uninterrupted = _Infos()
    PPO("MlpPolicy", _bandit(), n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(
        256, callback=[TaskScheduleSync(), uninterrupted])

    first, resumed = _Infos(), _Infos()
    model = PPO("MlpPolicy", _bandit(), n_steps=32, batch_size=32, n_epochs=1, seed=0)
    model.learn(128, callback=[TaskScheduleSync(), first])
    model.save(tmp_path / "model")
    model = PPO.load(tmp_path / "model", env=_bandit(seed=1))  # a fresh env: TaskScheduleSync positions it
    model.learn(128, callback=[TaskScheduleSync(), resumed], reset_num_timesteps=False)

    assert len(uninterrupted.seen) == len(first.seen) + len(resumed.seen) == 256
    assert first.seen + resumed.seen == uninterrupted.seen  # task ids and task steps alike
    assert resumed.seen[0] == (1, 64 - CHANGE_EVERY + 1)  # the resume's first step is step 65 of the copy, task 1


ENVS = {
    "channel_permutation": lambda: ChannelPermutation(gym.make("CartPole-v1"), change_every=10, axis=0),
    "game_switching": lambda: GameSwitchingEnv([lambda: gym.make("CartPole-v1")] * 2, change_every=10),
    "permuted_minatar": lambda: make_permuted_minatar("breakout", change_every=10),
}


@pytest.mark.parametrize("kind", list(ENVS))
@pytest.mark.parametrize("at", [7, 23, 30])
def test_set_env_steps_gives_the_task_step_of_the_schedule(kind, at):
    """Positioned after ``at`` steps, the copy reports the task step of a copy that took those steps (immediate
    mode: task ``k`` starts at step ``k * change_every``): at the reset and at every step after it."""
    env = ENVS[kind]()
    env.action_space.seed(0)
    env.reset(seed=0)
    env.set_env_steps(at)
    _, info = env.reset()
    assert (info["task_id"], info["task_step"]) == (at // 10, at % 10) and env.task_step == at % 10
    for _ in range(40):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        n = env.env_steps  # the step just taken has index n - 1
        assert (info["task_id"], info["task_step"]) == ((n - 1) // 10, n - (n - 1) // 10 * 10)
        if terminated or truncated:
            _, info = env.reset()
            assert (info["task_id"], info["task_step"]) == (n // 10, n % 10)
