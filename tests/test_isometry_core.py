"""MaxMin, the isometry penalty and its gradient, DfI, orthogonal init and AdamO."""

import copy

import pytest
import torch as th
from torch import nn

from sb3_plastic import AdamO, MaxMin, activations, dfi_per_layer, get_activation, isometry_penalty, isometry_penalty_grad
from sb3_plastic.isometry import orthogonal_init_network_
from sb3_plastic.optim import reset_optimizer_state


def maxmin_reference(x: th.Tensor) -> th.Tensor:
    """Elementwise loop over adjacent pairs of dim 1."""
    out = x.clone()
    for i in range(0, x.shape[1], 2):
        a, b = x[:, i], x[:, i + 1]
        out[:, i] = th.where(a >= b, a, b)
        out[:, i + 1] = th.where(a >= b, b, a)
    return out


@pytest.mark.parametrize("shape", [(5, 6), (3, 4, 5, 7), (2, 8, 3), (64, 8, 8, 8)])
def test_maxmin_matches_elementwise_reference(shape):
    th.manual_seed(0)
    x = th.randn(*shape)
    y = MaxMin()(x)
    assert y.shape == x.shape
    assert th.equal(y, maxmin_reference(x))
    # norm preserving, and pairs along dim 1 (channels), not along the last axis
    assert th.allclose(y.norm(), x.norm())
    if len(shape) == 4:
        assert th.equal(y[:, 0], th.maximum(x[:, 0], x[:, 1]))


def test_maxmin_gradient_norm_preserved_and_no_arg_constructor():
    th.manual_seed(0)
    x = th.randn(4, 10, requires_grad=True)
    g = th.randn(4, 10)
    MaxMin()(x).backward(g)
    assert th.allclose(x.grad.norm(), g.norm())
    assert get_activation("maxmin") is MaxMin


def _gather_only(monkeypatch):
    monkeypatch.setattr(activations, "BITWISE_MIN_NUMEL", 2**62)


def _special_values(x: th.Tensor) -> th.Tensor:
    """Ties, signed zeros, NaN and infinities in some pairs of a (N, C, ...) input."""
    x = x.clone()
    x[:, 0] = x[:, 1]  # ties
    x[0, 2], x[0, 3] = -0.0, 0.0
    x[1, 2], x[1, 3] = 0.0, -0.0
    x[0, 4].view(-1)[0], x[1, 5].view(-1)[0] = float("nan"), float("nan")
    x[2, 4].view(-1)[0], x[2, 5].view(-1)[0] = float("inf"), -float("inf")
    return x


@pytest.mark.parametrize("dtype", [th.float32, th.float64, th.float16, th.bfloat16])
def test_maxmin_bitwise_path_gives_the_gather_paths_bits(monkeypatch, dtype):
    """The fast path for conv feature maps (a masked swap of raw bits) against the gather path: the same bits
    forward and backward, ties, signed zeros, NaN and infinities included."""
    th.manual_seed(0)
    x = _special_values(th.randn(32, 8, 12, 12)).to(dtype).requires_grad_()
    g = th.randn(x.shape).to(dtype)
    g[3, 0].view(-1)[0] = float("inf")
    assert activations._takes_bitwise_path(x)
    y = MaxMin()(x)
    (gx,) = th.autograd.grad(y, x, g)
    _gather_only(monkeypatch)
    assert not activations._takes_bitwise_path(x)
    y_ref = MaxMin()(x)
    (gx_ref,) = th.autograd.grad(y_ref, x, g)
    as_int = activations._SAME_WIDTH_INT[dtype]
    assert th.equal(y.detach().view(as_int), y_ref.detach().view(as_int))
    assert th.equal(gx.view(as_int), gx_ref.view(as_int))
    # pairs along channels: channel 0 of the output is the larger of input channels 0 and 1 (finite entries)
    finite = x.detach()[4:, :2].float()
    assert th.equal(y.detach()[4:, 0].float(), th.maximum(finite[:, 0], finite[:, 1]))


def test_maxmin_bitwise_path_on_mlp_inputs_when_forced(monkeypatch):
    """(N, F) inputs take the gather path by default (planes of 1); forced, the bitwise path gives the same bits."""
    th.manual_seed(0)
    x = _special_values(th.randn(64, 12, 1))[:, :, 0].contiguous().requires_grad_()
    g = th.randn(x.shape)
    assert not activations._takes_bitwise_path(x)
    y_ref = MaxMin()(x)
    (gx_ref,) = th.autograd.grad(y_ref, x, g)
    monkeypatch.setattr(activations, "BITWISE_MIN_NUMEL", 1)
    monkeypatch.setattr(activations, "BITWISE_MIN_PLANE", 1)
    assert activations._takes_bitwise_path(x)
    y = MaxMin()(x)
    (gx,) = th.autograd.grad(y, x, g)
    assert th.equal(y.detach().view(th.int32), y_ref.detach().view(th.int32))
    assert th.equal(gx.view(th.int32), gx_ref.view(th.int32))


