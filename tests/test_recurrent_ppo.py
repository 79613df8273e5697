"""PlasticRecurrentPPO: sb3-contrib equivalence when plasticity is off, AdamO isometry and FIRE per LSTM gate
block, what the unit-reset interventions and Shrink & Perturb do to the LSTM, save/load, LSTM states."""

import math

import numpy as np
import pytest
import torch as th
from plastic_asserts import assert_intervention_ran, assert_same_adam_moments, assert_same_parameters
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

from sb3_plastic import (
    FIRE,
    PlasticityMonitor,
    PlasticRecurrentPPO,
    ReDo,
    dfi_per_layer,
    isometry_penalty,
    isometry_penalty_grad,
)
from sb3_plastic.callbacks.cbp import ContinualBackprop, GenerateAndTest
from sb3_plastic.callbacks.fire import newton_schulz_polar
from sb3_plastic.callbacks.redo import redo_reset_
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturb, shrink_perturb_recurrent_
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.diagnostics import network_diagnostics
from sb3_plastic.networks import PlasticMLP
from sb3_plastic.optim import MAX_ISOMETRY_STEP, AdamO
from sb3_plastic.recurrent import (
    fresh_gate_rows,
    fresh_recurrent_parameters,
    lstm_first_step,
    lstm_layer_outputs,
    orthogonal_recurrent_init_,
    recurrent_init_scheme,
    recurrent_weights,
)
from sb3_plastic.recurrent_policies import PlasticRecurrentActorCriticPolicy

OFF = dict(activation="tanh", isometry_mode="off", optimizer="adam")
FAST = dict(n_steps=32, batch_size=32, n_epochs=2, seed=0)
H = 8  # LSTM hidden size (CartPole observations have 4 features: input blocks (8, 4), recurrent blocks (8, 8))


def small(**extra):
    return dict(lstm_hidden_size=H, net_arch=[16], **extra)


def image_env():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)
    return env


def lstm_matrices(policy):
    return [
        (f"{name}.{pname}", p, b)
        for name in ("lstm_actor", "lstm_critic")
        if getattr(policy, name) is not None
        for pname, p, b in recurrent_weights(getattr(policy, name))
    ]


def gate_blocks(weight):
    return weight.detach().reshape(4, weight.shape[0] // 4, weight.shape[1])


def test_policy_mro_keeps_recurrent_methods():
    cls = PlasticRecurrentActorCriticPolicy
    for name in ("forward", "predict", "_predict", "evaluate_actions", "get_distribution", "predict_values"):
        assert getattr(cls, name) is getattr(RecurrentActorCriticPolicy, name), name


@pytest.mark.parametrize(
    "policy, env_fn, policy_kwargs, steps",
    [
        ("MlpLstmPolicy", lambda: "CartPole-v1", small(), 128),
        ("MlpLstmPolicy", lambda: "CartPole-v1", small(enable_critic_lstm=False), 128),
        ("MlpLstmPolicy", lambda: "CartPole-v1", small(enable_critic_lstm=False, shared_lstm=True, n_lstm_layers=2), 128),
        # NatureCNN is ReLU whatever the MLP's activation; sb3-contrib puts no MLP after it (net_arch=[])
        ("CnnLstmPolicy", image_env, dict(lstm_hidden_size=H), 64),
    ],
    ids=["critic_lstm", "critic_linear", "shared_2_layers", "cnn"],
)
def test_plasticity_off_is_contrib(policy, env_fn, policy_kwargs, steps):
    reference = RecurrentPPO(policy, env_fn(), policy_kwargs=dict(policy_kwargs), **FAST)
    reference.learn(steps)
    off = dict(OFF, activation="relu") if policy == "CnnLstmPolicy" else OFF
    plastic = PlasticRecurrentPPO(policy, env_fn(), policy_kwargs=dict(policy_kwargs), **off, **FAST)
    assert type(plastic.policy.optimizer) is th.optim.Adam
    assert plastic.policy.optimizer.param_groups[0]["eps"] == reference.policy.optimizer.param_groups[0]["eps"] == 1e-5
    plastic.learn(steps)
    assert_same_parameters(reference, plastic)
    fresh = RecurrentPPO(policy, env_fn(), policy_kwargs=dict(policy_kwargs), **FAST)
    assert any(not th.equal(x, y) for x, y in zip(fresh.policy.parameters(), reference.policy.parameters()))


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="MlpLstmPolicy"):
        PlasticRecurrentPPO("MlpPolicy", "CartPole-v1")


def test_adamo_groups_hold_the_lstm_gate_blocks():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), isometry_coef=0.05, **FAST)
    groups = model.policy.optimizer.param_groups
    assert isinstance(model.policy.optimizer, AdamO)
    assert [(g["isometry_coef"], g.get("isometry_blocks", 1)) for g in groups] == [(0.05, 1), (0.05, 4), (0.0, 1)]
    lstm = {id(p) for _, p, _ in lstm_matrices(model.policy)}
    assert {id(p) for p in groups[1]["params"]} == lstm and len(lstm) == 4
    mlp = {id(m.weight) for m in model.policy.mlp_extractor.modules() if isinstance(m, th.nn.Linear)}
    assert {id(p) for p in groups[0]["params"]} == mlp
    heads = {id(p) for head in model.policy.plastic_heads() for p in head.parameters()}
    assert heads <= {id(p) for p in groups[2]["params"]}
    # fnmatch patterns select LSTM matrices as any other parameter; they stay per gate block
    only = PlasticRecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), isometry_layers=["lstm_actor.*"], **FAST
    ).policy.optimizer.param_groups
    assert [g.get("isometry_blocks", 1) for g in only] == [4, 1]
    assert len(only[0]["params"]) == 2


