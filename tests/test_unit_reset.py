"""The unit-surgery module (sb3_plastic.common.unit_reset) that Continual Backprop and ReDo share (issue #13, part 6),
with the per-element Adam restart of part 1 through both methods and through SB3 models with plain torch Adam."""

from __future__ import annotations

import pytest
import torch as th
from stable_baselines3 import DQN
from torch import nn

from sb3_plastic.adam_restart import RESTART_KEY, AdamRestartMixin
from sb3_plastic.callbacks.cbp import ContinualBackprop, GenerateAndTest
from sb3_plastic.callbacks.redo import ReDo, redo_reset_
from sb3_plastic.common.surgery import Consumer, HiddenLayer, find_networks
from sb3_plastic.common.unit_reset import replace_units_

STEPS_BEFORE, K = 300, 20


def _net() -> nn.Sequential:
    th.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()


def _feed(opt: th.optim.Optimizer, params: list[nn.Parameter], gen: th.Generator) -> list[th.Tensor]:
    grads = [th.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    return grads


@pytest.mark.parametrize("method", ["cbp", "redo"])
def test_a_replaced_unit_is_trained_as_a_fresh_adam_entry(method):
    """CBP's and ReDo's replacement (one code path) restart Adam for the new unit: its incoming row, bias entry and
    outgoing column follow a fresh torch Adam on the same gradients; everything else keeps its Adam state."""
    net = _net()
    params = list(net.parameters())
    opt = th.optim.Adam(params, lr=1e-2, betas=(0.9, 0.999))
    hidden = HiddenLayer("0", net[0], net[1], [Consumer(net[2])])
    gen = th.Generator().manual_seed(1)
    for _ in range(STEPS_BEFORE):
        _feed(opt, params, gen)
    unit = th.tensor([2])
    if method == "cbp":
        gnt = GenerateAndTest([hidden], opt, replacement_rate=0.0)
        gnt.replace("0", unit)
    else:
        redo_reset_(hidden, unit, [opt])
    w0, b0, w1, b1 = params
    touched = [(w0, (2, slice(None))), (b0, (2,)), (w1, (slice(None), 2))]
    fresh = [nn.Parameter(p.detach()[ix].clone()) for p, ix in touched]
    fresh_opt = th.optim.Adam(fresh, lr=1e-2, betas=(0.9, 0.999))
    for _ in range(K):
        grads = _feed(opt, params, gen)
        by_param = dict(zip([id(p) for p in params], grads))
        for f, (p, ix) in zip(fresh, touched):
            f.grad = by_param[id(p)][ix].clone()
        fresh_opt.step()
        for f, (p, ix) in zip(fresh, touched):
            th.testing.assert_close(p.detach()[ix], f.detach(), rtol=1e-10, atol=1e-12)
    assert RESTART_KEY not in opt.state[b1]  # untouched tensors keep Adam's plain state
    marks = opt.state[w0][RESTART_KEY]
    assert (marks[2] == K).all() and (marks[[0, 1, 3, 4, 5]] == -1).all()


def test_replace_units_without_optimizer_state_and_empty():
    net = _net()
    hidden = HiddenLayer("0", net[0], net[1], [Consumer(net[2])])
    before = [p.detach().clone() for p in net.parameters()]
    replace_units_(hidden, th.tensor([], dtype=th.long), th.empty(0, 4, dtype=th.float64), [])
    assert all(th.equal(a, b) for a, b in zip(before, net.parameters()))
    fresh = th.full((1, 4), 0.5, dtype=th.float64)
    replace_units_(hidden, th.tensor([3]), fresh, [], mean_activation=th.tensor([[2.0]], dtype=th.float64))
    assert th.equal(net[0].weight[3], fresh[0]) and net[0].bias[3] == 0 and (net[2].weight[:, 3] == 0).all()
    th.testing.assert_close(net[2].bias.detach(), before[3] + 2.0 * before[2][:, 3])  # bias absorption


def _dqn() -> DQN:
    return DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_starts=16,
        train_freq=1,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(net_arch=[16]),
    )


