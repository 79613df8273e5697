"""Continual Backprop's two switches of issue #27: bias absorption off by default (Dohare's reference runs: ``gnt.py``
zeroes the mean activation before reading it) and the reference's stochastic replacement rule, each against a
hand-written reference."""

from __future__ import annotations

import pytest
import torch as th
from stable_baselines3 import PPO
from torch import nn

from sb3_plastic.callbacks.cbp import ContinualBackprop, ContinualBackpropConfig, GenerateAndTest
from sb3_plastic.common.surgery import Consumer, HiddenLayer, model_state


def _net(width: int = 8) -> nn.Sequential:
    th.manual_seed(0)
    return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))


def _activations(steps: int, width: int = 8, seed: int = 1) -> list[th.Tensor]:
    g = th.Generator().manual_seed(seed)
    return [th.rand(4, width, generator=g) + 0.5 for _ in range(steps)]


@pytest.mark.parametrize("absorb", [False, True])
def test_bias_absorption_is_an_option_off_by_default(absorb):
    net = _net()
    kwargs = dict(bias_absorption=True) if absorb else {}
    gnt = GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], replacement_rate=0.2,
                          maturity_threshold=2, decay_rate=0.9, **kwargs)
    assert gnt.bias_absorption is absorb
    acts = _activations(3)
    for h in acts[:2]:
        assert not gnt.step({"0": h})  # ages 1, 2: not yet eligible (age > 2)
    bias = net[2].bias.detach().clone()
    w_out = net[2].weight.detach().clone()
    gnt.update({"0": acts[2]})
    f_hat = gnt.bias_corrected_mean_activation("0")[:, 0].clone()
    chosen = gnt.select()
    assert chosen and chosen["0"].numel() >= 1
    gnt.replace("0", chosen["0"])
    units = chosen["0"]
    expected = bias + (w_out[:, units] * f_hat[units]).sum(dim=1) if absorb else bias
    th.testing.assert_close(net[2].bias.detach(), expected)
    assert th.all(net[2].weight.detach()[:, units] == 0)


def hand_counts(rate: float, eligible: int, steps: int, seed: int) -> list[int]:
    """gnt.py's ``test_features`` with ``accumulate=False``, written out: the units replaced at each step."""
    gen = th.Generator().manual_seed(seed)
    counts = []
    for _ in range(steps):
        x = rate * eligible
        if x < 1:
            if th.rand(1, generator=gen) <= x:
                x = 1
        counts.append(int(x))
    return counts


@pytest.mark.parametrize("rate", [0.03, 0.3])  # 8 units: 0.24 per step (draws) and 2.4 per step (fraction dropped)
def test_stochastic_rule_is_the_reference_rule(rate):
    net = _net()
    gen = th.Generator().manual_seed(5)
    gnt = GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], replacement_rate=rate,
                          maturity_threshold=0, decay_rate=0.9, replacement_rule="stochastic", generator=gen)
    gnt.state["0"]["age"].fill_(10**6)  # every unit eligible at every step (replaced units restart at age 0 ...)
    steps = 60
    counts = []
    for h in _activations(steps):
        gnt.state["0"]["age"].fill_(10**6)  # ... so keep all 8 eligible, as the hand reference assumes
        chosen = gnt.step({"0": h})
        counts.append(int(chosen["0"].numel()) if "0" in chosen else 0)
    assert counts == hand_counts(rate, 8, steps, seed=5)
    if rate == 0.03:
        assert 0 < sum(counts) < steps  # some steps replace one unit, most none
    else:
        assert set(counts) == {2}  # the reference drops the fraction; the accumulator would give 2 or 3


def test_accumulate_rule_stays_the_default_and_keeps_the_fraction():
    net = _net()
    gnt = GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], replacement_rate=0.3,
                          maturity_threshold=0, decay_rate=0.9)
    assert gnt.replacement_rule == "accumulate"
    counts = []
    for h in _activations(10):
        gnt.state["0"]["age"].fill_(10**6)
        counts.append(int(gnt.step({"0": h}).get("0", th.empty(0)).numel()))
    assert sum(counts) == 24 and set(counts) == {2, 3}  # 2.4 per step exactly over 10 steps


