"""ReDo and Shrink & Perturb: exact operations on hand-built layers, and the callbacks on SB3 / sb3-contrib."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from builders import fill_adam_state, shared_extractor_model
from sb3_contrib import QRDQN, TQC
from stable_baselines3 import DQN, PPO, SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.logger import configure
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from sb3_plastic import PlasticDQN
from sb3_plastic.activations import MaxMin
from sb3_plastic.callbacks.cbp import GenerateAndTest
from sb3_plastic.callbacks.redo import (
    ReDo,
    ReDoConfig,
    default_layer_init,
    dormant_units,
    model_layer_init,
    neuron_scores,
    redo_layers_,
    redo_reset_,
)
from sb3_plastic.callbacks.shrink_perturb import (
    ShrinkPerturb,
    ShrinkPerturbConfig,
    continual_shrink_perturb_,
    shrink_perturb_,
)
from sb3_plastic.common.surgery import NetworkSpec, find_networks

TAU = 0.025


def _snapshot(net: nn.Module, opt: th.optim.Optimizer) -> tuple[dict, dict]:
    params = {name: p.detach().clone() for name, p in net.named_parameters()}
    states = {
        name: {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, th.Tensor)} for name, p in net.named_parameters()
    }
    return params, states


# ----------------------------------------------------------------------------------------------- ReDo: exact
def test_redo_linear_layer_exact() -> None:
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = th.rand(64, 4) + 0.1  # positive inputs
    opt = th.optim.Adam(net.parameters(), lr=1e-3)
    fill_adam_state(net, opt, x)
    with th.no_grad():
        net[0].weight.abs_()  # every unit active on positive inputs ...
        net[0].bias.fill_(0.1)
        for unit in (1, 5):  # ... except two dead ones  # dead: negative weights and bias on positive inputs
            net[0].weight[unit] = -net[0].weight[unit].abs() - 0.1
            net[0].bias[unit] = -1.0
        net[0].weight[3] = net[0].weight[3].abs() * 1e-3  # barely active: score < tau but > 0
        net[0].bias[3] = 0.0

    # independent computation of the tau-dormant units
    with th.no_grad():
        h = th.relu(x @ net[0].weight.T + net[0].bias)
    a = h.abs().mean(dim=0)
    score = a / (a.mean() + 1e-9)
    expected = score <= TAU
    assert expected.nonzero().flatten().tolist() == [1, 3, 5]
    assert 0 < score[3] <= TAU
    assert th.equal(dormant_units(h, TAU), expected)
    assert th.allclose(neuron_scores(h), score)

    spec = NetworkSpec("net", net, opt, None, [[net[0], net[2]]], {})
    hidden = spec.hidden_layers()
    assert len(hidden) == 1 and hidden[0].consumers[0].layer is net[2]
    old, old_state = _snapshot(net, opt)
    steps = {name: opt.state[p]["step"].clone() for name, p in net.named_parameters()}

    th.manual_seed(123)
    results = redo_layers_(hidden, lambda: net(x), TAU, [opt])
    th.manual_seed(123)
    ref = copy.deepcopy(net[0])
    ref.reset_parameters()  # the layer's own default init, same seed

    assert results[0].n_dormant == 3 and results[0].dormant_fraction == pytest.approx(3 / 8)
    d, k = expected, ~expected
    w1, b1, w2 = net[0].weight, net[0].bias, net[2].weight
    assert th.equal(w1[d], ref.weight[d])  # fresh incoming weights
    assert th.all(b1[d] == 0)  # zero bias
    assert th.all(w2[:, d] == 0)  # zero outgoing weights
    # active units untouched, bitwise
    assert th.equal(w1[k], old["0.weight"][k]) and th.equal(b1[k], old["0.bias"][k])
    assert th.equal(w2[:, k], old["2.weight"][:, k]) and th.equal(net[2].bias, old["2.bias"])
    # moments of exactly the touched rows / entries / columns are zero, the rest untouched, steps kept
    for key in ("exp_avg", "exp_avg_sq"):
        s_w1, s_b1, s_w2 = (opt.state[p][key] for p in (w1, b1, w2))
        assert th.all(s_w1[d] == 0) and th.all(s_b1[d] == 0) and th.all(s_w2[:, d] == 0)
        assert th.equal(s_w1[k], old_state["0.weight"][key][k]) and th.equal(s_b1[k], old_state["0.bias"][key][k])
        assert th.equal(s_w2[:, k], old_state["2.weight"][key][:, k])
        assert th.equal(opt.state[net[2].bias][key], old_state["2.bias"][key])
    for name, p in net.named_parameters():
        assert th.equal(opt.state[p]["step"], steps[name])


def test_redo_conv_to_linear_flatten_mapping() -> None:
    th.manual_seed(1)
    conv, lin = nn.Conv2d(2, 4, 3), nn.Linear(4 * 3 * 3, 5)
    net = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), lin)
    x = th.rand(16, 2, 5, 5) + 0.1
    opt = th.optim.Adam(net.parameters(), lr=1e-3)
    fill_adam_state(net, opt, x)
    with th.no_grad():
        conv.weight.abs_()
        conv.bias.fill_(0.1)
        conv.weight[2] = -conv.weight[2] - 0.1
        conv.bias[2] = -1.0
    with th.no_grad():
        h = th.relu(conv(x))
    a = h.abs().mean(dim=(0, 2, 3))
    expected = a / (a.mean() + 1e-9) <= TAU
    assert expected.nonzero().flatten().tolist() == [2]
    assert th.equal(dormant_units(h, TAU), expected)

    hidden = NetworkSpec("net", net, opt, None, [[conv, lin]], {}).hidden_layers()
    assert hidden[0].consumers[0].columns_per_unit == 9
    old, old_state = _snapshot(net, opt)
    th.manual_seed(5)
    redo_layers_(hidden, lambda: net(x), TAU, [opt])
    th.manual_seed(5)
    ref = copy.deepcopy(conv)
    ref.reset_parameters()

    cols = th.zeros(36, dtype=th.bool)
    cols[18:27] = True  # channel 2 owns columns 2*9 .. 2*9+8 of the NCHW flatten
    assert th.equal(conv.weight[2], ref.weight[2]) and conv.bias[2] == 0
    assert th.equal(conv.weight[[0, 1, 3]], old["0.weight"][[0, 1, 3]])
    assert th.all(lin.weight[:, cols] == 0) and th.equal(lin.weight[:, ~cols], old["3.weight"][:, ~cols])
    for key in ("exp_avg", "exp_avg_sq"):
        assert th.all(opt.state[conv.weight][key][2] == 0)
        assert th.all(opt.state[lin.weight][key][:, cols] == 0)
        assert th.equal(opt.state[lin.weight][key][:, ~cols], old_state["3.weight"][key][:, ~cols])
        assert th.equal(opt.state[conv.weight][key][[0, 1, 3]], old_state["0.weight"][key][[0, 1, 3]])


def test_redo_maxmin_pair_is_one_unit() -> None:
    th.manual_seed(2)
    net = nn.Sequential(nn.Linear(3, 6), MaxMin(), nn.Linear(6, 2))
    x = th.rand(32, 3) + 0.1
    opt = th.optim.Adam(net.parameters(), lr=1e-3)
    fill_adam_state(net, opt, x)
    with th.no_grad():
        net[0].weight[0:2] = 0.0  # pair 0: both pre-activations 0 -> max = min = 0: dormant pair
        net[0].bias[0:2] = 0.0
        net[0].weight[2] = net[0].weight[2].abs() + 0.1  # pair 1: a > 0, b = 0 -> only the min feature is dormant
        net[0].bias[2] = 1.0
        net[0].weight[3] = 0.0
        net[0].bias[3] = 0.0
    with th.no_grad():
        h = net[1](net[0](x))
    feature_dormant = neuron_scores(h) <= TAU
    assert feature_dormant[:4].tolist() == [True, True, False, True]
    assert dormant_units(h, TAU, group_size=2).tolist() == [True, False, False]

    hidden = NetworkSpec("net", net, opt, None, [[net[0], net[2]]], {}).hidden_layers()
    assert hidden[0].group_size == 2 and hidden[0].n_units == 3
    old, _ = _snapshot(net, opt)
    results = redo_layers_(hidden, lambda: net(x), TAU, [opt])
    assert results[0].n_dormant == 1 and results[0].n_units == 3
    assert not th.equal(net[0].weight[0:2], old["0.weight"][0:2])  # the pair got fresh rows
    assert th.all(net[2].weight[:, 0:2] == 0)
    assert th.equal(net[0].weight[2:], old["0.weight"][2:]) and th.equal(net[2].weight[:, 2:], old["2.weight"][:, 2:])


def test_redo_reset_accepts_indices_and_checks_mask() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    hidden = NetworkSpec("net", net, None, None, [[net[0], net[2]]], {}).hidden_layers()[0]
    assert redo_reset_(hidden, th.tensor([1])).tolist() == [1]
    assert th.all(net[2].weight[:, 1] == 0) and net[0].bias[1] == 0
    with pytest.raises(ValueError, match="unit mask"):
        redo_reset_(hidden, th.ones(3, dtype=th.bool))


def test_model_layer_init_follows_the_model() -> None:
    ppo = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8, 8]))
    init = model_layer_init(ppo)
    w, b = init(ppo.policy.mlp_extractor.policy_net[0])  # (8, 4): orthogonal columns, SB3 gain sqrt(2)
    assert th.allclose(w.T @ w, 2 * th.eye(4), atol=1e-5) and th.all(b == 0)
    w, _ = init(ppo.policy.action_net)
    assert th.allclose(w @ w.T, 1e-4 * th.eye(2), atol=1e-8)
    dqn = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8]))
    layer = dqn.q_net.q_net[0]
    th.manual_seed(3)
    w, b = model_layer_init(dqn)(layer)  # DQN: PyTorch's default init, drawn as reset_parameters draws it
    th.manual_seed(3)
    ref = copy.deepcopy(layer)
    ref.reset_parameters()
    assert th.equal(w, ref.weight) and th.equal(b, ref.bias)


# ---------------------------------------------------------------------------------------- Shrink & Perturb: exact
def test_shrink_perturb_event_exact() -> None:
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    opt = th.optim.Adam(net.parameters(), lr=1e-3)
    fill_adam_state(net, opt, th.randn(8, 3))
    params_before = list(net.parameters())
    old = [p.detach().clone() for p in params_before]
    th.manual_seed(7)
    touched = shrink_perturb_([net[0], net[2]], 0.4, 0.1, default_layer_init, [opt])
    th.manual_seed(7)  # independent fresh draw: a reset copy of each layer, in order
    fresh = []
    for layer in (net[0], net[2]):
        ref = copy.deepcopy(layer)
        ref.reset_parameters()
        fresh += [ref.weight.detach(), ref.bias.detach()]
    for p, o, f in zip(net.parameters(), old, fresh):
        assert th.allclose(p, 0.4 * o + 0.1 * f, atol=1e-7, rtol=0)
    assert all(a is b for a, b in zip(net.parameters(), params_before))
    assert len(touched) == 4 and not any(p in opt.state for p in net.parameters())


def test_continual_shrink_perturb_exact() -> None:
    params = [th.randn(4, 3), th.randn(4)]
    old = [p.clone() for p in params]
    th.manual_seed(11)
    continual_shrink_perturb_(params, lr=0.01, weight_decay=0.5, noise_std=1e-3)
    th.manual_seed(11)
    for p, o in zip(params, old):
        assert th.allclose(p, (1 - 0.005) * o + 1e-3 * th.randn_like(o), atol=1e-7, rtol=0)


def test_continual_hook_only_in_training_and_removed() -> None:
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8]), learning_rate=0.01)
    model.set_logger(configure(None, [""]))
    cb = ShrinkPerturb("continual", noise_std=1e-3, weight_decay=0.5, weight_decay_mode="decoupled")
    cb.init_callback(model)
    cb.on_training_start({}, {})
    opt = model.policy.optimizer
    params = [p for layer in find_networks(model)[0].weight_layers() for p in (layer.weight, layer.bias)]
    old = [p.detach().clone() for p in params]
    model.policy.set_training_mode(False)
    opt.step()  # no gradients: Adam changes nothing; the hook must not act outside training
    assert all(th.equal(p, o) for p, o in zip(params, old))
    model.policy.set_training_mode(True)
    replay = th.Generator()
    replay.set_state(cb.generator(params[0].device).get_state())  # the noise comes from the callback's own stream
    global_before = th.random.get_rng_state()
    opt.step()
    assert th.equal(th.random.get_rng_state(), global_before)  # torch's global generator is not drawn from
    for p, o in zip(params, old):
        eps = th.randn(o.shape, generator=replay)
        assert th.allclose(p, (1 - 0.01 * 0.5) * o + 1e-3 * eps, atol=1e-7, rtol=0)
    assert all(th.equal(t, o) for t, o in zip(model.q_net_target.parameters(), old))  # targets follow their schedule
    assert cb.state["noise_steps"] == 1
    cb.on_training_end()
    snapshot = [p.detach().clone() for p in params]
    opt.step()
    assert all(th.equal(p, s) for p, s in zip(params, snapshot))


def test_continual_acts_once_per_adamo_step() -> None:
    th.optim.Adam([nn.Parameter(th.zeros(1))])  # once Adam.step is hooked, AdamO's super().step() fires hooks twice
    model = PlasticDQN("MlpPolicy", "CartPole-v1", learning_starts=20, batch_size=8, policy_kwargs=dict(net_arch=[8]), seed=0)
    cb = ShrinkPerturb("continual")
    model.learn(60, callback=cb)
    assert model._n_updates > 0 and cb.state["noise_steps"] == model._n_updates


# ----------------------------------------------------------------------------------------------- callbacks on RL
class _PPOConsistency(BaseCallback):
    """At each rollout end: the buffer's log-probs / values were produced by the current network."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        obs = th.as_tensor(buf.observations.reshape(-1, *buf.obs_shape))
        actions = th.as_tensor(buf.actions.reshape(-1))
        with th.no_grad():
            values, log_prob, _ = self.model.policy.evaluate_actions(obs, actions)
        assert th.allclose(log_prob, th.as_tensor(buf.log_probs.reshape(-1)), atol=1e-5)
        assert th.allclose(values.flatten(), th.as_tensor(buf.values.reshape(-1)), atol=1e-5)
        self.checked += 1


