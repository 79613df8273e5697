"""Issue 13, part 2 and the DfI item of part 5: the exact AdamO step by default, coupled mode as plain Adam on
``loss + lambda R`` every step (clipped together with the task gradient, as SB3 clips), one DfI definition."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch as th
import torch.nn.functional as F
from torch import nn

from sb3_plastic import AdamO, IsometryConfig, PlasticDQN, PlasticPPO
from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.diagnostics import dfi, network_diagnostics
from sb3_plastic.isometry import isometry_penalty, isometry_penalty_grad
from sb3_plastic.optim import with_isometry_step
from sb3_plastic.policies import PlasticPolicyMixin

FAST_PPO = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8, 8]), seed=0)


def hand_penalty(w: th.Tensor, scale: float = 1.0) -> th.Tensor:
    """``1/2 ||W^T W - s I||^2`` (tall) / ``1/2 ||W W^T - s I||^2`` (wide), written out: the independent reference
    (the authors' convention, issue #27)."""
    m = w.reshape(w.shape[0], -1)
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    return 0.5 * (gram - scale * th.eye(gram.shape[0], dtype=w.dtype)).square().sum()


# ---------------------------------------------------------------------------------------------------
# the exact step is the default
# ---------------------------------------------------------------------------------------------------
def test_exact_isometry_step_is_the_default_everywhere():
    assert IsometryConfig().isometry_interval == 1
    for function in (PlasticAlgorithmMixin.__init__, PlasticPolicyMixin.__init__, AdamO.__init__):
        assert inspect.signature(function).parameters["isometry_interval"].default == 1, function
    assert inspect.signature(with_isometry_step(th.optim.SGD).__init__).parameters["isometry_interval"].default == 1
    w = nn.Parameter(th.zeros(3, 3))
    assert AdamO([w]).param_groups[0]["isometry_interval"] == 1
    model = PlasticPPO("MlpPolicy", "CartPole-v1", **FAST_PPO)
    assert model.isometry_config.isometry_interval == 1
    assert all(g["isometry_interval"] == 1 for g in model.policy.optimizer.param_groups)
    dqn = PlasticDQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8]), seed=0)
    assert all(g["isometry_interval"] == 1 for g in dqn.policy.optimizer.param_groups)
    # "auto" stays a documented speed option
    auto = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_interval="auto", **FAST_PPO)
    assert all(g["isometry_interval"] == 32 for g in auto.policy.optimizer.param_groups)  # ceil(1024 / 32)


def test_a_policy_built_directly_refuses_auto_with_a_clear_message():
    import gymnasium as gym
    from stable_baselines3.common.utils import get_schedule_fn

    from sb3_plastic.policies import PlasticActorCriticPolicy

    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="isometry_interval='auto'.*batch_size"):
        PlasticActorCriticPolicy(env.observation_space, env.action_space, get_schedule_fn(1e-3), isometry_interval="auto")


# ---------------------------------------------------------------------------------------------------
# coupled mode: never amortised
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interval", [2, 32, "auto"])
def test_coupled_mode_rejects_an_interval(interval):
    with pytest.raises(ValueError, match="isometry_mode='coupled'.*isometry_interval"):
        IsometryConfig(isometry_mode="coupled", optimizer="adam", isometry_interval=interval)
    with pytest.raises(ValueError, match="isometry_mode='coupled'.*isometry_interval"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="coupled", optimizer="adam", isometry_interval=interval)
    if interval != "auto":
        w = nn.Parameter(th.randn(4, 4))
        with pytest.raises(ValueError, match="isometry_mode='coupled'.*isometry_interval"):
            AdamO([w], isometry_mode="coupled", isometry_interval=interval)
        opt = AdamO([w], isometry_mode="coupled")
        with pytest.raises(ValueError, match="isometry_mode='coupled'.*isometry_interval"):
            opt.add_param_group({"params": [nn.Parameter(th.randn(2, 2))], "isometry_interval": interval})


