"""``isometry_side``: the isometry penalty on one side of its target only (this library's ablation).

``R_floor = 1/2 sum_i min(sigma_i^2 - t, 0)^2`` and ``R_ceiling = 1/2 sum_i max(sigma_i^2 - t, 0)^2`` over the
``min(out, in)`` singular values: checked against an SVD (values, autograd of the SVD formula, the analytic gradient),
their sum against the penalty, a degenerate spectrum (an orthogonal matrix, where ``eigh``'s eigenvectors are
arbitrary), AdamO's decoupled and coupled steps against hand-written steps, the keyword on all eight algorithms, save /
load, and the errors.
"""

from __future__ import annotations

import pytest
import torch as th
from torch import nn

from sb3_plastic import AdamO, IsometryConfig, PlasticPPO
from sb3_plastic.isometry import isometry_penalty, isometry_penalty_grad
from sb3_plastic.optim import MAX_ISOMETRY_STEP, with_isometry_step
from tests.test_default_isometry_coef import CASES, _model
from tests.test_isometry_free_scale import spectrum_after_isometry_steps

SHAPES = {"square": (5, 5), "wide": (3, 7), "tall": (8, 3), "conv": (4, 2, 3, 3)}
CLIP = {"floor": lambda e: e.clamp(max=0.0), "ceiling": lambda e: e.clamp(min=0.0), "both": lambda e: e}


def svd_penalty(w: th.Tensor, side: str, target: float = 1.0) -> th.Tensor:
    """``1/2 sum_i f(sigma_i^2 - t)^2`` from the singular values of the matrix view (``f`` the side's clip)."""
    sq = th.linalg.svdvals(w.reshape(w.shape[0], -1)).square()
    return 0.5 * CLIP[side](sq - target).square().sum()


def mixed_spectrum(shape: tuple, seed: int) -> th.Tensor:
    """A float64 weight whose singular values straddle 1 (0.4 .. 1.8), so both sides are non-zero."""
    gen = th.Generator().manual_seed(seed)
    rows, cols = shape[0], int(th.tensor(shape[1:]).prod())
    u, _, vh = th.linalg.svd(th.randn(rows, cols, generator=gen, dtype=th.float64), full_matrices=False)
    sigma = th.linspace(0.4, 1.8, min(rows, cols), dtype=th.float64)
    return (u @ th.diag(sigma) @ vh).reshape(shape)