def test_rule_and_absorption_validated_and_reach_the_callback():
    with pytest.raises(ValueError, match="Unknown replacement_rule 'random'; allowed: \\['accumulate', 'stochastic'\\]"):
        ContinualBackprop(replacement_rule="random")
    with pytest.raises(ValueError, match="cbp_bias_absorption must be True or False, got 1"):
        ContinualBackpropConfig(replacement_rate=1e-4, cbp_bias_absorption=1)
    config = ContinualBackpropConfig(replacement_rate=1e-4, cbp_bias_absorption=True, cbp_replacement_rule="stochastic")
    cb = config.make_callback()
    assert (cb.bias_absorption, cb.replacement_rule) == (True, "stochastic")
    assert ContinualBackprop().bias_absorption is False and ContinualBackprop().replacement_rule == "accumulate"


def test_stochastic_generator_state_survives_save_and_load(tmp_path):
    """The draws come from a private generator whose state is saved with the model: a resumed run continues the
    sequence of draws (replaying draws from the saved state reaches the resumed generator's state)."""
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0, policy_kwargs=dict(net_arch=[16, 16]))
    model = PPO("MlpPolicy", "CartPole-v1", **kwargs)
    cb = ContinualBackprop(replacement_rate=0.02, maturity_threshold=3, replacement_rule="stochastic")
    model.learn(256, callback=cb)
    saved = cb.state["rng"].clone()
    assert th.equal(saved, cb.generator.get_state())
    assert cb.total_replaced > 0
    model.save(tmp_path / "ppo")
    loaded = PPO.load(tmp_path / "ppo", env=model.get_env())
    assert th.equal(model_state(loaded, "ContinualBackprop")["rng"], saved)
    again = ContinualBackprop(replacement_rate=0.02, maturity_threshold=3, replacement_rule="stochastic")
    loaded.learn(64, callback=again, reset_num_timesteps=False)
    expected = th.Generator()
    expected.set_state(saved)
    # the resumed generator started from the saved state: replaying its draws from there reaches its state now
    draws = 0
    while not th.equal(expected.get_state(), again.generator.get_state()):
        th.rand(1, generator=expected)
        draws += 1
        assert draws < 10_000


# ------------------------------------------------------------------ Dohare's RL runs: LeCun new units, Adam kept
@pytest.mark.parametrize("shape", [(6, 20), (5, 3, 2, 2)])
def test_lecun_new_units_are_the_reference_draw(shape):
    """``init="lecun"``: ``U(-b, b)``, ``b = gain * sqrt(3 / fan_in)`` (``get_layer_bound`` of lop/utils/miscellaneous.py
    with ``init='lecun'``), drawn from torch's generator: the same numbers as a hand draw of that bound."""
    import math

    from sb3_plastic.common.unit_reset import fresh_incoming_weights

    weight = th.zeros(shape)
    rows = th.tensor([1, 4])
    fan_in = math.prod(shape[1:])
    for gain in (1.0, 0.5):
        th.manual_seed(7)
        fresh = fresh_incoming_weights(weight, rows, "lecun", gain)
        th.manual_seed(7)
        bound = gain * math.sqrt(3.0 / fan_in)
        expected = th.empty(2, *shape[1:]).uniform_(-bound, bound)
        assert fresh.shape == (2, *shape[1:]) and th.equal(fresh, expected)
    big = fresh_incoming_weights(th.zeros(4000, 30), th.arange(4000), "lecun")
    assert float(big.abs().max()) <= math.sqrt(0.1) and float(big.var()) == pytest.approx(1 / 30, rel=0.03)


def _stepped_adam_net():
    net = _net()
    opt = th.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        net(th.randn(16, 3)).pow(2).sum().backward()
        opt.step()
    return net, opt