def test_maxmin_bitwise_path_under_torch_func(monkeypatch):
    """Jacobians (reverse and forward mode), vmap over vjp, a Hessian and double backward through the bitwise
    path equal those through the gather path."""
    from torch.func import hessian, jacfwd, jacrev, jvp, vjp, vmap

    th.manual_seed(1)
    x = th.randn(4, 4, 4, 4, dtype=th.float64)
    x[:, 1] = x[:, 0]  # ties
    weights = th.randn(x.shape, dtype=th.float64)

    def scalar(z):
        return (MaxMin()(z) * weights).sin().sum()

    def transforms():
        out = {"jacrev": jacrev(MaxMin())(x), "jacfwd": jacfwd(MaxMin())(x), "hessian": hessian(scalar)(x)}
        out["jvp"] = jvp(MaxMin(), (x,), (weights,))[1]
        _, vjp_fn = vjp(MaxMin(), x)
        out["vmap_vjp"] = vmap(vjp_fn)(th.stack([weights, weights.cos()]))[0]
        out["vmap"] = vmap(MaxMin())(x.unsqueeze(1).expand(4, 3, 4, 4, 4))
        xr = x.clone().requires_grad_()
        (gr,) = th.autograd.grad(scalar(xr), xr, create_graph=True)
        out["double_backward"] = th.autograd.grad(gr.square().sum(), xr)[0]
        return out

    monkeypatch.setattr(activations, "BITWISE_MIN_NUMEL", 1)
    monkeypatch.setattr(activations, "BITWISE_MIN_PLANE", 1)
    assert activations._takes_bitwise_path(x)
    fast = transforms()
    _gather_only(monkeypatch)
    slow = transforms()
    for key in slow:
        assert th.equal(fast[key], slow[key]), key


def test_maxmin_bitwise_path_under_vmap_without_a_batching_rule_for_view_dtype(monkeypatch):
    """torch 2.11 (the GPU machine's build) has no batching rule for ``Tensor.view(dtype)``: the monitor's NTK of a
    MaxMin CNN (vjp under vmap through the bitwise path's raw-bit swap) raised "Batching rule not implemented for
    aten::view.dtype" there. Simulated here by refusing view(dtype) on a batched tensor: under torch.func the swap
    selects with ``where`` instead, and the NTK equals the gather path's, bit for bit."""
    from sb3_plastic.diagnostics import empirical_ntk, module_function

    view = th.Tensor.view

    def view_without_batching_rule(self, *args, **kwargs):
        if args and isinstance(args[0], th.dtype) and th._C._functorch.is_batchedtensor(self):
            raise RuntimeError("Batching rule not implemented for aten::view.dtype")
        return view(self, *args, **kwargs)

    th.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), MaxMin(), nn.Flatten(), nn.Linear(8 * 6 * 6, 3))
    x = th.randn(5, 3, 6, 6)
    monkeypatch.setattr(activations, "BITWISE_MIN_NUMEL", 1)
    assert activations._takes_bitwise_path(th.randn(5, 8, 6, 6))
    monkeypatch.setattr(th.Tensor, "view", view_without_batching_rule)
    fn, params = module_function(net, x)
    ntk = empirical_ntk(fn, params)
    chunked = empirical_ntk(fn, params, max_elements=2000)  # the forward-mode product under vmap too
    _gather_only(monkeypatch)
    reference = empirical_ntk(fn, params)
    assert ntk.shape == (15, 15) and th.equal(ntk, reference)
    assert th.equal(chunked, empirical_ntk(fn, params, max_elements=2000))
    assert th.allclose(chunked, reference, rtol=1e-4, atol=1e-6)


