"""FIRE's edge cases around task changes and triggers that cannot act.

* ``fire_on_task_change`` does not fire on the restart of a resumed run (save -> load -> continue fires
  exactly where the uninterrupted run fires);
* ``on_task_change`` on an env whose infos have no ``task_id`` warns (once);
* ``at`` beyond the end of the call, an int ``at`` already passed, and ``every`` longer than the call warn
  with the numbers; reachable triggers stay quiet (the on-policy end is the rollout boundary after
  ``total_timesteps``).
"""

from __future__ import annotations

import warnings

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic import FIRE, PlasticPPO

BANDIT = "sb3_plastic/RandomLabelBandit-v0"
PPO_KWARGS = dict(n_steps=4, batch_size=8, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")
CARTPOLE = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0, device="cpu")


def _bandit():
    # 2 copies, change_every=5 steps of each copy: a task lasts 10 model timesteps
    return make_vec_env(BANDIT, n_envs=2, seed=0, env_kwargs=dict(change_every=5, n_contexts=8, obs_dim=4))


def _fire_messages(record) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("FIRE")]


def test_resumed_run_fires_where_the_uninterrupted_run_fires(tmp_path):
    whole = PlasticPPO("MlpPolicy", _bandit(), fire_on_task_change=True, **PPO_KWARGS)
    whole.learn(48)
    expected = whole.plastic_state["FIRE:auto"]["timesteps"]
    # task changes at 10, 20, 30 -> fired at the next rollout boundary (rollouts of 8 timesteps); the change at 40
    # falls on a rollout start and fires there
    assert expected == [16, 24, 32, 40]

    model = PlasticPPO("MlpPolicy", _bandit(), fire_on_task_change=True, **PPO_KWARGS)
    model.learn(28)  # stops at 32, inside task 3 (30..39); the change at 30 fires when learn() ends
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=_bandit(), device="cpu")
    loaded.learn(16, reset_num_timesteps=False)
    assert loaded.num_timesteps == 48
    assert loaded.plastic_state["FIRE:auto"]["timesteps"] == expected


def test_on_task_change_without_task_id_warns_once():
    model = PPO("MlpPolicy", "CartPole-v1", **CARTPOLE)
    fire = FIRE(on_task_change=True)
    with pytest.warns(UserWarning) as record:
        model.learn(96, callback=fire)  # three rollouts
    messages = [m for m in _fire_messages(record) if "task_id" in m]
    assert len(messages) == 1
    assert "first 32 timesteps" in messages[0] and "will not fire" in messages[0]
    assert fire.fire_count == 0


def test_on_task_change_with_task_ids_is_quiet():
    model = PPO("MlpPolicy", _bandit(), **PPO_KWARGS)
    fire = FIRE(on_task_change=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.learn(24, callback=fire)
    assert _fire_messages(record) == []
    assert fire.fired_at == [16, 24]  # changes at 10 and 20


def test_fire_at_beyond_the_end_warns_with_the_numbers():
    model = PPO("MlpPolicy", "CartPole-v1", **CARTPOLE)
    fire = FIRE(at=1000)
    with pytest.warns(UserWarning) as record:
        model.learn(64, callback=fire)
    (message,) = _fire_messages(record)
    assert "at=1000" in message and "num_timesteps 1000" in message and "0 -> 64" in message
    assert fire.fire_count == 0
    # the keyword of the plastic algorithms says the same
    plastic = PlasticPPO("MlpPolicy", "CartPole-v1", fire_at=1000, **CARTPOLE)
    with pytest.warns(UserWarning, match=r"FIRE at=1000 \(fire_at\)"):
        plastic.learn(64)


def test_int_fire_at_already_passed_warns():
    model = PPO("MlpPolicy", "CartPole-v1", **CARTPOLE)
    model.learn(64)
    fire = FIRE(at=10)
    with pytest.warns(UserWarning) as record:
        model.learn(32, callback=fire, reset_num_timesteps=False)
    (message,) = _fire_messages(record)
    assert "at=10" in message and "already passed" in message and "64 -> 96" in message
    assert fire.fire_count == 0


def test_fire_every_longer_than_the_call_warns():
    model = PPO("MlpPolicy", "CartPole-v1", **CARTPOLE)
    fire = FIRE(every=500)
    with pytest.warns(UserWarning) as record:
        model.learn(64, callback=fire)
    (message,) = _fire_messages(record)
    assert "every=500" in message and "0 -> 64" in message and "next multiple of 500 is 500" in message


def test_reachable_triggers_are_quiet_and_fire():
    """at=50 with learn(40): PPO runs to the rollout boundary 64, so the point is reached and no warning."""
    model = PPO("MlpPolicy", "CartPole-v1", **CARTPOLE)
    fires = [FIRE(at=50, name="at"), FIRE(every=32, name="every"), FIRE(at=0.5, name="half")]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.learn(40, callback=fires)
    assert _fire_messages(record) == []
    assert [f.fired_at for f in fires] == [[64], [32, 64], [32]]


def _aligned_bandit():
    # 2 copies, change_every=8 steps of each copy: a task lasts 16 model timesteps, two rollouts of 8 (n_steps=4)
    return make_vec_env(BANDIT, n_envs=2, seed=0, env_kwargs=dict(change_every=8, n_contexts=8, obs_dim=4))


def test_a_switch_on_a_rollout_boundary_is_acted_on_before_that_rollout():
    """When a task starts exactly at a rollout start (C-CHAIN's Gym-control protocol: 200 rollouts of 800 steps a
    task), the on-policy events told of the switch happen at that rollout start, so the new task's first rollout is
    collected and trained on by the rewritten networks, not one rollout later (the switch is in no info yet: the
    env's next step starts the task)."""
    from sb3_plastic.callbacks import LayerReset, ShrinkPerturb

    class SpyShrinkPerturb(ShrinkPerturb):
        def apply(self):
            self.applied_at = [*getattr(self, "applied_at", []), int(self.model.num_timesteps)]
            return super().apply()

    model = PPO("MlpPolicy", _aligned_bandit(), **PPO_KWARGS)
    fire, reset = FIRE(on_task_change=True), LayerReset(layers="heads", on_task_change=True)
    snp = SpyShrinkPerturb(on_task_change=True)
    model.learn(40, callback=[fire, reset, snp])
    assert fire.fired_at == [16, 32]  # the rollouts starting at 16 and 32 are the tasks' first
    assert reset.event_timesteps == [16, 32]
    assert snp.applied_at == [16, 32]


def test_the_next_task_id_is_the_task_of_the_next_step():
    import gymnasium as gym

    env = gym.make(BANDIT, change_every=3, n_contexts=4, obs_dim=2)
    assert env.get_wrapper_attr("next_task_id") is None  # before the first reset
    env.reset(seed=0)
    env.action_space.seed(0)
    announced = []
    for _ in range(7):
        announced.append(env.get_wrapper_attr("next_task_id"))
        _, _, _, _, info = env.step(env.action_space.sample())
        assert info["task_id"] == announced[-1]  # the step runs the task next_task_id announced
    assert announced == [0, 0, 0, 1, 1, 1, 2]
    env.get_wrapper_attr("pin_task")(5)
    assert env.get_wrapper_attr("next_task_id") == 5
    env.get_wrapper_attr("pin_task")(None)
    assert env.get_wrapper_attr("next_task_id") == 2  # 7 steps: task 7 // 3
