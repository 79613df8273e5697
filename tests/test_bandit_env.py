"""sb3_plastic/RandomLabelBandit-v0: checkers, rewards against the labels, task switches, lockstep copies."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401
from sb3_plastic.envs.bandit_envs import ContextualBandit, RandomLabelBandit

ENV_ID = "sb3_plastic/RandomLabelBandit-v0"


def test_passes_env_checkers():
    gym_check_env(gym.make(ENV_ID, change_every=10).unwrapped)
    sb3_check_env(gym.make(ENV_ID, change_every=10))


def _context_index(bandit: ContextualBandit, obs: np.ndarray) -> int:
    (index,) = np.flatnonzero((bandit.contexts == obs).all(axis=1))
    return int(index)


def test_reward_is_one_exactly_for_the_label_and_episode_length():
    env = gym.make(ENV_ID, change_every=1000, episode_length=5)
    bandit = env.unwrapped
    obs, info = env.reset(seed=0)
    assert info["task_id"] == 0
    for t in range(5):
        i = _context_index(bandit, obs)
        label = int(bandit.labels[i])
        wrong = (label + 1) % bandit.action_space.n
        # the reward depends on the context shown before the step
        action = label if t % 2 == 0 else wrong
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == (1.0 if t % 2 == 0 else 0.0)
        assert terminated == (t == 4) and not truncated


def test_labels_redrawn_per_task_contexts_fixed_and_copies_in_lockstep():
    vec = make_vec_env(ENV_ID, n_envs=3, seed=7, env_kwargs=dict(change_every=4, n_contexts=64))
    vec.reset()
    labels = [np.array(vec.get_attr("labels")[i]) for i in range(3)]
    contexts = vec.get_attr("contexts")
    assert all(np.array_equal(labels[0], lab) for lab in labels)  # same task 0 labels in every copy
    assert all(np.array_equal(contexts[0], c) for c in contexts)
    seen = {}
    for step in range(12):
        _, _, _, infos = vec.step(np.zeros(3, dtype=int))
        tasks = {info["task_id"] for info in infos}
        assert tasks == {step // 4}
        current = vec.get_attr("labels")
        assert all(np.array_equal(current[0], lab) for lab in current)
        seen.setdefault(step // 4, np.array(current[0]))
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])
    assert np.array_equal(vec.get_attr("contexts")[0], contexts[0])
    # another task seed gives another label sequence; the same one reproduces it
    other = RandomLabelBandit(ContextualBandit(n_contexts=64), change_every=4, task_seed=1)
    other.reset(seed=0)
    same = RandomLabelBandit(ContextualBandit(n_contexts=64), change_every=4, task_seed=0)
    same.reset(seed=0)
    assert np.array_equal(same.unwrapped.labels, seen[0])
    assert not np.array_equal(other.unwrapped.labels, seen[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_contexts=0), "n_contexts"),
        (dict(n_actions=1), "n_actions"),
        (dict(obs_dim=2.5), "obs_dim"),
        (dict(episode_length=-1), "episode_length"),
        (dict(context_seed=-3), "context_seed"),
        (dict(change_every=0), "change_every"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make(ENV_ID, **kwargs)


def test_set_labels_validates():
    bandit = ContextualBandit(n_contexts=4, n_actions=3)
    with pytest.raises(ValueError, match="labels"):
        bandit.set_labels(np.array([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="labels"):
        bandit.set_labels(np.zeros(5, dtype=int))
