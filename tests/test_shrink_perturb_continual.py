"""Continual Shrink & Perturb as Dohare et al. ran it (issue 13, part 4): L2 inside the gradient the optimizer
sees (torch Adam's ``weight_decay``, after SB3's gradient clipping) plus N(0, sigma^2) noise after each step, checked
against a hand-written loop; decoupled decay as the explicit option; AdamO; keywords and save -> load."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.logger import configure

from sb3_plastic import PlasticDQN
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturb, ShrinkPerturbConfig

WD, SIGMA, CLIP = 0.05, 1e-3, 0.5


def _dqn(cls=DQN, **kwargs):
    model = cls("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16, 16]), learning_rate=1e-2, seed=0, **kwargs)
    model.set_logger(configure(None, [""]))
    return model


def _batches(n: int):
    g = th.Generator().manual_seed(5)
    return [(th.randn(32, 4, generator=g), th.randn(32, 2, generator=g)) for _ in range(n)]


def _train_step(net, opt, x, y, seed: int) -> None:
    opt.zero_grad()
    ((net(x) - y) ** 2).mean().backward()
    th.nn.utils.clip_grad_norm_(net.parameters(), CLIP)  # as SB3's train() does before step()
    th.manual_seed(seed)
    opt.step()


def _start(cb: ShrinkPerturb, model) -> th.Generator:
    """Start ``cb`` on ``model``; return a generator that draws the callback's noise stream (its private generator,
    seeded from the model's seed: the global one is not used)."""
    cb.init_callback(model)
    cb.on_training_start({}, {})
    model.policy.set_training_mode(True)
    return th.Generator().manual_seed(cb.state["rng"]["seed"])


def _noise(p, gen):
    return th.randn(p.shape, generator=gen, dtype=p.dtype)


