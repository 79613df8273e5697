"""Options that cannot act say so: a game-switching env with one game never switches; ``at_episode_end=True`` with
``change_every`` shorter than an episode skips tasks (warned once)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest

from sb3_plastic.envs import ChannelPermutation
from sb3_plastic.envs._deps import check_games
from sb3_plastic.envs.minatar_envs import make_switching_minatar


def _messages(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("games", ["breakout", ["breakout"], ["breakout", "breakout"]])
def test_switching_minatar_with_one_game_warns(games):
    messages = _messages(lambda: make_switching_minatar(games, change_every=100))
    assert [m for m in messages if "only one game ('breakout')" in m and "never changes game" in m]


def test_switching_minatar_with_two_games_does_not_warn():
    assert not [m for m in _messages(lambda: make_switching_minatar(["breakout", "asterix"], change_every=100))
                if "one game" in m]


def test_one_atari_game_warns_without_ale():
    # the check shared by SwitchingMinAtar and SwitchingAtari (no ALE needed: the canonical name is given)
    messages = _messages(lambda: check_games(["Pong", "Pong"], str, "Atari"))
    assert [m for m in messages if "SwitchingAtari" in m and "only one game ('Pong')" in m]


def _cartpole(change_every: int, at_episode_end: bool) -> ChannelPermutation:
    return ChannelPermutation(gym.make("CartPole-v1"), change_every=change_every, axis=0, at_episode_end=at_episode_end)


def _run(env: ChannelPermutation, episodes: int) -> list[int]:
    env.reset(seed=0)
    tasks = []
    for _ in range(episodes):
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(0)  # always left: CartPole episodes of ~10 steps
            done = terminated or truncated
        _, info = env.reset()
        tasks.append(info["task_id"])
    return tasks


def test_at_episode_end_with_a_short_change_every_warns_once_about_skipped_tasks():
    env = _cartpole(change_every=3, at_episode_end=True)
    messages = _messages(lambda: _run(env, 5))
    skipped = [m for m in messages if "skipping task" in m]
    assert len(skipped) == 1 and "change_every=3" in skipped[0] and "at_episode_end=True" in skipped[0]


@pytest.mark.parametrize("change_every, at_episode_end", [(3, False), (1000, True)])
def test_no_skip_warning_when_no_task_is_skipped(change_every, at_episode_end):
    env = _cartpole(change_every, at_episode_end)
    assert not [m for m in _messages(lambda: _run(env, 5)) if "skipping task" in m]


def test_no_skip_warning_for_a_resume_or_a_pin():
    env = _cartpole(change_every=1000, at_episode_end=True)

    def jumps():
        env.reset(seed=0)
        env.set_env_steps(5000)  # a resume jumps to task 5 by design
        env.reset()
        env.pin_task(9)
        env.reset()
        env.pin_task(None)  # back to task 5
        env.reset()

    assert not [m for m in _messages(jumps) if "skipping task" in m]
    assert env.task_id == 5
