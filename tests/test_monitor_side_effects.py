"""A PlasticityMonitor pass changes nothing: ``learn()`` with the monitor gives bit-identical parameters, buffers,
optimizer state and random streams to ``learn()`` without it, for every algorithm and policy kind the library
supports; the parameters stay the same objects, trainable and held by their optimizers (issue #12, item 1). Also
the monitor's rough edges: passes skipped by ``max_overhead`` are counted, logged and warned about, and the NTK
ignores repeated probe rows."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch as th
from sb3_contrib import CrossQ, MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.logger import Logger

from sb3_plastic import (
    PlasticCrossQ,
    PlasticDQN,
    PlasticityMonitor,
    PlasticMaskablePPO,
    PlasticMLP,
    PlasticPPO,
    PlasticRecurrentPPO,
    PlasticSAC,
)
from sb3_plastic.callbacks import monitor as monitor_module
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.diagnostics import COND_CAP, network_diagnostics


def image_env():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)  # FakeImageEnv draws observations from its space: make them reproducible
    return env


def masked_env():
    return InvalidActionEnvDiscrete(dim=10, n_invalid_actions=4)


ON = dict(n_steps=32, seed=0)
PPO_FAST = dict(ON, batch_size=16, n_epochs=2)
OFF = dict(learning_starts=40, buffer_size=1000, batch_size=16, seed=0)
TINY = dict(net_arch=[16, 16])  # pass copies: SB3 writes into policy_kwargs (SAC adds use_sde)
CNN = dict(features_extractor_kwargs=dict(features_dim=16), net_arch=[16])
MLP_EXTRACTOR = dict(features_extractor_class=PlasticMLP, features_extractor_kwargs=dict(net_arch=(16,)), net_arch=[8])

# (name, algorithm class, policy, env factory, algorithm kwargs, policy_kwargs, steps, monitor every)
CASES = [
    ("ppo-cnn", PPO, "CnnPolicy", image_env, PPO_FAST, CNN, 96, 32),
    ("plastic-ppo-cnn", PlasticPPO, "CnnPolicy", image_env, PPO_FAST, CNN, 96, 32),
    ("ppo-mlp-extractor", PPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, MLP_EXTRACTOR, 96, 32),
    (
        "ppo-mlp-extractor-separate",
        PPO,
        "MlpPolicy",
        lambda: "CartPole-v1",
        PPO_FAST,
        dict(MLP_EXTRACTOR, share_features_extractor=False),
        96,
        32,
    ),
    ("a2c-mlp-extractor", A2C, "MlpPolicy", lambda: "CartPole-v1", dict(n_steps=8, seed=0), MLP_EXTRACTOR, 48, 8),
    ("dqn", DQN, "MlpPolicy", lambda: "CartPole-v1", OFF, TINY, 120, 30),
    ("plastic-dqn", PlasticDQN, "MlpPolicy", lambda: "CartPole-v1", OFF, TINY, 120, 30),
    ("sac", SAC, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY, 100, 25),
    ("plastic-sac", PlasticSAC, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY, 100, 25),
    ("td3", TD3, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY, 100, 25),
    ("recurrent-ppo", RecurrentPPO, "MlpLstmPolicy", lambda: "CartPole-v1", PPO_FAST, dict(TINY, lstm_hidden_size=8), 96, 32),
    (
        "plastic-recurrent-ppo",
        PlasticRecurrentPPO,
        "MlpLstmPolicy",
        lambda: "CartPole-v1",
        PPO_FAST,
        dict(TINY, lstm_hidden_size=8),
        96,
        32,
    ),
    ("crossq", CrossQ, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY, 100, 25),
    ("plastic-crossq", PlasticCrossQ, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY, 100, 25),
    ("maskable-ppo", MaskablePPO, "MlpPolicy", masked_env, PPO_FAST, MLP_EXTRACTOR, 96, 32),
    ("plastic-maskable-ppo", PlasticMaskablePPO, "MlpPolicy", masked_env, PPO_FAST, TINY, 96, 32),
]


def optimizers(model) -> dict[str, th.optim.Optimizer]:
    """Every optimizer of a model: those of its policy's modules and the entropy coefficient's."""
    out = {}
    for name, module in model.policy.named_modules():
        opt = getattr(module, "optimizer", None)
        if isinstance(opt, th.optim.Optimizer):
            out[f"{name}.optimizer"] = opt
    if isinstance(getattr(model, "ent_coef_optimizer", None), th.optim.Optimizer):
        out["ent_coef_optimizer"] = model.ent_coef_optimizer
    return out


def held_parameters(opt: th.optim.Optimizer) -> list[th.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def assert_same_state(a, b) -> None:
    """Bit-identical parameters and buffers (state_dict: BatchRenorm statistics included) and optimizer state."""
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert th.equal(sa[key], sb[key]), key
    oa, ob = optimizers(a), optimizers(b)
    assert list(oa) == list(ob)
    for name in oa:
        da, db = oa[name].state_dict(), ob[name].state_dict()
        assert da["state"].keys() == db["state"].keys(), name
        for idx, state in da["state"].items():
            for key, value in state.items():
                other = db["state"][idx][key]
                assert th.equal(th.as_tensor(value), th.as_tensor(other)), (name, idx, key)


def build(cls, policy, env_fn, kwargs, policy_kwargs):
    model = cls(policy, env_fn(), policy_kwargs=dict(policy_kwargs), **kwargs)
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


@pytest.mark.parametrize(
    "cls, policy, env_fn, kwargs, policy_kwargs, steps, every",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_learning_with_the_monitor_is_bit_identical(cls, policy, env_fn, kwargs, policy_kwargs, steps, every):
    reference = build(cls, policy, env_fn, kwargs, policy_kwargs)
    reference.learn(steps)
    ref_rng = (th.random.get_rng_state(), np.random.get_state()[1].copy())

    model = build(cls, policy, env_fn, kwargs, policy_kwargs)
    before = {name: (p, p.requires_grad) for name, p in model.policy.named_parameters(remove_duplicate=False)}
    held_before = {name: held_parameters(opt) for name, opt in optimizers(model).items()}
    monitor = PlasticityMonitor(every=every, probe_size=16, ntk_probe_size=4, max_overhead=None)
    model.learn(steps, callback=monitor)
    assert monitor.state["events"] >= 2  # the monitor did run (and its passes came between updates)

    # the same parameter objects, as trainable as before, held by the same optimizers
    after = dict(model.policy.named_parameters(remove_duplicate=False))
    assert list(after) == list(before)
    for name, (p, requires_grad) in before.items():
        assert after[name] is p, f"{name} was replaced by another tensor"
        assert type(after[name]) is th.nn.Parameter, name
        assert after[name].requires_grad == requires_grad, name
    for name, opt in optimizers(model).items():
        assert all(x is y for x, y in zip(held_parameters(opt), held_before[name], strict=True)), name
    # bit-identical training, and the global random streams where they would be without the monitor
    assert_same_state(reference, model)
    assert th.equal(th.random.get_rng_state(), ref_rng[0])
    assert np.array_equal(np.random.get_state()[1], ref_rng[1])


def test_extractor_parameters_are_trained_with_the_monitor():
    """The symptom of issue #12: with the monitor the shared extractor stopped training (dist_from_init = 0)."""
    model = build(PPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, MLP_EXTRACTOR)
    initial = model.policy.features_extractor.mlp[1].weight.detach().clone()
    monitor = PlasticityMonitor(every=32, probe_size=16, ntk_probe_size=4, max_overhead=None)
    model.learn(96, callback=monitor)
    assert not th.equal(model.policy.features_extractor.mlp[1].weight, initial)
    values = monitor.run()
    assert values["plasticity/policy/features_extractor.mlp.1/dist_from_init"] > 0


