"""``isometry_free_scale``: the isometry penalty with each weight's own mean squared singular value as the target.

``R(W) = 1/2 ||Gram - t I||_F^2`` with ``t = tr(Gram) / d`` at the current weights, i.e. ``1/2 sum_i (sigma_i^2 -
mean_j sigma_j^2)^2``: checked against an SVD, against autograd of that formula, and through AdamO's decoupled and
coupled steps against a hand-written step; a scaled orthonormal matrix is a fixed point at any scale, where the fixed
target pulls it to ``sqrt(s)``.
"""

from __future__ import annotations

import pytest
import torch as th
from torch import nn

from sb3_plastic import AdamO, IsometryConfig, PlasticPPO
from sb3_plastic.isometry import isometry_penalty, isometry_penalty_grad
from sb3_plastic.optim import MAX_ISOMETRY_STEP

SHAPES = {"square": (5, 5), "wide": (3, 7), "tall": (8, 3), "conv": (4, 2, 3, 3)}


def svd_penalty(w: th.Tensor) -> th.Tensor:
    """``1/2 sum_i (sigma_i^2 - mean sigma^2)^2`` over the ``min(out, in)`` singular values of the matrix view."""
    sq = th.linalg.svdvals(w.reshape(w.shape[0], -1)).square()
    return 0.5 * (sq - sq.mean()).square().sum()


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_penalty_is_the_spread_of_the_squared_singular_values(shape):
    w = th.randn(*shape, generator=th.Generator().manual_seed(sum(shape)), dtype=th.float64)
    assert float(isometry_penalty(w, free_scale=True)) == pytest.approx(float(svd_penalty(w)), rel=1e-10)
    # the analytic gradient (the target read off the weights, not differentiated) is the exact gradient of R
    v = w.clone().requires_grad_(True)
    svd_penalty(v).backward()
    th.testing.assert_close(isometry_penalty_grad(w, free_scale=True), v.grad)
    # normalize divides both by the Gram matrix's size
    d = min(w.shape[0], w[0].numel())
    th.testing.assert_close(isometry_penalty_grad(w, free_scale=True, normalize=True), v.grad / d)


@pytest.mark.parametrize("shape", [(6, 6), (8, 3), (3, 8)], ids=["square", "tall", "wide"])
@pytest.mark.parametrize("c", [0.3, 1.0, 4.0])
def test_a_scaled_isometry_costs_nothing_at_any_scale(shape, c):
    q = th.linalg.qr(th.randn(max(shape), min(shape), generator=th.Generator().manual_seed(3), dtype=th.float64))[0]
    w = c * (q if shape[0] >= shape[1] else q.T)
    assert float(isometry_penalty(w, free_scale=True)) == pytest.approx(0.0, abs=1e-20 * c**4 + 1e-24)
    assert float(isometry_penalty_grad(w, free_scale=True).abs().max()) < 1e-10 * c**3
    if c != 1.0:  # the fixed target s = 1 does not
        assert float(isometry_penalty(w)) > 0.1


def test_blocks_take_one_target_each():
    w = th.randn(12, 5, generator=th.Generator().manual_seed(1), dtype=th.float64)
    w[4:8] *= 3.0  # blocks of very different scales
    per_block = sum(float(svd_penalty(w[i * 4:(i + 1) * 4])) for i in range(3))
    assert float(isometry_penalty(w, blocks=3, free_scale=True)) == pytest.approx(per_block, rel=1e-10)
    grads = th.cat([isometry_penalty_grad(w[i * 4:(i + 1) * 4], free_scale=True) for i in range(3)])
    th.testing.assert_close(isometry_penalty_grad(w, blocks=3, free_scale=True), grads)


def hand_free_step(w: th.Tensor, lr: float, lam: float) -> th.Tensor:
    """AdamO's decoupled step with the free target, written out: ``W - c * 2 W (Gram - t I)`` (tall) with ``t`` the
    Gram matrix's mean diagonal and ``c = min(lr * lam, MAX_ISOMETRY_STEP / (2 * bound))``, ``bound`` the largest
    absolute row sum of the Gram matrix."""
    w = w.double()
    gram = w.T @ w
    t = gram.diagonal().mean()
    bound = max(float(gram.abs().sum(dim=1).max()), float(t))
    c = min(lr * lam, MAX_ISOMETRY_STEP / (2 * bound))
    return (w - c * 2 * w @ (gram - t * th.eye(gram.shape[0], dtype=w.dtype))).float()


@pytest.mark.parametrize("lam", [0.3, 500.0], ids=["free", "clamped"])
def test_decoupled_step_against_a_hand_written_step(lam):
    """With a zero task gradient Adam moves nothing, so one AdamO step is the isometry step alone."""
    w0 = th.randn(8, 3, generator=th.Generator().manual_seed(7)) * 1.7
    w = nn.Parameter(w0.clone())
    opt = AdamO([w], lr=1e-2, isometry_coef=lam, isometry_scale=1.0, isometry_free_scale=True)
    w.grad = th.zeros_like(w)
    opt.step()
    th.testing.assert_close(w.detach(), hand_free_step(w0, 1e-2, lam), rtol=1e-5, atol=1e-6)