@pytest.mark.parametrize("coef", [0.5, 1e6], ids=["free", "clamped"])
def test_isometry_step_moves_each_gate_block_towards_isometry(coef):
    """With a zero task gradient the AdamO step of an LSTM weight is the decoupled isometry step, computed
    gate block by gate block: each block moves by ``-step_b * grad R(W_b)`` with its own clamp."""
    model = PlasticRecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), isometry_coef=coef, isometry_interval=1, **FAST
    )
    opt = model.policy.optimizer
    lr = opt.param_groups[0]["lr"]
    with th.no_grad():  # singular values above the target s = 1, so that the blocks' Gram bounds decide the clamp
        for _, p, _ in lstm_matrices(model.policy):
            p.mul_(3.0)
    before = {name: p.detach().clone() for name, p, _ in lstm_matrices(model.policy)}
    for p in model.policy.parameters():
        p.grad = th.zeros_like(p)
    opt.step()
    for name, p, blocks in lstm_matrices(model.policy):
        assert blocks == 4
        old, new = gate_blocks(before[name]), gate_blocks(p)
        steps = []
        for b in range(4):
            w = old[b].clone().requires_grad_(True)
            gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
            (0.5 * ((gram - th.eye(gram.shape[0])) ** 2).sum()).backward()  # R(W_b), by autograd
            bound = max(float(gram.detach().abs().sum(dim=1).max()), 1.0)  # at least the target s = 1
            step = min(lr * coef, MAX_ISOMETRY_STEP / (2.0 * bound))
            steps.append(step)
            assert th.allclose(new[b], old[b] - step * w.grad, atol=1e-6), (name, b)
            assert isometry_penalty(new[b]) < isometry_penalty(old[b])
        assert th.allclose(opt.state[p]["isometry_step"], th.tensor(steps), rtol=1e-5)
        if coef > 1:  # the clamp acts per block, so blocks with different Gram bounds take different steps
            assert len({round(s, 8) for s in steps}) > 1


def test_training_with_isometry_reduces_lstm_dfi():
    model = PlasticRecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), isometry_coef=20.0, learning_rate=3e-3, **FAST
    )
    before = dfi_per_layer(model.policy)
    model.learn(256)
    after = dfi_per_layer(model.policy)
    for key in ("lstm_actor.weight_ih_l0", "lstm_actor.weight_hh_l0", "lstm_critic.weight_hh_l0"):
        assert after[key] < before[key], key
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def test_maxmin_orthogonal_init_per_gate_block():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), activation="maxmin", seed=1)
    for name, p, _ in lstm_matrices(model.policy):
        for block in gate_blocks(p):
            assert th.allclose(th.linalg.svdvals(block), th.ones(min(block.shape)), atol=1e-5), name
    for lstm in (model.policy.lstm_actor, model.policy.lstm_critic):
        assert all(float(b.detach().abs().max()) == 0.0 for n, b in lstm.named_parameters() if n.startswith("bias"))
    action_net = model.policy.action_net
    assert th.allclose(th.linalg.svdvals(action_net.weight.detach()), th.full((1,), 0.01), atol=1e-5)


def test_fire_makes_each_gate_block_a_scaled_polar_factor():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), isometry_coef=0.05, **FAST)
    model.learn(64)  # optimizer state exists
    before = {name: p.detach().clone().double() for name, p, _ in lstm_matrices(model.policy)}
    biases = {n: b.detach().clone() for n, b in model.policy.lstm_actor.named_parameters() if n.startswith("bias")}
    # 30 Newton-Schulz steps (the reference's 10 leave very small singular values of a random block short of 1)
    callback = FIRE(at=0.5, iterations=30)
    callback.init_callback(model)
    assert set(map(id, callback.selected_layers())) >= {id(model.policy.lstm_actor), id(model.policy.lstm_critic)}
    callback._fire(["test"])
    for name, p, _ in lstm_matrices(model.policy):
        assert p not in model.policy.optimizer.state, name  # moments and step count of rewritten matrices dropped
        for old, new in zip(gate_blocks(before[name]), gate_blocks(p)):
            u, _, vh = th.linalg.svd(old, full_matrices=False)
            scale = math.sqrt(old.shape[0] / old.shape[1])  # FIRE's Linear scale sqrt(out / in), per block
            assert th.allclose(new.double(), scale * (u @ vh), atol=2e-4), name
            assert th.allclose(new.double(), scale * newton_schulz_polar(old, 30), atol=1e-6), name
    for n, bias in model.policy.lstm_actor.named_parameters():
        if n.startswith("bias"):
            assert th.equal(bias, biases[n]), n  # biases untouched
    # the recurrent blocks are square: exactly orthogonal
    hh = gate_blocks(model.policy.lstm_actor.weight_hh_l0)
    assert th.allclose(hh @ hh.mT, th.eye(H).expand(4, H, H), atol=2e-4)


def test_fire_keyword_trains_and_fires_once():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), fire_at=0.5, **FAST)
    biases = model.policy.lstm_actor.bias_hh_l0.detach().clone()
    model.learn(256)
    assert model.plastic_state["FIRE:auto"]["count"] == 1
    assert not th.equal(biases, model.policy.lstm_actor.bias_hh_l0)  # trained on, not rewritten by FIRE
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def test_find_networks_lists_lstm_cells():
    """Every LSTM layer is a layer of units (cells) for Continual Backprop and ReDo; the top layer's readers are the
    first layers after the LSTM; the features extractor's layers are weight layers and hidden layers read by the
    LSTMs' weight_ih_l0."""
    mlp = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(enable_critic_lstm=False), **FAST)
    (spec,) = find_networks(mlp)
    assert [h.name for h in spec.hidden_layers()] == ["mlp_extractor.policy_net.0", "critic", "mlp_extractor.value_net.0"]
    assert spec.recurrent == [mlp.policy.lstm_actor] and spec.extra_layers == []
    (cells,) = spec.recurrent_units()
    assert cells.name == "lstm_actor.l0" and cells.n_units == H
    assert [c.layer for c in cells.consumers] == [mlp.policy.mlp_extractor.policy_net[0]]

    two_layers = small(enable_critic_lstm=False, shared_lstm=True, n_lstm_layers=2)
    shared = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=two_layers, **FAST)
    low, top = find_networks(shared)[0].recurrent_units()
    policy = shared.policy
    assert (low.name, top.name) == ("lstm_actor.l0", "lstm_actor.l1")
    assert low.consumers == []
    assert [w for w, _ in low.outgoing()] == [policy.lstm_actor.weight_ih_l1, policy.lstm_actor.weight_hh_l0]
    assert [c.layer for c in top.consumers] == [policy.mlp_extractor.policy_net[0], policy.mlp_extractor.value_net[0]]

    cnn = PlasticRecurrentPPO("CnnLstmPolicy", image_env(), policy_kwargs=dict(lstm_hidden_size=H), **FAST)
    (spec,) = find_networks(cnn)
    extractor = [m for m in cnn.policy.features_extractor.modules() if isinstance(m, (th.nn.Linear, th.nn.Conv2d))]
    assert spec.extra_layers == extractor and all(any(m is x for x in spec.weight_layers()) for m in extractor)
    # no MLP between the LSTM and the heads: the hidden layers are the extractor's, the last one read by both LSTMs
    hidden = spec.hidden_layers()
    assert [h.layer for h in hidden] == extractor
    assert [(c.layer, c.weight_name, c.bias_name) for c in hidden[-1].consumers] == [
        (cnn.policy.lstm_actor, "weight_ih_l0", "bias_ih_l0"),
        (cnn.policy.lstm_critic, "weight_ih_l0", "bias_ih_l0"),
    ]
    actor, critic = spec.recurrent_units()
    assert [c.layer for c in actor.consumers] == [cnn.policy.action_net]
    assert [c.layer for c in critic.consumers] == [cnn.policy.value_net]


