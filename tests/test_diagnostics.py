"""Every diagnostic of sb3_plastic.diagnostics against an independent computation on a constructed case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN
from torch import nn

from sb3_plastic import MaxMin, PlasticDQN
from sb3_plastic.common.surgery import HiddenLayer, find_networks
from sb3_plastic.diagnostics import (
    COND_CAP,
    capture_features,
    dfi,
    distance_from_init,
    dormant_fraction,
    effective_rank,
    effective_rank_from_values,
    empirical_ntk,
    feature_norm,
    feature_singular_values,
    feature_variance,
    gradient_norm,
    kernel_stats,
    module_function,
    network_diagnostics,
    network_norms,
    network_output_function,
    output_gradient_norm,
    spec_parameters,
    srank,
    srank_from_singular_values,
    weight_norm,
    weight_spectrum,
    zero_fraction,
)
from sb3_plastic.isometry import orthogonal_init_network_


def orthonormal(rows: int, cols: int, seed: int) -> th.Tensor:
    q, _ = th.linalg.qr(th.randn(rows, cols, generator=th.Generator().manual_seed(seed), dtype=th.float64))
    return q


def with_singular_values(s: list[float], n: int, f: int) -> th.Tensor:
    """``U diag(s) V^T`` with orthonormal ``U (n, r)`` and ``V (f, r)``."""
    return orthonormal(n, len(s), 0) @ th.diag(th.tensor(s, dtype=th.float64)) @ orthonormal(f, len(s), 1).T


# ---------------------------------------------------------------------------------------------------
# Dead and dormant units
# ---------------------------------------------------------------------------------------------------
def dead_relu_layer() -> tuple[nn.Linear, th.Tensor]:
    th.manual_seed(0)
    layer = nn.Linear(5, 8)
    with th.no_grad():
        layer.weight.abs_()
        layer.bias.fill_(0.1)
        layer.weight[[0, 3]] = 0.0  # dead: always relu(-1) = 0
        layer.bias[[0, 3]] = -1.0
        layer.weight[5] *= 1e-4  # dormant, not dead: tiny positive activity
        layer.bias[5] = 1e-5
    x = th.rand(64, 5)
    return layer, x


def test_dead_and_dormant_units_of_a_constructed_layer():
    layer, x = dead_relu_layer()
    h = th.relu(layer(x)).detach()
    # by hand: ReDo score = mean|h_i| / mean_j mean|h_j|
    activity = h.abs().mean(dim=0).numpy()
    scores = activity / activity.mean()
    assert set(np.nonzero(scores <= 0.025)[0]) == {0, 3, 5}
    assert dormant_fraction(h, tau=0.025) == pytest.approx(3 / 8)
    assert zero_fraction(h) == pytest.approx(2 / 8)
    # conv-shaped activations: a unit is a channel, dead if zero at every position of every sample
    conv_h = h.view(64, 8, 1, 1).expand(64, 8, 2, 3).contiguous()
    assert zero_fraction(conv_h) == pytest.approx(2 / 8)
    assert dormant_fraction(conv_h) == pytest.approx(3 / 8)


def test_maxmin_pair_is_dead_only_if_both_features_are():
    h = th.randn(10, 6)
    h[:, 0] = 0.0  # half of pair 0
    h[:, 2:4] = 0.0  # all of pair 1
    assert zero_fraction(h, group_size=1) == pytest.approx(3 / 6)
    assert zero_fraction(h, group_size=2) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        zero_fraction(th.zeros(4, 5), group_size=2)


def test_network_diagnostics_find_the_dead_units_of_a_model_layer():
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16, 16]), seed=0)
    spec = find_networks(model)[0]
    first = spec.hidden_layers()[0]
    with th.no_grad():
        first.layer.weight[[1, 4, 7]] = 0.0
        first.layer.bias[[1, 4, 7]] = -1.0
    obs = th.randn(50, 4)
    out = network_diagnostics(model, spec, obs, ntk_size=0)
    h = th.relu(first.layer(obs)).detach()
    assert out[f"{first.name}/zero_fraction"] == pytest.approx(3 / 16)
    assert out[f"{first.name}/dormant_fraction"] == pytest.approx(dormant_fraction(h))
    assert out[f"{first.name}/srank"] == srank(h)


# ---------------------------------------------------------------------------------------------------
# Feature rank and norm
# ---------------------------------------------------------------------------------------------------
def test_srank_and_effective_rank_of_features_with_known_singular_values():
    s = [10.0, 5.0, 2.0, 1.0, 0.5, 0.05, 0.02]
    features = with_singular_values(s, 40, 12).float()
    # by hand: cumulative share 10/18.57=.54, 15/..=.81, 17/..=.92, 18/..=.969, 18.5/..=.9962 >= .99 -> 5
    total = sum(s)
    k = next(i + 1 for i in range(len(s)) if sum(s[: i + 1]) / total >= 0.99)
    assert k == 5
    assert srank(features) == 5
    assert srank(features, delta=0.1) == 3  # 17 / 18.57 = 0.915 >= 0.9
    p = np.array(s) / total
    assert effective_rank(features) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-5)
    # a conv-shaped (N, C, H, W) feature map is the same matrix reshaped
    assert srank(features.view(40, 3, 2, 2)) == 5
    # degenerate cases
    assert srank(th.zeros(8, 4)) == 0 and effective_rank(th.zeros(8, 4)) == 0.0
    assert effective_rank(with_singular_values([3.0, 3.0, 3.0], 10, 6)) == pytest.approx(3.0)


def random_features(kind: str, seed: int) -> th.Tensor:
    """Float32 feature-like matrices: tall / wide ReLU features, low-rank, rank-deficient with repeated rows."""
    g = th.Generator().manual_seed(seed)
    if kind == "tall":
        return th.relu(th.randn(300, 40, generator=g))
    if kind == "wide":
        return th.relu(th.randn(64, 900, generator=g) + 0.3)
    if kind == "low-rank":  # rank 7 (floating zeros beyond)
        return th.randn(120, 7, generator=g) @ th.randn(7, 200, generator=g)
    if kind == "repeated-rows":  # a probe batch with repeated observations: rank 20 of 100 rows
        return th.relu(th.randn(20, 500, generator=g)).repeat(5, 1)
    if kind == "decaying":  # singular values 1 ... 1e-6, geometric
        return with_singular_values([10.0 ** (-6 * i / 49) for i in range(50)], 80, 60).float()
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["tall", "wide", "low-rank", "repeated-rows", "decaying"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_feature_singular_values_match_svdvals(kind, seed):
    """The Gram-matrix singular values give the srank and effective rank of float64 ``svdvals``, and values within
    ~1e-8 of sigma_max."""
    h = random_features(kind, seed)
    exact = th.linalg.svdvals(h.double())
    fast = feature_singular_values(h)
    assert fast.dtype == th.float64 and fast.shape == exact.shape
    assert th.all(fast[:-1] >= fast[1:])
    assert th.allclose(fast, exact, rtol=0, atol=1e-7 * float(exact[0]))
    for delta in (0.01, 0.1):
        assert srank_from_singular_values(fast, delta) == srank_from_singular_values(exact, delta)
        assert srank(h, delta) == srank_from_singular_values(exact, delta)
    assert effective_rank_from_values(fast) == pytest.approx(effective_rank_from_values(exact), rel=1e-6)
    assert effective_rank(h) == pytest.approx(effective_rank_from_values(exact), rel=1e-6)


def test_fast_feature_singular_values_fall_back_when_tiny_values_matter():
    """Many singular values below the Gram's resolution (~1e-8 sigma_max): the plain Gram recipe loses them and misses
    the effective rank, the fallback to svdvals keeps it exact."""
    s = [1.0] + [1e-9] * 300
    h = with_singular_values(s, 400, 320)
    exact = th.linalg.svdvals(h)
    gram = th.linalg.eigvalsh(h.T @ h).clamp(min=0).sqrt().flip(0)
    naive, true = effective_rank_from_values(gram), effective_rank_from_values(exact)
    assert abs(naive / true - 1) > 1e-6  # the Gram values alone would be off (this case tests the fallback)
    assert effective_rank(h) == pytest.approx(true, rel=1e-9)
    assert th.allclose(feature_singular_values(h), exact)
    # a cumulative share at 1 - delta up to rounding (99 of 100 equal values): decided as svdvals decides it
    tie = with_singular_values([1.0] * 99 + [0.999999999], 150, 120)
    assert srank(tie) == srank_from_singular_values(th.linalg.svdvals(tie))


@pytest.mark.parametrize("shape", [(64, 576), (512, 3136), (300, 40), (1, 50)])
def test_weight_spectrum_matches_svdvals(shape):
    g = th.Generator().manual_seed(3)
    w = th.randn(*shape, generator=g) / math.sqrt(shape[1])
    s = th.linalg.svdvals(w.double())
    spectrum = weight_spectrum(w)
    assert spectrum["sigma_max"] == pytest.approx(float(s[0]), rel=1e-9)
    assert spectrum["sigma_min"] == pytest.approx(float(s[-1]), rel=1e-7)
    # ill-conditioned (cond 1e6): svdvals, exact sigma_min
    bad = with_singular_values([1.0, 1e-3, 1e-6], 3, 5)
    assert weight_spectrum(bad)["sigma_min"] == pytest.approx(1e-6, rel=1e-7)
    assert weight_spectrum(bad)["cond"] == pytest.approx(1e6, rel=1e-7)


def test_capture_features_keeps_a_repeated_identical_output_once():
    layer = nn.Linear(3, 4)
    hidden = HiddenLayer(name="l", layer=layer, activation=nn.ReLU())
    x, y = th.randn(5, 3), th.randn(2, 3)
    (h,) = capture_features([hidden], lambda: (layer(x), layer(x), layer(y)))
    assert h.shape == (7, 4)  # x once, then y
    assert th.allclose(h, th.relu(layer(th.cat([x, y]))).detach())


def test_feature_norm_is_the_mean_per_sample_norm():
    h = th.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
    assert feature_norm(h) == pytest.approx((5 + 1 + 10) / 3)


def test_feature_variance_is_plasticines_mean_per_sample_variance_across_units():
    """By hand: each sample's unbiased variance over its units, averaged over the batch (a conv map flattened to
    C*H*W units); a one-unit layer has none (0, not NaN)."""
    h = th.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [2.0, 4.0, 9.0]])
    per_sample = [sum((v - sum(r) / 3) ** 2 for v in r) / 2 for r in ([1, 2, 3], [0, 0, 0], [2, 4, 9])]
    assert feature_variance(h) == pytest.approx(sum(per_sample) / 3)  # (1 + 0 + 13) / 3
    g = th.Generator().manual_seed(0)
    conv = th.randn(4, 2, 3, 3, generator=g)
    assert feature_variance(conv) == pytest.approx(float(conv.reshape(4, -1).double().var(dim=1).mean()))
    assert feature_variance(th.ones(5, 1)) == 0.0


# ---------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------
def test_weight_norm_distance_and_spectrum():
    w = with_singular_values([4.0, 2.0, 0.5], 5, 3).float()
    assert weight_norm(w) == pytest.approx(math.sqrt(16 + 4 + 0.25), rel=1e-5)
    spectrum = weight_spectrum(w)
    assert spectrum["sigma_max"] == pytest.approx(4.0, rel=1e-5)
    assert spectrum["sigma_min"] == pytest.approx(0.5, rel=1e-5)
    assert spectrum["cond"] == pytest.approx(8.0, rel=1e-5)
    # a conv kernel (out, in, kh, kw) is its (out, in*kh*kw) matrix
    kernel = with_singular_values([3.0, 1.0], 2, 8).float().view(2, 2, 2, 2)
    assert weight_spectrum(kernel)["cond"] == pytest.approx(3.0, rel=1e-5)
    assert weight_spectrum(th.zeros(3, 3))["cond"] == COND_CAP  # all-zero: numerically singular
    singular = th.diag(th.tensor([2.0, 0.0]))
    assert weight_spectrum(singular)["cond"] == COND_CAP
    # distance from init: every entry moved by c -> c * sqrt(numel)
    init = w.clone()
    assert distance_from_init(w + 0.1, init) == pytest.approx(0.1 * math.sqrt(15), rel=1e-5)
    norm, dist = network_norms({"a": w + 0.1, "b": th.ones(4)}, {"a": init, "b": th.ones(4)})
    assert norm == pytest.approx(math.sqrt(float((w + 0.1).double().square().sum()) + 4), rel=1e-6)
    assert dist == pytest.approx(0.1 * math.sqrt(15), rel=1e-5)
    assert network_norms({"a": w})[1] is None


def test_dfi_of_an_orthogonal_maxmin_network_is_zero():
    net = nn.Sequential(nn.Linear(6, 16), MaxMin(), nn.Linear(16, 16), MaxMin(), nn.Linear(16, 3))
    orthogonal_init_network_(net)
    for layer in (net[0], net[2], net[4]):
        assert dfi(layer.weight) == pytest.approx(0.0, abs=1e-9)
    model = PlasticDQN("MlpPolicy", "CartPole-v1", activation="maxmin", policy_kwargs=dict(net_arch=[16, 16]), seed=0)
    spec = find_networks(model)[0]
    out = network_diagnostics(model, spec, th.randn(20, 4), ntk_size=0)
    for layer in spec.weight_layers():
        assert out[f"{spec.layer_names[id(layer)]}/dfi"] == pytest.approx(0.0, abs=1e-9)
    assert out["dfi"] == pytest.approx(0.0, abs=1e-9)
    # an independent value: W = 2 I (n x n) -> ||4 I - I||_F^2 = 9 n
    scaled = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[4]), seed=0)
    scaled_spec = find_networks(scaled)[0]
    hidden = scaled_spec.hidden_layers()[0]
    with th.no_grad():
        hidden.layer.weight.copy_(2 * th.eye(4))
    assert network_diagnostics(scaled, scaled_spec, th.randn(5, 4), ntk_size=0)[f"{hidden.name}/dfi"] == pytest.approx(36.0)


def _svd_dfi(w: th.Tensor) -> float:
    """Independent reference: ``||G - I||_F^2`` of the smaller Gram matrix is ``sum (sigma_i^2 - 1)^2`` over the
    ``min(out, in)`` singular values."""
    sigma = th.linalg.svdvals(w.detach().double().flatten(1))
    return float((sigma.square() - 1).square().sum())


def test_hidden_layer_dfi_leaves_out_the_heads():
    """``dfi_hidden`` sums the non-head layers only: a head that grows moves ``dfi``, not ``dfi_hidden``."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8, 6]), seed=0)
    spec = find_networks(model)[0]
    heads = {id(h) for h in spec.heads()}
    assert {spec.layer_names[id(h)] for h in spec.heads()} == {"action_net", "value_net"}
    obs = th.randn(10, 4, generator=th.Generator().manual_seed(0))
    out = network_diagnostics(model, spec, obs, ntk_size=0)
    hidden_ref = sum(_svd_dfi(m.weight) for m in spec.weight_layers() if id(m) not in heads)
    head_ref = sum(_svd_dfi(m.weight) for m in spec.weight_layers() if id(m) in heads)
    assert hidden_ref > 0 and head_ref > 0
    assert out["dfi_hidden"] == pytest.approx(hidden_ref, rel=1e-5)
    assert out["dfi"] == pytest.approx(hidden_ref + head_ref, rel=1e-5)
    with th.no_grad():
        model.policy.value_net.weight.mul_(10.0)
    grown = network_diagnostics(model, spec, obs, ntk_size=0)
    assert grown["dfi_hidden"] == pytest.approx(out["dfi_hidden"], rel=1e-9)
    assert grown["dfi"] > out["dfi"] + 1.0
    assert grown["dfi"] == pytest.approx(hidden_ref + sum(
        _svd_dfi(m.weight) for m in spec.weight_layers() if id(m) in heads), rel=1e-5)


