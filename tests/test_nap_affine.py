"""Normalize-and-Project's scale and offset (issue #27): with a positively homogeneous activation every layer norm's
``(gamma, beta)`` is projected jointly to its initial norm after each optimizer step, checked against a hand-written
loop; before Tanh nothing of the norm is projected (and the option says it has no effect)."""

from __future__ import annotations

import copy
import math

import pytest
import torch as th
from torch import nn

from sb3_plastic import PlasticPPO
from sb3_plastic.callbacks import NormalizeAndProject
from sb3_plastic.callbacks.nap import NaPConfig, homogeneous_norms, normalized_layers

PPO_FAST = dict(n_steps=32, batch_size=16, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[8, 8]))


def _joint(params) -> th.Tensor:
    return th.sqrt(sum(p.detach().pow(2).sum() for p in params))


def _train_steps(policy, opt, obs, actions):
    opt.zero_grad()
    values, log_prob, _ = policy.evaluate_actions(obs, actions)
    (values.pow(2).mean() - 3 * log_prob.mean()).backward()
    opt.step()


@pytest.mark.parametrize("project_affine", [True, False])
def test_scale_and_offset_projected_jointly_against_a_hand_written_loop(project_affine):
    th.manual_seed(0)
    model = PlasticPPO("MlpPolicy", "CartPole-v1", nap=True, activation="relu", learning_rate=5e-2, **PPO_FAST)
    policy = model.policy
    model.policy.optimizer = th.optim.Adam(policy.parameters(), lr=5e-2, eps=1e-5)
    callback = NormalizeAndProject(project_affine=project_affine)
    callback.init_callback(model)
    callback.on_training_start({}, {})
    policy.set_training_mode(True)
    reference = copy.deepcopy(policy)
    ref_opt = th.optim.Adam(reference.parameters(), lr=5e-2, eps=1e-5)
    norms = [n for _, n in homogeneous_norms(reference)]
    assert len(norms) == 4 and len(homogeneous_norms(policy)) == 4  # 2 per MLP (policy, value)
    layers = normalized_layers(reference)
    layer_targets = [_joint((m.weight, m.bias)) for m in layers]
    norm_targets = [_joint((n.weight, n.bias)) for n in norms]
    assert [float(t) for t in norm_targets] == pytest.approx([math.sqrt(8)] * 4)  # gamma = 1, beta = 0
    obs, actions = th.randn(32, 4), th.randint(0, 2, (32,))
    for _ in range(6):
        _train_steps(policy, policy.optimizer, obs, actions)
        _train_steps(reference, ref_opt, obs, actions)
        with th.no_grad():  # the reference's projection, by hand
            for module, target in [*zip(layers, layer_targets), *(zip(norms, norm_targets) if project_affine else [])]:
                scale = target / _joint((module.weight, module.bias))
                module.weight.mul_(scale)
                module.bias.mul_(scale)
        for p, q in zip(policy.parameters(), reference.parameters()):
            th.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    moved = [float(_joint((n.weight, n.bias))) for _, n in homogeneous_norms(policy)]
    if project_affine:
        assert moved == pytest.approx([math.sqrt(8)] * 4, rel=1e-5)
        assert set(callback.state["affine"]) == {f"policy.{name}" for name, _ in homogeneous_norms(policy)}
    else:
        assert max(abs(m - math.sqrt(8)) for m in moved) > 1e-3  # left free, they moved
        assert "affine" not in callback.state


def test_no_homogeneous_activation_no_affine_projection_and_a_warning():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", nap=True, **PPO_FAST)  # PPO's default Tanh
    assert homogeneous_norms(model.policy) == []
    callback = NormalizeAndProject()
    callback.init_callback(model)
    with pytest.warns(UserWarning, match="project_affine=True. has no effect"):
        callback.on_training_start({}, {})


def test_config_keyword():
    assert NaPConfig(nap=True).make_callback().project_affine is True
    assert NaPConfig(nap=True, nap_project_affine=False).make_callback().project_affine is False
    with pytest.raises(ValueError, match="nap_project_affine must be True or False, got 'no'"):
        NaPConfig(nap=True, nap_project_affine="no")
    with pytest.warns(UserWarning, match="nap_project_affine"):
        NaPConfig(nap=False, nap_project_affine=False)


def test_homogeneous_norms_finds_only_norms_before_homogeneous_activations():
    net = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.ReLU(), nn.Linear(4, 4), nn.LayerNorm(4), nn.Tanh(),
                        nn.Linear(4, 2))
    assert [name for name, _ in homogeneous_norms(net)] == ["1"]