def _all_finite(model) -> bool:
    return all(th.isfinite(p).all() for p in model.policy.parameters())


def test_ppo_interventions_between_rollouts() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    redo = ReDo(period=1, tau=0.5, probe_size=32)  # tau 0.5: something is recycled at every check
    event = ShrinkPerturb(every=40)  # triggers in the middle of rollouts
    cont = ShrinkPerturb("continual", noise_std=1e-3, name="c")
    check = _PPOConsistency()
    model.learn(64 * 5, callback=[redo, event, cont, check])
    assert check.checked == 5
    assert redo.state["events"] == 5 and redo.state["total_resets"] > 0  # after each train (last: at training end)
    # due at 40, 104, 168, 232, 296 (every counts from the last event): applied at rollout starts 64, 128, 192, 256
    # and, pending when learn() ends, at training end
    assert event.state["events"] == 5 and not event.state["pending"]
    assert cont.state["noise_steps"] == 5 * 2 * 2  # trains x epochs x minibatches
    assert _all_finite(model)
    # learn() called one rollout at a time: ReDo still checks (at training end, after train())
    redo = ReDo(period=2, tau=0.5, probe_size=32, name="loop")
    for _ in range(3):
        model.learn(64, callback=[redo, check], reset_num_timesteps=False)
    assert redo.state["events"] == 3 and check.checked == 8