def _first_step_with(lstm, x, layer=None, cell=None, value=None):
    """First-step LSTM output from zero states, written out independently, with ``h[:, cell]`` of ``layer`` set to
    ``value`` before the layers above read it."""
    h = x
    for index in range(lstm.num_layers):
        gates = h @ getattr(lstm, f"weight_ih_l{index}").T
        gates = gates + getattr(lstm, f"bias_ih_l{index}") + getattr(lstm, f"bias_hh_l{index}")
        i, _, g, o = gates.chunk(4, dim=-1)
        h = th.sigmoid(o) * th.tanh(th.sigmoid(i) * th.tanh(g))
        if index == layer:
            h = h.clone()
            h[:, cell] = value
    return h


def _policy_first_step(policy, obs):
    """Action logits and values of sb3-contrib's own forward (nn.LSTM) for single observations from zero states."""
    n = obs.shape[0]
    zeros = lambda lstm: (th.zeros(lstm.num_layers, n, H), th.zeros(lstm.num_layers, n, H))  # noqa: E731
    starts = th.ones(n)
    dist, _ = policy.get_distribution(obs, zeros(policy.lstm_actor), starts)
    critic = policy.lstm_critic if policy.lstm_critic is not None else policy.lstm_actor
    values = policy.predict_values(obs, zeros(critic), starts)
    return dist.distribution.logits, values


@pytest.mark.parametrize(
    "policy_kwargs, extra, name",
    [
        (small(), {}, "lstm_actor.l0"),
        (small(), dict(activation="maxmin"), "lstm_critic.l0"),
        (small(enable_critic_lstm=False, shared_lstm=True, n_lstm_layers=2), {}, "lstm_actor.l0"),
    ],
    ids=["default_init", "orthogonal_init", "lower_layer_of_2"],
)
def test_forced_lstm_cell_replacement(policy_kwargs, extra, name):
    """Replacing cell j: fresh gate rows j, H+j, 2H+j, 3H+j from the LSTM's initialiser, zero biases there, zero column
    j in weight_hh and in every reader, readers' biases moved by W[:, j] * f_j, everything else bit-identical, optimizer
    moments of exactly those entries zeroed; the first-step outputs change only as h_j -> f_j would change them."""
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=policy_kwargs, **extra, **FAST)
    model.learn(64)  # optimizer moments exist
    policy, opt = model.policy, model.policy.optimizer
    (spec,) = find_networks(model)
    cells = {u.name: u for u in spec.recurrent_units()}[name]
    lstm = cells.layer
    engine = GenerateAndTest(
        [cells], opt, replacement_rate=0.0, recurrent_init=recurrent_init_scheme(model), bias_absorption=True
    )
    rng = np.random.default_rng(0)
    for _ in range(3):  # statistics of a few batches of sequences
        x = th.as_tensor(rng.normal(size=(5, 6, lstm.input_size)), dtype=th.float32)
        engine.step({name: lstm_layer_outputs(lstm, x)[cells.index].reshape(-1, H)})
    j = 3
    f_j = float(engine.bias_corrected_mean_activation(name)[j, 0])
    assert f_j != 0.0
    obs = th.as_tensor(rng.normal(size=(16, 4)), dtype=th.float32)
    with th.no_grad():
        h_pi = _first_step_with(policy.lstm_actor, obs, cells.index if lstm is policy.lstm_actor else None, j, f_j)
        logits_expected = policy._get_action_dist_from_latent(policy.mlp_extractor.forward_actor(h_pi)).distribution.logits
        critic = policy.lstm_critic if policy.lstm_critic is not None else policy.lstm_actor
        h_vf = _first_step_with(critic, obs, cells.index if lstm is critic else None, j, f_j)
        values_expected = policy.value_net(policy.mlp_extractor.forward_critic(h_vf))

    params, before, moments = _snapshot(policy, opt)
    rows = th.tensor([j, H + j, 2 * H + j, 3 * H + j])
    readers = [c.layer for c in cells.consumers]
    touched: dict[str, th.Tensor] = {}  # parameter name -> mask of the entries the replacement may write

    def mark(param, rows_=None, col=None):
        n = params[id(param)]
        mask = touched.setdefault(n, th.zeros_like(param, dtype=th.bool))
        if rows_ is not None:
            mask[rows_] = True
        if col is not None:
            mask[:, col] = True

    for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        mark(cells.param(kind), rows_=rows)
    mark(cells.param("weight_hh"), col=j)
    for reader in readers:
        mark(reader.weight, col=j)
    if not cells.top:
        mark(cells.param("weight_ih", cells.index + 1), col=j)

    engine.replace(name, th.tensor([j]))

    after = {n: p.detach() for n, p in policy.named_parameters()}
    # fresh gate rows, from the initialiser
    for kind in ("weight_ih", "weight_hh"):
        w_old, w_new = before[params[id(cells.param(kind))]], cells.param(kind).detach()
        keep = th.ones(w_new.shape[1], dtype=th.bool)
        if kind == "weight_hh":
            keep[j] = False
        assert (w_new[rows][:, keep] != w_old[rows][:, keep]).all(), kind
        if extra.get("activation") == "maxmin":
            assert (w_new[rows].norm(dim=1) <= 1.0 + 1e-5).all()  # rows of orthogonal gate blocks (gain 1)
        else:
            assert float(w_new[rows].abs().max()) <= 1 / math.sqrt(H)  # PyTorch's U(-1/sqrt(H), 1/sqrt(H))
    for kind in ("bias_ih", "bias_hh"):
        assert th.equal(cells.param(kind).detach()[rows], th.zeros(4)), kind
    # zero outgoing weights: the recurrence (all 4H rows), the readers, the next layer's input
    assert th.equal(cells.param("weight_hh").detach()[:, j], th.zeros(4 * H))
    for reader in readers:
        assert th.equal(reader.weight.detach()[:, j], th.zeros(reader.out_features))
        expected_bias = before[params[id(reader.bias)]] + before[params[id(reader.weight)]][:, j] * f_j
        assert th.allclose(reader.bias.detach(), expected_bias, atol=1e-6, rtol=0)
    if not cells.top:
        nxt_w, nxt_b = cells.param("weight_ih", cells.index + 1), cells.param("bias_ih", cells.index + 1)
        assert th.equal(nxt_w.detach()[:, j], th.zeros(4 * H))
        expected_bias = before[params[id(nxt_b)]] + before[params[id(nxt_w)]][:, j] * f_j
        assert th.allclose(nxt_b.detach(), expected_bias, atol=1e-6, rtol=0)
        assert th.equal(cells.param("bias_hh", cells.index + 1), before[params[id(cells.param("bias_hh", cells.index + 1))]])
    absorbing = {params[id(r.bias)] for r in readers}
    if not cells.top:
        absorbing.add(params[id(cells.param("bias_ih", cells.index + 1))])
    _assert_only_touched_changed(policy, opt, before, after, touched, absorbing, moments)
    assert int(engine.state[name]["replaced"]) == 1 and int(engine.state[name]["age"][j]) == 0
    # the network at the first step from zero states: as the old network with h_j replaced by its mean f_j
    with th.no_grad():
        logits, values = _policy_first_step(policy, obs)
    assert th.allclose(logits, logits_expected, atol=1e-5)
    assert th.allclose(values, values_expected, atol=1e-5)


