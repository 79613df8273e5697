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