class _EventSpy(BaseCallback):
    """Right after a Shrink & Perturb event: same Parameters, optimizer state gone, target synced."""

    def __init__(self, sp: ShrinkPerturb) -> None:
        super().__init__()
        self.sp, self.seen, self.checked = sp, 0, 0

    def _on_training_start(self) -> None:
        self.param_ids = [id(p) for p in self.model.policy.parameters()]

    def _on_step(self) -> bool:
        events = self.sp.state.get("events", 0)
        if events != self.seen:
            self.seen = events
            q, target = self.model.q_net, self.model.q_net_target
            assert all(th.equal(a, b) for a, b in zip(q.parameters(), target.parameters()))
            assert not any(p in self.model.policy.optimizer.state for p in q.parameters())
            assert [id(p) for p in self.model.policy.parameters()] == self.param_ids
            self.checked += 1
        return True


def test_shrink_perturb_event_on_dqn_syncs_target_and_clears_state() -> None:
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_starts=20,
        batch_size=16,
        train_freq=1,
        target_update_interval=10**6,
        policy_kwargs=dict(net_arch=[16]),
        seed=0,
    )
    sp = ShrinkPerturb(every=60)
    spy = _EventSpy(sp)
    model.learn(200, callback=[sp, spy])
    assert sp.state["events"] == 3 and spy.checked == 3


