"""Unit resets restart Adam per element (issue #13, part 1).

After ``reset_optimizer_state(optimizer, param, index, dim)`` the reset entries must behave exactly as the entries
of a freshly built ``torch.optim.Adam`` (per-element bias correction: Dohare's AdamGnT, the ReDo reference), and
every other entry must be bit-identical to an uninterrupted run. The reference is a fresh ``torch.optim.Adam`` fed
the reset entries' gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch as th
from torch import nn

from sb3_plastic.adam_restart import RESTART_KEY, AdamRestartMixin, enable_restart
from sb3_plastic.optim import AdamO, reset_optimizer_state

RESET_AT = 10_000
K = 40
ROWS = [1, 3]  # rows of the first weight / bias, columns of the second weight


def _net() -> nn.Sequential:
    th.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()


def _grads(gen: th.Generator, params: list[nn.Parameter]) -> list[th.Tensor]:
    return [th.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]


def _step(opt: th.optim.Optimizer, params: list[nn.Parameter], grads: list[th.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


def _make(kind: str, params: list[nn.Parameter], betas: tuple[float, float]) -> th.optim.Optimizer:
    if kind == "adamo":  # no isometry penalty: its step couples every entry of a matrix
        return AdamO(params, lr=1e-3, betas=betas, weight_decay=1e-2, isometry_coef=0.0)
    return th.optim.Adam(params, lr=1e-3, betas=betas, weight_decay=1e-2, amsgrad=kind == "adam_amsgrad")


def _masks(params: list[nn.Parameter]) -> list[th.Tensor]:
    m = [th.zeros_like(p, dtype=th.bool) for p in params]
    m[0][ROWS] = True
    m[1][ROWS] = True
    m[2][:, ROWS] = True
    return m


def _reset(opt: th.optim.Optimizer, params: list[nn.Parameter]) -> None:
    w0, b0, w1, _ = params
    reset_optimizer_state(opt, w0, ROWS, dim=0)
    reset_optimizer_state(opt, b0, th.tensor(ROWS), dim=0)
    reset_optimizer_state(opt, w1, th.tensor([False, True, False, True, False]), dim=1)


def _trained(kind: str, betas: tuple[float, float]) -> tuple[list[nn.Parameter], th.optim.Optimizer]:
    params = list(_net().parameters())
    opt = _make(kind, params, betas)
    gen = th.Generator().manual_seed(1)
    for _ in range(RESET_AT):
        _step(opt, params, _grads(gen, params))
    return params, opt


_CACHE: dict[tuple[str, tuple[float, float]], tuple[list[th.Tensor], dict]] = {}


def _at_reset(kind: str, betas: tuple[float, float]) -> tuple[list[nn.Parameter], th.optim.Optimizer]:
    """The run at step 10 000 (computed once per setting), as fresh copies."""
    key = (kind, betas)
    if key not in _CACHE:
        params, opt = _trained(kind, betas)
        _CACHE[key] = ([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()))
    values, state = _CACHE[key]
    params = [nn.Parameter(v.clone()) for v in values]
    opt = _make(kind, params, betas)
    opt.load_state_dict(copy.deepcopy(state))
    return params, opt


BETAS = [(0.9, 0.999), (0.99, 0.99)]
KINDS = ["adamo", "adam", "adam_amsgrad"]


@pytest.mark.parametrize("betas", BETAS, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("save_load", [False, True], ids=["", "save_load"])
def test_reset_entries_follow_a_fresh_adam_untouched_entries_are_bit_identical(kind, betas, save_load):
    params, opt = _at_reset(kind, betas)
    ref_params, ref_opt = _at_reset(kind, betas)  # the uninterrupted run
    masks = _masks(params)
    _reset(opt, params)
    # the fresh Adam of each tensor's reset entries, from their values at the reset
    fresh = [nn.Parameter(p.detach()[m].clone()) for p, m in zip(params, masks) if m.any()]
    fresh_opt = th.optim.Adam(
        fresh, lr=1e-3, betas=betas, weight_decay=1e-2, amsgrad=kind == "adam_amsgrad", eps=opt.defaults["eps"]
    )
    if kind == "adamo":  # AdamO's weight decay is decoupled (AdamW)
        fresh_opt = th.optim.AdamW(fresh, lr=1e-3, betas=betas, weight_decay=1e-2, eps=opt.defaults["eps"])
    gen = th.Generator().manual_seed(2)
    for k in range(K):
        if save_load and k == K // 2:  # a new optimizer (as after SB3's load) from the state dict
            state = copy.deepcopy(opt.state_dict())
            opt = _make(kind, params, betas)
            opt.load_state_dict(state)
            if not isinstance(opt, AdamRestartMixin):
                enable_restart(opt)  # what ContinualBackprop / ReDo do at training start
        grads = _grads(gen, params)
        _step(opt, params, grads)
        _step(ref_opt, ref_params, grads)
        _step(fresh_opt, fresh, [g[m] for g, m in zip(grads, masks) if m.any()])
        reset_params = [p for p, m in zip(params, masks) if m.any()]
        for p, f, m in zip(reset_params, fresh, [m for m in masks if m.any()]):
            th.testing.assert_close(p.detach()[m], f.detach(), rtol=1e-10, atol=1e-12)
        for p, r, m in zip(params, ref_params, masks):
            assert th.equal(p.detach()[~m], r.detach()[~m])


def test_without_resets_the_restart_class_is_bit_identical_to_adam():
    net_a, net_b = _net(), _net()
    opt_a = th.optim.Adam(net_a.parameters(), lr=1e-2)
    opt_b = th.optim.Adam(net_b.parameters(), lr=1e-2)
    enable_restart(opt_b)
    assert isinstance(opt_b, th.optim.Adam) and isinstance(opt_b, AdamRestartMixin)
    calls = []
    opt_b.register_step_post_hook(lambda *a: calls.append(1))
    gen_a, gen_b = th.Generator().manual_seed(3), th.Generator().manual_seed(3)
    for _ in range(50):
        _step(opt_a, list(net_a.parameters()), _grads(gen_a, list(net_a.parameters())))
        _step(opt_b, list(net_b.parameters()), _grads(gen_b, list(net_b.parameters())))
    assert len(calls) == 50  # the swapped class still runs the optimizer's step hooks, once per step
    for a, b in zip(net_a.parameters(), net_b.parameters()):
        assert th.equal(a, b)


def test_restart_state_marks_reset_entries_and_ends():
    net = _net()
    params = list(net.parameters())
    opt = th.optim.Adam(params, lr=1e-3, betas=(0.5, 0.5))
    gen = th.Generator().manual_seed(4)
    _step(opt, params, _grads(gen, params))
    reset_optimizer_state(opt, params[0], [2], dim=0)
    marks = opt.state[params[0]][RESTART_KEY]
    assert marks.shape == params[0].shape
    assert (marks[2] == 0).all() and (marks[[0, 1, 3, 4]] == -1).all()
    _step(opt, params, _grads(gen, params))
    assert (opt.state[params[0]][RESTART_KEY][2] == 1).all()
    # once beta^t is negligible for both betas the entries are ordinary entries again and the state goes away
    for _ in range(1100):
        _step(opt, params, _grads(gen, params))
    assert RESTART_KEY not in opt.state[params[0]]
    reset_optimizer_state(opt, params[0])  # the whole tensor: Adam's state is dropped (fresh everywhere)
    assert params[0] not in opt.state


def test_enable_restart_rejects_optimizers_without_adams_update():
    p = nn.Parameter(th.zeros(3))
    with pytest.raises(ValueError, match="RMSprop"):
        enable_restart(th.optim.RMSprop([p]))
    # RMSprop and SGD have no bias correction: zeroing their buffers already makes a fresh entry
    opt = th.optim.RMSprop([p])
    p.grad = th.ones(3)
    opt.step()
    reset_optimizer_state(opt, p, [0])
    assert opt.state[p]["square_avg"][0] == 0 and RESTART_KEY not in opt.state[p]
