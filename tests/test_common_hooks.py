"""The shared hook helpers of sb3_plastic.common.hooks (gradient addition inside backward, outermost step hooks)."""

import torch as th

from sb3_plastic.common.hooks import OutermostStepHooks, add_to_grad_hook


def test_add_to_grad_hook_equals_autograd_of_loss_plus_penalty_and_is_clipped_with_it():
    th.manual_seed(0)
    w = th.randn(5, 3, requires_grad=True)
    x = th.randn(7, 5)
    ref = w.detach().clone().requires_grad_(True)
    ((x @ ref).square().sum() + 0.3 * ref.square().sum()).backward()
    th.nn.utils.clip_grad_norm_([ref], 1.0)

    on = [True]
    handle = add_to_grad_hook(w, lambda p, g: g.add_(p.detach(), alpha=0.6), active=lambda: on[0])
    (x @ w).square().sum().backward()
    th.nn.utils.clip_grad_norm_([w], 1.0)
    assert th.allclose(w.grad, ref.grad, rtol=1e-6, atol=1e-7)

    task = th.autograd.grad((x @ w).square().sum(), w)[0]  # autograd.grad does not accumulate: no hook
    w.grad = None
    on[0] = False
    (x @ w).square().sum().backward()
    assert th.equal(w.grad, task)
    on[0] = True
    handle.remove()
    w.grad = None
    (x @ w).square().sum().backward()
    assert th.equal(w.grad, task)


class _NestedAdam(th.optim.Adam):
    """A subclass whose ``step`` calls the hooked ``Adam.step``: torch then fires the step hooks twice."""

    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


def test_outermost_step_hooks_act_once_per_nested_step():
    th.manual_seed(0)
    net = th.nn.Linear(4, 3)
    th.optim.Adam(th.nn.Linear(2, 2).parameters())  # a plain Adam exists: Adam.step is hooked
    opt = _NestedAdam(net.parameters(), lr=1e-3)
    calls: list[str] = []
    raw = [0]
    opt.register_step_post_hook(lambda o, a, k: raw.__setitem__(0, raw[0] + 1))
    active = [True]
    hooks = OutermostStepHooks(
        opt, after=lambda o: calls.append("after"), before=lambda o: calls.append("before"), active=lambda: active[0]
    )
    for _ in range(3):
        net(th.randn(2, 4)).sum().backward()
        opt.step()
    assert raw[0] == 6  # the nesting the helper exists for
    assert calls == ["before", "after"] * 3
    active[0] = False
    opt.step()
    assert len(calls) == 6 and hooks.depth == 0
    hooks.depth = 5  # a step that raised between the hooks
    hooks.reset()
    active[0] = True
    opt.step()
    assert calls[-2:] == ["before", "after"]
    hooks.remove()
    opt.step()
    assert len(calls) == 8
