"""Continual Backprop (Dohare et al., 2024): generate-and-test formulas on hand-built nets, conv and MaxMin
units, optimizer-moment resets, hook gating, SB3 / sb3-contrib runs, save/load and argument errors."""

import math

import numpy as np
import pytest
import torch as th
from sb3_contrib import QRDQN, TQC
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.envs import FakeImageEnv
from torch import nn

from sb3_plastic import AdamO, MaxMin, PlasticPPO
from sb3_plastic.callbacks.cbp import (
    CBP_KEYS,
    ContinualBackprop,
    ContinualBackpropConfig,
    GenerateAndTest,
    fresh_incoming_weights,
    resolve_init,
)
from sb3_plastic.common.surgery import Consumer, HiddenLayer, NetworkSpec, model_state

ETA = 0.9


def two_layer(activation=None, n_in=3, n_hidden=5, n_out=2):
    th.manual_seed(0)
    act = activation if activation is not None else nn.ReLU()
    return nn.Sequential(nn.Linear(n_in, n_hidden), act, nn.Linear(n_hidden, n_out))


def hidden_of(net):
    return HiddenLayer("0", net[0], net[1], [Consumer(net[2])])


def known_activations(steps, batch=8, width=5, seed=1, signed=False):
    """Activations whose magnitude grows with the unit index (distinct utilities); positive unless ``signed``."""
    g = th.Generator().manual_seed(seed)
    scale = th.linspace(0.2, 1.0, width)
    sign = (lambda x: 2 * x - 1) if signed else (lambda x: x)
    return [sign(th.rand(batch, width, generator=g)) * scale for _ in range(steps)]


# ---------------------------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh])
@pytest.mark.parametrize("utility", ["contribution", "adaptable_contribution"])
def test_linear_formulas_match_direct_computation(utility, activation):
    net = two_layer(activation())
    rate, maturity, steps = 0.3, 2, 9
    gnt = GenerateAndTest([hidden_of(net)], None, rate, maturity, ETA, utility, bias_absorption=True)
    n = 5
    age, f, u, acc, total = np.zeros(n), np.zeros(n), np.zeros(n), 0.0, 0
    for h in known_activations(steps, signed=activation is nn.Tanh):
        w1 = net[0].weight.detach().double().numpy().copy()
        w2 = net[2].weight.detach().double().numpy().copy()
        b2 = net[2].bias.detach().double().numpy().copy()
        hn = h.double().numpy()
        # the formulas, independently
        age += 1
        f = ETA * f + (1 - ETA) * hn.mean(0)
        y = np.abs(w2).mean(0) * np.abs(hn).mean(0)
        if utility == "adaptable_contribution":  # GnT's: |h - f_hat| (centred on the updated mean) / mean|W_in|
            y = np.abs(w2).mean(0) * np.abs(hn - f / (1 - ETA**age)).mean(0) / np.abs(w1).mean(1)
        u = ETA * u + (1 - ETA) * y
        u_hat = u / (1 - ETA**age)
        eligible = np.flatnonzero(age > maturity)
        k = 0
        if len(eligible):
            acc += rate * len(eligible)
            k = math.floor(acc + 1e-9)
            acc -= k
        expected = eligible[np.argsort(u_hat[eligible], kind="stable")[:k]]
        f_hat = f / (1 - ETA**age)

        chosen = gnt.step({"0": h}).get("0", th.empty(0, dtype=th.long))

        assert chosen.tolist() == expected.tolist()
        for j in expected:  # mean contribution moved into the next bias
            b2 = b2 + w2[:, j] * f_hat[j]
        np.testing.assert_allclose(net[2].bias.detach().double().numpy(), b2, rtol=1e-5, atol=1e-6)
        # statistics before the reset of the replaced units
        keep = np.setdiff1d(np.arange(n), expected)
        np.testing.assert_allclose(gnt.state["0"]["utility"].numpy()[keep], u[keep], rtol=1e-5)
        np.testing.assert_allclose(gnt.bias_corrected_utility("0").numpy()[keep], u_hat[keep], rtol=1e-5)
        np.testing.assert_allclose(gnt.bias_corrected_mean_activation("0").numpy()[keep, 0], f_hat[keep], rtol=1e-5, atol=1e-7)
        age[expected], u[expected], f[expected] = 0, 0, 0
        total += k
        np.testing.assert_array_equal(gnt.ages("0").numpy(), age)
        assert gnt.eligible("0").numpy().nonzero()[0].tolist() == np.flatnonzero(age > maturity).tolist()
        assert gnt.state["0"]["utility"][expected].abs().sum() == 0
        assert float(gnt.state["0"]["accumulated"]) == pytest.approx(acc)
    assert gnt.replaced("0") == total > 0


def test_fractional_replacements_accumulate():
    net = two_layer(n_hidden=4)
    gnt = GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], replacement_rate=0.1, maturity_threshold=0)
    h = th.rand(4, 4)
    history = []
    for t in range(1, 21):
        gnt.step({"0": h})
        history.append(gnt.replaced("0"))
        # 4 eligible units every step (a new unit is eligible after one step): 0.4 units per step
        assert gnt.replaced("0") == math.floor(0.4 * t + 1e-9)
    assert history[:5] == [0, 0, 1, 1, 2]