def test_maxmin_path_choice():
    """The bitwise path only for large (N, C, *spatial) maps of a float dtype in eager mode; MLP inputs, small
    maps and traced modules take the gather path."""
    big = th.randn(64, 16, 8, 8)
    assert activations._takes_bitwise_path(big)
    assert not activations._takes_bitwise_path(th.randn(256, 256))  # (N, F): pairs are adjacent elements
    assert not activations._takes_bitwise_path(th.randn(8, 16, 10, 10))  # below BITWISE_MIN_NUMEL
    assert not activations._takes_bitwise_path(th.randn(2048, 16, 2, 2))  # planes below BITWISE_MIN_PLANE
    assert not activations._takes_bitwise_path(big.to(th.int32))
    traced = th.jit.trace(MaxMin(), big)
    assert "gather" in str(traced.graph) and "bitwise" not in str(traced.graph)
    assert th.equal(traced(big), MaxMin()(big))


def test_maxmin_odd_width_error():
    with pytest.raises(ValueError, match="even"):
        MaxMin()(th.randn(2, 5))
    with pytest.raises(ValueError, match="got 3"):
        MaxMin()(th.randn(2, 3, 4, 4))


def test_unknown_activation_error():
    with pytest.raises(ValueError, match="'gelu'.*allowed"):
        get_activation("gelu")


@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (6, 3, 3, 3), (40, 3, 2, 2), (5, 5)])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_isometry_gradient_matches_autograd(shape, scale):
    w = th.randn(*shape, dtype=th.float64, requires_grad=True)
    isometry_penalty(w, scale).backward()
    assert th.allclose(isometry_penalty_grad(w.detach(), scale), w.grad, rtol=1e-10, atol=1e-10)


def test_penalty_value_against_singular_values():
    w = th.randn(9, 5, dtype=th.float64)
    s = th.linalg.svdvals(w)
    # 1/2 ||W^T W - s I||_F^2 = 1/2 sum (sigma_i^2 - s)^2 over the min(out, in) singular values
    assert th.isclose(isometry_penalty(w, 2.0), 0.5 * ((s**2 - 2.0) ** 2).sum())
    assert th.isclose(isometry_penalty(w.T, 2.0), 0.5 * ((s**2 - 2.0) ** 2).sum())


def test_dfi_orthogonal_maxmin_network_is_zero():
    net = nn.Sequential(nn.Linear(8, 16), MaxMin(), nn.Linear(16, 16), MaxMin(), nn.Conv1d(16, 4, 1))
    orthogonal_init_network_(net, gain=1.0)
    dfi = dfi_per_layer(net)
    assert set(dfi) == {"0", "2", "4"}
    assert max(dfi.values()) < 1e-9
    # a layer scaled by 2 has DfI = sum (4 - 1)^2 over its 8 singular values
    with th.no_grad():
        net[0].weight.mul_(2)
    assert dfi_per_layer(net)["0"] == pytest.approx(8 * 9.0, rel=1e-5)


def test_bad_scale_error():
    with pytest.raises(ValueError, match="isometry_scale"):
        isometry_penalty(th.randn(3, 3), -1.0)