def _svd_dfi_free(w: th.Tensor, blocks: int = 1) -> float:
    """Independent reference of the scale-free DfI: ``sum (sigma_i^2 - mean sigma^2)^2`` over each row block's
    ``min(out, in)`` singular values."""
    total = 0.0
    for block in w.detach().double().flatten(1).chunk(blocks, dim=0):
        sq = th.linalg.svdvals(block).square()
        total += float((sq - sq.mean()).square().sum())
    return total


@pytest.mark.parametrize("shape,blocks", [((7, 3), 1), ((3, 7), 1), ((5, 5), 1), ((12, 5), 4), ((4, 2, 3, 3), 1)])
def test_scale_free_dfi_matches_the_svd(shape, blocks):
    """``deviation_from_isometry(free_scale=True)`` is the spread of the squared singular values about their mean
    (per block), whatever ``scale``; 0 for ``c Q``; the fixed-scale DfI of ``c Q`` is not."""
    from sb3_plastic.isometry import deviation_from_isometry

    w = th.randn(*shape, generator=th.Generator().manual_seed(3))
    ref = _svd_dfi_free(w, blocks)
    assert ref > 1e-3
    assert deviation_from_isometry(w, blocks=blocks, free_scale=True) == pytest.approx(ref, rel=1e-4)
    assert deviation_from_isometry(w, 5.0, blocks, free_scale=True) == pytest.approx(ref, rel=1e-4)
    q = th.empty(6, 4)
    th.nn.init.orthogonal_(q, gain=3.0, generator=th.Generator().manual_seed(0))
    assert deviation_from_isometry(q, free_scale=True) < 1e-8
    assert deviation_from_isometry(q) == pytest.approx(4 * (9 - 1) ** 2, rel=1e-4)