def adam_state_after_training(net, optimizer_cls):
    opt = optimizer_cls(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        net(th.randn(16, net[0].in_features)).pow(2).mean().backward()
        opt.step()
    return opt


@pytest.mark.parametrize("optimizer_cls", [th.optim.Adam, AdamO])
def test_replaced_unit_fresh_in_zero_out_moments_and_bias_absorption(optimizer_cls):
    net = two_layer()
    opt = adam_state_after_training(net, optimizer_cls)
    gnt = GenerateAndTest(
        [hidden_of(net)], opt, replacement_rate=0.2, maturity_threshold=1, decay_rate=ETA, bias_absorption=True
    )
    hs = known_activations(2)
    gnt.step({"0": hs[0]})
    w1, b1 = net[0].weight.detach().clone(), net[0].bias.detach().clone()
    w2, b2 = net[2].weight.detach().clone(), net[2].bias.detach().clone()
    f_hat = ((1 - ETA) * ETA * hs[0].mean(0) + (1 - ETA) * hs[1].mean(0)) / (1 - ETA**2)
    chosen = gnt.step({"0": hs[1]})["0"]
    assert chosen.tolist() == [0]  # one replacement (0.2 * 5), the smallest activations -> lowest utility
    j = 0
    others = [1, 2, 3, 4]
    # fresh incoming weights, zero bias, zero outgoing weights; the other units untouched
    assert not th.allclose(net[0].weight[j], w1[j]) and net[0].weight[j].abs().min() > 0
    bound = 1 / math.sqrt(net[0].in_features)  # PyTorch's default init of a fresh layer
    assert net[0].weight[j].abs().max() <= bound
    assert net[0].bias[j] == 0 and th.all(net[2].weight[:, j] == 0)
    assert th.equal(net[0].weight[others], w1[others]) and th.equal(net[0].bias[others], b1[others])
    assert th.equal(net[2].weight[:, others], w2[:, others])
    # the next layer's output at the mean activation is unchanged
    z = th.randn(5)
    z[j] = f_hat[j]
    th.testing.assert_close(net[2].weight @ z + net[2].bias, w2 @ z + b2)
    # moments of the touched rows / columns are zero, the others are not
    for param, index, dim in [(net[0].weight, j, 0), (net[0].bias, j, 0), (net[2].weight, j, 1)]:
        for key in ("exp_avg", "exp_avg_sq"):
            moment = opt.state[param][key]
            assert th.all(moment.select(dim, index) == 0), key
            assert moment.abs().sum() > 0
    # statistics restart
    assert gnt.ages("0")[j] == 0 and gnt.state["0"]["utility"][j] == 0
    assert th.all(gnt.state["0"]["mean_activation"][j] == 0)
    # training goes on
    opt.zero_grad()
    net(th.randn(4, 3)).sum().backward()
    opt.step()
    assert all(th.isfinite(p).all() for p in net.parameters())


def test_conv_and_conv_to_linear():
    th.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3))
    opt = adam_state_after_training_conv(net)
    spec = NetworkSpec("net", net, opt, None, [[net[0], net[2], net[5]]], {id(m): n for n, m in net.named_modules()})
    layers = spec.hidden_layers()
    assert [(hl.name, [(c.layer, c.columns_per_unit) for c in hl.consumers]) for hl in layers] == [
        ("0", [(net[2], 1)]),
        ("2", [(net[5], 4)]),
    ]
    gnt = GenerateAndTest(layers, opt, replacement_rate=0.25, maturity_threshold=1, decay_rate=ETA, bias_absorption=True)
    xs = [th.randn(5, 2, 6, 6) for _ in range(2)]
    acts = []
    with th.no_grad():
        for x in xs:
            h0 = th.relu(net[0](x))
            acts.append({"0": h0, "2": th.relu(net[2](h0))})
    gnt.step(acts[0])
    # utility after one step: (1 - eta) * y, u_hat = y
    y0 = net[2].weight.abs().mean(dim=(0, 2, 3)) * acts[0]["0"].abs().mean(dim=(0, 2, 3))
    y2 = net[5].weight.abs().view(3, 6, 4).mean(dim=(0, 2)) * acts[0]["2"].abs().mean(dim=(0, 2, 3))
    th.testing.assert_close(gnt.bias_corrected_utility("0"), y0.detach())
    th.testing.assert_close(gnt.bias_corrected_utility("2"), y2.detach())
    # per-position mean activations for the replacement at step 2
    f_hat = {
        name: ((1 - ETA) * ETA * acts[0][name].mean(0) + (1 - ETA) * acts[1][name].mean(0)) / (1 - ETA**2)
        for name in ("0", "2")
    }
    snap = {k: v.detach().clone() for k, v in net.state_dict().items()}
    u_hat = {  # weights are unchanged since step 1 (nothing was eligible)
        "0": (
            ETA * (1 - ETA) * y0 + (1 - ETA) * net[2].weight.abs().mean(dim=(0, 2, 3)) * acts[1]["0"].abs().mean(dim=(0, 2, 3))
        )
        / (1 - ETA**2),
        "2": (
            ETA * (1 - ETA) * y2
            + (1 - ETA) * net[5].weight.abs().view(3, 6, 4).mean(dim=(0, 2)) * acts[1]["2"].abs().mean(dim=(0, 2, 3))
        )
        / (1 - ETA**2),
    }
    chosen = gnt.step(acts[1])
    # 0.25 * 4 = 1 channel of conv 0, 0.25 * 6 = 1.5 -> 1 channel of conv 2 (0.5 carried over); lowest u_hat
    assert chosen["0"].tolist() == [int(u_hat["0"].argmin())] and chosen["2"].tolist() == [int(u_hat["2"].argmin())]
    assert float(gnt.state["2"]["accumulated"]) == pytest.approx(0.5)
    c0, c2 = int(chosen["0"]), int(chosen["2"])
    # conv -> conv: zero kernel slices, fresh filter, conv2 output unchanged for a constant map f_bar on c0
    assert th.all(net[2].weight[:, c0] == 0) and net[0].bias[c0] == 0  # incl. the fresh row c2 of conv 2
    assert not th.equal(net[0].weight[c0], snap["0.weight"][c0])
    z = th.randn(1, 4, 4, 4)
    z[0, c0] = f_hat["0"][c0].mean()
    before = nn.functional.conv2d(z, snap["2.weight"], snap["2.bias"])
    out_keep = [k for k in range(6) if k != c2]  # output channel c2 of conv 2 is itself new
    th.testing.assert_close(net[2](z)[:, out_keep], before[:, out_keep], rtol=1e-5, atol=1e-5)
    # conv -> linear: channel c2 owns columns c2*4 .. c2*4+3; the output at the per-position mean is unchanged
    cols = list(range(c2 * 4, c2 * 4 + 4))
    assert th.all(net[5].weight[:, cols] == 0) and net[2].bias[c2] == 0
    z = th.randn(1, 6, 2, 2)
    z[0, c2] = f_hat["2"][c2]
    before = nn.functional.linear(z.flatten(1), snap["5.weight"], snap["5.bias"])
    th.testing.assert_close(net[5](z.flatten(1)), before, rtol=1e-5, atol=1e-5)
    for key in ("exp_avg", "exp_avg_sq"):
        assert th.all(opt.state[net[5].weight][key][:, cols] == 0)
        assert th.all(opt.state[net[2].weight][key][c2] == 0) and th.all(opt.state[net[2].weight][key][:, c0] == 0)
        assert th.all(opt.state[net[0].weight][key][c0] == 0) and opt.state[net[0].bias][key][c0] == 0