@pytest.mark.parametrize(
    "cls, env, kwargs",
    [
        (DQN, "CartPole-v1", dict(learning_starts=50, batch_size=32, buffer_size=1000, target_update_interval=50)),
        (QRDQN, "CartPole-v1", dict(learning_starts=50, batch_size=32, buffer_size=1000)),
        (SAC, "Pendulum-v1", dict(learning_starts=50, batch_size=32, buffer_size=1000)),
        (TQC, "Pendulum-v1", dict(learning_starts=50, batch_size=32, buffer_size=1000)),
    ],
)
def test_callbacks_run_on_off_policy(cls, env, kwargs) -> None:
    model = cls("MlpPolicy", env, policy_kwargs=dict(net_arch=[32, 32]), seed=0, **kwargs)
    redo = ReDo(period=20, tau=0.1, probe_size=32)
    event = ShrinkPerturb(every=100)
    cont = ShrinkPerturb("continual", name="c")
    model.learn(300, callback=[redo, event, cont])
    assert redo.state["events"] >= 2 and event.state["events"] == 3 and cont.state["noise_steps"] > 0
    assert set(redo.state["layer_resets"]) == {f"{s.name}/{h.name}" for s in find_networks(model) for h in s.hidden_layers()}
    assert _all_finite(model)
    for spec in find_networks(model):
        if spec.target is not None:
            assert all(th.isfinite(p).all() for p in spec.target.parameters())