def _train_pair(opt_a, opt_b, net_a, net_b, steps=25):
    for _ in range(steps):
        x = th.randn(16, 6)
        for net, opt in ((net_a, opt_a), (net_b, opt_b)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_adamo_with_zero_coef_equals_torch_adam(weight_decay):
    th.manual_seed(0)
    net_a = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    net_b = copy.deepcopy(net_a)
    opt_a = th.optim.Adam(net_a.parameters(), lr=1e-2, eps=1e-5, weight_decay=weight_decay, decoupled_weight_decay=True)
    opt_b = AdamO(net_b.parameters(), lr=1e-2, eps=1e-5, weight_decay=weight_decay, isometry_coef=0.0)
    for _ in range(25):
        _train_pair(opt_a, opt_b, net_a, net_b, steps=1)
        for pa, pb in zip(net_a.parameters(), net_b.parameters()):
            assert th.equal(pa, pb)


def test_adamo_drives_singular_values_to_sqrt_scale():
    th.manual_seed(1)
    for scale in (1.0, 2.0):
        w = nn.Parameter(th.randn(12, 7) * 2.5)
        opt = AdamO([w], lr=1e-2, isometry_coef=5.0, isometry_scale=scale)
        for _ in range(3000):
            w.grad = th.zeros_like(w)  # no task gradient: only the isometry step acts
            opt.step()
        assert th.allclose(th.linalg.svdvals(w.detach()), th.full((7,), scale**0.5), atol=1e-4)


def test_adamo_decoupled_moments_see_only_task_gradient():
    th.manual_seed(2)
    w = nn.Parameter(th.randn(5, 5))
    opt = AdamO([w], lr=1e-3, isometry_coef=1.0)
    g = th.randn(5, 5)
    w.grad = g.clone()
    opt.step()
    assert th.allclose(opt.state[w]["exp_avg"], 0.1 * g)  # (1 - beta1) * g: no penalty gradient inside
    coupled = nn.Parameter(w.detach().clone())
    opt_c = AdamO([coupled], lr=1e-3, isometry_coef=1.0, isometry_mode="coupled")
    coupled.grad = g.clone()
    expected = 0.1 * (g + isometry_penalty_grad(coupled.detach()))
    opt_c.step()
    assert th.allclose(opt_c.state[coupled]["exp_avg"], expected)


def test_adamo_step_formula():
    """theta <- Adam(theta) - lr * lambda * grad R(theta_before), checked against a hand computation."""
    th.manual_seed(3)
    w = nn.Parameter(th.randn(4, 6) * 0.5)
    before = w.detach().clone()
    lr, lam = 1e-3, 0.3
    opt = AdamO([w], lr=lr, isometry_coef=lam, eps=1e-8)
    g = th.randn(4, 6)
    w.grad = g.clone()
    opt.step()
    adam = before - lr * g / (g.abs() + 1e-8)  # first Adam step: m_hat = g, sqrt(v_hat) = |g|
    expected = adam - lr * lam * isometry_penalty_grad(before)
    assert th.allclose(w.detach(), expected, atol=1e-6)


def test_adamo_param_group_override_and_one_dim_params_untouched():
    a = nn.Parameter(th.randn(6, 6) * 3)
    b = nn.Parameter(th.randn(6, 6) * 3)
    bias = nn.Parameter(th.randn(6) * 3)
    opt = AdamO([{"params": [a, bias]}, {"params": [b], "isometry_coef": 0.0}], lr=1e-2, isometry_coef=1.0)
    b0, bias0 = b.detach().clone(), bias.detach().clone()
    for p in (a, b, bias):
        p.grad = th.zeros_like(p)
    opt.step()
    assert th.equal(b.detach(), b0) and th.equal(bias.detach(), bias0)
    assert not th.equal(a.detach(), b0)


def test_adamo_blow_up_guard_clamps_step():
    w = nn.Parameter(th.randn(10, 10) * 10)  # sigma_max^2 ~ 400 * 10
    opt = AdamO([w], lr=1.0, isometry_coef=10.0)  # lr * lambda = 10: an unclamped cubic step explodes
    for _ in range(200):
        w.grad = th.zeros_like(w)
        opt.step()
        assert th.isfinite(w).all()
    assert float(opt.state[w]["isometry_step"]) < 10.0
    assert th.linalg.svdvals(w.detach()).max() < 1.5


def test_adamo_state_dict_round_trip():
    th.manual_seed(4)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    groups = [{"params": [net[0].weight]}, {"params": [net[0].bias, net[2].weight, net[2].bias], "isometry_coef": 0.0}]
    opt = AdamO(groups, lr=1e-3, isometry_coef=0.05, isometry_scale=2.0)
    for _ in range(3):
        opt.zero_grad()
        net(th.randn(5, 4)).sum().backward()
        opt.step()
    net2 = copy.deepcopy(net)
    groups2 = [{"params": [net2[0].weight]}, {"params": [net2[0].bias, net2[2].weight, net2[2].bias], "isometry_coef": 0.0}]
    opt2 = AdamO(groups2, lr=1e-3)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares tensors otherwise
    assert opt2.param_groups[0]["isometry_coef"] == 0.05 and opt2.param_groups[0]["isometry_scale"] == 2.0
    assert opt2.param_groups[1]["isometry_coef"] == 0.0
    x = th.randn(5, 4)
    for n, o in ((net, opt), (net2, opt2)):
        o.zero_grad()
        n(x).sum().backward()
        o.step()
    for pa, pb in zip(net.parameters(), net2.parameters()):
        assert th.equal(pa, pb)


def test_adamo_bad_arguments():
    p = [nn.Parameter(th.randn(2, 2))]
    with pytest.raises(ValueError, match="isometry_coef.*-1"):
        AdamO(p, isometry_coef=-1)
    with pytest.raises(ValueError, match="isometry_mode 'sideways'.*allowed"):
        AdamO(p, isometry_mode="sideways")
    with pytest.raises(ValueError, match="isometry_scale"):
        AdamO(p, isometry_scale=0)


@pytest.mark.parametrize("optimizer_class", [AdamO, th.optim.Adam])
def test_reset_moments_rows_columns_and_whole(optimizer_class):
    w = nn.Parameter(th.randn(5, 4))
    opt = optimizer_class([w], lr=1e-3)
    w.grad = th.randn(5, 4)
    opt.step()
    reset_optimizer_state(opt, w, [1, 3], dim=0)
    for key in ("exp_avg", "exp_avg_sq"):
        state = opt.state[w][key]
        assert (state[[1, 3]] == 0).all() and (state[[0, 2, 4]] != 0).all()
    reset_optimizer_state(opt, w, th.tensor([True, False, False, False]), dim=1)
    assert (opt.state[w]["exp_avg"][:, 0] == 0).all() and (opt.state[w]["exp_avg"][0, 1:] != 0).all()
    reset_optimizer_state(opt, w)
    assert w not in opt.state
    with pytest.raises(ValueError, match="not a parameter"):
        reset_optimizer_state(opt, nn.Parameter(th.randn(2)))


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")
def test_adamo_cuda_matches_cpu():
    th.manual_seed(5)
    w_cpu = nn.Parameter(th.randn(16, 8))
    w_gpu = nn.Parameter(w_cpu.detach().cuda())
    opts = [AdamO([w_cpu], lr=1e-2, isometry_coef=0.5), AdamO([w_gpu], lr=1e-2, isometry_coef=0.5)]
    for _ in range(20):
        g = th.randn(16, 8)
        w_cpu.grad, w_gpu.grad = g.clone(), g.cuda()
        for o in opts:
            o.step()
    assert th.allclose(w_cpu.detach(), w_gpu.detach().cpu(), atol=1e-4)


def test_adamo_runs_step_hooks_once_per_step():
    th.optim.Adam([nn.Parameter(th.zeros(1))])  # once any Adam exists torch has wrapped Adam.step with hooks
    w = nn.Parameter(th.randn(3, 3))
    opt = AdamO([w], lr=1e-3, isometry_coef=0.1)
    calls = []
    opt.register_step_post_hook(lambda *_: calls.append(1))
    opt.register_step_pre_hook(lambda *_: calls.append(0))
    for _ in range(3):
        w.grad = th.randn(3, 3)
        opt.step()
    assert calls == [0, 1] * 3


@pytest.mark.parametrize("interval", [1, 3])
def test_compiled_adamo_step_compiles_once_and_matches_eager(interval):
    """``torch.compile(opt.step)`` on the policies' layout (the regularised weights in one group, the rest in
    another): the step keeps its state tensors, which the compiled step's guards hold, so it does not recompile at
    every step (falling back to eager, silently, at the recompile limit), and it updates as the eager step."""
    from torch._dynamo.utils import counters

    th.manual_seed(11)
    nets = [nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))]
    nets.append(copy.deepcopy(nets[0]))
    opts = [AdamO([dict(params=[net[0].weight, net[2].weight]), dict(params=[net[0].bias, net[2].bias],
                                                                          isometry_coef=0.0)],
                  lr=1e-2, isometry_coef=0.5, isometry_interval=interval) for net in nets]
    th._dynamo.reset()
    counters.clear()
    compiled = th.compile(opts[1].step)
    graphs = []
    for _ in range(12):
        x = th.randn(5, 6)
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            net(x).pow(2).sum().backward()
        opts[0].step()
        compiled()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[2 * interval + 1] > 0, graphs  # no compilation once the count has varied
    for eager, comp in zip(*nets):
        for a, b in zip(eager.parameters(), comp.parameters()):
            assert th.allclose(a, b, atol=1e-5)
    for group0, group1 in zip(opts[0].param_groups, opts[1].param_groups):
        for p0, p1 in zip(group0["params"], group1["params"]):
            if p0.dim() == 2:
                s0, s1 = opts[0].state[p0], opts[1].state[p1]
                assert s0["isometry_count"] == s1["isometry_count"] == 12
                assert th.allclose(s0["isometry_step"], s1["isometry_step"])

def test_isometry_interval_applies_every_k_steps_with_k_times_the_step():
    th.manual_seed(6)
    w = nn.Parameter(th.randn(6, 4) * 0.7)
    lr, lam, k = 1e-3, 0.2, 3
    opt = AdamO([w], lr=lr, isometry_coef=lam, isometry_interval=k)
    expected = w.detach().clone()
    for step in range(7):
        w.grad = th.zeros_like(w)  # Adam's update is zero: only the isometry step moves w
        if step % k == 0:
            expected = expected - k * lr * lam * isometry_penalty_grad(expected)
        opt.step()
        assert th.allclose(w.detach(), expected, atol=1e-6), step
    with pytest.raises(ValueError, match="isometry_interval"):
        AdamO([w], isometry_interval=0)