def test_conv_maxmin_signed_utility():
    th.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), MaxMin(), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    spec = NetworkSpec("net", net, None, None, [[net[0], net[3]]], {id(m): n for n, m in net.named_modules()})
    (layer,) = spec.hidden_layers()
    assert layer.group_size == 2 and layer.n_units == 2 and layer.consumers[0].columns_per_unit == 9
    gnt = GenerateAndTest([layer], None, replacement_rate=0.5, maturity_threshold=0, decay_rate=ETA, bias_absorption=True)
    with th.no_grad():
        h = net[1](net[0](th.randn(6, 2, 5, 5)))  # signed: mean|h| is not mean(h)
    w2, b2 = net[3].weight.detach().clone(), net[3].bias.detach().clone()
    gnt.update({"0": h})
    y = w2.abs().view(3, 4, 9).mean(dim=(0, 2)) * h.abs().mean(dim=(0, 2, 3))
    th.testing.assert_close(gnt.bias_corrected_utility("0"), y.view(2, 2).mean(1))
    th.testing.assert_close(gnt.bias_corrected_mean_activation("0"), h.mean(0).flatten(1))
    (unit,) = gnt.select()["0"].tolist()  # 0.5 * 2 eligible units = 1
    assert unit == int(y.view(2, 2).mean(1).argmin())
    f_hat = gnt.bias_corrected_mean_activation("0")
    gnt.replace("0", th.tensor([unit]))
    cols = list(range(unit * 18, unit * 18 + 18))  # channels 2u, 2u+1, 9 columns each
    assert th.all(net[3].weight[:, cols] == 0)
    z = th.randn(4, 9)
    z[2 * unit : 2 * unit + 2] = f_hat[2 * unit : 2 * unit + 2]
    th.testing.assert_close(net[3](z.flatten()), nn.functional.linear(z.flatten(), w2, b2), atol=1e-5, rtol=1e-5)


