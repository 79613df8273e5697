"""TRAC (Muppidi et al., 2024) as ``optimizer="trac"``: erfi against scipy, the whole update against a hand-written
transcription of the reference's step with a hand-written Adam, the keyword on the algorithms, save / load."""

import math

import numpy as np
import pytest
import torch as th

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticRecurrentPPO, PlasticSAC
from sb3_plastic.optim import AdamO
from sb3_plastic.trac import TRAC_BETAS, TRACAdam, erfi, trac_class


def test_erfi_matches_scipy():
    special = pytest.importorskip("scipy.special")
    for x in (-7.3, -2.0, -1e-3, 0.0, 1e-9, 0.5, 1 / math.sqrt(2), 3.0, 5.99, 6.0, 6.01, 9.5, 20.0, 26.0):
        assert math.isclose(erfi(x), float(special.erfi(x)), rel_tol=1e-12, abs_tol=1e-300), x
    assert erfi(30.0) == math.inf


def _reference_trac(steps, lr, x, y, w0):
    """The reference's step (ComputationalRobotics/TRAC trac.py), transcribed with numpy / scipy and a hand-written
    Adam (betas 0.9, 0.999, eps 1e-8): clone grad and param, base step, Delta = (x - ref) / (sum s + eps), h = <Delta, g>,
    Delta += update, v = b^2 v + h^2, sigma = b sigma - h, s = s_prev / erfi(1/sqrt2) * erfi(sigma / (sqrt2 sqrt v +
    eps)), param = ref + Delta * max(sum s, 0)."""
    special = pytest.importorskip("scipy.special")
    betas = np.array(TRAC_BETAS)
    w = w0.copy()
    m, v_adam = np.zeros_like(w), np.zeros_like(w)
    s, variance, sigma = np.zeros(6), np.zeros(6), np.full(6, 1e-8)
    ref = None
    trajectory = []
    for t in range(1, steps + 1):
        grad = 2 * x.T @ (x @ w - y) / len(x)
        before = w.copy()
        m = 0.9 * m + 0.1 * grad
        v_adam = 0.999 * v_adam + 0.001 * grad**2
        base = before - lr * (m / (1 - 0.9**t)) / (np.sqrt(v_adam / (1 - 0.999**t)) + 1e-8)
        if ref is None:
            ref = before.copy()
        delta = (before - ref) / (s.sum() + 1e-8)
        h = float((delta * grad).sum())
        delta = delta + (base - before)
        variance = betas**2 * variance + h**2
        sigma = betas * sigma - h
        s = 1e-8 / special.erfi(1 / np.sqrt(2)) * special.erfi(sigma / (np.sqrt(2) * np.sqrt(variance) + 1e-8))
        w = ref + delta * max(s.sum(), 0.0)
        trajectory.append(w.copy())
    return trajectory


def test_tracadam_follows_the_hand_written_reference():
    rng = np.random.default_rng(0)
    x, w0 = rng.normal(size=(32, 3)), rng.normal(size=(3, 2))
    y = x @ rng.normal(size=(3, 2)) + 0.1 * rng.normal(size=(32, 2))
    expected = _reference_trac(60, 0.05, x, y, w0)
    weight = th.nn.Parameter(th.tensor(w0))
    unused = th.nn.Parameter(th.ones(4, dtype=th.float64))  # never gets a gradient: untouched, as the reference skips it
    optimizer = TRACAdam([weight, unused], lr=0.05)
    xt, yt = th.tensor(x), th.tensor(y)
    for t, target in enumerate(expected):
        optimizer.zero_grad()
        ((xt @ weight - yt) ** 2).sum(dim=1).mean().backward()
        optimizer.step()
        assert np.allclose(weight.detach().numpy(), target, rtol=1e-9, atol=1e-12), t
    assert optimizer.trac_scale > 0.1  # the scale grew from 1e-8: TRAC let Adam's iterate move
    assert th.equal(unused, th.ones(4, dtype=th.float64))
    assert optimizer.state["trac"]["iter_count"] == 60