def test_redo_counters_survive_save_load(tmp_path) -> None:
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=20, batch_size=16, policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(150, callback=ReDo(period=10, tau=0.1))
    state = dict(model.plastic_state["ReDo"])
    assert state["events"] > 0 and state["last_step"] > 0
    model.save(tmp_path / "m")
    loaded = DQN.load(tmp_path / "m", env=model.get_env())
    assert loaded.plastic_state["ReDo"] == state
    cb = ReDo(period=10, tau=0.1)
    loaded.learn(150, callback=cb, reset_num_timesteps=False)
    assert cb.state is loaded.plastic_state["ReDo"]
    assert cb.state["events"] > state["events"] and cb.state["total_resets"] >= state["total_resets"]
    assert cb.state["last_step"] > state["last_step"]
    for key, count in state["layer_resets"].items():
        assert cb.state["layer_resets"][key] >= count


def test_task_change_trigger() -> None:
    class TaskCartPole(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.t = 0

        def step(self, action):
            obs, r, term, trunc, info = self.env.step(action)
            self.t += 1
            info["task_id"] = np.int64(self.t // 50)
            return obs, r, term, trunc, info

    env = TaskCartPole(gym.make("CartPole-v1"))
    model = DQN("MlpPolicy", env, learning_starts=1000, policy_kwargs=dict(net_arch=[8]), seed=0)
    sp = ShrinkPerturb(on_task_change=True)
    model.learn(160, callback=sp)
    assert sp.state["events"] == 3 and sp.state["task_ids"] == [3]


# ----------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tau=0.0), r"tau .*\(0, 1\].*0\.0"),
        (dict(tau=1.5), r"tau .*\(0, 1\].*1\.5"),
        (dict(period=0), r"period .*> 0.*got 0"),
        (dict(period=-5), r"period .*got -5"),
        (dict(probe_size=0), r"probe_size .*got 0"),
    ],
)
def test_redo_bad_arguments(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ReDo(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shrink=0.0, every=10), r"shrink .*\(0, 1\].*0\.0"),
        (dict(shrink=1.2, every=10), r"shrink .*1\.2"),
        (dict(perturb=-0.1, every=10), r"perturb .*>= 0.*-0\.1"),
        (dict(mode="continual", noise_std=-1.0), r"noise_std .*>= 0.*-1\.0"),
        (dict(mode="continual", weight_decay=math.nan), r"weight_decay"),
        (dict(mode="sometimes", every=10), r"Unknown mode 'sometimes'.*'event', 'continual'"),
        (dict(mode="event"), r"needs a trigger.*every.*on_task_change"),
        (dict(mode="continual", every=10), r"only apply to mode='event'"),
        (dict(every=0), r"every .*integer > 0.*got 0"),
    ],
)
def test_shrink_perturb_bad_arguments(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ShrinkPerturb(**kwargs)


def test_configs() -> None:
    assert not ReDoConfig().enabled and ReDoConfig().make_callback() is None
    cb = ReDoConfig(redo_period=500, redo_tau=0.1, redo_probe_size=64).make_callback()
    assert isinstance(cb, ReDo) and (cb.period, cb.tau, cb.probe_size) == (500, 0.1, 64)
    with pytest.raises(ValueError, match=r"redo_tau .*\(0, 1\].*2"):
        ReDoConfig(redo_tau=2)
    with pytest.raises(ValueError, match=r"redo_period .*got 0"):
        ReDoConfig(redo_period=0)

    assert not ShrinkPerturbConfig().enabled and ShrinkPerturbConfig().make_callback() is None
    sp = ShrinkPerturbConfig(shrink_perturb="event", shrink_perturb_every=1000, shrink_factor=0.5).make_callback()
    assert isinstance(sp, ShrinkPerturb) and (sp.mode, sp.every, sp.shrink, sp.perturb) == ("event", 1000, 0.5, 0.1)
    sp = ShrinkPerturbConfig(shrink_perturb="continual", perturb_noise_std=1e-4, shrink_weight_decay=1e-3).make_callback()
    assert (sp.mode, sp.noise_std, sp.weight_decay) == ("continual", 1e-4, 1e-3)
    with pytest.raises(ValueError, match=r"shrink_perturb='event' needs a trigger.*shrink_perturb_every"):
        ShrinkPerturbConfig(shrink_perturb="event")
    with pytest.raises(ValueError, match=r"shrink_factor .*\(0, 1\]"):
        ShrinkPerturbConfig(shrink_factor=0)
    with pytest.raises(ValueError, match=r"Unknown shrink_perturb 'yes'"):
        ShrinkPerturbConfig(shrink_perturb="yes")


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_redo_that_finds_no_dormant_unit_leaves_the_run_unchanged(algo):
    """ReDo's probe draws from numpy's global generator with its state restored: a ReDo that recycles nothing
    (tanh units are never dormant at a tiny tau) leaves the trajectory bit-identical to a run without it."""
    from stable_baselines3 import DQN, PPO

    def make():
        if algo == "ppo":
            return PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=3)
        return DQN(
            "MlpPolicy", "CartPole-v1", learning_starts=50, buffer_size=1000, batch_size=16, train_freq=4, seed=3,
            policy_kwargs=dict(net_arch=[32, 32], activation_fn=th.nn.Tanh),
        )

    plain = make()  # (built and trained before the other: construction seeds the global generators)
    plain.learn(320)
    redo = ReDo(period=1, tau=1e-6, probe_size=32)
    probed = make()
    probed.learn(320, callback=redo)
    assert redo.state["events"] > 0 and sum(redo.state["layer_resets"].values()) == 0
    for a, b in zip(plain.policy.parameters(), probed.policy.parameters()):
        assert th.equal(a, b)