def test_coupled_penalty_gradient_is_in_grad_after_backward_once():
    """After ``backward`` the gradient already holds ``g + lambda grad R`` (so clipping between backward and
    step sees the sum), and the step adds nothing more: Adam's first moment is ``(1 - beta1) (g + lambda grad R)``."""
    th.manual_seed(0)
    lam = 0.3
    w = nn.Parameter(th.randn(5, 3))
    x = th.randn(7, 3)
    old = AdamO([w], lr=1e-3, isometry_coef=lam, isometry_mode="coupled")  # a stale optimizer over the same weight
    opt = AdamO([w], lr=1e-3, isometry_coef=lam, isometry_mode="coupled")  # the newest one owns the penalty
    assert old is not None
    loss = (x @ w.T).tanh().sum()
    (g,) = th.autograd.grad(loss, w, retain_graph=True)
    expected = g + lam * th.func.grad(hand_penalty)(w.detach())
    loss.backward()
    assert th.allclose(w.grad, expected, atol=1e-6)
    opt.step()
    assert th.allclose(opt.state[w]["exp_avg"], 0.1 * expected, atol=1e-6)
    # a gradient set by hand (no backward) gets the penalty at step()
    w.grad = g.clone()
    penalty = lam * th.func.grad(hand_penalty)(w.detach())
    m = opt.state[w]["exp_avg"].clone()
    opt.step()
    assert th.allclose(opt.state[w]["exp_avg"], 0.9 * m + 0.1 * (g + penalty), atol=1e-6)


def test_coupled_penalty_of_stacked_gate_blocks_in_backward():
    """An LSTM-style weight (``isometry_blocks=4``): the hook adds the per-block penalty gradient."""
    th.manual_seed(2)
    w = nn.Parameter(th.randn(12, 5) * 0.5)
    bias = nn.Parameter(th.zeros(12))
    opt = AdamO([{"params": [w], "isometry_blocks": 4}, {"params": [bias]}], isometry_coef=0.1, isometry_mode="coupled")
    x = th.randn(3, 5)
    (x @ w.T + bias).sin().sum().backward()
    with th.no_grad():
        g = ((x @ w.T + bias).cos().T @ x)
    blocks = th.func.grad(lambda v: sum(hand_penalty(b) for b in v.reshape(4, 3, 5)))(w.detach())
    assert th.allclose(w.grad, g + 0.1 * blocks, atol=1e-5)
    assert th.allclose(bias.grad, (x @ w.T + bias).cos().sum(0).detach(), atol=1e-6)  # 1-dim: no penalty
    del opt  # a garbage-collected optimizer adds nothing any more
    w.grad = None
    (x @ w.T + bias).sin().sum().backward()
    assert th.allclose(w.grad, g, atol=1e-5)


def test_coupled_penalty_survives_state_dict_round_trip_and_edits():
    th.manual_seed(1)
    w = nn.Parameter(th.randn(6, 4))
    opt = AdamO([w], lr=1e-3, isometry_coef=0.2, isometry_mode="coupled")
    (w.square().sum()).backward()
    opt.step()
    fresh = AdamO([w], lr=1e-3, isometry_coef=0.0, isometry_mode="coupled")
    fresh.load_state_dict(opt.state_dict())
    assert fresh.param_groups[0]["isometry_coef"] == 0.2
    w.grad = None
    (w.square().sum()).backward()
    assert th.allclose(w.grad, 2 * w.detach() + 0.2 * isometry_penalty_grad(w.detach()), atol=1e-6)
    fresh.param_groups[0]["isometry_coef"] = 0.0  # an edited group: the hook reads the live value
    w.grad = None
    (w.square().sum()).backward()
    assert th.allclose(w.grad, 2 * w.detach(), atol=1e-6)


def _hand_adam(params: list[th.Tensor], grads: list[th.Tensor], group: dict) -> th.optim.Adam:
    ref = [p.detach().clone().requires_grad_(True) for p in params]
    adam = th.optim.Adam(ref, lr=group["lr"], betas=group["betas"], eps=group["eps"])
    for p, g in zip(ref, grads):
        p.grad = g.clone()
    adam.step()
    return adam


