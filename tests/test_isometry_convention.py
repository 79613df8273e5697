"""The isometry penalty in its authors' convention (issue #27; Arosseau/nanochat-isometry ``nanochat/ortho_reg.py``).

``R(W) = 1/2 ||Gram(W) - t I||_F^2`` on the smaller Gram matrix, gradient ``2 (W W^T - t I) W`` (wide / square) or
``2 W (W^T W - t I)`` (tall), ``t = s`` or ``s * out / in`` for a tall W with ``rect_scale``, optionally divided by the
Gram matrix's size. Checked against a hand computation; the library's defaults train bit for bit as before the
change (fixtures made by the old code, tests/fixtures/make_isometry_v1.py) and a zip of the old code loads with its
effective lambda.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch as th
from torch import nn

from sb3_plastic import AdamO, IsometryConfig, PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.isometry import ISOMETRY_FORMAT, deviation_from_isometry, isometry_penalty, isometry_penalty_grad
from sb3_plastic.optim import upgrade_isometry_groups

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))  # the fixture script's training runs are the tests' own (tests/fixtures: no package)
SHAPES = {"square": (5, 5), "wide": (3, 7), "tall": (8, 3)}


def hand_penalty_and_grad(w: th.Tensor, s: float, rect: bool, normalize: bool) -> tuple[float, th.Tensor]:
    """The port's formulas written out with explicit loops over the Gram entries (float64)."""
    out, inp = w.shape
    tall = out > inp
    gram = w.T @ w if tall else w @ w.T
    d = gram.shape[0]
    target = s * out / inp if (rect and tall) else s
    value = 0.0
    dev = th.zeros(d, d, dtype=w.dtype)
    for i in range(d):
        for j in range(d):
            dev[i, j] = gram[i, j] - (target if i == j else 0.0)
            value += 0.5 * float(dev[i, j]) ** 2
    grad = 2 * (w @ dev) if tall else 2 * (dev @ w)
    if normalize:
        return value / d, grad / d
    return value, grad


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("rect", [False, True], ids=["plain", "rect"])
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_penalty_and_gradient_against_hand_computation(shape, rect, normalize, scale):
    w = th.randn(*shape, generator=th.Generator().manual_seed(sum(shape)), dtype=th.float64)
    value, grad = hand_penalty_and_grad(w, scale, rect, normalize)
    assert float(isometry_penalty(w, scale, rect_scale=rect, normalize=normalize)) == pytest.approx(value, rel=1e-12)
    th.testing.assert_close(isometry_penalty_grad(w, scale, rect_scale=rect, normalize=normalize), grad)
    # and the gradient is the derivative of the value
    v = w.clone().requires_grad_(True)
    isometry_penalty(v, scale, rect_scale=rect, normalize=normalize).backward()
    th.testing.assert_close(v.grad, grad)


def test_rect_scale_only_changes_tall_matrices_and_matches_fire_scale():
    gen = th.Generator().manual_seed(3)
    for shape in (SHAPES["square"], SHAPES["wide"]):
        w = th.randn(*shape, generator=gen, dtype=th.float64)
        assert th.equal(isometry_penalty(w, rect_scale=True), isometry_penalty(w))
    # a tall matrix with singular values sqrt(out / in) (FIRE's scale of a tall layer) is at the rect target
    q, _ = th.linalg.qr(th.randn(64, 4, generator=gen, dtype=th.float64))
    fire = q * (64 / 4) ** 0.5
    assert float(isometry_penalty(fire, rect_scale=True)) == pytest.approx(0.0, abs=1e-20)
    assert float(isometry_penalty(q)) == pytest.approx(0.0, abs=1e-20)  # orthonormal columns: the default target
    assert float(isometry_penalty(fire)) == pytest.approx(0.5 * 4 * (16 - 1) ** 2)


