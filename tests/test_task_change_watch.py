"""The task-change detection shared by FIRE and Shrink & Perturb (:class:`TaskChangeWatch`)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic import PlasticPPO, ShrinkPerturb
from sb3_plastic.callbacks.base import TaskChangeWatch

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
PPO_KWARGS = dict(n_steps=4, batch_size=8, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")


def _bandit():
    # 2 copies, change_every=5 steps of each copy: a task lasts 10 model timesteps
    return make_vec_env(BANDIT, n_envs=2, seed=0, env_kwargs=dict(change_every=5, n_contexts=8, obs_dim=4))


def test_watch_sees_a_change_per_copy_and_keeps_ids_of_silent_copies():
    watch = TaskChangeWatch("X on_task_change=True", "act")
    state: dict = {}
    assert not watch.changed([{"task_id": 0}, {"task_id": 0}], state)  # baseline
    assert not watch.changed([{"task_id": np.int64(0)}, {}], state)  # numpy scalar == int; no id keeps the last
    assert state["task_ids"] == [0, 0]
    assert watch.changed([{}, {"task_id": 1}], state)  # one copy moved on
    assert state["task_ids"] == [0, 1]
    assert not watch.changed([{"task_id": 0}, {"task_id": 1}], state)
    assert watch.seen


def test_watch_ids_survive_a_json_round_trip():
    watch = TaskChangeWatch("X", "act")
    state = {"task_ids": [[1, 2]]}  # a tuple id as SB3's JSON save returns it
    assert not watch.changed([{"task_id": (1, 2)}], state)
    assert watch.changed([{"task_id": (1, 3)}], state)


def test_shrink_perturb_on_task_change_without_task_id_warns_once():
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    sp = ShrinkPerturb(mode="event", on_task_change=True)
    with pytest.warns(UserWarning) as record:
        model.learn(96, callback=sp)  # three rollouts
    messages = [str(w.message) for w in record if str(w.message).startswith("ShrinkPerturb")]
    assert len(messages) == 1
    assert "first 32 timesteps" in messages[0] and "shrink_perturb_on_task_change" in messages[0]
    assert sp.state["events"] == 0


def test_shrink_perturb_on_task_change_with_task_ids_is_quiet_and_acts():
    model = PlasticPPO("MlpPolicy", _bandit(), shrink_perturb="event", shrink_perturb_on_task_change=True, **PPO_KWARGS)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.learn(32)  # rollouts of 8 timesteps
    assert [w for w in record if str(w.message).startswith("ShrinkPerturb")] == []
    state = model.plastic_state["ShrinkPerturb:auto"]
    # changes at 10 and 20 applied at the next rollout starts (16, 24); the change at 30 is still pending when
    # learn() ends and is applied at training end (between rollouts), not lost
    assert state["events"] == 3 and not state["pending"]