# seeds 14 and 389 drew rows orthogonal only to ~1e-3 when the projection ran in float32 (0.3 % of 5 000 seeds)
@pytest.mark.parametrize("seed", [0, 14, 389])
def test_fresh_gate_rows_follow_the_lstm_initialiser(seed):
    th.manual_seed(seed)
    lstm = th.nn.LSTM(H, H)
    orthogonal_recurrent_init_(lstm, gain=1.3)
    cells = th.tensor([1, 5])
    rows = fresh_gate_rows(lstm.weight_hh_l0, cells, "orthogonal", 1.3)
    new = lstm.weight_hh_l0.detach().clone()
    new[th.cat([cells + g * H for g in range(4)])] = rows
    for block in gate_blocks(new):  # square gate blocks stay orthogonal (scaled by the gain)
        assert th.allclose(block @ block.T, 1.3**2 * th.eye(H), atol=1e-5)
    big = fresh_gate_rows(th.empty(4 * 256, 300), th.arange(100))
    assert big.shape == (400, 300) and float(big.abs().max()) <= 1 / 16
    assert float(big.std()) == pytest.approx(1 / 16 / math.sqrt(3), rel=0.02)


@pytest.mark.parametrize("episode_start_inside", [False, True], ids=["one_call", "step_by_step"])
def test_lstm_hook_records_real_steps_only(episode_start_inside):
    """The hook on the LSTM records every layer's output over the minibatch's sequences (as sb3-contrib runs them:
    one call, or one call per step when an episode starts inside a sequence) and drops the padded steps."""
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(n_lstm_layers=2), **FAST)
    policy = model.policy
    lstm = policy.lstm_actor
    units = [u for u in find_networks(model)[0].recurrent_units() if u.layer is lstm]
    engine = GenerateAndTest(units, policy.optimizer, replacement_rate=0.0, decay_rate=0.0)
    n_seq, length = 3, 5
    rng = np.random.default_rng(1)
    features = th.as_tensor(rng.normal(size=(n_seq * length, 4)), dtype=th.float32)
    states = (th.as_tensor(rng.normal(size=(2, n_seq, H)), dtype=th.float32),) * 2
    starts = th.zeros(n_seq * length)
    if episode_start_inside:
        starts[length + 2] = 1.0
    mask = th.ones(n_seq * length)
    mask[length - 2 : length] = 0.0  # the first sequence is 3 steps long, padded to 5
    # independent reference: one-layer LSTMs with each layer's weights, run by sb3-contrib's own sequence code
    low = th.nn.LSTM(4, H)
    high = th.nn.LSTM(H, H)
    for ref, index in ((low, 0), (high, 1)):
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(ref, f"{kind}_l0").data.copy_(getattr(lstm, f"{kind}_l{index}"))
    with th.no_grad():
        out_low, _ = policy._process_sequence(features, (states[0][:1], states[1][:1]), starts, low)
        out_high, _ = policy._process_sequence(out_low, (states[0][1:], states[1][1:]), starts, high)
    engine.attach()
    try:
        engine.set_sequence_mask(mask)
        policy.set_training_mode(True)
        output, _ = policy._process_sequence(features, states, starts, lstm)
        assert th.allclose(output, out_high, atol=1e-6)
        policy.set_training_mode(False)
        policy._process_sequence(features, states, starts, lstm)  # eval mode: not recorded
        engine.step()
    finally:
        engine.detach()
    real = mask > 0
    for u, expected in zip(units, (out_low, out_high)):
        f = engine.state[u.name]["mean_activation"][:, 0]  # decay 0: the mean over the real steps
        assert th.allclose(f, expected[real].mean(dim=0), atol=1e-6), u.name
        assert int(engine.state[u.name]["age"][0]) == 1


def test_redo_replaces_dormant_lstm_cells():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), **FAST)
    model.learn(64)
    lstm = model.policy.lstm_actor
    before = {k: v.detach().clone() for k, v in lstm.named_parameters()}
    mlp_before = model.policy.mlp_extractor.policy_net[0].weight.detach().clone()
    redo = ReDo(period=1, tau=1.0)  # score <= 1: the cells below the layer's mean activity
    redo.init_callback(model)
    observations = th.as_tensor(np.random.default_rng(0).normal(size=(64, 4)), dtype=th.float32)
    with th.no_grad():
        activity = lstm_first_step(lstm, observations).abs().mean(dim=0)
    dormant = (activity / (activity.mean() + 1e-9) <= 1.0).nonzero().flatten()
    results = {r.name: r for _, r in redo.recycle(observations)}
    assert results["lstm_actor.l0"].n_dormant == len(dormant) > 0
    assert results["lstm_critic.l0"].n_dormant > 0
    rows = th.cat([dormant + g * H for g in range(4)])
    kept = th.ones(4 * H, dtype=th.bool)
    kept[rows] = False
    assert (lstm.weight_ih_l0[rows] != before["weight_ih_l0"][rows]).all()
    assert th.equal(lstm.weight_ih_l0[kept], before["weight_ih_l0"][kept])
    assert th.equal(lstm.bias_hh_l0[rows], th.zeros(len(rows)))
    assert th.equal(lstm.weight_hh_l0[:, dormant], th.zeros(4 * H, len(dormant)))
    assert th.equal(model.policy.mlp_extractor.policy_net[0].weight[:, dormant], th.zeros(16, len(dormant)))
    assert not th.equal(mlp_before, model.policy.mlp_extractor.policy_net[0].weight)
    assert redo.state["layer_resets"]["policy/lstm_actor.l0"] == len(dormant)