def test_conv_adaptable_contribution_is_centred_per_position():
    """GnT's adaptable contribution on a conv layer (MaxMin pairs): mean|W_out| * mean|h - f_hat| / mean|W_in| per
    feature, ``f_hat`` per channel and spatial position, averaged over a pair's two features."""
    th.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), MaxMin(), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    spec = NetworkSpec("net", net, None, None, [[net[0], net[3]]], {id(m): n for n, m in net.named_modules()})
    (layer,) = spec.hidden_layers()
    gnt = GenerateAndTest([layer], None, replacement_rate=0.0, decay_rate=ETA, utility="adaptable_contribution")
    with th.no_grad():
        h1, h2 = (net[1](net[0](th.randn(6, 2, 5, 5))) for _ in range(2))
    w_out = net[3].weight.detach().abs().view(3, 4, 9).mean(dim=(0, 2))
    w_in = net[0].weight.detach().abs().flatten(1).mean(dim=1)
    f, u = th.zeros(4, 3, 3), th.zeros(4)
    for age, h in enumerate((h1, h2), start=1):
        gnt.update({"0": h})
        f = ETA * f + (1 - ETA) * h.mean(0)
        f_hat = f / (1 - ETA**age)
        u = ETA * u + (1 - ETA) * w_out * (h - f_hat).abs().mean(dim=(0, 2, 3)) / w_in
        th.testing.assert_close(gnt.state["0"]["utility"], u.view(2, 2).mean(1))


def adam_state_after_training_conv(net):
    opt = th.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        net(th.randn(4, 2, 6, 6)).pow(2).mean().backward()
        opt.step()
    return opt


def test_maxmin_pair_is_one_unit():
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 6), MaxMin(), nn.Linear(6, 3))
    layer = hidden_of(net)
    assert layer.group_size == 2 and layer.n_units == 3
    opt = adam_state_after_training(net, AdamO)
    gnt = GenerateAndTest(
        [layer], opt, replacement_rate=0.34, maturity_threshold=1, decay_rate=ETA, init="orthogonal", bias_absorption=True
    )
    g = th.Generator().manual_seed(3)
    hs = [th.rand(8, 6, generator=g) * th.tensor([1.0, 1.0, 0.1, 0.1, 2.0, 2.0]) for _ in range(2)]
    gnt.step({"0": hs[0]})
    y = net[2].weight.abs().mean(0) * hs[0].abs().mean(0)
    th.testing.assert_close(gnt.bias_corrected_utility("0"), y.view(3, 2).mean(1))
    w1, w2, b2 = net[0].weight.detach().clone(), net[2].weight.detach().clone(), net[2].bias.detach().clone()
    f_hat = ((1 - ETA) * ETA * hs[0].mean(0) + (1 - ETA) * hs[1].mean(0)) / (1 - ETA**2)
    chosen = gnt.step({"0": hs[1]})["0"]
    assert chosen.tolist() == [1]  # the pair (2, 3) has the smallest activations
    pair = [2, 3]
    assert gnt.ages("0").tolist() == [2, 0, 2]
    assert th.all(net[2].weight[:, pair] == 0) and th.all(net[0].bias[pair] == 0)
    assert th.equal(net[0].weight[[0, 1, 4, 5]], w1[[0, 1, 4, 5]])
    # orthogonal init: the new rows are orthonormal to each other and to the kept rows
    new = net[0].weight[pair]
    th.testing.assert_close(new @ new.T, th.eye(2), atol=1e-5, rtol=0)
    th.testing.assert_close(new @ w1[[0, 1, 4, 5]].T, th.zeros(2, 4), atol=1e-5, rtol=0)
    z = th.randn(6)
    z[pair] = f_hat[pair]
    th.testing.assert_close(net[2].weight @ z + net[2].bias, w2 @ z + b2)
    for key in ("exp_avg", "exp_avg_sq"):
        assert th.all(opt.state[net[0].weight][key][pair] == 0)
        assert th.all(opt.state[net[2].weight][key][:, pair] == 0)


def test_fresh_incoming_weights_initialisers():
    th.manual_seed(0)
    wide = nn.Linear(10, 6)
    nn.init.orthogonal_(wide.weight)
    rows = th.tensor([1, 4])
    with th.no_grad():
        wide.weight[rows] = fresh_incoming_weights(wide.weight, rows, "orthogonal", 1.0)
    th.testing.assert_close(wide.weight @ wide.weight.T, th.eye(6), atol=1e-5, rtol=0)  # still an isometry
    conv = nn.Conv2d(3, 8, 3)  # matrix view 8 x 27
    new = fresh_incoming_weights(conv.weight, th.tensor([0, 7]), "orthogonal", math.sqrt(2))
    assert new.shape == (2, 3, 3, 3)
    th.testing.assert_close(new.flatten(1).norm(dim=1), th.full((2,), math.sqrt(2)))
    tall = nn.Linear(3, 12)  # rows cannot be orthonormal: rows of a fresh orthogonal matrix
    new = fresh_incoming_weights(tall.weight, th.arange(12), "orthogonal", 1.0)
    th.testing.assert_close(new.T @ new, th.eye(3), atol=1e-5, rtol=0)
    default = fresh_incoming_weights(conv.weight, th.arange(8), "default")
    assert default.abs().max() <= 1 / math.sqrt(27) and default.std() > 0
    with pytest.raises(ValueError, match="allowed"):
        fresh_incoming_weights(conv.weight, th.arange(2), "xavier")