def _clip(grads: list[th.Tensor], max_norm: float) -> list[th.Tensor]:
    """``torch.nn.utils.clip_grad_norm_`` written out: scale by ``max_norm / (||g|| + 1e-6)`` when below 1."""
    total = th.sqrt(sum(g.double().square().sum() for g in grads))
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    return [g * coef for g in grads]


def _check_update(model, params_before, grads, regularised_ids):
    opt = model.policy.optimizer
    group = opt.param_groups[0]
    ref = _hand_adam(params_before, grads, group)
    after = [p for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.policy.named_parameters()}
    for p_ref, p in zip(ref.param_groups[0]["params"], after):
        assert th.allclose(opt.state[p]["exp_avg"], ref.state[p_ref]["exp_avg"], rtol=1e-5, atol=1e-9), names[id(p)]
        assert th.allclose(p.detach(), p_ref.detach(), rtol=1e-5, atol=1e-7), names[id(p)]
    assert regularised_ids  # the penalty acted on something


def test_coupled_dqn_train_update_is_adam_on_clipped_grad_of_loss_plus_penalty():
    """One SB3 ``DQN.train()`` gradient step in coupled mode equals ``Adam(clip(grad(loss + lambda R)))``, computed
    by hand: the penalty gradient is clipped together with the task gradient (``max_grad_norm``)."""
    lam, max_norm = 0.05, 0.05
    model = PlasticDQN(
        "MlpPolicy",
        "CartPole-v1",
        isometry_mode="coupled",
        optimizer="adam",
        isometry_coef=lam,
        learning_starts=10_000,
        batch_size=16,
        max_grad_norm=max_norm,
        policy_kwargs=dict(net_arch=[16, 16]),
        seed=0,
    )
    model.learn(64)  # fills the buffer, no update (learning_starts)
    batches = []
    sample = model.replay_buffer.sample
    model.replay_buffer.sample = lambda *a, **k: batches.append(sample(*a, **k)) or batches[-1]
    opt = model.policy.optimizer
    params = [p for g in opt.param_groups for p in g["params"]]
    regularised = {id(p) for p in model.policy.regularised_parameters()}
    q_net = copy.deepcopy(model.policy.q_net)
    target = copy.deepcopy(model.policy.q_net_target)
    model.train(gradient_steps=1, batch_size=16)
    (data,) = batches
    discounts = getattr(data, "discounts", None)
    gamma = model.gamma if discounts is None else discounts
    with th.no_grad():
        next_q = target(data.next_observations).max(dim=1).values.reshape(-1, 1)
        target_q = data.rewards + (1 - data.dones) * gamma * next_q
    ref_params = dict(q_net.named_parameters())
    names = {id(p): n for n, p in model.policy.q_net.named_parameters()}
    ordered = [ref_params[names[id(p)]] for p in params]
    q = q_net(data.observations).gather(1, data.actions.long())
    loss = F.smooth_l1_loss(q, target_q)
    loss = loss + lam * sum(hand_penalty(q) for p, q in zip(params, ordered) if id(p) in regularised)
    raw = list(th.autograd.grad(loss, ordered))
    assert float(th.sqrt(sum(g.square().sum() for g in raw))) > 2 * max_norm  # clipping is active in this test
    grads = _clip(raw, max_norm)
    _check_update(model, [p.detach() for p in ordered], grads, regularised)