def test_coupled_default_equals_torch_adam_weight_decay_plus_noise_loop():
    model = _dqn()
    net, opt = model.q_net, model.policy.optimizer
    group = opt.param_groups[0]
    # the reference (Dohare et al.'s code): torch Adam with weight_decay, then noise on every parameter
    ref_net = copy.deepcopy(net)
    ref_opt = th.optim.Adam(ref_net.parameters(), lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=WD)
    cb = ShrinkPerturb("continual", weight_decay=WD, noise_std=SIGMA)
    assert cb.weight_decay_mode == "coupled"
    gen = _start(cb, model)
    for k, (x, y) in enumerate(_batches(30)):
        _train_step(net, opt, x, y, seed=100 + k)
        _train_step(ref_net, ref_opt, x, y, seed=100 + k)
        for p in ref_net.parameters():
            p.data.add_(_noise(p, gen), alpha=SIGMA)
        for name, p in net.named_parameters():  # the gradient is what backward() and the clipping left
            assert th.equal(p.grad, dict(ref_net.named_parameters())[name].grad), name
    for (name, p), q in zip(net.named_parameters(), ref_net.parameters()):
        assert th.allclose(p, q, atol=1e-6, rtol=0), name
    assert cb.state["noise_steps"] == 30
    # Adam's moments saw the L2 term: they equal the reference's
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert th.allclose(opt.state[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"], rtol=1e-5, atol=1e-12)
    cb.on_training_end()


def test_decoupled_option_is_the_old_shrink():
    model = _dqn()
    net, opt = model.q_net, model.policy.optimizer
    ref_net = copy.deepcopy(net)
    group = opt.param_groups[0]
    ref_opt = th.optim.Adam(ref_net.parameters(), lr=group["lr"], betas=group["betas"], eps=group["eps"])
    cb = ShrinkPerturb("continual", weight_decay=WD, noise_std=SIGMA, weight_decay_mode="decoupled")
    gen = _start(cb, model)
    for k, (x, y) in enumerate(_batches(10)):
        _train_step(net, opt, x, y, seed=7 + k)
        _train_step(ref_net, ref_opt, x, y, seed=7 + k)
        for p in ref_net.parameters():
            p.data.mul_(1 - group["lr"] * WD).add_(_noise(p, gen), alpha=SIGMA)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert th.allclose(p, q, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode, low, high", [("coupled", 0.0, 1e-3), ("decoupled", 0.0499, 0.0501)])
def test_weight_without_task_gradient(mode, low, high):
    """The issue's measurement: under Dohare's coupled L2 (wd 1e-4, lr 1e-3) a weight that gets no task gradient
    decays to ~0 (Adam normalises the L2 term); the decoupled (1 - lr wd) shrink leaves it at 0.0500."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[4]), learning_rate=1e-3, seed=0)
    model.set_logger(configure(None, [""]))
    opt = model.policy.optimizer
    with th.no_grad():
        for p in model.q_net.parameters():
            p.fill_(0.05)
    cb = ShrinkPerturb("continual", weight_decay=1e-4, noise_std=0.0, weight_decay_mode=mode)
    _start(cb, model)
    for _ in range(3000):
        for p in model.q_net.parameters():
            p.grad = th.zeros_like(p)
        opt.step()
    values = th.cat([p.detach().abs().flatten() for p in model.q_net.parameters()])
    assert low <= float(values.max()) <= high and float(values.min()) >= low


def test_ppo_equals_sb3_adam_with_weight_decay():
    """End to end: PPO + the coupled continual form without noise is PPO with Adam(weight_decay=wd) (the L2 term
    after SB3's clip_grad_norm_, as torch's weight_decay), bit for bit."""
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, max_grad_norm=0.5, seed=0, policy_kwargs=dict(net_arch=[16]))
    ref = PPO("MlpPolicy", "CartPole-v1", **copy.deepcopy(kwargs))
    ref.policy.optimizer.param_groups[0]["weight_decay"] = WD
    ref.learn(192)
    model = PPO("MlpPolicy", "CartPole-v1", **copy.deepcopy(kwargs))
    model.learn(192, callback=ShrinkPerturb("continual", weight_decay=WD, noise_std=0.0))
    layer_params = {id(p) for m in model.policy.modules() if isinstance(m, th.nn.Linear) for p in m.parameters()}
    for (name, p), q in zip(model.policy.named_parameters(), ref.policy.parameters()):
        if id(p) in layer_params:
            assert th.equal(p, q), name
    # log_std-like parameters are not layer parameters: here PPO on a discrete env has none
    assert len(layer_params) == len(list(model.policy.parameters()))


def test_coupled_with_adamo_reaches_its_moments_once():
    """AdamO (its step calls Adam's: the step hooks run twice): the L2 term joins the gradient once per step."""
    model = _dqn(PlasticDQN)
    net, opt = model.q_net, model.policy.optimizer
    ref_net, ref_opt = copy.deepcopy((net, opt))  # before the hooks are installed
    cb = ShrinkPerturb("continual", weight_decay=WD, noise_std=SIGMA)
    gen = _start(cb, model)
    for k, (x, y) in enumerate(_batches(10)):
        _train_step(net, opt, x, y, seed=3 + k)
        ref_opt.zero_grad()
        ((ref_net(x) - y) ** 2).mean().backward()
        th.nn.utils.clip_grad_norm_(ref_net.parameters(), CLIP)
        for p in ref_net.parameters():
            p.grad.add_(p.detach(), alpha=WD)
        th.manual_seed(3 + k)
        ref_opt.step()
        for p in (p for group in ref_opt.param_groups for p in group["params"]):  # noise drawn in group order
            p.data.add_(_noise(p, gen), alpha=SIGMA)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert th.allclose(p, q, atol=1e-6, rtol=0)
    assert cb.state["noise_steps"] == 10


def test_keyword_validation_and_save_load(tmp_path):
    assert ShrinkPerturbConfig().shrink_weight_decay_mode == "coupled"
    cfg = ShrinkPerturbConfig(shrink_perturb="continual", shrink_weight_decay_mode="decoupled")
    assert cfg.make_callback().weight_decay_mode == "decoupled"
    with pytest.raises(ValueError, match=r"Unknown weight_decay_mode 'l2'.*\['coupled', 'decoupled'\]"):
        ShrinkPerturb("continual", weight_decay_mode="l2")
    with pytest.raises(ValueError, match="shrink_weight_decay_mode"):
        ShrinkPerturbConfig(shrink_perturb="continual", shrink_weight_decay_mode=None)
    model = PlasticDQN(
        "MlpPolicy",
        "CartPole-v1",
        policy_kwargs=dict(net_arch=[8]),
        learning_starts=20,
        batch_size=8,
        seed=0,
        shrink_perturb="continual",
        shrink_weight_decay_mode="decoupled",
    )
    model.learn(60)
    steps = model.plastic_state
    model.save(tmp_path / "m.zip")
    loaded = PlasticDQN.load(tmp_path / "m.zip")
    assert loaded.intervention_configs["shrink_perturb"].shrink_weight_decay_mode == "decoupled"
    assert loaded.plastic_state.keys() == steps.keys()
    noise = [v for k, v in loaded.plastic_state.data.items() if k.startswith("ShrinkPerturb")]
    assert noise and noise[0]["noise_steps"] == model._n_updates > 0
    np.testing.assert_equal(
        [p.detach().numpy() for p in loaded.policy.parameters()], [p.detach().numpy() for p in model.policy.parameters()]
    )