def test_a_pass_in_training_mode_changes_no_statistics_and_no_mode():
    """Called while the networks are in training mode (CrossQ's BatchRenorm would update its running statistics
    on a forward pass), the diagnostics change no buffer, no module's mode and no ``.grad``."""
    model = build(CrossQ, "MlpPolicy", lambda: "Pendulum-v1", OFF, TINY)
    model.learn(60)
    model.policy.set_training_mode(True)
    model.policy.actor.set_training_mode(False)  # a mixed state, to see that each module's own flag is restored
    for p in model.policy.parameters():
        p.grad = th.full_like(p, 0.5)
    modes = {name: m.training for name, m in model.policy.named_modules()}
    buffers = {name: b.clone() for name, b in model.policy.named_buffers()}
    assert any(name.endswith("ra_mean") for name in buffers)  # BatchRenorm statistics
    obs = th.as_tensor(model.replay_buffer.observations[:16, 0])
    actions = th.as_tensor(model.replay_buffer.actions[:16, 0])
    rng = th.random.get_rng_state()
    for spec in find_networks(model):
        network_diagnostics(model, spec, obs, actions if spec.name == "critic" else None, ntk_size=4)
    assert {name: m.training for name, m in model.policy.named_modules()} == modes
    for name, b in model.policy.named_buffers():
        assert th.equal(b, buffers[name]), name
    assert all(th.equal(p.grad, th.full_like(p, 0.5)) for p in model.policy.parameters())
    assert th.equal(th.random.get_rng_state(), rng)