@pytest.mark.parametrize("callback", ["cbp", "redo"])
def test_sb3_torch_adam_restarts_through_the_callbacks_and_save_load(callback, tmp_path):
    """A plain SB3 model (torch Adam): the callback gives its optimizer per-element restarts in place (same object,
    still a torch Adam); the restart state is saved and loaded with the model and used again by the next learn."""
    model = _dqn()
    opt = model.policy.optimizer
    cb = ContinualBackprop(0.2, maturity_threshold=5) if callback == "cbp" else ReDo(period=20, tau=1.0)
    model.learn(80, callback=cb)
    assert model.policy.optimizer is opt and isinstance(opt, th.optim.Adam) and isinstance(opt, AdamRestartMixin)
    weight = find_networks(model)[0].hidden_layers()[0].layer.weight
    assert RESTART_KEY in opt.state[weight] and bool((opt.state[weight][RESTART_KEY] >= 0).any())
    marks = opt.state[weight][RESTART_KEY].clone()
    model.save(tmp_path / "m.zip")
    loaded = DQN.load(tmp_path / "m.zip", env=model.get_env())
    new_opt = loaded.policy.optimizer
    new_weight = find_networks(loaded)[0].hidden_layers()[0].layer.weight
    assert th.equal(new_opt.state[new_weight][RESTART_KEY], marks)
    cb = ContinualBackprop(0.2, maturity_threshold=5) if callback == "cbp" else ReDo(period=20, tau=1.0)
    loaded.learn(4, callback=cb, reset_num_timesteps=False)
    assert isinstance(new_opt, AdamRestartMixin)


def test_callbacks_that_do_nothing_leave_sb3_bit_identical():
    """With CBP off (rate 0) the optimizer is untouched; with ReDo that never finds a dormant unit the swapped
    optimizer steps bit-identically to plain SB3."""
    ref = _dqn().learn(60)  # each model built (seed 0 reseeds the global generators) and trained in turn
    off = _dqn().learn(60, callback=ContinualBackprop(0.0))
    redo = _dqn().learn(60, callback=ReDo(period=10**6))
    assert type(off.policy.optimizer) is th.optim.Adam and isinstance(redo.policy.optimizer, AdamRestartMixin)
    for a, b, c in zip(ref.policy.parameters(), off.policy.parameters(), redo.policy.parameters()):
        assert th.equal(a, b) and th.equal(a, c)


@pytest.mark.parametrize("method", ["cbp", "redo"])
def test_a_replaced_unit_of_a_nap_layer_gets_its_layer_norm_affine_reset(method):
    """NaP (``Linear -> LayerNorm -> ReLU``): a new unit's LayerNorm scale / offset go back to their init (1, 0) and
    their optimizer state restarts; the other features keep theirs, bitwise."""
    from sb3_plastic import PlasticDQN

    model = PlasticDQN("MlpPolicy", "CartPole-v1", nap=True, learning_starts=16, train_freq=1, batch_size=16, seed=0)
    model.learn(40)
    spec = find_networks(model)[0]
    hidden = spec.hidden_layers()[0]
    ln, opt = hidden.pre_norm, spec.optimizer
    assert isinstance(ln, nn.LayerNorm) and ln.weight in opt.state
    with th.no_grad():  # trained-looking affine parameters and moments
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
        for p in (ln.weight, ln.bias):
            opt.state[p]["exp_avg"].uniform_(0.1, 1.0)
            opt.state[p]["exp_avg_sq"].uniform_(0.1, 1.0)
    before = {k: (p.detach().clone(), {n: v.clone() for n, v in opt.state[p].items()}) for k, p in ln.named_parameters()}
    j = 5
    if method == "cbp":
        GenerateAndTest([hidden], opt, replacement_rate=0.0).replace(hidden.name, th.tensor([j]))
    else:
        redo_reset_(hidden, th.tensor([j]), [opt])
    keep = th.tensor([i for i in range(hidden.n_features) if i != j])
    for name, init in (("weight", 1.0), ("bias", 0.0)):
        p = getattr(ln, name)
        old, old_state = before[name]
        assert p[j] == init
        assert th.equal(p[keep], old[keep])
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key][j] == 0
            assert th.equal(opt.state[p][key][keep], old_state[key][keep])