@pytest.mark.parametrize("restart", [True, False])
def test_optimizer_restart_can_be_left_to_the_reference_plain_adam(restart):
    """``optimizer_restart=False``: a replacement leaves every optimizer entry as it was (the reference's RL runs built
    torch's plain Adam, which ``update_optim_params`` never touches); the default zeroes the touched rows / columns."""
    net, opt = _stepped_adam_net()
    gnt = GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], opt, replacement_rate=0.2,
                          maturity_threshold=0, optimizer_restart=restart)
    assert gnt.restarted_optimizers == ([opt] if restart else [])
    before = {name: {k: v.clone() for k, v in opt.state[p].items()} for name, p in net.named_parameters()}
    chosen = gnt.step({"0": th.rand(4, 8) + 0.5})
    units = chosen["0"]
    assert units.numel() >= 1
    for name, p in net.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            now, was = opt.state[p][key], before[name][key]
            if not restart:
                assert th.equal(now, was)
            elif name in ("0.weight", "0.bias"):
                kept = ~th.isin(th.arange(8), units)
                assert not now[units].any() and th.equal(now[kept], was[kept])
            elif name == "2.weight":
                assert not now[:, units].any()
    with pytest.raises(ValueError, match="optimizer_restart must be True or False, got 1"):
        GenerateAndTest([HiddenLayer("0", net[0], net[1], [Consumer(net[2])])], opt, optimizer_restart=1)


def test_the_callback_and_the_keywords_carry_the_unit_init_and_the_restart_switch(tmp_path, monkeypatch):
    """``ContinualBackprop(unit_init="lecun", optimizer_restart=False)`` draws new units with LeCun's bound whatever the
    policy was built with and keeps torch's plain Adam (no restart class); the algorithm keywords ``cbp_unit_init`` /
    ``cbp_optimizer_restart`` build that callback and survive save / load; bad values name themselves."""
    import sb3_plastic.callbacks.cbp as cbp_module
    from sb3_plastic import PlasticPPO
    from sb3_plastic.adam_restart import AdamRestartMixin

    draws = []
    original = cbp_module.fresh_incoming_weights

    def spy(weight, rows, init="default", gain=1.0):
        draws.append((init, gain))
        return original(weight, rows, init, gain)

    monkeypatch.setattr(cbp_module, "fresh_incoming_weights", spy)
    for unit_init, restart, expected in ((None, True, ("orthogonal", 2 ** 0.5)), ("lecun", False, ("lecun", 1.0))):
        draws.clear()
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, n_epochs=1, seed=0)
        callback = ContinualBackprop(replacement_rate=0.5, maturity_threshold=1, unit_init=unit_init,
                                     optimizer_restart=restart)
        model.learn(64, callback=callback)
        assert draws and set(draws) == {expected}
        assert isinstance(model.policy.optimizer, AdamRestartMixin) is restart
    model = PlasticPPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, n_epochs=1, seed=0, replacement_rate=0.5,
                       maturity_threshold=1, cbp_unit_init="lecun", cbp_optimizer_restart=False)
    draws.clear()
    model.learn(64)
    assert draws and set(draws) == {("lecun", 1.0)}
    model.save(tmp_path / "cbp")
    loaded = PlasticPPO.load(tmp_path / "cbp")
    config = loaded.intervention_configs["cbp"]
    assert (config.cbp_unit_init, config.cbp_optimizer_restart) == ("lecun", False)
    with pytest.raises(ValueError, match=r"Unknown cbp_unit_init 'xavier'; allowed: None \(the layer's own initialiser\), "
                                         r"'default', 'orthogonal', 'lecun'"):
        ContinualBackpropConfig(replacement_rate=1e-4, cbp_unit_init="xavier")
    with pytest.raises(ValueError, match="cbp_optimizer_restart must be True or False, got 'no'"):
        ContinualBackpropConfig(replacement_rate=1e-4, cbp_optimizer_restart="no")
    with pytest.raises(ValueError, match="Unknown unit_init 'he'"):
        ContinualBackprop(unit_init="he")
    with pytest.warns(UserWarning, match="cbp_unit_init"):
        ContinualBackpropConfig(cbp_unit_init="lecun")  # Continual Backprop off: the option cannot act