def test_cbp_callback_replaces_cells_of_contrib_recurrent_ppo():
    """The callback on plain sb3-contrib RecurrentPPO with a shared 2-layer LSTM: cells of both layers are
    replaced over a few hundred steps; the minibatch watch on the rollout buffer is removed at training end."""
    model = RecurrentPPO(
        "MlpLstmPolicy",
        "CartPole-v1",
        policy_kwargs=small(enable_critic_lstm=False, shared_lstm=True, n_lstm_layers=2),
        **FAST,
    )
    callback = ContinualBackprop(replacement_rate=0.05, maturity_threshold=2)
    model.learn(256, callback=callback)
    counts = callback.counts()
    assert counts["policy/lstm_actor.l0"] > 0 and counts["policy/lstm_actor.l1"] > 0
    assert "_get_samples" not in vars(model.rollout_buffer)
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def test_cbp_unit_init_draws_lstm_cells_too(monkeypatch):
    """``unit_init`` reaches the cells of an LSTM layer as well as the Linear units (no layer keeps its own scheme
    silently): every replacement of the run draws with ``("lecun", 1.0)``."""
    import sb3_plastic.callbacks.cbp as cbp_module

    inits = []
    original = cbp_module.replace_cells_

    def spy(spec, units, optimizers, init, gain, f_hat=None):
        inits.append((init, gain))
        return original(spec, units, optimizers, init, gain, f_hat)

    monkeypatch.setattr(cbp_module, "replace_cells_", spy)
    model = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(enable_critic_lstm=False), **FAST)
    callback = ContinualBackprop(replacement_rate=0.05, maturity_threshold=2, unit_init="lecun")
    model.learn(256, callback=callback)
    assert callback.counts()["policy/lstm_actor.l0"] > 0
    assert inits and set(inits) == {("lecun", 1.0)}


@pytest.mark.parametrize(
    "intervention",
    [
        dict(fire_at=0.5),
        dict(replacement_rate=0.05, maturity_threshold=2),
        dict(redo_period=2, redo_tau=0.5),
        dict(shrink_perturb="event", shrink_perturb_every=96),
        dict(shrink_perturb="continual"),
    ],
    ids=lambda d: next(iter(d)),
)
def test_intervention_keywords(intervention):
    model = PlasticRecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), activation="maxmin", **FAST, **intervention
    )
    assert len(model.intervention_callbacks()) == 1
    model.learn(320)
    assert_intervention_ran(model, intervention)
    state = model.plastic_state
    if "replacement_rate" in intervention:
        layers = state["ContinualBackprop:auto"]["policy"]
        assert set(layers) == {"mlp_extractor.policy_net.0", "mlp_extractor.value_net.0", "lstm_actor.l0", "lstm_critic.l0"}
        assert int(layers["lstm_actor.l0"]["replaced"]) > 0 and int(layers["lstm_critic.l0"]["replaced"]) > 0
    if intervention.get("shrink_perturb") == "event":
        assert state["ShrinkPerturb:auto"]["events"] >= 2
    if intervention.get("shrink_perturb") == "continual":
        assert state["ShrinkPerturb:auto"]["noise_steps"] > 0
    _check_predict_with_states(model)


def test_shrink_perturb_on_the_lstm():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), **FAST)
    model.learn(64)
    lstm = model.policy.lstm_actor
    before = {k: v.detach().clone() for k, v in lstm.named_parameters()}
    # event form through the callback, pure shrink: every LSTM weight and bias scaled, optimizer state dropped
    callback = ShrinkPerturb(mode="event", every=10, shrink=0.5, perturb=0.0)
    callback.init_callback(model)
    callback.apply()
    for name, p in lstm.named_parameters():
        assert th.allclose(p, 0.5 * before[name]), name
        assert p not in model.policy.optimizer.state
    # with a perturbation: shrink * theta + perturb * a fresh draw of PyTorch's LSTM init U(-1/sqrt(H), 1/sqrt(H))
    now = {k: v.detach().clone() for k, v in lstm.named_parameters()}
    th.manual_seed(7)
    fresh = fresh_recurrent_parameters(lstm)
    assert all(float(t.abs().max()) <= 1 / math.sqrt(H) for t in fresh.values())
    th.manual_seed(7)
    shrink_perturb_recurrent_([lstm], 0.4, 0.1)
    for name, p in lstm.named_parameters():
        assert th.allclose(p, 0.4 * now[name] + 0.1 * fresh[name]), name


def _check_predict_with_states(model):
    env = model.get_env()
    obs = env.reset()
    states, starts = None, np.ones((env.num_envs,), dtype=bool)
    for _ in range(5):
        action, states = model.predict(obs, state=states, episode_start=starts, deterministic=True)
        assert states[0].shape == (model.policy.lstm_actor.num_layers, env.num_envs, H)
        obs, _, dones, _ = env.step(action)
        starts = dones


def test_save_load_learn_continues(tmp_path):
    model = PlasticRecurrentPPO(
        "MlpLstmPolicy",
        "CartPole-v1",
        policy_kwargs=small(),
        isometry_coef=0.05,
        replacement_rate=0.05,
        maturity_threshold=2,
        **FAST,
    )
    model.learn(128)
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = PlasticRecurrentPPO.load(path, env=model.get_env())
    assert loaded.isometry_config == model.isometry_config
    assert isinstance(loaded.policy, PlasticRecurrentActorCriticPolicy)
    assert [g.get("isometry_blocks", 1) for g in loaded.policy.optimizer.param_groups] == [1, 4, 1]
    assert_same_parameters(model, loaded)
    assert_same_adam_moments(model.policy.optimizer, loaded.policy.optimizer)
    saved = model.plastic_state["ContinualBackprop:auto"]["policy"]
    restored = loaded.plastic_state["ContinualBackprop:auto"]["policy"]
    assert {"lstm_actor.l0", "lstm_critic.l0"} <= set(saved)
    for layer, entry in saved.items():
        for key in ("utility", "age", "mean_activation", "replaced"):
            assert th.equal(entry[key], restored[layer][key]), (layer, key)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + 64
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))
    _check_predict_with_states(loaded)


def test_monitor_reports_lstm_blocks():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), **FAST)
    monitor = PlasticityMonitor(every=32, ntk_probe_size=4, max_overhead=None)
    model.learn(64, callback=monitor)
    values = monitor.run()
    dfi = dfi_per_layer(model.policy)
    key = "plasticity/policy/lstm_actor.weight_hh_l0/dfi"
    assert values[key] == pytest.approx(dfi["lstm_actor.weight_hh_l0"], rel=1e-5)
    heads = dfi["action_net"] + dfi["value_net"]  # the LSTM matrices count as hidden layers
    assert values["plasticity/policy/dfi_hidden"] == pytest.approx(sum(dfi.values()) - heads, rel=1e-5)
    assert values["plasticity/policy/dfi"] - values["plasticity/policy/dfi_hidden"] == pytest.approx(heads, rel=1e-4)
    assert math.isfinite(values["plasticity/policy/ntk_erank"])
    x = th.randn(5, 4)
    lstm = model.policy.lstm_actor
    assert th.allclose(lstm_first_step(lstm, x), lstm(x[None])[0][0], atol=1e-6)