def test_dfi_keeps_its_definition():
    """DfI is ||Gram - s I||^2 without the 1/2 and without rect_scale (the logged keys keep their meaning)."""
    w = th.randn(9, 4, generator=th.Generator().manual_seed(1), dtype=th.float64)
    full = float(((w.T @ w) - 2.0 * th.eye(4, dtype=th.float64)).square().sum())
    assert deviation_from_isometry(w, 2.0) == pytest.approx(full, rel=1e-6)
    assert deviation_from_isometry(w, 2.0) == pytest.approx(2 * float(isometry_penalty(w, 2.0)), rel=1e-6)


@pytest.mark.parametrize("rect", [False, True], ids=["plain", "rect"])
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("mode", ["decoupled", "coupled"])
def test_adamo_step_uses_the_convention(rect, normalize, mode):
    """One AdamO step against torch Adam plus the hand-computed penalty step (decoupled) / gradient (coupled)."""
    gen = th.Generator().manual_seed(7)
    w0 = th.randn(8, 3, generator=gen) * 0.7  # tall
    g = th.randn(8, 3, generator=gen)
    lr, lam = 1e-2, 0.3
    w = nn.Parameter(w0.clone())
    opt = AdamO(
        [w], lr=lr, isometry_coef=lam, isometry_mode=mode, isometry_rect_scale=rect, isometry_normalize=normalize
    )
    ref = nn.Parameter(w0.clone())
    ref_opt = th.optim.Adam([ref], lr=lr)
    _, pen = hand_penalty_and_grad(w0.double(), 1.0, rect, normalize)
    w.grad = g.clone()
    ref.grad = g.clone() + (lam * pen.float() if mode == "coupled" else 0.0)
    opt.step()
    ref_opt.step()
    if mode == "decoupled":
        with th.no_grad():
            ref.sub_(lr * lam * pen.float())
    th.testing.assert_close(w.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


def test_isometry_step_uses_the_scheduled_learning_rate():
    """The decoupled step is ``lr(t) * lambda * grad R`` with SB3's scheduled ``lr(t)``, as the port's
    ``base lr * schedule``: after training with a linear schedule the step of the last update is the schedule's
    value at that update times lambda (not the initial learning rate)."""
    model = PlasticPPO(
        "MlpPolicy", "CartPole-v1", learning_rate=lambda f: 1e-3 * f, n_steps=64, batch_size=32, n_epochs=1,
        isometry_coef=0.5, seed=0, policy_kwargs=dict(net_arch=[8, 8]),
    )
    model.learn(192)
    lr_now = model.lr_schedule(model._current_progress_remaining)
    assert lr_now < 0.7e-3  # the schedule has moved
    opt = model.policy.optimizer
    steps = [float(opt.state[p]["isometry_step"]) for g in opt.param_groups if g["isometry_coef"] > 0 for p in g["params"]]
    assert steps and all(s == pytest.approx(lr_now * 0.5, rel=1e-9) for s in steps)
    assert all(g["lr"] == pytest.approx(lr_now) for g in opt.param_groups)


def test_config_rejects_non_bool_options():
    with pytest.raises(ValueError, match="isometry_rect_scale must be True or False, got 1"):
        IsometryConfig(isometry_rect_scale=1)
    with pytest.raises(ValueError, match="isometry_normalize must be True or False, got 'yes'"):
        IsometryConfig(isometry_normalize="yes")
    with pytest.raises(ValueError, match="isometry_rect_scale must be True or False"):
        AdamO([nn.Parameter(th.ones(2, 2))], isometry_rect_scale=None)


# --------------------------------------------------------------------------------------- behaviour kept
def _params(model) -> dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = th.get_num_threads()  # the fixture script trains on one thread, as when it made the files
    yield
    th.set_num_threads(threads)


def _assert_same(new: dict[str, th.Tensor], old: dict[str, th.Tensor]) -> None:
    assert new.keys() == old.keys()
    for key in old:
        # the same arithmetic (lambda doubled, the gradient halved: exact powers of two); a tolerance only for another
        # machine's BLAS than the one that made the fixture
        th.testing.assert_close(new[key], old[key], rtol=0, atol=1e-6, msg=key)


def test_default_runs_train_as_before_the_change():
    """Short default runs of PlasticPPO / PlasticSAC / PlasticDQN (the family defaults, now 0.02 / 2e-3 / 0.02) end
    with the parameters the library produced before issue #27 (at 0.01 / 1e-3 / 0.01 without the 1/2)."""
    import make_isometry_v1 as fixture

    old = th.load(FIXTURES / "isometry_v1_defaults.pt")
    new = fixture.default_runs()
    for name in ("ppo", "sac", "dqn"):
        _assert_same(new[name], old[name])


def test_old_zip_loads_with_its_effective_lambda():
    path = FIXTURES / "isometry_v1_ppo.zip"
    model = PlasticPPO.load(path, env=gym.make("CartPole-v1"))
    assert model.isometry_format == ISOMETRY_FORMAT == 2
    config = model.isometry_config
    assert (config.isometry_coef, config.isometry_rect_scale, config.isometry_normalize) == (0.1, False, False)
    assert model.policy.isometry_config.isometry_coef == 0.1
    groups = model.policy.optimizer.param_groups
    assert sorted(g["isometry_coef"] for g in groups) == [0.0, 0.1]
    assert all(g["isometry_rect_scale"] is False and g["isometry_normalize"] is False for g in groups)


def test_old_zip_continues_training_as_the_old_code_did(tmp_path):
    import make_isometry_v1 as fixture

    _assert_same(fixture.continued(FIXTURES / "isometry_v1_ppo.zip"), th.load(FIXTURES / "isometry_v1_ppo_continued.pt"))
    # saved again by today's code, it keeps its lambda (no second doubling)
    model = PlasticPPO.load(FIXTURES / "isometry_v1_ppo.zip", env=gym.make("CartPole-v1"))
    model.save(tmp_path / "v2.zip")
    again = PlasticPPO.load(tmp_path / "v2.zip", env=gym.make("CartPole-v1"))
    assert again.isometry_config.isometry_coef == 0.1
    assert sorted(g["isometry_coef"] for g in again.policy.optimizer.param_groups) == [0.0, 0.1]


def test_optimizer_state_of_the_old_convention_is_upgraded():
    w = nn.Parameter(th.randn(4, 3))
    old_group = {"lr": 1e-3, "isometry_coef": 0.05, "isometry_scale": 1.0, "isometry_mode": "decoupled",
                 "isometry_interval": 1, "params": [0]}
    state = {"state": {}, "param_groups": [old_group]}
    upgraded = upgrade_isometry_groups(state)
    assert upgraded["param_groups"][0]["isometry_coef"] == 0.1 and old_group["isometry_coef"] == 0.05
    assert upgrade_isometry_groups(upgraded) is upgraded  # today's format: unchanged
    opt = AdamO([w], isometry_coef=0.7, isometry_rect_scale=True)
    opt.load_state_dict(state)
    group = opt.param_groups[0]
    assert (group["isometry_coef"], group["isometry_rect_scale"], group["isometry_normalize"]) == (0.1, False, False)


@pytest.mark.parametrize("cls", [PlasticPPO, PlasticSAC, PlasticDQN], ids=["PPO", "SAC", "DQN"])
def test_new_zip_records_the_format(cls, tmp_path):
    env = "Pendulum-v1" if cls is PlasticSAC else "CartPole-v1"
    model = cls("MlpPolicy", env, seed=0, isometry_coef=0.3, isometry_rect_scale=True, policy_kwargs=dict(net_arch=[4]))
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip")
    assert loaded.isometry_format == ISOMETRY_FORMAT
    assert loaded.isometry_config.isometry_coef == 0.3 and loaded.isometry_config.isometry_rect_scale is True
