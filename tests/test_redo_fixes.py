"""ReDo (Sokar et al., 2023) after the audit: outgoing weights of recycled units are zero after every layer is
reset, scores are read after a normalisation between a layer and its activation, the period counts optimizer
steps, options that cannot act say so, and tau accepts any real number."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch as th
import torch.nn.functional as F
from builders import fill_adam_state, shared_extractor_model
from stable_baselines3 import PPO, SAC
from torch import nn

from sb3_plastic.callbacks.redo import (
    ReDo,
    ReDoConfig,
    default_layer_init,
    dormant_units,
    probe_activity,
    redo_layers_,
)
from sb3_plastic.common.surgery import Consumer, HiddenLayer, find_networks

TAU = 0.025


def _dead_net() -> tuple[nn.Sequential, th.Tensor, list[HiddenLayer], th.optim.Optimizer]:
    """4 -> 8 -> 8 -> 2 ReLU net on positive inputs whose unit 0 is dead in both hidden layers, with Adam state."""
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = th.rand(64, 4) + 0.1
    with th.no_grad():
        for layer in (net[0], net[2]):
            layer.weight.abs_()
            layer.bias.fill_(0.1)
            layer.weight[0] = -layer.weight[0].abs() - 0.1
            layer.bias[0] = -1.0
    opt = th.optim.Adam(net.parameters(), lr=1e-3)
    fill_adam_state(net, opt, x, seed=5)
    hidden = [
        HiddenLayer("0", net[0], net[1], [Consumer(net[2])]),
        HiddenLayer("2", net[2], net[3], [Consumer(net[4])]),
    ]
    return net, x, hidden, opt


# ------------------------------------------------------------------ 1. outgoing weights of recycled units
def test_units_recycled_in_consecutive_layers_keep_zero_outgoing_weights() -> None:
    net, x, hidden, opt = _dead_net()
    th.manual_seed(7)
    results = redo_layers_(hidden, lambda: net(x), TAU, [opt])
    assert [r.n_dormant for r in results] == [1, 1]
    th.manual_seed(7)  # independent reference: the fresh draws in layer order
    fresh0, _ = default_layer_init(net[0])
    fresh2, _ = default_layer_init(net[2])
    # layer 0's recycled unit reads nothing into layer 2, even into layer 2's fresh unit 0
    assert th.all(net[2].weight[:, 0] == 0)
    assert th.all(net[4].weight[:, 0] == 0)
    assert th.equal(net[0].weight[0], fresh0[0])
    assert th.equal(net[2].weight[0, 1:], fresh2[0, 1:])  # the rest of layer 2's fresh row is the draw
    for p, cols in ((net[2].weight, 0), (net[4].weight, 0)):
        for key in ("exp_avg", "exp_avg_sq"):
            assert th.all(opt.state[p][key][:, cols] == 0)


def test_redo_callback_zeroes_outgoing_across_networks() -> None:
    """SAC with a shared extractor: the actor's extractor unit and the critic's first-layer unit are recycled in
    one check; the critic reader's column of the extractor unit stays zero after the critic's own reset."""
    model = shared_extractor_model(SAC, steps=60)
    actor_spec = find_networks(model)[0]
    last = {h.name: h for h in actor_spec.hidden_layers()}["actor.features_extractor.mlp.3"]
    q_first = model.policy.critic.q_networks[0][0]
    obs = th.as_tensor(model.replay_buffer.sample(32).observations)
    actions = th.as_tensor(model.replay_buffer.sample(32).actions)
    with th.no_grad():  # unit 2 of the extractor's last layer and unit 0 of q-network 0's first layer: dead
        last.layer.weight[2] = 0.0
        last.layer.bias[2] = -5.0
        q_first.weight[0] = 0.0
        q_first.bias[0] = -5.0
    redo = ReDo(period=1, tau=TAU, probe_size=32)
    redo.init_callback(model)
    redo._on_training_start()
    out = dict(((net, r.name), r) for net, r in redo.recycle(obs, actions))
    assert out[("actor", last.name)].n_dormant >= 1
    assert out[("critic", "critic.qf0.0")].n_dormant >= 1
    assert th.all(q_first.weight[:, 2] == 0)
    for q in model.policy.critic.q_networks:
        assert th.all(q[0].weight[:, 2] == 0)


# ------------------------------------------------------------------ 2. a norm between a layer and its activation
def _nap_dqn():
    from sb3_plastic import PlasticDQN

    model = PlasticDQN("MlpPolicy", "CartPole-v1", nap=True, seed=0)
    spec = find_networks(model)[0]
    x = th.as_tensor(np.random.default_rng(0).normal(size=(128, 4)), dtype=th.float32)
    return model, spec, x


def _true_activity(seq: nn.Sequential, x: th.Tensor) -> list[th.Tensor]:
    """mean |ReLU(LayerNorm(W x + b))| per unit of each hidden layer, written out."""
    out = []
    h = x
    with th.no_grad():
        for i in (0, 3):
            lin, ln = seq[i], seq[i + 1]
            z = h @ lin.weight.T + lin.bias
            mu, var = z.mean(dim=1, keepdim=True), z.var(dim=1, unbiased=False, keepdim=True)
            h = th.relu((z - mu) / th.sqrt(var + ln.eps) * ln.weight + ln.bias)
            out.append(h.abs().mean(dim=0))
    return out


def test_redo_scores_a_layer_normalised_before_its_activation() -> None:
    model, spec, x = _nap_dqn()
    seq = model.q_net.q_net
    with th.no_grad():  # non-trivial affine parameters of the norms
        for ln in (seq[1], seq[4]):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    activity = probe_activity(spec.hidden_layers(), lambda: spec.module(x))
    for got, want in zip(activity, _true_activity(seq, x)):
        th.testing.assert_close(got, want)


def test_monitor_dormant_fraction_is_read_after_the_norm() -> None:
    """Lowering every first-layer bias by 5 leaves the network unchanged (LayerNorm is shift invariant): nothing
    is dormant, although ReLU(W x + b - 5) would be zero everywhere."""
    from sb3_plastic.diagnostics import capture_features, dormant_fraction

    model, spec, x = _nap_dqn()
    seq = model.q_net.q_net
    before = model.q_net(x).detach()
    with th.no_grad():
        seq[0].bias.sub_(5.0)
    th.testing.assert_close(model.q_net(x), before, atol=1e-4, rtol=1e-4)
    hidden = spec.hidden_layers()
    feats = capture_features(hidden, lambda: spec.module(x))
    truth = _true_activity(seq, x)
    th.testing.assert_close(feats[0].abs().mean(dim=0), truth[0])
    with th.no_grad():
        h = th.relu(F.layer_norm(x @ seq[0].weight.T + seq[0].bias, (64,), seq[1].weight, seq[1].bias))
    assert dormant_fraction(feats[0], TAU) == float(dormant_units(h, TAU).float().mean()) < 0.5
    results = redo_layers_(hidden, lambda: spec.module(x), TAU)
    assert results[0].n_dormant == int(dormant_units(feats[0], TAU).sum()) < 32


def test_batch_norm_before_the_activation_is_applied_without_changing_its_statistics() -> None:
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
    x = th.randn(32, 3) + 2.0
    net.train()
    net(x)  # some running statistics
    from sb3_plastic.common.surgery import NetworkSpec

    spec = NetworkSpec("net", net, None, None, [[net[0], net[3]]], {})
    hidden = spec.hidden_layers()
    stats = (net[1].running_mean.clone(), net[1].running_var.clone(), net[1].num_batches_tracked.clone())
    activity = probe_activity(hidden, lambda: net(x))  # training mode: one forward's update of the statistics
    with th.no_grad():
        z = net[0](x)
        want = th.relu((z - z.mean(0)) / th.sqrt(z.var(0, unbiased=False) + net[1].eps) * net[1].weight + net[1].bias)
    th.testing.assert_close(activity[0], want.abs().mean(0))
    assert int(net[1].num_batches_tracked) == int(stats[2]) + 1  # the probe's own forward only
    net.eval()
    activity = probe_activity(hidden, lambda: net(x))
    with th.no_grad():
        want = th.relu(net[1](net[0](x)))
    th.testing.assert_close(activity[0], want.abs().mean(0))


def test_a_module_after_the_layer_that_cannot_be_applied_warns() -> None:
    from sb3_plastic.callbacks import redo as redo_module

    class Odd(nn.Module):
        def forward(self, x):
            return x[:, :2]  # changes the shape: not an element-wise activation

    net = nn.Sequential(nn.Linear(3, 4), Odd(), nn.Linear(2, 1))
    hidden = HiddenLayer("odd", net[0], net[1], [])
    redo_module._WARNED.clear()
    with pytest.warns(UserWarning, match="odd.*Odd"):
        probe_activity([hidden], lambda: net[0](th.randn(5, 3)))


# ------------------------------------------------------------------ 3. the period counts optimizer steps
def test_period_counts_minibatch_updates_on_ppo(tmp_path) -> None:
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    model = PPO("MlpPolicy", "CartPole-v1", **kwargs)
    steps = []
    model.policy.optimizer.register_step_post_hook(lambda *a: steps.append(1))
    redo = ReDo(period=4, tau=0.1, probe_size=32)  # one train() = 2 epochs x 2 minibatches = 4 optimizer steps
    model.learn(64 * 3, callback=redo)
    assert len(steps) == 12 and redo.gradient_steps == 12
    assert redo.state["events"] == 3  # after each train() (old: period in epochs -> 1 event)
    assert redo.state["last_step"] == 12
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m", env=model.get_env())
    cb = ReDo(period=4, tau=0.1, probe_size=32)
    loaded.learn(64 * 2, callback=cb, reset_num_timesteps=False)
    assert cb.gradient_steps == 20 and cb.state["events"] == 5 and cb.state["last_step"] == 20
    # the step hooks are gone after training
    assert not loaded.policy.optimizer._optimizer_step_post_hooks


def test_period_larger_than_one_train() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    redo = ReDo(period=6, tau=0.1, probe_size=32)
    model.learn(64 * 4, callback=redo)  # steps 4, 8, 12, 16: checks at 8 and 16
    assert redo.state["events"] == 2 and redo.state["last_step"] == 16


# ------------------------------------------------------------------ 4. options that cannot act say so
def test_redo_without_hidden_layers_warns() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, policy_kwargs=dict(net_arch=[]), seed=0)
    with pytest.warns(UserWarning, match="ReDo.*no hidden"):
        model.learn(64, callback=ReDo(period=1, probe_size=32))


def test_on_policy_probe_smaller_than_asked_warns_once() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(64 * 3, callback=ReDo(period=1, probe_size=256))
    probe = [w for w in caught if "probe" in str(w.message)]
    assert len(probe) == 1 and "64" in str(probe[0].message) and "256" in str(probe[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(64 * 2, callback=ReDo(period=1, probe_size=64))
    assert not [w for w in caught if "probe" in str(w.message)]


# ------------------------------------------------------------------ 5. tau of any real type
@pytest.mark.parametrize("tau", [np.float32(0.1), np.float64(0.025), 1, np.int64(1)])
def test_tau_accepts_real_numbers(tau) -> None:
    assert ReDo(tau=tau).tau == pytest.approx(float(tau))
    assert ReDoConfig(redo_tau=tau).redo_tau == pytest.approx(float(tau))
    assert dormant_units(th.rand(4, 3), tau).shape == (3,)


@pytest.mark.parametrize("tau", [True, np.bool_(True), float("nan"), 0, 1.5, "0.1", None])
def test_tau_rejects_non_numbers(tau) -> None:
    with pytest.raises(ValueError, match="tau must be a number in \\(0, 1\\]"):
        ReDo(tau=tau)