@pytest.mark.parametrize("side", ["floor", "ceiling"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_penalty_and_gradient_against_the_svd(shape, side):
    w = mixed_spectrum(shape, sum(shape))
    expected = svd_penalty(w, side)
    assert float(expected) > 1e-3  # the weight has singular values on both sides of 1
    assert float(isometry_penalty(w, side=side)) == pytest.approx(float(expected), rel=1e-10)
    v = w.clone().requires_grad_(True)
    svd_penalty(v, side).backward()
    th.testing.assert_close(isometry_penalty_grad(w, side=side), v.grad)
    # autograd of isometry_penalty itself gives the same gradient (the penalty is written to be differentiated)
    a = w.clone().requires_grad_(True)
    isometry_penalty(a, side=side).backward()
    th.testing.assert_close(a.grad, v.grad)
    d = min(w.shape[0], w[0].numel())
    th.testing.assert_close(isometry_penalty_grad(w, side=side, normalize=True), v.grad / d)


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_the_two_sides_add_up_to_the_penalty(shape):
    w = mixed_spectrum(shape, 11)
    for scale in (1.0, 2.0):
        total = isometry_penalty(w, scale, side="floor") + isometry_penalty(w, scale, side="ceiling")
        assert float(total) == pytest.approx(float(isometry_penalty(w, scale)), rel=1e-10)
        grads = isometry_penalty_grad(w, scale, side="floor") + isometry_penalty_grad(w, scale, side="ceiling")
        th.testing.assert_close(grads, isometry_penalty_grad(w, scale))


def test_a_spectrum_on_one_side_is_free_on_the_other():
    """SB3's orthogonal init at gain sqrt(2) (every sigma^2 = 2, a degenerate spectrum): the floor at s = 1 costs
    nothing, the ceiling is the whole penalty; at s = 4 the reverse."""
    q = th.linalg.qr(th.randn(16, 6, generator=th.Generator().manual_seed(2), dtype=th.float64))[0] * 2**0.5
    for w in (q, q.T):
        assert float(isometry_penalty(w, side="floor")) == pytest.approx(0.0, abs=1e-20)
        assert float(isometry_penalty_grad(w, side="floor").abs().max()) < 1e-12
        th.testing.assert_close(isometry_penalty_grad(w, side="ceiling"), isometry_penalty_grad(w))
        th.testing.assert_close(isometry_penalty_grad(w, 4.0, side="floor"), isometry_penalty_grad(w, 4.0))
        assert float(isometry_penalty_grad(w, 4.0, side="ceiling").abs().max()) < 1e-12


def test_blocks_are_one_sided_each():
    w = th.cat([mixed_spectrum((4, 5), 1), 2.0 * mixed_spectrum((4, 5), 2), 0.5 * mixed_spectrum((4, 5), 3)])
    for side in ("floor", "ceiling"):
        per_block = sum(float(svd_penalty(w[i * 4:(i + 1) * 4], side)) for i in range(3))
        assert float(isometry_penalty(w, blocks=3, side=side)) == pytest.approx(per_block, rel=1e-10)
        grads = th.cat([isometry_penalty_grad(w[i * 4:(i + 1) * 4], side=side) for i in range(3)])
        th.testing.assert_close(isometry_penalty_grad(w, blocks=3, side=side), grads)


def hand_step(w: th.Tensor, lr: float, lam: float, side: str) -> th.Tensor:
    """AdamO's decoupled step on one side, written out from the SVD: ``W - c * 2 W V f(Lambda - 1) V^T`` (tall;
    ``V``, ``Lambda`` from the SVD of ``W``), ``c = min(lr * lam, MAX_ISOMETRY_STEP / (2 * bound))``, ``bound`` the
    largest absolute row sum of ``W^T W``."""
    w = w.double()
    _, sigma, vh = th.linalg.svd(w, full_matrices=False)
    residual = vh.T @ th.diag(CLIP[side](sigma.square() - 1.0)) @ vh
    bound = max(float((w.T @ w).abs().sum(dim=1).max()), 1.0)
    c = min(lr * lam, MAX_ISOMETRY_STEP / (2 * bound))
    return (w - c * 2 * w @ residual).float()


@pytest.mark.parametrize("side", ["floor", "ceiling"])
@pytest.mark.parametrize("lam", [0.3, 500.0], ids=["free", "clamped"])
def test_decoupled_step_against_a_hand_written_step(lam, side):
    """With a zero task gradient Adam moves nothing, so one AdamO step is the one-sided isometry step alone."""
    w0 = mixed_spectrum((8, 3), 7).float()
    w = nn.Parameter(w0.clone())
    opt = AdamO([w], lr=1e-2, isometry_coef=lam, isometry_side=side)
    w.grad = th.zeros_like(w)
    opt.step()
    th.testing.assert_close(w.detach(), hand_step(w0, 1e-2, lam, side), rtol=1e-5, atol=1e-6)


def test_block_step_is_one_sided_per_block():
    w0 = th.cat([mixed_spectrum((4, 3), 4), 1.5 * mixed_spectrum((4, 3), 5)]).float()
    w = nn.Parameter(w0.clone())
    opt = AdamO([dict(params=[w], isometry_blocks=2)], lr=1e-2, isometry_coef=0.3, isometry_side="floor")
    w.grad = th.zeros_like(w)
    opt.step()
    expected = th.cat([hand_step(w0[:4], 1e-2, 0.3, "floor"), hand_step(w0[4:], 1e-2, 0.3, "floor")])
    th.testing.assert_close(w.detach(), expected, rtol=1e-5, atol=1e-6)


def test_steps_move_only_the_penalised_side():
    """Many steps with zero task gradient: the floor lifts the singular values below 1 to 1 and leaves those above
    it; the ceiling brings those above down to 1 and leaves those below."""
    w0 = mixed_spectrum((16, 8), 0).float()
    sigma0 = th.linalg.svdvals(w0)
    out = {side: spectrum_after_isometry_steps(w0, isometry_side=side) for side in ("floor", "ceiling")}
    above = sigma0 > 1.0
    th.testing.assert_close(out["floor"][above], sigma0[above], rtol=1e-4, atol=1e-5)
    assert th.allclose(out["floor"][~above], th.ones(int((~above).sum())), atol=2e-3)
    th.testing.assert_close(out["ceiling"][~above], sigma0[~above], rtol=1e-4, atol=1e-5)
    assert th.allclose(out["ceiling"][above], th.ones(int(above.sum())), atol=2e-3)


@pytest.mark.parametrize("side", ["floor", "ceiling"])
def test_coupled_mode_is_adam_on_the_loss_plus_the_one_sided_penalty(side):
    """Coupled mode against torch's Adam on ``<g, W> + lambda * R_side(W)`` differentiated through the SVD."""
    w0 = mixed_spectrum((3, 7), 6).float()
    g = th.randn(3, 7, generator=th.Generator().manual_seed(5))
    w = nn.Parameter(w0.clone())
    opt = AdamO([w], lr=1e-2, isometry_coef=0.4, isometry_mode="coupled", isometry_side=side)
    w.grad = g.clone()
    opt.step()
    ref = w0.double().requires_grad_(True)
    ((g.double() * ref).sum() + 0.4 * svd_penalty(ref, side)).backward()
    ref_param = nn.Parameter(w0.clone())
    ref_param.grad = ref.grad.float()
    th.optim.Adam([ref_param], lr=1e-2).step()
    th.testing.assert_close(w.detach(), ref_param.detach(), rtol=1e-6, atol=1e-7)


def test_any_optimizer_with_the_step_takes_it():
    w0 = mixed_spectrum((8, 3), 8).float()
    w = nn.Parameter(w0.clone())
    opt = with_isometry_step(th.optim.SGD)([w], lr=1e-2, isometry_coef=0.3, isometry_side="ceiling")
    w.grad = th.zeros_like(w)
    opt.step()
    th.testing.assert_close(w.detach(), hand_step(w0, 1e-2, 0.3, "ceiling"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls,env_id,expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_the_keyword_reaches_every_isometry_group(cls: type, env_id: str, expected: float) -> None:
    del expected
    for side in ("both", "floor"):
        model = _model(cls, env_id, **({} if side == "both" else dict(isometry_side=side)))
        assert model.isometry_config.isometry_side == side
        parts = [model.policy, getattr(model.policy, "actor", None), getattr(model.policy, "critic", None)]
        groups = [g for part in parts if getattr(part, "optimizer", None) is not None for g in part.optimizer.param_groups]
        assert groups and all(g["isometry_side"] == side for g in groups)


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match=r"isometry_side must be one of \['both', 'floor', 'ceiling'\], got 'low'"):
        IsometryConfig(isometry_side="low")
    with pytest.raises(ValueError, match=r"isometry_side must be one of .* got None"):
        AdamO([nn.Parameter(th.ones(2, 2))], isometry_side=None)
    with pytest.raises(ValueError, match=r"isometry_side='floor' takes a fixed target; isometry_free_scale=True"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_side="floor", isometry_free_scale=True)
    with pytest.raises(ValueError, match=r"isometry_side='ceiling' takes a fixed target"):
        isometry_penalty(th.ones(2, 2), side="ceiling", free_scale=True)


def test_without_a_penalty_it_is_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"isometry_side='floor' (is|are) ignored"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_side="floor", isometry_coef=0.0, n_steps=64)


def test_plastic_model_carries_it_through_save_and_load(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", activation="relu", isometry_coef=0.2, isometry_side="ceiling",
                       n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[16, 16]))
    model.learn(128)
    model.save(tmp_path / "m")
    loaded = PlasticPPO.load(tmp_path / "m")
    assert loaded.policy.isometry_config.isometry_side == "ceiling"
    assert all(g["isometry_side"] == "ceiling" for g in loaded.policy.optimizer.param_groups if g["isometry_coef"] > 0)
    # the loaded optimizer steps as the saved one: one step from the same gradients moves the weights alike
    for opt in (model.policy.optimizer, loaded.policy.optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = th.ones_like(p)
        opt.step()
    for a, b in zip(model.policy.parameters(), loaded.policy.parameters()):
        th.testing.assert_close(a, b)
