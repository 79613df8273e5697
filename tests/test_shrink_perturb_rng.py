"""Shrink & Perturb draws from a private generator (audit): theta_fresh and the continual noise leave torch's global
random state as it was (the run's action sampling is that of the same-seed run without S&P), the stream depends on
the model's seed, and it continues across save -> load."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch as th
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.logger import configure

from sb3_plastic import PlasticPPO
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturb, shrink_perturb_seed

PPO_KWARGS = dict(n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]))


def _started(cb, model):
    model.set_logger(configure(None, [""]))
    model._total_timesteps = 10**6  # as inside learn(): the every of the callbacks below is reachable
    cb.init_callback(model)
    cb.on_training_start({}, {})
    return cb


def _params(model):
    return [p.detach().clone() for p in model.policy.parameters()]


def test_event_leaves_the_global_rng_untouched():
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, **PPO_KWARGS)
    cb = _started(ShrinkPerturb(every=64), model)
    before, rng = _params(model), th.random.get_rng_state()
    cb.apply()
    assert th.equal(th.random.get_rng_state(), rng)
    assert any(not th.equal(a, b) for a, b in zip(before, _params(model)))


def test_continual_noise_leaves_the_global_rng_untouched():
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, policy_kwargs=dict(net_arch=[8]))
    cb = _started(ShrinkPerturb("continual", noise_std=1e-2, weight_decay=0.0), model)
    model.policy.set_training_mode(True)
    opt = model.policy.optimizer
    before, rng = _params(model), th.random.get_rng_state()
    for p in model.q_net.parameters():
        p.grad = th.zeros_like(p)
    opt.step()
    assert cb.state["noise_steps"] == 1
    assert th.equal(th.random.get_rng_state(), rng)
    assert any(not th.equal(a, b) for a, b in zip(before, _params(model)))
    cb.on_training_end()


def test_actions_after_an_event_are_those_of_the_run_without_it():
    """S&P with shrink 1 and perturb 0 leaves the weights as they are: with a private stream, the whole run (actions
    included) is the run without the callback."""
    ref = PPO("MlpPolicy", "CartPole-v1", seed=3, **PPO_KWARGS)
    ref.learn(192)
    model = PPO("MlpPolicy", "CartPole-v1", seed=3, **PPO_KWARGS)
    model.learn(192, callback=ShrinkPerturb(every=64, shrink=1.0, perturb=1e-30))
    assert model.rollout_buffer.actions.tolist() == ref.rollout_buffer.actions.tolist()


def test_seed_follows_the_model_seed():
    assert shrink_perturb_seed(0, "ShrinkPerturb") == shrink_perturb_seed(0, "ShrinkPerturb")
    assert shrink_perturb_seed(0, "ShrinkPerturb") != shrink_perturb_seed(1, "ShrinkPerturb")
    assert shrink_perturb_seed(0, "ShrinkPerturb") != shrink_perturb_seed(0, "ShrinkPerturb:auto")
    a = _started(ShrinkPerturb(every=64), PPO("MlpPolicy", "CartPole-v1", seed=5, **PPO_KWARGS))
    b = _started(ShrinkPerturb(every=64), PPO("MlpPolicy", "CartPole-v1", seed=5, **PPO_KWARGS))
    a.apply()
    b.apply()
    assert all(th.equal(x, y) for x, y in zip(_params(a.model), _params(b.model)))


def test_draw_continues_across_save_and_load(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", seed=0, shrink_perturb="event", shrink_perturb_every=64, **PPO_KWARGS)
    model.learn(128)  # events at 64 and 128
    state = model.plastic_state["ShrinkPerturb:auto"]
    assert state["events"] == 2 and "cpu" in state["rng"]["states"]
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    assert all(th.equal(x, y) for x, y in zip(_params(model), _params(loaded)))
    a = _started(ShrinkPerturb(every=64, name="auto"), model)
    b = _started(ShrinkPerturb(every=64, name="auto"), loaded)
    th.manual_seed(123)  # the global state does not matter
    a.apply()
    th.manual_seed(456)
    b.apply()
    assert all(th.equal(x, y) for x, y in zip(_params(model), _params(loaded)))


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")
def test_cuda_event_and_noise_leave_the_cpu_and_cuda_global_rngs_untouched():
    """On a CUDA model the private stream is the CUDA generator (theta_fresh is drawn on the device): neither the CPU
    nor the CUDA global state moves, and the generator's state is kept for save -> load."""
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, device="cuda", **PPO_KWARGS)
    cb = _started(ShrinkPerturb(every=64), model)
    before, cpu, cuda = _params(model), th.random.get_rng_state(), th.cuda.get_rng_state()
    cb.apply()
    assert th.equal(th.random.get_rng_state(), cpu) and th.equal(th.cuda.get_rng_state(), cuda)
    assert any(not th.equal(a, b) for a, b in zip(before, _params(model)))
    assert any(key.startswith("cuda") for key in cb.state["rng"]["states"])
    dqn = DQN("MlpPolicy", "CartPole-v1", seed=0, device="cuda", policy_kwargs=dict(net_arch=[8]))
    noise = _started(ShrinkPerturb("continual", noise_std=1e-2, weight_decay=0.0), dqn)
    dqn.policy.set_training_mode(True)
    for p in dqn.q_net.parameters():
        p.grad = th.zeros_like(p)
    cpu, cuda = th.random.get_rng_state(), th.cuda.get_rng_state()
    dqn.policy.optimizer.step()
    assert noise.state["noise_steps"] == 1
    assert th.equal(th.random.get_rng_state(), cpu) and th.equal(th.cuda.get_rng_state(), cuda)
    noise.on_training_end()