def test_block_penalty_and_gradient():
    w = th.randn(12, 5, dtype=th.float64, requires_grad=True)
    penalty = isometry_penalty(w, 1.0, blocks=4)
    assert th.allclose(penalty, sum(isometry_penalty(b) for b in w.detach().reshape(4, 3, 5)))
    penalty.backward()
    assert th.allclose(isometry_penalty_grad(w.detach(), 1.0, blocks=4), w.grad)
    assert isometry_penalty_grad(w.detach()).shape == w.shape  # one block: the unchanged path
    with pytest.raises(ValueError, match="blocks=5"):
        isometry_penalty(w.detach(), blocks=5)
    with pytest.raises(ValueError, match="isometry_blocks"):
        AdamO([{"params": [th.nn.Parameter(th.zeros(6, 2))], "isometry_blocks": 4}])
    with pytest.raises(ValueError, match="isometry_blocks must be an int"):
        AdamO([{"params": [th.nn.Parameter(th.zeros(8, 2))], "isometry_blocks": 0}])


def test_continual_shrink_perturb_reaches_the_lstm():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), **OFF, **FAST)
    callback = ShrinkPerturb(mode="continual", noise_std=1e-3, weight_decay=0.0)
    callback.init_callback(model)
    callback._on_training_start()  # installs the optimizer step hooks
    try:
        before = {k: v.detach().clone() for k, v in model.policy.lstm_actor.named_parameters()}
        model.policy.set_training_mode(True)
        for p in model.policy.parameters():
            p.grad = th.zeros_like(p)  # Adam moves nothing: the change is the noise alone
        model.policy.optimizer.step()
        for name, p in model.policy.lstm_actor.named_parameters():
            delta = (p.detach() - before[name]).flatten()
            assert 5e-4 < float(delta.std()) < 2e-3, name
    finally:
        callback._on_training_end()


class _TinyConv(BaseFeaturesExtractor):
    """A CNN extractor whose conv output is the LSTM input (no Linear after the flatten): 4 channels of 3 x 3."""

    def __init__(self, observation_space):
        super().__init__(observation_space, features_dim=36)
        self.cnn = th.nn.Sequential(th.nn.Conv2d(1, 4, kernel_size=12, stride=12), th.nn.ReLU(), th.nn.Flatten())

    def forward(self, observations):
        return self.cnn(observations)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_forced_extractor_unit_replacement(kind):
    """A unit of the features extractor in front of the LSTM: fresh incoming weights, zero bias, zero columns of every
    reader (weight_ih_l0 of each LSTM in all 4 gate blocks, a critic Linear; the channel's P = H*W flatten columns for
    a CNN), mean contribution absorbed into bias_ih_l0 / the Linear bias, all else bit-identical, moments of exactly
    the touched entries zeroed."""
    if kind == "mlp":
        kwargs = small(features_extractor_class=PlasticMLP, features_extractor_kwargs=dict(net_arch=(12, 10)))
        model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=kwargs, **FAST)
        n_pos, j = 1, 3
    else:
        kwargs = dict(lstm_hidden_size=H, features_extractor_class=_TinyConv, enable_critic_lstm=False)
        model = PlasticRecurrentPPO("CnnLstmPolicy", image_env(), policy_kwargs=kwargs, **FAST)
        n_pos, j = 9, 2
    model.learn(64)  # optimizer moments exist
    policy, opt = model.policy, model.policy.optimizer
    (spec,) = find_networks(model)
    hidden = spec.hidden_layers()
    extractor_layers = [m for m in policy.features_extractor.modules() if isinstance(m, (th.nn.Linear, th.nn.Conv2d))]
    last = next(h for h in hidden if h.layer is extractor_layers[-1])
    lstm_readers = [c for c in last.consumers if isinstance(c.layer, th.nn.LSTM)]
    expected_readers = [policy.lstm_actor] + ([policy.lstm_critic] if kind == "mlp" else [policy.critic])
    assert [c.layer for c in last.consumers] == expected_readers
    assert all(c.columns_per_unit == n_pos for c in last.consumers) and lstm_readers
    engine = GenerateAndTest([last], opt, replacement_rate=0.0, decay_rate=0.9, bias_absorption=True)
    rng = np.random.default_rng(0)
    shape = (7, last.n_features) if kind == "mlp" else (7, 4, 3, 3)
    batches = [th.as_tensor(rng.uniform(0, 2, size=shape), dtype=th.float32) for _ in range(3)]
    for h in batches:
        engine.step({last.name: h})
    # independent bias-corrected running mean of channel / feature j, per position
    eta = 0.9
    means = [h.mean(dim=0).reshape(h.shape[1], -1)[j] for h in batches]
    f = sum((1 - eta) * eta ** (len(means) - 1 - t) * m for t, m in enumerate(means)) / (1 - eta ** len(means))
    assert f.shape == (n_pos,)

    params, before, moments = _snapshot(policy, opt)
    cols = th.arange(j * n_pos, (j + 1) * n_pos)
    touched: dict[str, th.Tensor] = {}
    layer = last.layer
    for param in (layer.weight, layer.bias):
        touched.setdefault(params[id(param)], th.zeros_like(param, dtype=th.bool))[j] = True
    for c in last.consumers:
        touched.setdefault(params[id(c.weight)], th.zeros_like(c.weight, dtype=th.bool))[:, cols] = True

    engine.replace(last.name, th.tensor([j]))

    after = {n: p.detach() for n, p in policy.named_parameters()}
    w_name = params[id(layer.weight)]
    assert (after[w_name][j] != before[w_name][j]).all()  # fresh incoming weights
    assert th.equal(layer.bias.detach()[j], th.tensor(0.0))
    absorbing = set()
    for c in last.consumers:
        w_old = before[params[id(c.weight)]]
        assert th.equal(c.weight.detach()[:, cols], th.zeros(w_old.shape[0], n_pos))  # every row: all 4 gate blocks
        if isinstance(c.layer, th.nn.LSTM):
            assert w_old.shape[0] == 4 * H and c.bias is c.layer.bias_ih_l0
        b_name = params[id(c.bias)]
        absorbing.add(b_name)
        expected = before[b_name] + w_old[:, cols] @ f
        assert th.allclose(c.bias.detach(), expected, atol=1e-6, rtol=0), b_name
    _assert_only_touched_changed(policy, opt, before, after, touched, absorbing, moments)
    for lstm in [c.layer for c in lstm_readers]:  # bias_hh and the recurrent weights untouched
        assert th.equal(lstm.bias_hh_l0, before[params[id(lstm.bias_hh_l0)]])


