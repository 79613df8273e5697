"""Normalize-and-Project (Lyle et al., 2024; issue #15): layer norms before every nonlinearity, built with the
networks of every plastic algorithm, and the projection of each normalised layer back to its initial norm after every
optimizer step.

References: a hand-written loop (a copy of the network and optimizer, stepped and projected by hand), the layer-norm
formula written out, the initial norms recorded before training, an uninterrupted run for save -> load -> continue.
"""

from __future__ import annotations

import copy

import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.envs import FakeImageEnv
from test_regularisers import assert_resume_equals_uninterrupted
from test_sb3_parity import PAIRS, algo_kwargs, has_alias, make_env, policy_name
from torch import nn

from sb3_plastic import PlasticDQN, PlasticPPO
from sb3_plastic.callbacks import NormalizeAndProject, insert_layer_norms_
from sb3_plastic.callbacks.nap import (
    ChannelLayerNorm,
    add_norm_parameters_to_optimizers,
    nap_learning_rate_schedule,
    normalized_layers,
    project_,
)

PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)


def test_layer_norm_before_every_nonlinearity_mlp_and_cnn():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", nap=True, **PPO_FAST)
    kinds = [type(m) for m in model.policy.mlp_extractor.policy_net]
    assert kinds == [nn.Linear, nn.LayerNorm, nn.Tanh, nn.Linear, nn.LayerNorm, nn.Tanh]
    assert not any(isinstance(m, nn.LayerNorm) for m in (model.policy.action_net, model.policy.value_net))
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    cnn = PlasticPPO("CnnPolicy", env, nap=True, **PPO_FAST).policy.features_extractor
    convs = [type(m) for m in cnn.cnn]
    assert convs[:3] == [nn.Conv2d, ChannelLayerNorm, nn.ReLU] and convs.count(ChannelLayerNorm) == 3
    assert [type(m) for m in cnn.linear] == [nn.Linear, nn.LayerNorm, nn.ReLU]
    assert not any(isinstance(m, nn.LayerNorm) for m in PlasticPPO("MlpPolicy", "CartPole-v1").policy.modules())


def test_channel_layer_norm_is_the_formula_over_channels():
    th.manual_seed(0)
    norm = ChannelLayerNorm(6)
    with th.no_grad():
        norm.weight.copy_(th.rand(6) + 0.5)
        norm.bias.copy_(th.randn(6))
    x = th.randn(3, 6, 5, 4)
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    expected = (x - mean) / th.sqrt(var + norm.eps) * norm.weight.view(1, -1, 1, 1) + norm.bias.view(1, -1, 1, 1)
    th.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)


def test_norm_parameters_join_the_optimizer_of_their_layer_and_targets_mirror():
    model = PlasticDQN("MlpPolicy", "CartPole-v1", nap=True, seed=0)
    norms = [m for m in model.policy.q_net.modules() if isinstance(m, nn.LayerNorm)]
    held = {id(p) for g in model.policy.optimizer.param_groups for p in g["params"]}
    assert len(norms) == 2 and all(id(p) in held for n in norms for p in n.parameters())
    target_norms = [m for m in model.policy.q_net_target.modules() if isinstance(m, nn.LayerNorm)]
    assert len(target_norms) == 2 and not any(id(p) in held for n in target_norms for p in n.parameters())
    # AdamO: no isometry penalty on the norms
    for group in model.policy.optimizer.param_groups:
        if any(id(p) == id(norms[0].weight) for p in group["params"]):
            assert group["isometry_coef"] == 0.0