# ---------------------------------------------------------------------------------------------------
# max_overhead: skipped passes are said
# ---------------------------------------------------------------------------------------------------
class FakeClock:
    """``time.perf_counter`` that advances 1 s per call: a pass (3 calls) seems to take 2 s, so with
    ``max_overhead=0.02`` the next one waits for 100 s of training, far more than the run lasts."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


class Recorder(Logger):
    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self.dumps: list[tuple[int, dict]] = []

    def dump(self, step: int = 0) -> None:
        self.dumps.append((step, dict(self.name_to_value)))
        super().dump(step)


def test_passes_skipped_by_max_overhead_are_counted_logged_and_warned(monkeypatch):
    monkeypatch.setattr(monitor_module, "time", FakeClock())
    model = build(PPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, TINY)
    logger = Recorder()
    model.set_logger(logger)
    monitor = PlasticityMonitor(every=32, probe_size=16, ntk_probe_size=0, max_overhead=0.02)
    with pytest.warns(UserWarning, match=r"max_overhead=0\.02.*max_overhead=None") as record:
        model.learn(32 * 6, callback=monitor)
    assert len([w for w in record if "max_overhead" in str(w.message)]) == 1  # warned once
    assert monitor.state["events"] == 1  # the first pass only; the 5 later rollout ends were due but skipped
    assert monitor.state["skipped"] == 5
    skipped = [(step, v["plasticity/skipped_passes"]) for step, v in logger.dumps if "plasticity/skipped_passes" in v]
    assert skipped[0] == (32, 0) and skipped[-1] == (32 * 6, 5)


def test_no_cap_no_skipped_passes(monkeypatch):
    monkeypatch.setattr(monitor_module, "time", FakeClock())
    model = build(PPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, TINY)
    monitor = PlasticityMonitor(every=32, probe_size=16, ntk_probe_size=0, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(32 * 4, callback=monitor)
    assert monitor.state["events"] == 4 and monitor.state["skipped"] == 0


# ---------------------------------------------------------------------------------------------------
# NTK on a probe with repeated rows
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("net", ["q_net", "critic"])
def test_ntk_ignores_repeated_probe_rows(net):
    th.manual_seed(0)
    if net == "q_net":
        model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(TINY), seed=0)
        obs = th.randn(5, 4)
        actions = None
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(TINY), seed=0)
        obs = th.randn(5, 3)
        actions = th.rand(5, 1) * 2 - 1
    spec = next(s for s in find_networks(model) if s.name == net)
    order = th.tensor([0, 1, 0, 2, 1, 3, 3, 4, 2, 0])  # repeated frames, first occurrences in order 0..4
    kw = dict(ntk_size=5)
    unique = network_diagnostics(model, spec, obs, actions, **kw)
    repeated = network_diagnostics(model, spec, obs[order], None if actions is None else actions[order], **kw)
    for key in ("ntk_cond", "ntk_log10_cond", "ntk_erank", "ntk_trace", "ntk_size"):
        assert repeated[key] == pytest.approx(unique[key], rel=1e-6), key
    assert repeated["ntk_size"] == 5
    assert math.isfinite(repeated["ntk_cond"]) and repeated["ntk_cond"] < COND_CAP
    assert repeated["ntk_log10_cond"] == pytest.approx(math.log10(repeated["ntk_cond"]))


def test_same_observation_with_other_actions_is_not_a_repeat():
    """A critic's probe row is (observation, action): one observation with two actions is two rows."""
    model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(TINY), seed=0)
    spec = next(s for s in find_networks(model) if s.name == "critic")
    obs = th.randn(1, 3).repeat(4, 1)
    actions = th.tensor([[-0.5], [0.0], [0.5], [0.0]])
    values = network_diagnostics(model, spec, obs, actions, ntk_size=4)
    assert values["ntk_size"] == 3