# ---------------------------------------------------------------------------------------------- hooks
def test_hooks_record_only_training_forwards_with_grad():
    th.optim.Adam([nn.Parameter(th.zeros(1))])  # torch's Adam.step is now hooked: AdamO's super().step() fires hooks too
    net = two_layer()
    opt = AdamO(net.parameters(), lr=1e-2)
    gnt = GenerateAndTest([hidden_of(net)], opt, replacement_rate=0.5, maturity_threshold=1000)
    gnt.attach()
    gnt.attach()  # idempotent
    x = th.randn(8, 3)

    def train_step(forward=True):
        opt.zero_grad()
        if forward:
            net(x).pow(2).mean().backward()
        else:
            for p in net.parameters():
                p.grad = th.zeros_like(p)
        opt.step()

    net.eval()
    net(x)  # a rollout / predict forward: not recorded
    net.train()
    with th.no_grad():
        net(x)  # a target computation: not recorded
    train_step(forward=False)
    assert gnt.ages("0").sum() == 0 and gnt.state["0"]["utility"].sum() == 0
    net.train()
    for n in range(1, 4):
        train_step()
        assert gnt.ages("0").tolist() == [n] * 5  # exactly one update per optimizer step
    u = gnt.state["0"]["utility"].clone()
    net.eval()
    net(th.randn(32, 3))
    net.train()
    train_step(forward=False)
    assert th.equal(gnt.state["0"]["utility"], u) and gnt.ages("0").tolist() == [3] * 5
    gnt.detach()
    assert not gnt.attached and not opt._optimizer_step_post_hooks
    train_step()
    assert gnt.ages("0").tolist() == [3] * 5


# ---------------------------------------------------------------------------------------------- SB3
PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)
OFF_FAST = dict(learning_starts=50, buffer_size=1000, seed=0)
TINY = dict(net_arch=[16, 16])
FAST_CBP = dict(replacement_rate=0.05, maturity_threshold=5)


@pytest.mark.parametrize(
    "cls, env, kwargs, steps",
    [
        (PPO, "CartPole-v1", dict(PPO_FAST, policy_kwargs=dict(TINY)), 384),
        (A2C, "CartPole-v1", dict(n_steps=8, seed=0, policy_kwargs=dict(TINY)), 160),
        (DQN, "CartPole-v1", dict(OFF_FAST, train_freq=2, policy_kwargs=dict(TINY)), 250),
        (QRDQN, "CartPole-v1", dict(OFF_FAST, train_freq=2, policy_kwargs=dict(TINY, n_quantiles=5)), 250),
        (SAC, "Pendulum-v1", dict(OFF_FAST, policy_kwargs=dict(TINY)), 200),
        (TQC, "Pendulum-v1", dict(OFF_FAST, policy_kwargs=dict(TINY, n_quantiles=5)), 200),
        (PlasticPPO, "CartPole-v1", dict(PPO_FAST, activation="maxmin", policy_kwargs=dict(TINY)), 384),
    ],
    ids=["PPO", "A2C", "DQN", "QRDQN", "SAC", "TQC", "PlasticPPO-maxmin"],
)
def test_runs_on_sb3_algorithms(cls, env, kwargs, steps):
    model = cls("MlpPolicy", env, **kwargs)
    cb = ContinualBackprop(**FAST_CBP)
    model.learn(steps, callback=cb, log_interval=None)
    counts = cb.counts()
    networks = {"PPO": ["policy"], "A2C": ["policy"], "DQN": ["q_net"], "QRDQN": ["quantile_net"]}.get(
        cls.__name__, ["actor", "critic"]
    )
    if cls is PlasticPPO:
        networks = ["policy"]
    assert sorted(cb.state) == sorted(networks)
    assert counts and all(v > 0 for v in counts.values()), counts
    assert all(th.isfinite(p).all() for p in model.policy.parameters())
    logged = model.logger.name_to_value
    assert logged["plasticity/cbp/replaced"] == cb.total_replaced
    assert all(logged[f"plasticity/cbp/{key}/replaced"] == v for key, v in counts.items())
    assert not cb.engines  # hooks removed at training end
    if cls is PlasticPPO:
        assert resolve_init(model) == ("orthogonal", 1.0)
        assert all(e["age"].numel() == 8 for e in cb.state["policy"].values())  # 16 MaxMin features = 8 units