def test_projection_equals_a_hand_written_loop():
    th.manual_seed(0)
    model = PlasticPPO("MlpPolicy", "CartPole-v1", nap=True, learning_rate=1e-2, **PPO_FAST)
    callback = NormalizeAndProject()
    callback.init_callback(model)
    callback.on_training_start({}, {})
    policy = model.policy
    policy.set_training_mode(True)
    reference = copy.deepcopy(policy)
    ref_opt = th.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5)  # PPO's Adam
    layers = normalized_layers(policy)
    ref_layers = normalized_layers(reference)
    assert len(layers) == 4
    initial = [th.sqrt(sum(p.detach().pow(2).sum() for p in (m.weight, m.bias))) for m in ref_layers]
    obs = th.randn(32, 4)
    actions = th.randint(0, 2, (32,))
    model.policy.optimizer = th.optim.Adam(policy.parameters(), lr=1e-2, eps=1e-5)  # same update as the reference
    callback.on_training_start({}, {})  # hooks on the new optimizer
    for _ in range(5):
        for net, opt in ((policy, policy.optimizer), (reference, ref_opt)):
            opt.zero_grad()
            values, log_prob, _ = net.evaluate_actions(obs, actions)
            (values.pow(2).mean() - 3 * log_prob.mean()).backward()
            opt.step()
        with th.no_grad():  # the reference's projection, by hand
            for layer, n0 in zip(ref_layers, initial):
                n = th.sqrt(layer.weight.pow(2).sum() + layer.bias.pow(2).sum())
                layer.weight.mul_(n0 / n)
                layer.bias.mul_(n0 / n)
        for p, q in zip(policy.parameters(), reference.parameters()):
            th.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    grown = [float(th.sqrt(sum(p.detach().pow(2).sum() for p in (m.weight, m.bias)))) for m in layers]
    assert grown == pytest.approx([float(n) for n in initial], rel=1e-5)
    assert callback.state["projections"] == 5
    policy.set_training_mode(False)  # an optimizer step outside train() is not projected
    before = [m.weight.detach().clone() for m in layers]
    policy.optimizer.zero_grad()
    policy.evaluate_actions(obs, actions)[1].mean().backward()
    policy.optimizer.step()
    assert callback.state["projections"] == 5 and not th.equal(before[0], layers[0].weight)


def test_projection_of_a_normalised_layer_keeps_the_function():
    th.manual_seed(1)
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    insert_layer_norms_(net)
    x = th.randn(10, 5)
    out = net(x)
    with th.no_grad():
        net[0].weight.mul_(7.0)
        net[0].bias.mul_(7.0)
    project_(net[0], 2.0)
    assert float(th.sqrt(net[0].weight.detach().pow(2).sum() + net[0].bias.detach().pow(2).sum())) == pytest.approx(2.0)
    th.testing.assert_close(net(x), out, rtol=1e-3, atol=1e-4)  # only the norm's eps sees the scale
    assert insert_layer_norms_(net) == []  # idempotent


def test_plain_sb3_model_with_inserted_norms():
    model = PPO("MlpPolicy", "CartPole-v1", **PPO_FAST)
    with pytest.raises(ValueError, match="no layer followed by a layer norm"):
        model.learn(64, callback=NormalizeAndProject())
    inserted = insert_layer_norms_(model.policy)
    add_norm_parameters_to_optimizers(inserted, [model.policy.optimizer])
    callback = NormalizeAndProject()
    model.learn(128, callback=callback)
    for key, layer, _ in callback.projected_layers():
        n = float(th.sqrt(layer.weight.detach().pow(2).sum() + layer.bias.detach().pow(2).sum()))
        assert n == pytest.approx(callback.state["norms"][key], rel=1e-5)