# ------------------------------------------------------------------ shared features extractor (SAC / TD3)
def test_redo_shared_extractor_resets_every_critic_reader() -> None:
    model = shared_extractor_model(SAC)
    actor, critic = model.policy.actor, model.policy.critic
    actor_spec, critic_spec = find_networks(model)
    last = {h.name: h for h in actor_spec.hidden_layers()}["actor.features_extractor.mlp.3"]
    readers = [actor.latent_pi[0], *(q[0] for q in critic.q_networks)]
    assert [c.layer for c in last.consumers] == readers
    opts = [actor_spec.optimizer, critic_spec.optimizer]
    before = {id(p): p.detach().clone() for p in model.policy.parameters()}
    moments = {(id(o), id(p)): {k: v.clone() for k, v in o.state[p].items()} for o in opts for p in o.state}
    j = 4
    redo_reset_(last, th.tensor([j]), opts)
    touched = {id(last.layer.weight): 0, id(last.layer.bias): 0, **{id(r.weight): 1 for r in readers}}
    for p in model.policy.parameters():
        dim = touched.get(id(p))
        if dim is None:
            assert th.equal(p, before[id(p)])
            continue
        keep = th.tensor([i for i in range(p.shape[dim]) if i != j])
        assert th.equal(p.index_select(dim, keep), before[id(p)].index_select(dim, keep))
        if dim == 1:
            assert th.all(p[:, j] == 0)
    assert last.layer.bias[j] == 0
    for o in opts:
        for p in o.state:
            for key, old in moments[(id(o), id(p))].items():
                new, dim = o.state[p][key], touched.get(id(p))
                if key == "step" or dim is None:
                    assert th.equal(new, old)
                    continue
                keep = th.tensor([i for i in range(new.shape[dim]) if i != j])
                assert th.all(new.select(dim, j) == 0)
                assert th.equal(new.index_select(dim, keep), old.index_select(dim, keep))