def test_ppo_cnn_conv_to_linear():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    model = PPO("CnnPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0)
    assert resolve_init(model) == ("orthogonal", math.sqrt(2))
    cb = ContinualBackprop(replacement_rate=0.05, maturity_threshold=2)
    model.learn(96, callback=cb)
    counts = cb.counts()
    assert len(counts) == 4 and all(v > 0 for v in counts.values()), counts  # 3 convs + the features Linear
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


class _RolloutProbe(BaseCallback):
    """Checks that rollouts and predict() leave the CBP statistics alone, and that hooks are installed once."""

    def __init__(self, cbp):
        super().__init__()
        self.cbp = cbp
        self.checked = 0
        self.n_hooks = []

    def _snapshot(self):
        return {(n, layer, k): v.clone() for n, d in self.cbp.state.items() for layer, e in d.items() for k, v in e.items()}

    def _on_rollout_start(self):
        self.before = self._snapshot()
        self.n_hooks.append(len(self.model.policy.optimizer._optimizer_step_post_hooks))

    def _on_step(self):
        self.model.predict(self.locals["new_obs"], deterministic=True)
        return True

    def _on_rollout_end(self):
        after = self._snapshot()
        assert after.keys() == self.before.keys()
        assert all(th.equal(after[k], self.before[k]) for k in after)
        self.checked += 1


def test_rollouts_and_predict_change_nothing_and_hooks_install_once():
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(TINY), **PPO_FAST)
    cb = ContinualBackprop(replacement_rate=0.5, maturity_threshold=10_000)
    probe = _RolloutProbe(cb)
    model.learn(192, callback=CallbackList([cb, probe]))
    model.learn(128, callback=CallbackList([cb, probe]), reset_num_timesteps=False)
    assert probe.checked == 5
    assert set(probe.n_hooks) == {1}  # one post hook per learn() call, never two
    assert not model.policy.optimizer._optimizer_step_post_hooks
    updates = 5 * 2 * 2  # rollouts * epochs * minibatches
    assert all(e["age"].tolist() == [updates] * 16 for e in cb.state["policy"].values())