def test_save_load_continue_equals_the_uninterrupted_run(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", nap=True, learning_rate=3e-3, **PPO_FAST)
    layers = normalized_layers(model.policy)
    initial = [float(th.sqrt(m.weight.detach().pow(2).sum() + m.bias.detach().pow(2).sum())) for m in layers]
    loaded, path = assert_resume_equals_uninterrupted(model, tmp_path)
    norms = loaded.plastic_state["NormalizeAndProject:auto"]["norms"]
    assert sorted(norms.values()) == pytest.approx(sorted(initial))
    with pytest.raises(ValueError, match="nap"):
        PlasticPPO.load(path, nap=False)


@pytest.mark.parametrize("plastic_cls, kind", [(c, k) for c in PAIRS for k in ("mlp", "cnn", "multi") if has_alias(c, k)])
def test_nap_on_every_plastic_algorithm_and_policy(plastic_cls, kind):
    model = plastic_cls(
        policy_name(plastic_cls, kind), make_env(plastic_cls, kind), nap=True, seed=0, **algo_kwargs(plastic_cls, kind)
    )
    assert [type(c) for c in model.intervention_callbacks()] == [NormalizeAndProject]
    model.learn(80)
    state = model.plastic_state["NormalizeAndProject:auto"]
    assert state["norms"] and state["projections"] > 0
    (callback,) = model.intervention_callbacks()
    callback.init_callback(model)
    for key, layer, _ in callback.projected_layers():
        n = float(th.sqrt(sum(p.detach().double().pow(2).sum() for p in (layer.weight, layer.bias) if p is not None)))
        assert n == pytest.approx(state["norms"][key], rel=1e-5), key


@pytest.mark.parametrize("kwargs, match", [(dict(nap="yes"), "nap"), (dict(nap=True, nap_project="heads"), "heads")])
def test_bad_nap_keywords(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_nap_learning_rate_schedule():
    one = nap_learning_rate_schedule(1e-3, 0.1)
    assert one(1.0) == pytest.approx(1e-3) and one(0.5) == pytest.approx(5.5e-4) and one(0.0) == pytest.approx(1e-4)
    two = nap_learning_rate_schedule(1e-3, 0.0, n_tasks=2)
    assert two(0.75) == pytest.approx(5e-4) and two(0.5) == pytest.approx(1e-3) and two(0.25) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="final_fraction"):
        nap_learning_rate_schedule(1e-3, 2.0)


def test_units_of_a_normalised_layer_are_read_after_the_activation():
    """The interventions and diagnostics (CBP, ReDo, the monitor) see a NaP layer's post-activation outputs
    ``ReLU(LayerNorm(W x + b))``, computed here independently from the layers' parameters."""
    from sb3_plastic.callbacks.cbp import GenerateAndTest
    from sb3_plastic.callbacks.redo import probe_activity
    from sb3_plastic.common.surgery import find_networks
    from sb3_plastic.diagnostics import capture_features

    model = PlasticDQN("MlpPolicy", "CartPole-v1", nap=True, seed=0)
    spec = find_networks(model)[0]
    hidden = spec.hidden_layers()
    assert len(hidden) == 2 and all(isinstance(h.activation, nn.ReLU) for h in hidden)
    assert all(isinstance(h.pre_norm, nn.LayerNorm) for h in hidden)
    seq = model.q_net.q_net
    with th.no_grad():
        for ln in (seq[1], seq[4]):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
        x = th.randn(64, 4)
        want, h = [], x
        for i in (0, 3):
            z = h @ seq[i].weight.T + seq[i].bias
            normed = (z - z.mean(1, keepdim=True)) / th.sqrt(z.var(1, unbiased=False, keepdim=True) + seq[i + 1].eps)
            h = th.relu(normed * seq[i + 1].weight + seq[i + 1].bias)
            want.append(h)
    for got, ref in zip(probe_activity(hidden, lambda: spec.module(x)), want):  # ReDo
        th.testing.assert_close(got, ref.abs().mean(0))
    for got, ref in zip(capture_features(hidden, lambda: spec.module(x)), want):  # the monitor
        th.testing.assert_close(got, ref)
    gnt = GenerateAndTest(hidden, spec.optimizer, replacement_rate=0.0)  # Continual Backprop's hooks
    gnt.attach()
    spec.module.train()
    spec.module(x)
    for h_spec, ref in zip(hidden, want):
        th.testing.assert_close(gnt._stored[h_spec.name], ref)
    gnt.detach()


def test_nap_without_projection_is_the_layer_norms_alone():
    """nap_project='none': the networks get NaP's layer norms and nothing else (no callback, norms grow freely); the
    projected back under nap_project='normalized', free under 'none'."""
    kwargs = dict(activation="relu", isometry_mode="off", optimizer="adam", n_steps=64, batch_size=32, n_epochs=2,
                  seed=0, nap=True, learning_rate=0.01)
    alone = PlasticPPO("MlpPolicy", "CartPole-v1", nap_project="none", **kwargs)
    assert alone.intervention_callbacks() == []
    assert [type(m).__name__ for m in alone.policy.mlp_extractor.policy_net] == ["Linear", "LayerNorm", "ReLU"] * 2
    layer = alone.policy.mlp_extractor.policy_net[3]
    before = float(th.cat([layer.weight.flatten(), layer.bias]).detach().norm())
    alone.learn(256)
    after = float(th.cat([layer.weight.flatten(), layer.bias]).detach().norm())
    projected = PlasticPPO("MlpPolicy", "CartPole-v1", nap_project="normalized", **kwargs)
    projected.learn(256)
    p_layer = projected.policy.mlp_extractor.policy_net[3]
    assert abs(float(th.cat([p_layer.weight.flatten(), p_layer.bias]).detach().norm()) - before) < 1e-4  # projected
    assert abs(after - before) > 1e-3  # not projected: the norm moved