def test_closure_and_bad_settings_are_clear_errors():
    param = th.nn.Parameter(th.ones(2))
    with pytest.raises(ValueError, match="closure"):
        TRACAdam([param]).step(lambda: 0.0)
    with pytest.raises(ValueError, match="trac_betas"):
        TRACAdam([param], trac_betas=(1.5,))
    with pytest.raises(ValueError, match="trac_s_prev"):
        TRACAdam([param], trac_s_prev=0.0)
    with pytest.raises(ValueError, match="closure"):
        trac_class(th.optim.LBFGS)
    with pytest.raises(ValueError, match="isometry_mode='decoupled'.*trac"):
        PlasticPPO("MlpPolicy", "CartPole-v1", optimizer="trac")


@pytest.mark.parametrize("cls, env_id, kwargs", [
    (PlasticPPO, "CartPole-v1", dict(n_steps=64, batch_size=32, n_epochs=2)),
    (PlasticDQN, "CartPole-v1", dict(learning_starts=32, buffer_size=500, train_freq=1)),
    (PlasticSAC, "Pendulum-v1", dict(learning_starts=32, buffer_size=500, batch_size=16)),
    (PlasticRecurrentPPO, "CartPole-v1", dict(n_steps=32, batch_size=32, n_epochs=1)),
])
def test_optimizer_trac_on_the_algorithms(cls, env_id, kwargs):
    policy = "MlpLstmPolicy" if cls is PlasticRecurrentPPO else "MlpPolicy"
    model = cls(policy, env_id, optimizer="trac", isometry_mode="off", seed=0, policy_kwargs=dict(net_arch=[16]),
                **kwargs)
    optimizers = [model.policy.optimizer] if cls is not PlasticSAC else [model.actor.optimizer, model.critic.optimizer]
    assert all(type(o).__name__ == "TRACAdam" for o in optimizers)
    model.learn(96)
    for optimizer in optimizers:
        assert optimizer.state["trac"]["iter_count"] > 0
        refs = optimizer.state["trac"]["ref"]
        assert len(refs) == len([p for g in optimizer.param_groups for p in g["params"]])


def test_coupled_isometry_penalty_goes_through_trac():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", optimizer="trac", isometry_mode="coupled", isometry_coef=0.1,
                       n_steps=64, batch_size=32, n_epochs=1, seed=0)
    optimizer = model.policy.optimizer
    assert isinstance(optimizer, AdamO) and type(optimizer).__name__ == "TRACAdamO"
    assert optimizer.param_groups[0]["isometry_mode"] == "coupled"
    model.learn(64)
    assert optimizer.state["trac"]["iter_count"] == 2


@pytest.mark.parametrize("option", ["isometry_rect_scale", "isometry_normalize"])
def test_coupled_penalty_through_trac_keeps_every_isometry_option(option):
    """The penalty TRAC's base optimizer adds is the one asked for: before the fix, ``optimizer="trac"`` silently
    dropped ``isometry_rect_scale`` and ``isometry_normalize`` (its param groups kept False)."""
    model = PlasticPPO("MlpPolicy", "CartPole-v1", optimizer="trac", isometry_mode="coupled", isometry_coef=0.1,
                       isometry_scale=2.0, n_steps=64, batch_size=32, n_epochs=1, seed=0, **{option: True})
    groups = [g for g in model.policy.optimizer.param_groups if g["isometry_coef"] > 0]
    assert groups and all(g[option] is True and g["isometry_scale"] == 2.0 for g in groups)


def test_trac_state_survives_save_load(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", optimizer="trac", isometry_mode="off", n_steps=64, batch_size=32,
                       n_epochs=2, seed=0)
    model.learn(128)
    state = model.policy.optimizer.state["trac"]
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip")
    restored = loaded.policy.optimizer.state["trac"]
    assert restored["s"] == state["s"] and restored["sigma"] == state["sigma"] and restored["iter_count"] == 8
    for a, b in zip(restored["ref"], state["ref"]):
        assert th.equal(a, b)
    # the next step of the loaded optimizer equals the next step of the original one (same gradient)
    for model_ in (model, loaded):
        model_.policy.optimizer.zero_grad()
        sum((p**2).sum() for p in model_.policy.parameters()).backward()
        model_.policy.optimizer.step()
    for a, b in zip(model.policy.parameters(), loaded.policy.parameters()):
        assert th.equal(a, b)