def test_network_scale_free_dfi_sums_layers_and_ignores_a_uniform_level():
    """``dfi_free`` / ``dfi_free_hidden`` are the sums of the per-layer SVD reference (all layers / no heads); a layer
    set to ``c Q`` adds nothing to them however large ``c``, where it moves ``dfi``."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8, 6]), seed=0)
    spec = find_networks(model)[0]
    heads = {id(h) for h in spec.heads()}
    obs = th.randn(10, 4, generator=th.Generator().manual_seed(0))
    out = network_diagnostics(model, spec, obs, ntk_size=0)
    hidden = sum(_svd_dfi_free(m.weight) for m in spec.weight_layers() if id(m) not in heads)
    every = sum(_svd_dfi_free(m.weight) for m in spec.weight_layers())
    assert 0 < hidden < every
    assert out["dfi_free_hidden"] == pytest.approx(hidden, rel=1e-4)
    assert out["dfi_free"] == pytest.approx(every, rel=1e-4)
    layer = model.policy.mlp_extractor.policy_net[0]
    before = _svd_dfi_free(layer.weight)
    with th.no_grad():
        th.nn.init.orthogonal_(layer.weight, gain=7.0, generator=th.Generator().manual_seed(1))
    after = network_diagnostics(model, spec, obs, ntk_size=0)
    assert after["dfi_free_hidden"] == pytest.approx(hidden - before, rel=1e-4, abs=1e-4)
    assert after["dfi_hidden"] > out["dfi_hidden"] + 100


def _svd_sides(w: th.Tensor, scale: float = 1.0, blocks: int = 1) -> tuple[float, float]:
    """Independent reference of the DfI's two sides: ``sum (sigma_i^2 - s)^2`` over each row block's singular values
    below ``sqrt(s)`` and over those above."""
    floor = ceiling = 0.0
    for block in w.detach().double().flatten(1).chunk(blocks, dim=0):
        e = th.linalg.svdvals(block).square() - scale
        floor += float(e[e < 0].square().sum())
        ceiling += float(e[e > 0].square().sum())
    return floor, ceiling


@pytest.mark.parametrize("shape,blocks", [((7, 3), 1), ((3, 7), 1), ((5, 5), 1), ((12, 5), 4), ((4, 2, 3, 3), 1)])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_dfi_sides_match_the_svd_and_add_up_to_the_dfi(shape, blocks, scale):
    """``deviation_from_isometry_sides`` is the SVD reference on each side of ``sqrt(s)`` (per block), the two parts
    add up to the DfI, and both sides are present in a Gaussian draw at this scale."""
    from sb3_plastic.isometry import deviation_from_isometry, deviation_from_isometry_sides

    w = th.randn(*shape, generator=th.Generator().manual_seed(4))
    d = min(shape[0] // blocks, math.prod(shape[1:]))
    w = w * (scale * d * blocks / float(w.square().sum())) ** 0.5  # mean squared singular value s: both sides
    floor, ceiling = deviation_from_isometry_sides(w, scale, blocks)
    ref_floor, ref_ceiling = _svd_sides(w, scale, blocks)
    assert ref_floor > 1e-3 and ref_ceiling > 1e-3
    assert floor == pytest.approx(ref_floor, rel=1e-6)
    assert ceiling == pytest.approx(ref_ceiling, rel=1e-6)
    assert floor + ceiling == pytest.approx(deviation_from_isometry(w, scale, blocks), rel=1e-5)


def test_dfi_sides_of_scaled_orthogonal_weights_and_non_finite_weights():
    """``c Q`` has all its DfI on one side: above the target for ``c > sqrt(s)``, below it for ``c < sqrt(s)``, none
    at ``c = sqrt(s)``; non-finite weights give NaN on both sides."""
    from sb3_plastic.isometry import deviation_from_isometry_sides

    q = th.empty(6, 4, dtype=th.float64)
    th.nn.init.orthogonal_(q, generator=th.Generator().manual_seed(0))
    floor, ceiling = deviation_from_isometry_sides(3.0 * q)
    assert floor == 0.0 and ceiling == pytest.approx(4 * (9 - 1) ** 2, rel=1e-9)
    floor, ceiling = deviation_from_isometry_sides(0.5 * q, 2.0)
    assert ceiling == 0.0 and floor == pytest.approx(4 * (0.25 - 2) ** 2, rel=1e-9)
    assert max(deviation_from_isometry_sides(2.0 ** 0.5 * q, 2.0)) < 1e-24
    bad = q.clone()
    bad[0, 0] = math.nan
    assert all(math.isnan(v) for v in deviation_from_isometry_sides(bad))
    with pytest.raises(ValueError, match="scale"):
        deviation_from_isometry_sides(q, -1.0)


def test_network_dfi_sides_sum_the_layers_and_tell_whether_a_floor_acts():
    """The monitor's ``<layer>/dfi_floor`` / ``dfi_ceiling`` are the SVD reference at the model's ``isometry_scale``,
    the network keys their sums (``..._hidden`` without the heads); a model whose hidden layers all sit above the
    target reads ``dfi_floor_hidden = 0`` and its ``isometry_side="floor"`` penalty is 0 there, while shrunk layers
    read twice the floor penalty."""
    from sb3_plastic import PlasticPPO
    from sb3_plastic.isometry import isometry_penalty

    model = PlasticPPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8, 6]), seed=0, device="cpu",
                       isometry_scale=2.0, isometry_side="floor")
    spec = find_networks(model)[0]
    heads = {id(h) for h in spec.heads()}
    hidden = [m for m in spec.weight_layers() if id(m) not in heads]
    obs = th.randn(10, 4, generator=th.Generator().manual_seed(0))
    with th.no_grad():
        for layer in hidden:
            layer.weight.mul_(1.5)  # orthogonal at sqrt(2): every singular value now above the target
    out = network_diagnostics(model, spec, obs, ntk_size=0, dfi_scale=2.0)
    for layer in spec.weight_layers():
        name = spec.layer_names[id(layer)]
        ref = _svd_sides(layer.weight, 2.0)
        assert out[f"{name}/dfi_floor"] == pytest.approx(ref[0], rel=1e-6, abs=1e-12)
        assert out[f"{name}/dfi_ceiling"] == pytest.approx(ref[1], rel=1e-6)
    assert out["dfi_floor_hidden"] == 0.0 and out["dfi_ceiling_hidden"] > 1.0
    assert sum(float(isometry_penalty(m.weight.detach(), 2.0, side="floor")) for m in hidden) == pytest.approx(0.0, abs=1e-9)
    head_sides = [_svd_sides(h.weight, 2.0) for h in spec.heads()]
    assert out["dfi_floor"] == pytest.approx(sum(f for f, _ in head_sides), rel=1e-6)
    assert out["dfi_ceiling"] == pytest.approx(out["dfi_ceiling_hidden"] + sum(c for _, c in head_sides), rel=1e-6)
    with th.no_grad():
        for layer in hidden:
            layer.weight.mul_(0.4)  # now below the target: only the floor side
    out = network_diagnostics(model, spec, obs, ntk_size=0, dfi_scale=2.0)
    floor_penalty = sum(float(isometry_penalty(m.weight.detach(), 2.0, side="floor")) for m in hidden)
    assert out["dfi_ceiling_hidden"] == 0.0 and floor_penalty > 1.0
    assert out["dfi_floor_hidden"] == pytest.approx(2 * floor_penalty, rel=1e-5)


# ---------------------------------------------------------------------------------------------------
# Gradients and NTK
# ---------------------------------------------------------------------------------------------------
def test_gradient_norms_against_manual_autograd():
    th.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = th.randn(10, 3), th.randn(10, 2)
    fn, params = module_function(net, x)
    value = gradient_norm(lambda p: (fn(p) - y).square().mean(), params)
    grads = th.autograd.grad((net(x) - y).square().mean(), list(net.parameters()))
    assert value == pytest.approx(float(th.sqrt(sum(g.square().sum() for g in grads))), rel=1e-5)
    # output gradient norm: sqrt(mean_k ||grad mean_n f_k(x_n)||^2)
    per_output = []
    for k in range(2):
        g = th.autograd.grad(net(x)[:, k].mean(), list(net.parameters()))
        per_output.append(float(sum(gi.square().sum() for gi in g)))
    expected = math.sqrt(sum(per_output) / 2)
    assert output_gradient_norm(fn, params) == pytest.approx(expected, rel=1e-5)
    assert output_gradient_norm(fn, params, max_elements=1) == pytest.approx(expected, rel=1e-5)
    assert all(p.grad is None for p in net.parameters())  # torch.func accumulated nothing


def test_ntk_of_a_linear_network_matches_its_closed_form():
    """f(x) = W2 W1 x. d f_k(x)/d W2 = e_k (W1 x)^T and d f_k(x)/d W1 = W2[k]^T x^T, so
    K[(n,k),(m,l)] = delta_kl (W1 x_n).(W1 x_m) + (W2 W2^T)_kl (x_n . x_m), i.e.
    K = kron(X W1^T W1 X^T, I) + kron(X X^T, W2 W2^T) with rows ordered (sample, output)."""
    th.manual_seed(0)
    d, h, o, n = 4, 6, 3, 5
    net = nn.Sequential(nn.Linear(d, h, bias=False), nn.Linear(h, o, bias=False))
    x = th.randn(n, d)
    w1, w2 = net[0].weight.detach().double(), net[1].weight.detach().double()
    xd = x.double()
    closed = th.kron(xd @ w1.T @ w1 @ xd.T, th.eye(o, dtype=th.float64)) + th.kron(xd @ xd.T, w2 @ w2.T)
    fn, params = module_function(net, x)
    ntk = empirical_ntk(fn, params)
    assert ntk.shape == (n * o, n * o)
    assert th.allclose(ntk, closed, rtol=1e-5, atol=1e-5)
    # the memory-bounded path (row blocks of J (J^T E) with forward-mode products) gives the same kernel
    assert th.allclose(empirical_ntk(fn, params, max_elements=3 * 60), closed, rtol=1e-5, atol=1e-5)
    assert all(p.grad is None for p in net.parameters())


def test_kernel_stats_of_a_kernel_with_known_eigenvalues():
    lam = th.tensor([8.0, 4.0, 2.0, 1.0], dtype=th.float64)
    q = orthonormal(4, 4, 3)
    stats = kernel_stats(q @ th.diag(lam) @ q.T)
    p = lam / lam.sum()
    assert stats["cond"] == pytest.approx(8.0)
    assert stats["erank"] == pytest.approx(float(th.exp(-(p * p.log()).sum())))
    assert stats["trace"] == pytest.approx(15 / 4)
    assert kernel_stats(th.diag(th.tensor([1.0, 0.0])))["cond"] == COND_CAP


def test_model_ntk_against_manual_jacobian_rows():
    """The NTK of a DQN's Q-network from its head outputs against J J^T built row by row with autograd."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8, 8]), seed=0)
    spec = find_networks(model)[0]
    obs = th.randn(6, 4)
    fn, params = network_output_function(model, spec, obs)
    q = spec.module(obs)
    assert th.allclose(fn(params), q)
    trained = list(spec.parameters())
    rows = []
    for n in range(6):
        for k in range(2):
            grads = th.autograd.grad(spec.module(obs)[n, k], trained)
            rows.append(th.cat([g.flatten() for g in grads]).double())
    jac = th.stack(rows)
    assert th.allclose(empirical_ntk(fn, params), jac @ jac.T, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in trained)
    assert set(spec_parameters(spec)) == {name for name, p in spec.module.named_parameters()}