# ---------------------------------------------------------------------------------------------------
# ParameterSwap: aliased submodules and tied weights
# ---------------------------------------------------------------------------------------------------
class Aliased(th.nn.Module):
    """``b`` is ``a`` (as SB3's policy holds its extractor under three names); ``d.weight`` is ``c.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = th.nn.Linear(3, 3)
        self.b = self.a
        self.c = th.nn.Linear(3, 3, bias=False)
        self.d = th.nn.Linear(3, 2)
        self.d.weight = th.nn.Parameter(th.randn(2, 3))
        self.e = th.nn.Linear(3, 2, bias=False)
        self.e.weight = self.d.weight

    def forward(self, x: th.Tensor) -> th.Tensor:
        return self.d(th.tanh(self.c(th.tanh(self.b(self.a(x)))))) + self.e(x)


def test_parameter_swap_differentiates_through_aliases_and_restores_the_parameters():
    from sb3_plastic.diagnostics import gradient_norm, module_function, swapped_parameters

    th.manual_seed(0)
    net = Aliased()
    x = th.randn(5, 3)
    before = list(net.named_parameters(remove_duplicate=False))
    fn, params = module_function(net, x)
    assert set(params) == {"a.weight", "a.bias", "c.weight", "d.weight", "d.bias"}  # de-duplicated names
    norm = gradient_norm(lambda p: fn(p).square().sum(), params)
    net(x).square().sum().backward()  # the reference: autograd on the module itself
    expected = math.sqrt(sum(float(p.grad.double().square().sum()) for p in net.parameters()))
    assert norm == pytest.approx(expected, rel=1e-5)
    after = list(net.named_parameters(remove_duplicate=False))
    assert [n for n, _ in after] == [n for n, _ in before]
    for (name, p), (_, q) in zip(before, after):
        assert q is p and type(q) is th.nn.Parameter and q.requires_grad, name
    # the swapped values are seen under every alias, and the originals come back even after an error
    zeros = {name: th.zeros_like(p) for name, p in params.items()}
    with pytest.raises(RuntimeError, match="inside"):
        with swapped_parameters(net, zeros):
            assert th.equal(net(x), th.zeros(5, 2))
            raise RuntimeError("inside")
    assert all(q is p for (_, p), (_, q) in zip(before, net.named_parameters(remove_duplicate=False)))
    with pytest.raises(ValueError, match="'nope'"):
        swapped_parameters(net, {"nope": th.zeros(1)})