def test_coupled_ppo_train_update_is_adam_on_clipped_grad_of_loss_plus_penalty():
    """The same for ``PPO.train()`` (one epoch, one minibatch of the whole rollout)."""
    lam = 0.05
    model = PlasticPPO(
        "MlpPolicy",
        "CartPole-v1",
        isometry_mode="coupled",
        optimizer="adam",
        isometry_coef=lam,
        max_grad_norm=0.05,
        **FAST_PPO,
    )
    before = copy.deepcopy(model.policy)
    train = model.train
    model.train = lambda: None
    model.learn(32)  # one rollout, no update
    model.train = train
    buffer = model.rollout_buffer
    model.train()
    opt = model.policy.optimizer
    params = [p for g in opt.param_groups for p in g["params"]]
    regularised = {id(p) for p in model.policy.regularised_parameters()}
    names = {id(p): n for n, p in model.policy.named_parameters()}
    ref_params = dict(before.named_parameters())
    ordered = [ref_params[names[id(p)]] for p in params]
    obs = th.as_tensor(buffer.observations).reshape(32, -1)
    actions = th.as_tensor(buffer.actions).reshape(32).long()
    adv = th.as_tensor(buffer.advantages).reshape(32)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    returns = th.as_tensor(buffer.returns).reshape(32)
    old_log_prob = th.as_tensor(buffer.log_probs).reshape(32)
    values, log_prob, entropy = before.evaluate_actions(obs, actions)
    ratio = th.exp(log_prob - old_log_prob)
    clip = 0.2
    policy_loss = -th.min(adv * ratio, adv * th.clamp(ratio, 1 - clip, 1 + clip)).mean()
    loss = policy_loss + model.vf_coef * F.mse_loss(returns, values.flatten()) - model.ent_coef * entropy.mean()
    loss = loss + lam * sum(hand_penalty(q) for p, q in zip(params, ordered) if id(p) in regularised)
    grads = _clip(list(th.autograd.grad(loss, ordered)), 0.05)
    _check_update(model, [p.detach() for p in ordered], grads, regularised)


# ---------------------------------------------------------------------------------------------------
# DfI: one definition
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (7, 7), (6, 3, 3, 3), (40, 3, 2, 2)])
def test_dfi_is_the_penalty_on_the_smaller_gram_matrix(shape):
    """DfI (diagnostics) == 2 R (the penalty, with its 1/2) == ``||G - I||^2`` of the smaller Gram matrix; the larger
    Gram matrix gives exactly ``|in - out|`` more (its extra eigenvalues are 0) and the same gradient."""
    g = th.Generator().manual_seed(sum(shape))
    w = th.randn(*shape, generator=g, dtype=th.float64) * 0.4
    ref = 2 * float(hand_penalty(w))
    assert dfi(w) == pytest.approx(ref, rel=1e-5)
    assert 2 * float(isometry_penalty(w)) == pytest.approx(ref, rel=1e-12)
    m = w.reshape(shape[0], -1)
    big = m @ m.T if m.shape[0] > m.shape[1] else m.T @ m
    other = (big - th.eye(big.shape[0], dtype=w.dtype)).square().sum()
    assert float(other) - ref == pytest.approx(abs(m.shape[0] - m.shape[1]), rel=1e-9, abs=1e-9)
    def larger_gram_dfi(v: th.Tensor) -> th.Tensor:
        gram = v @ v.T if v.shape[0] > v.shape[1] else v.T @ v
        return (gram - th.eye(gram.shape[0], dtype=v.dtype)).square().sum()

    other_grad = th.func.grad(larger_gram_dfi)(m)
    assert th.allclose(other_grad.reshape(shape), 2 * isometry_penalty_grad(w), atol=1e-10)


def test_monitor_dfi_of_a_wide_layer_equals_the_penalty():
    """The diagnostics' per-layer DfI of a model with wide, tall and square layers is twice the isometry penalty R
    (DfI keeps its definition without the 1/2 across issue #27)."""
    model = PlasticDQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16, 2]), seed=0)
    spec = find_networks(model)[0]
    out = network_diagnostics(model, spec, th.randn(10, 4), ntk_size=0)
    shapes = set()
    for layer in spec.weight_layers():
        shapes.add(layer.weight.shape[0] >= layer.weight.shape[1])
        expected = 2 * float(hand_penalty(layer.weight.detach().double()))
        assert out[f"{spec.layer_names[id(layer)]}/dfi"] == pytest.approx(expected, rel=1e-5)
    assert shapes == {True, False}
