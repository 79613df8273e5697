"""Audit of PlasticityMonitor: it never kills training, never runs silently short, and logs against the right origin
(non-finite weights, a replay buffer smaller than the probe, a monitor attached late, the model's isometry scale,
non-numeric task ids across save / load)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN

from sb3_plastic import PlasticDQN
from sb3_plastic.callbacks.monitor import PlasticityMonitor
from sb3_plastic.common.surgery import find_networks

DQN_FAST = dict(learning_starts=64, buffer_size=1000, train_freq=4, policy_kwargs=dict(net_arch=[16, 16]))


def learn(model, steps: int, monitor: PlasticityMonitor, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(steps, callback=monitor, **kwargs)
    return [str(w.message) for w in caught]


def test_nan_weight_does_not_stop_training_and_warns_once():
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_FAST)
    spec = find_networks(model)[0]
    layer = spec.weight_layers()[0]
    name = spec.layer_names[id(layer)]
    with th.no_grad():
        layer.weight[0, 0] = float("nan")
    monitor = PlasticityMonitor(every=40, max_overhead=None, probe_size=32, ntk_probe_size=2)
    messages = learn(model, 200, monitor)
    assert model.num_timesteps == 200
    assert monitor.state["events"] >= 3
    about_layer = [m for m in messages if "non-finite" in m and f"'{name}'" in m and "weights" in m]
    assert len(about_layer) == 1  # once, though every pass sees it
    values = monitor.run()
    assert np.isnan(values[f"plasticity/q_net/{name}/cond"])


def test_replay_buffer_smaller_than_the_probe_uses_the_full_buffer_with_a_warning():
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **dict(DQN_FAST, buffer_size=100))
    monitor = PlasticityMonitor(every=50, max_overhead=None, probe_size=256, ntk_probe_size=2)
    messages = learn(model, 300, monitor)
    assert monitor.state["events"] >= 1
    assert monitor._probe[0].shape[0] == 100
    assert sum("probe_size=256" in m and "100" in m for m in messages) == 1
    # the buffer is full from step 101 (SB3 calls the callback before storing the step's transition): passes at
    # 101, 151, 201, 251
    assert monitor.state["events"] == 4


def test_monitor_attached_after_training_warns_that_distances_start_there():
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_FAST)
    model.learn(300)
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=0)
    messages = learn(model, 50, monitor)
    assert any("dist_from_init" in m and "attach" in m for m in messages)
    fresh = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=0)
    assert not any("attach" in m for m in learn(DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_FAST), 50, fresh))


def _smaller_gram_dfi(w: np.ndarray, s: float) -> float:
    w = w.reshape(w.shape[0], -1).astype(np.float64)
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    return float(np.sum((gram - s * np.eye(gram.shape[0])) ** 2))


def test_dfi_is_logged_against_the_models_isometry_scale():
    model = PlasticDQN("MlpPolicy", "CartPole-v1", seed=0, isometry_scale=2.0, **DQN_FAST)
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=0)
    learn(model, 80, monitor)
    values = monitor.run()
    spec = find_networks(model)[0]
    total = 0.0
    for layer in spec.weight_layers():
        name = spec.layer_names[id(layer)]
        expected = _smaller_gram_dfi(layer.weight.detach().numpy(), 2.0)
        total += expected
        assert values[f"plasticity/q_net/{name}/dfi"] == pytest.approx(expected, rel=1e-6)
        assert expected != pytest.approx(_smaller_gram_dfi(layer.weight.detach().numpy(), 1.0), rel=1e-3)
    assert values["plasticity/q_net/dfi"] == pytest.approx(total, rel=1e-6)


def test_non_numeric_task_numbers_survive_save_and_load(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_FAST)
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=0)
    learn(model, 70, monitor)
    assert [monitor._task_number(t) for t in ("left", "right", 7)] == [0.0, 1.0, 7.0]
    model.save(tmp_path / "m.zip")
    loaded = DQN.load(tmp_path / "m.zip", env=model.get_env())
    again = PlasticityMonitor(every=1000, max_overhead=None, probe_size=32, ntk_probe_size=0)
    learn(loaded, 10, again, reset_num_timesteps=False)
    assert [again._task_number(t) for t in ("right", "up", "left")] == [1.0, 2.0, 0.0]


def test_the_probe_batch_is_saved_reused_and_redrawn_for_another_size(tmp_path):
    """The probe batch lives in the persistent state: a loaded model's monitor measures on the same samples (an image
    batch in the buffer's uint8, as drawn); a monitor with another ``probe_size`` draws (and keeps) a new batch;
    ``resample=True`` keeps none."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.envs import FakeImageEnv

    env = make_vec_env(lambda: FakeImageEnv(screen_height=8, screen_width=8, n_channels=1, discrete=True), seed=0)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[8]))
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(model, 32, monitor)
    observations, actions = monitor._probe
    stored = monitor.state["probe"]
    assert observations.dtype == th.uint8 and observations.shape == (16, 1, 8, 8)  # channel-first (SB3 transposes)
    assert stored["probe_size"] == 16 and th.equal(stored["observations"], observations)
    assert th.equal(stored["actions"], actions)
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=env)
    again = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(loaded, 32, again, reset_num_timesteps=False)
    assert again._probe[0].dtype == th.uint8 and th.equal(again._probe[0], observations)
    assert th.equal(again._probe[1], actions)
    other = PlasticityMonitor(every=1000, max_overhead=None, probe_size=8, ntk_probe_size=0)
    learn(loaded, 32, other, reset_num_timesteps=False)
    assert other._probe is None  # the kept batch has 16 samples: not this monitor's
    assert other.run() and other._probe[0].shape[0] == 8
    assert loaded.plastic_state["PlasticityMonitor"]["probe"]["probe_size"] == 8
    resampling = PlasticityMonitor(every=1000, max_overhead=None, probe_size=8, ntk_probe_size=0, resample=True)
    learn(loaded, 32, resampling, reset_num_timesteps=False)
    assert "probe" not in loaded.plastic_state["PlasticityMonitor"]