def test_save_load_learn_keeps_statistics(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(TINY), **PPO_FAST)
    model.learn(256, callback=ContinualBackprop(replacement_rate=0.02, maturity_threshold=3))
    state = {
        (layer, k): v.clone() for layer, e in model_state(model, "ContinualBackprop")["policy"].items() for k, v in e.items()
    }
    assert sum(int(v) for (_, k), v in state.items() if k == "replaced") > 0
    model.save(tmp_path / "ppo")
    loaded = PPO.load(tmp_path / "ppo", env=model.get_env())
    restored = model_state(loaded, "ContinualBackprop")["policy"]
    assert {(layer, k) for layer, e in restored.items() for k in e} == set(state)
    for (layer, k), v in state.items():
        assert th.equal(restored[layer][k], v), (layer, k)
    cb = ContinualBackprop(replacement_rate=0.02, maturity_threshold=3)
    loaded.learn(128, callback=cb, reset_num_timesteps=False)
    new_updates = 2 * 2 * 2
    carried = 0
    for layer, entry in cb.state["policy"].items():
        assert int(entry["replaced"]) >= int(state[(layer, "replaced")])
        old_age, new_age = state[(layer, "age")], entry["age"]
        survived = new_age >= new_updates  # not replaced during the second learn()
        assert th.equal(new_age[survived], old_age[survived] + new_updates)
        carried += int(survived.sum())
    assert carried > 0


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(replacement_rate=-0.1), r"replacement_rate .*\[0, 1\].*-0.1"),
        (dict(replacement_rate=1.5), r"replacement_rate .*1.5"),
        (dict(replacement_rate=float("nan")), "replacement_rate"),
        (dict(maturity_threshold=-1), "maturity_threshold must be an integer >= 0.*-1"),
        (dict(maturity_threshold=2.5), "maturity_threshold.*2.5"),
        (dict(decay_rate=1.0), r"decay_rate must be a number in \[0, 1\).*1.0"),
        (dict(decay_rate=-0.5), "decay_rate"),
        (dict(utility="weight"), r"Unknown utility 'weight'; allowed: \['contribution', 'adaptable_contribution'\]"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ContinualBackprop(**kwargs)
    config_kwargs = {{"decay_rate": "cbp_decay_rate", "utility": "cbp_utility"}.get(k, k): v for k, v in kwargs.items()}
    config_match = match.replace("decay_rate", "cbp_decay_rate").replace("utility", "cbp_utility")
    with pytest.raises(ValueError, match=config_match):
        ContinualBackpropConfig(**config_kwargs)


def test_structure_and_core_errors():
    net = two_layer()
    wrong = HiddenLayer("0", net[0], net[1], [Consumer(nn.Linear(3, 2))])  # 5 features cannot feed 3 inputs
    with pytest.raises(ValueError, match="cannot feed Linear with 3 inputs"):
        GenerateAndTest([wrong])
    with pytest.raises(ValueError, match="unique layer names"):
        GenerateAndTest([hidden_of(net), hidden_of(net)])
    with pytest.raises(ValueError, match=r"Unknown init 'xavier'; allowed: \['default', 'orthogonal', 'lecun'\]"):
        GenerateAndTest([hidden_of(net)], init="xavier")
    with pytest.raises(ValueError, match="has 7 units, the layer has 5"):
        GenerateAndTest([hidden_of(net)], state={"0": {"age": th.zeros(7, dtype=th.long)}})
    with pytest.raises(KeyError, match="no hidden layer named"):
        GenerateAndTest([hidden_of(net)]).step({"1": th.ones(2, 5)})


def test_config():
    assert CBP_KEYS == (
        "replacement_rate", "maturity_threshold", "cbp_decay_rate", "cbp_utility", "cbp_bias_absorption",
        "cbp_replacement_rule", "cbp_unit_init", "cbp_optimizer_restart",
    )
    config = ContinualBackpropConfig()
    assert not config.enabled
    config = ContinualBackpropConfig(replacement_rate=1e-4, maturity_threshold=10_000.0, cbp_utility="adaptable_contribution")
    assert config.enabled and config.maturity_threshold == 10_000 and isinstance(config.maturity_threshold, int)
    cb = config.make_callback(name="zoo")
    assert isinstance(cb, ContinualBackprop) and cb.enabled and cb.state_key == "ContinualBackprop:zoo"
    assert (cb.replacement_rate, cb.maturity_threshold, cb.decay_rate, cb.utility) == (
        1e-4,
        10_000,
        0.99,
        "adaptable_contribution",
    )
    assert not ContinualBackprop(replacement_rate=0.0).enabled
    sampled = ContinualBackpropConfig(replacement_rate=np.float64(1e-3), maturity_threshold=np.int64(500))  # optuna / numpy
    assert type(sampled.replacement_rate) is float and type(sampled.maturity_threshold) is int
    with pytest.raises(ValueError, match="maturity_threshold must be an integer >= 0.*True"):
        ContinualBackpropConfig(maturity_threshold=True)


# ------------------------------------------------------------------ shared features extractor (SAC / TQC / TD3)
def shared_extractor_sac(cls=SAC, steps=80, **kwargs):
    """An off-policy actor-critic whose actor and critics read ONE PlasticMLP features extractor, trained
    ``steps`` steps so that both optimizers have moments everywhere."""
    from sb3_plastic.networks import PlasticMLP

    policy_kwargs = dict(
        net_arch=[8],
        share_features_extractor=True,
        features_extractor_class=PlasticMLP,
        features_extractor_kwargs=dict(net_arch=(8, 6)),
    )
    model = cls("MlpPolicy", "Pendulum-v1", learning_starts=40, batch_size=16, policy_kwargs=policy_kwargs, **kwargs)
    model.learn(steps)
    return model


def test_shared_extractor_units_reach_every_critic():
    from sb3_plastic.common.surgery import find_networks

    model = shared_extractor_sac(SAC, seed=0)
    policy = model.policy
    actor, critic = policy.actor, policy.critic
    assert critic.features_extractor is actor.features_extractor
    actor_spec, critic_spec = find_networks(model)
    # the critic target follows the shared extractor through SB3's polyak update of critic.parameters()
    names = [n for n, _ in critic.named_parameters()]
    assert names == [n for n, _ in policy.critic_target.named_parameters()]
    assert any(n.startswith("features_extractor.") for n in names)
    ext_last = actor.features_extractor.mlp[3]
    critic_firsts = [q[0] for q in critic.q_networks]
    hidden = {h.name: h for h in actor_spec.hidden_layers()}
    last = hidden["actor.features_extractor.mlp.3"]
    assert [c.layer for c in last.consumers] == [actor.latent_pi[0], *critic_firsts]
    assert all(c.offset == 0 and c.columns_per_unit == 1 for c in last.consumers)
    assert [c.layer for c in hidden["actor.features_extractor.mlp.1"].consumers] == [ext_last]
    assert actor_spec.optimizers() == [actor.optimizer, critic.optimizer]
    assert not any(h.layer is ext_last for h in critic_spec.hidden_layers())  # the actor's optimizer trains it

    opts = (actor.optimizer, critic.optimizer)
    gnt = GenerateAndTest([last], actor.optimizer, decay_rate=ETA, other_optimizers=[critic.optimizer], bias_absorption=True)
    consumers = [c.layer for c in last.consumers]
    # utility: mean |W_out| over every outgoing weight of every consumer (actor + both critics)
    hs = known_activations(2, width=6)
    gnt.update({last.name: hs[0]})
    out = sum(w.weight[:, :6].abs().sum(0) for w in consumers)
    rows = sum(w.weight.shape[0] for w in consumers)
    th.testing.assert_close(gnt.state[last.name]["utility"], (1 - ETA) * out / rows * hs[0].abs().mean(0))
    gnt.update({last.name: hs[1]})
    f_hat = ((1 - ETA) * ETA * hs[0].mean(0) + (1 - ETA) * hs[1].mean(0)) / (1 - ETA**2)

    j, others = 2, [0, 1, 3, 4, 5]
    before = {id(p): p.detach().clone() for p in policy.parameters()}
    moments = {
        (id(o), id(p)): {k: v.clone() for k, v in o.state[p].items() if isinstance(v, th.Tensor)}
        for o in opts
        for p in o.state
    }
    target_before = [p.detach().clone() for p in policy.critic_target.parameters()]
    gnt.replace(last.name, th.tensor([j]))
    for layer in consumers:
        w_old, b_old = before[id(layer.weight)], before[id(layer.bias)]
        assert th.all(layer.weight[:, j] == 0)
        keep = [c for c in range(layer.in_features) if c != j]
        assert th.equal(layer.weight[:, keep], w_old[:, keep])
        th.testing.assert_close(layer.bias, b_old + w_old[:, j] * f_hat[j])  # bias absorption in every consumer
    assert ext_last.bias[j] == 0 and not th.equal(ext_last.weight[j], before[id(ext_last.weight)][j])
    assert th.equal(ext_last.weight[others], before[id(ext_last.weight)][others])
    touched = {id(ext_last.weight): (0, j), id(ext_last.bias): (0, j)}
    touched.update({id(layer.weight): (1, j) for layer in consumers})
    for p in policy.parameters():
        if id(p) not in touched and id(p) not in {id(layer.bias) for layer in consumers}:
            assert th.equal(p, before[id(p)])
    for o in opts:
        for p in o.state:
            for key, old in moments[(id(o), id(p))].items():
                new = o.state[p][key]
                if key == "step" or id(p) not in touched:
                    assert th.equal(new, old), key
                    continue
                dim, index = touched[id(p)]
                assert th.all(new.select(dim, index) == 0), key
                keep = [i for i in range(new.shape[dim]) if i != index]
                assert th.equal(new.index_select(dim, th.tensor(keep)), old.index_select(dim, th.tensor(keep))), key
    # the critic target is left to polyak averaging (as for the non-shared case)
    assert all(th.equal(a, b) for a, b in zip(policy.critic_target.parameters(), target_before))
    # every consumer was reached: the moments of column j are zero in the critic's optimizer
    assert all(th.all(critic.optimizer.state[q.weight]["exp_avg"][:, j] == 0) for q in critic_firsts)


@pytest.mark.parametrize("cls", [SAC, TQC])
def test_shared_extractor_continual_backprop_learns(cls):
    model = shared_extractor_sac(cls, steps=0, seed=0)
    cb = ContinualBackprop(replacement_rate=0.2, maturity_threshold=3)
    model.learn(120, callback=cb, log_interval=None)
    counts = cb.counts()
    assert counts.get("actor/actor.features_extractor.mlp.3", 0) > 0, counts
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


def test_maturity_defaults_to_dohares_rl_value():
    """Dohare et al.'s RL runs use a maturity of 10 000 updates (100 is their supervised setting)."""
    assert ContinualBackprop().maturity_threshold == 10_000
    assert ContinualBackpropConfig().maturity_threshold == 10_000
    model = PlasticPPO("MlpPolicy", "CartPole-v1", replacement_rate=1e-4, n_steps=64, batch_size=32)
    assert model.intervention_configs["cbp"].maturity_threshold == 10_000


# ---------------------------------------------------------------------------------------------- audit fixes
def test_shared_activation_after_a_norm_is_recorded_after_the_norm():
    """One activation module shared by two layers, each with a LayerNorm in front of it: the hooks record
    ``act(LayerNorm(z))`` of each layer (written out here), not ``act(z)``."""
    th.manual_seed(0)
    act = nn.ReLU()
    net = nn.Sequential(nn.Linear(3, 6), nn.LayerNorm(6), act, nn.Linear(6, 6), nn.LayerNorm(6), act, nn.Linear(6, 2))
    with th.no_grad():
        for ln in (net[1], net[4]):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    spec = NetworkSpec("net", net, None, None, [[net[0], net[3], net[6]]], {id(net[0]): "0", id(net[3]): "3"})
    hidden = spec.hidden_layers()
    gnt = GenerateAndTest(hidden, None, replacement_rate=0.0)
    gnt.attach()
    x = th.randn(16, 3)
    net(x)
    with th.no_grad():
        h, want = x, []
        for i in (0, 3):
            z = net[i](h)
            normed = (z - z.mean(1, keepdim=True)) / th.sqrt(z.var(1, unbiased=False, keepdim=True) + 1e-5)
            h = th.relu(normed * net[i + 1].weight + net[i + 1].bias)
            want.append(h)
    for spec_h, ref in zip(hidden, want):
        th.testing.assert_close(gnt._stored[spec_h.name], ref)
    gnt.detach()


def _small_ppo(net_arch):
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=net_arch), seed=0)
    return PPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_cbp_without_hidden_layers_warns_at_training_start():
    with pytest.warns(UserWarning, match="ContinualBackprop.*nothing to act on"):
        _small_ppo([]).learn(64, callback=ContinualBackprop(0.1, maturity_threshold=0))


def test_cbp_whose_units_never_mature_warns_once_at_training_end():
    import warnings

    model = _small_ppo([8])
    cb = ContinualBackprop(0.1, maturity_threshold=1000)  # 2 rollouts = 8 optimizer steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(128, callback=cb)
        model.learn(64, callback=cb, reset_num_timesteps=False)
    immature = [w for w in caught if "maturity_threshold" in str(w.message)]
    assert len(immature) == 1 and "1000" in str(immature[0].message) and " 8 optimizer steps" in str(immature[0].message)
    assert cb.total_replaced == 0
    with warnings.catch_warnings(record=True) as caught:  # units mature: no warning
        warnings.simplefilter("always")
        _small_ppo([8]).learn(128, callback=ContinualBackprop(0.1, maturity_threshold=2))
    assert not [w for w in caught if "maturity_threshold" in str(w.message)]