def test_cbp_keyword_replaces_extractor_units_of_cnn_lstm():
    model = PlasticRecurrentPPO(
        "CnnLstmPolicy",
        image_env(),
        policy_kwargs=dict(lstm_hidden_size=H),
        replacement_rate=0.05,
        maturity_threshold=2,
        **FAST,
    )
    model.learn(128)
    entries = {
        layer: int(entry["replaced"])
        for key in model.plastic_state.keys()
        if "cbp" in key.lower() or "continual" in key.lower()
        for layer, entry in model.plastic_state[key].get("policy", {}).items()
    }
    assert entries, list(model.plastic_state.keys())
    extractor = {k: v for k, v in entries.items() if k.startswith("features_extractor.")}
    assert "features_extractor.linear.0" in extractor and "features_extractor.cnn.0" in extractor
    assert sum(extractor.values()) > 0, entries
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def test_diagnostics_cover_lstm_cells():
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=small(), **FAST)
    model.learn(64)
    (spec,) = find_networks(model)
    obs = th.as_tensor(np.random.default_rng(1).normal(size=(40, 4)), dtype=th.float32)
    tau = 0.5
    values = network_diagnostics(model, spec, obs, tau=tau, ntk_size=0)
    n_units = n_dormant = 0.0
    for name in ("lstm_actor", "lstm_critic"):
        with th.no_grad():
            h = _first_step_with(getattr(model.policy, name), obs)
        score = h.abs().mean(dim=0) / (h.abs().mean() + 1e-9)
        d = float((score <= tau).float().mean())
        assert values[f"{name}.l0/dormant_fraction"] == pytest.approx(d)
        assert values[f"{name}.l0/zero_fraction"] == float((h == 0).all(dim=0).float().mean())
        assert values[f"{name}.l0/feature_norm"] == pytest.approx(float(h.norm(dim=1).mean()), rel=1e-5)
        assert values[f"{name}.l0/feature_variance"] == pytest.approx(float(h.double().var(dim=1).mean()), rel=1e-5)
        s = th.linalg.svdvals(h.double())
        p = s / s.sum()
        assert values[f"{name}.l0/effective_rank"] == pytest.approx(float(th.exp(-(p * th.log(p)).sum())), rel=1e-4)
        assert 1 <= values[f"{name}.l0/srank"] <= H
        n_units += H
        n_dormant += d * H
    for hidden in spec.hidden_layers():
        n_units += hidden.n_units
        n_dormant += values[f"{hidden.name}/dormant_fraction"] * hidden.n_units
    assert values["dormant_fraction"] == pytest.approx(n_dormant / n_units)
    monitor = PlasticityMonitor(every=32, ntk_probe_size=0, max_overhead=None)
    model.learn(32, callback=monitor, reset_num_timesteps=False)
    reported = monitor.run()
    for name in ("lstm_actor.l0", "lstm_critic.l0"):
        for metric in ("dormant_fraction", "zero_fraction", "srank", "effective_rank", "feature_norm", "feature_variance"):
            assert math.isfinite(reported[f"plasticity/policy/{name}/{metric}"])


def _assert_only_touched_changed(policy, opt, before, after, touched, absorbing, moments) -> None:
    """Every parameter entry outside ``touched`` (and the bias-absorbing tensors) is bit-identical, and the
    optimizer moments are zero on exactly the touched entries and unchanged elsewhere (step counts kept)."""
    for n in before:
        if n in absorbing:
            continue
        keep = ~touched[n] if n in touched else th.ones_like(before[n], dtype=th.bool)
        assert th.equal(after[n][keep], before[n][keep]), n
    named = dict(policy.named_parameters())
    for n, state in moments.items():
        p = named[n]
        for key, old in state.items():
            new = opt.state[p][key]
            if not isinstance(old, th.Tensor) or old.shape != p.shape:
                assert (th.equal(new, old) if isinstance(old, th.Tensor) else new == old), (n, key)
                continue
            mask = touched.get(n, th.zeros_like(p, dtype=th.bool))
            assert th.equal(new[mask], th.zeros(int(mask.sum()))), (n, key)
            assert th.equal(new[~mask], old[~mask]), (n, key)


def _snapshot(policy, opt):
    """(parameter id -> name, name -> copy of the parameter, name -> copy of its optimizer state)."""
    params = {id(p): n for n, p in policy.named_parameters()}
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    moments = {
        n: {k: v.clone() if isinstance(v, th.Tensor) else v for k, v in opt.state[p].items()}
        for n, p in policy.named_parameters()
        if p in opt.state
    }
    return params, before, moments


def _extractor_reset_model(kind, **extra):
    """A PlasticRecurrentPPO whose features extractor feeds the LSTM(s), trained a little (moments exist), with the
    hidden layer of the extractor's last layer, the number of columns per unit and a unit index."""
    if kind == "mlp":
        kwargs = small(features_extractor_class=PlasticMLP, features_extractor_kwargs=dict(net_arch=(12, 10)), **extra)
        model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=kwargs, **FAST)
        n_pos, j = 1, 3
    else:
        kwargs = dict(lstm_hidden_size=H, features_extractor_class=_TinyConv, enable_critic_lstm=False, **extra)
        model = PlasticRecurrentPPO("CnnLstmPolicy", image_env(), policy_kwargs=kwargs, **FAST)
        n_pos, j = 9, 2
    model.learn(64)
    (spec,) = find_networks(model)
    layers = [m for m in model.policy.pi_features_extractor.modules() if isinstance(m, (th.nn.Linear, th.nn.Conv2d))]
    last = next(h for h in spec.hidden_layers() if h.layer is layers[-1])
    return model, last, n_pos, j


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_redo_resets_extractor_unit_in_front_of_the_lstm(kind):
    """ReDo's reset of an extractor unit: fresh incoming row, zero bias, zero columns of every reader (weight_ih_l0 of
    each LSTM in all 4 gate blocks, the critic Linear), no bias absorption, moments of exactly those entries zeroed,
    everything else bit-identical."""
    model, last, n_pos, j = _extractor_reset_model(kind)
    policy, opt = model.policy, model.policy.optimizer
    expected_readers = [policy.lstm_actor] + ([policy.lstm_critic] if kind == "mlp" else [policy.critic])
    assert [c.layer for c in last.consumers] == expected_readers
    assert all(c.columns_per_unit == n_pos for c in last.consumers)
    params, before, moments = _snapshot(policy, opt)
    cols = th.arange(j * n_pos, (j + 1) * n_pos)
    touched: dict[str, th.Tensor] = {}
    for param in (last.layer.weight, last.layer.bias):
        touched.setdefault(params[id(param)], th.zeros_like(param, dtype=th.bool))[j] = True
    for c in last.consumers:
        touched.setdefault(params[id(c.weight)], th.zeros_like(c.weight, dtype=th.bool))[:, cols] = True

    redo_reset_(last, th.tensor([j]), [opt])

    after = {n: p.detach() for n, p in policy.named_parameters()}
    w_name = params[id(last.layer.weight)]
    assert (after[w_name][j] != before[w_name][j]).all()
    assert th.equal(last.layer.bias.detach()[j], th.tensor(0.0))
    for c in last.consumers:
        assert th.equal(c.weight.detach()[:, cols], th.zeros(c.weight.shape[0], n_pos))
        if isinstance(c.layer, th.nn.LSTM):
            assert c.weight is c.layer.weight_ih_l0 and c.weight.shape[0] == 4 * H
    _assert_only_touched_changed(policy, opt, before, after, touched, set(), moments)