@pytest.mark.parametrize("cls", [SAC, TD3])
def test_redo_shared_extractor_learns(cls) -> None:
    model = shared_extractor_model(cls, steps=0)
    redo = ReDo(period=20, tau=0.5, probe_size=16)
    model.learn(120, callback=redo)
    assert redo.state["events"] >= 2
    assert "actor/actor.features_extractor.mlp.3" in redo.state["layer_resets"]
    assert _all_finite(model)


class _ConvFlatten(BaseFeaturesExtractor):
    """A CNN extractor ending in conv + flatten (no Linear): 4 channels of 3 x 3 positions, features_dim 36."""

    def __init__(self, observation_space):
        super().__init__(observation_space, features_dim=36)
        self.cnn = nn.Sequential(nn.Conv2d(1, 4, kernel_size=12, stride=12), nn.ReLU(), nn.Flatten())

    def forward(self, observations):
        return self.cnn(observations)


@pytest.mark.parametrize("method", ["redo", "cbp"])
def test_critic_conv_extractor_channel_maps_to_its_columns_not_the_actions(method):
    """SAC with share_features_extractor=False and a critic extractor ending in a conv: each q-network's first layer
    reads cat(features, actions), so channel c owns columns c*P .. c*P+P-1 with P = features_dim / channels = 9 (not
    in_features / channels): a reset zeroes exactly those columns and never the action columns."""
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=False)
    kwargs = dict(features_extractor_class=_ConvFlatten, share_features_extractor=False, net_arch=[16])
    model = SAC("CnnPolicy", env, buffer_size=64, learning_starts=8, batch_size=8, policy_kwargs=kwargs, seed=0)
    model.learn(16)
    critic = next(s for s in find_networks(model) if s.name == "critic")
    conv = critic.module.features_extractor.cnn[0]
    hidden = next(h for h in critic.hidden_layers() if h.layer is conv)
    firsts = [q[0] for q in critic.module.q_networks]
    assert [c.layer for c in hidden.consumers] == firsts
    n_actions = int(np.prod(env.action_space.shape))
    assert all(c.columns_per_unit == 9 and c.offset == 0 and c.weight.shape[1] == 36 + n_actions for c in hidden.consumers)
    c_reset, cols = 2, th.arange(18, 27)
    before = [q.weight.detach().clone() for q in firsts]
    if method == "redo":
        redo_reset_(hidden, th.tensor([c_reset]), [critic.optimizer])
    else:
        engine = GenerateAndTest([hidden], critic.optimizer, replacement_rate=0.0, decay_rate=0.9)
        engine.step({hidden.name: th.rand(5, 4, 3, 3)})
        engine.replace(hidden.name, th.tensor([c_reset]))
    for q, old in zip(firsts, before):
        keep = th.ones(q.weight.shape[1], dtype=th.bool)
        keep[cols] = False
        assert th.equal(q.weight.detach()[:, cols], th.zeros(q.weight.shape[0], 9))
        assert th.equal(q.weight.detach()[:, keep], old[:, keep])  # the other channels and the action columns
        assert q.weight.detach()[:, 36:].abs().sum() > 0
        state = critic.optimizer.state[q.weight]
        assert th.equal(state["exp_avg"][:, cols], th.zeros(q.weight.shape[0], 9))
        assert (state["exp_avg"][:, 36:] != 0).any()