def test_a_replay_probe_keeps_its_dtype_across_save_and_load(tmp_path):
    """Off-policy the batch comes from the replay buffer in the observation's own dtype (uint8 images stay uint8)."""
    from stable_baselines3.common.envs import FakeImageEnv

    env = FakeImageEnv(screen_height=8, screen_width=8, n_channels=1, discrete=True)
    model = DQN("MlpPolicy", env, seed=0, learning_starts=16, buffer_size=100, policy_kwargs=dict(net_arch=[8]))
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(model, 40, monitor)
    observations = monitor._probe[0]
    assert observations.dtype == th.uint8 and monitor.state["probe"]["observations"].dtype == th.uint8
    model.save(tmp_path / "m.zip")
    loaded = DQN.load(tmp_path / "m.zip", env=env)
    again = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(loaded, 8, again, reset_num_timesteps=False)
    assert again._probe[0].dtype == th.uint8 and th.equal(again._probe[0], observations)


def test_a_dict_probe_batch_survives_save_and_load(tmp_path):
    """MultiInputPolicy: the probe batch is a dict of tensors; it is kept and comes back key by key."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.envs import SimpleMultiObsEnv

    env = SimpleMultiObsEnv(random_start=False)
    model = PPO("MultiInputPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0)
    monitor = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(model, 32, monitor)
    drawn = monitor._probe[0]
    assert isinstance(drawn, dict) and set(drawn) == {"vec", "img"}
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=env)
    again = PlasticityMonitor(every=1000, max_overhead=None, probe_size=16, ntk_probe_size=0)
    learn(loaded, 32, again, reset_num_timesteps=False)
    assert set(again._probe[0]) == set(drawn)
    assert all(th.equal(again._probe[0][k], drawn[k]) for k in drawn)
    assert again.run() and monitor.state["probe"]["probe_size"] == 16