def test_redo_recycle_reaches_extractor_units_in_front_of_the_lstm():
    model, last, _, _ = _extractor_reset_model("mlp")
    redo = ReDo(period=1, tau=1.0)  # score <= 1: the units below their layer's mean activity
    redo.init_callback(model)
    observations = th.as_tensor(np.random.default_rng(0).normal(size=(64, 4)), dtype=th.float32)
    with th.no_grad():
        h = model.policy.pi_features_extractor(observations)  # PlasticMLP's output: the last layer's activation
    activity = h.abs().mean(dim=0)
    dormant = (activity / (activity.mean() + 1e-9) <= 1.0).nonzero().flatten()
    before = {id(c.layer): c.weight.detach().clone() for c in last.consumers}
    results = {r.name: r for _, r in redo.recycle(observations)}
    assert results[last.name].n_dormant == len(dormant) > 0
    kept = th.ones(last.n_features, dtype=th.bool)
    kept[dormant] = False
    for c in last.consumers:
        w_ih = before[id(c.layer)]
        # the LSTM's own recycled cells (recycled after the extractor) get whole fresh gate rows; every other row
        # of weight_ih_l0 (all 4 gate blocks) reads the recycled extractor units through zero columns only
        cell_rows = (c.weight.detach() != w_ih)[:, kept].any(dim=1)
        lstm_name = "lstm_actor" if c.layer is model.policy.lstm_actor else "lstm_critic"
        assert int(cell_rows.sum()) == 4 * results[f"{lstm_name}.l0"].n_dormant
        rows = ~cell_rows
        assert th.equal(c.weight.detach()[rows][:, dormant], th.zeros(int(rows.sum()), len(dormant)))
        assert th.equal(c.weight.detach()[rows][:, kept], w_ih[rows][:, kept])


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_cbp_utility_of_extractor_unit_is_pooled_over_all_readers(kind):
    """Contribution utility of an extractor unit: mean|h_j| (batch and positions) times mean |W[:, cols_j]| pooled over
    every reader (weight_ih_l0 of each LSTM, all 4H rows; the critic Linear), running average with bias correction."""
    model, last, n_pos, _ = _extractor_reset_model(kind)
    engine = GenerateAndTest([last], model.policy.optimizer, replacement_rate=0.0, decay_rate=0.9)
    rng = np.random.default_rng(1)
    shape = (7, last.n_features) if kind == "mlp" else (7, 4, 3, 3)
    batches = [th.as_tensor(rng.uniform(0, 2, size=shape), dtype=th.float32) for _ in range(2)]
    n = last.n_features
    w_abs = sum(c.weight.detach().abs()[:, : n * n_pos].reshape(-1, n, n_pos).sum(dim=(0, 2)) for c in last.consumers)
    w_count = sum(c.weight.shape[0] * n_pos for c in last.consumers)
    eta, u = 0.9, th.zeros(n)
    for t, h in enumerate(batches, start=1):
        engine.step({last.name: h})
        y = (w_abs / w_count) * h.reshape(h.shape[0], n, -1).abs().mean(dim=(0, 2))
        u = eta * u + (1 - eta) * y
        assert th.allclose(engine.bias_corrected_utility(last.name), u / (1 - eta**t), rtol=1e-5, atol=1e-7)
    assert engine.replaced(last.name) == 0


@pytest.mark.parametrize("critic_lstm", [True, False])
def test_find_networks_with_separate_extractors(critic_lstm):
    """share_features_extractor=False: the actor's extractor is read by lstm_actor only, the critic's by lstm_critic
    (weight_ih_l0 / bias_ih_l0) or by the critic Linear; both extractors are extra layers."""
    kwargs = small(
        features_extractor_class=PlasticMLP,
        features_extractor_kwargs=dict(net_arch=(12, 10)),
        share_features_extractor=False,
        enable_critic_lstm=critic_lstm,
    )
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=kwargs, **FAST)
    policy = model.policy
    assert policy.pi_features_extractor is not policy.vf_features_extractor
    (spec,) = find_networks(model)
    hidden = {id(h.layer): h for h in spec.hidden_layers()}

    def layers(extractor):
        return [m for m in extractor.modules() if isinstance(m, th.nn.Linear)]

    pi_layers, vf_layers = layers(policy.pi_features_extractor), layers(policy.vf_features_extractor)
    assert {id(m) for m in pi_layers + vf_layers} <= {id(m) for m in spec.extra_layers}
    pi_last, vf_last = hidden[id(pi_layers[-1])], hidden[id(vf_layers[-1])]
    assert [c.layer for c in pi_last.consumers] == [policy.lstm_actor]
    assert (pi_last.consumers[0].weight_name, pi_last.consumers[0].bias_name) == ("weight_ih_l0", "bias_ih_l0")
    (vf_reader,) = vf_last.consumers
    if critic_lstm:
        assert vf_reader.layer is policy.lstm_critic
        assert vf_reader.weight is policy.lstm_critic.weight_ih_l0 and vf_reader.bias is policy.lstm_critic.bias_ih_l0
    else:
        assert vf_reader.layer is policy.critic and vf_reader.weight is policy.critic.weight
    assert all(c.columns_per_unit == 1 and c.offset == 0 for c in (*pi_last.consumers, vf_reader))
    # the first layers of each extractor feed the next layer of the same extractor
    assert [c.layer for c in hidden[id(pi_layers[0])].consumers] == [pi_layers[1]]
    assert [c.layer for c in hidden[id(vf_layers[0])].consumers] == [vf_layers[1]]