def spectrum_after_isometry_steps(w0: th.Tensor, steps: int = 3000, **isometry: object) -> th.Tensor:
    """The singular values of ``w0`` after ``steps`` AdamO steps with a zero task gradient (lr 1e-2, lambda 0.5 and
    the given isometry keywords): the isometry step alone, repeated."""
    w = nn.Parameter(w0.clone())
    opt = AdamO([w], lr=1e-2, isometry_coef=0.5, **isometry)
    for _ in range(steps):
        w.grad = th.zeros_like(w)
        opt.step()
    return th.linalg.svdvals(w.detach())


def test_decoupled_steps_even_out_the_spectrum_and_keep_its_level():
    """Many steps with zero task gradient: the fixed target pulls every singular value to ``sqrt(s) = 1``; the free
    target makes them equal near their starting RMS (here ~2.6), far from 1."""
    gen = th.Generator().manual_seed(0)
    u, _, vh = th.linalg.svd(th.randn(16, 8, generator=gen), full_matrices=False)
    w0 = u @ th.diag(th.linspace(2.0, 3.0, 8)) @ vh
    rms0 = float(th.linalg.svdvals(w0).square().mean().sqrt())
    out = {free: spectrum_after_isometry_steps(w0, isometry_free_scale=free) for free in (False, True)}
    assert th.allclose(out[False], th.ones(8), atol=1e-3)
    assert float(out[True].max() - out[True].min()) < 1e-3
    assert 0.9 * rms0 < float(out[True].mean()) < rms0  # evening out lowers the RMS a little, never to 1


def test_block_step_takes_one_target_per_block():
    w0 = th.randn(8, 3, generator=th.Generator().manual_seed(2))
    w0[4:] *= 2.5
    w = nn.Parameter(w0.clone())
    opt = AdamO([dict(params=[w], isometry_blocks=2)], lr=1e-2, isometry_coef=0.3, isometry_free_scale=True)
    w.grad = th.zeros_like(w)
    opt.step()
    expected = th.cat([hand_free_step(w0[:4], 1e-2, 0.3), hand_free_step(w0[4:], 1e-2, 0.3)])
    th.testing.assert_close(w.detach(), expected, rtol=1e-5, atol=1e-6)


def test_coupled_mode_adds_the_free_gradient():
    gen = th.Generator().manual_seed(5)
    w0, g = th.randn(3, 7, generator=gen) * 1.5, th.randn(3, 7, generator=gen)
    w = nn.Parameter(w0.clone())
    opt = AdamO([w], lr=1e-2, isometry_coef=0.4, isometry_mode="coupled", isometry_free_scale=True)
    ref = nn.Parameter(w0.clone())
    ref_opt = th.optim.Adam([ref], lr=1e-2)
    w.grad = g.clone()
    ref.grad = g + 0.4 * isometry_penalty_grad(w0.double(), free_scale=True).float()
    opt.step()
    ref_opt.step()
    th.testing.assert_close(w.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match="isometry_free_scale must be True or False, got 'yes'"):
        IsometryConfig(isometry_free_scale="yes")
    with pytest.raises(ValueError, match="isometry_free_scale must be True or False, got 1"):
        AdamO([nn.Parameter(th.ones(2, 2))], isometry_free_scale=1)
    with pytest.raises(ValueError, match="isometry_free_scale=True .* isometry_rect_scale=True would have no effect"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_free_scale=True, isometry_rect_scale=True)
    with pytest.raises(ValueError, match="isometry_free_scale=True .* isometry_rect_scale=True would have no effect"):
        AdamO([nn.Parameter(th.ones(2, 2))], isometry_free_scale=True, isometry_rect_scale=True)


@pytest.mark.parametrize("off", [dict(isometry_mode="off", optimizer="adam"), dict(isometry_coef=0.0)],
                         ids=["mode-off", "coef-0"])
def test_penalty_options_without_a_penalty_say_so(off):
    """The penalty's options cannot act without a penalty: they are named in a warning, not dropped silently."""
    with pytest.warns(UserWarning, match=r"isometry_normalize=True, isometry_free_scale=True are ignored"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_free_scale=True, isometry_normalize=True, n_steps=64, **off)


def test_plastic_model_carries_it_through_save_and_load(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", activation="relu", isometry_coef=0.2, isometry_scale=2.0,
                       isometry_free_scale=True, n_steps=64, batch_size=32, n_epochs=1, seed=0,
                       policy_kwargs=dict(net_arch=[16, 16]))
    groups = [g for g in model.policy.optimizer.param_groups if g["isometry_coef"] > 0]
    assert groups and all(g["isometry_free_scale"] is True for g in groups)
    model.learn(128)
    model.save(tmp_path / "m")
    loaded = PlasticPPO.load(tmp_path / "m")
    assert loaded.policy.isometry_config.isometry_free_scale is True
    assert all(g["isometry_free_scale"] is True for g in loaded.policy.optimizer.param_groups if g["isometry_coef"] > 0)
    # the default is off: the group of a default model says so
    default = PlasticPPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0)
    assert all(g["isometry_free_scale"] is False for g in default.policy.optimizer.param_groups)
