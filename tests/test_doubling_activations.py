"""CReLU (Abbas et al., 2023) and deep Fourier features (Lewandowski et al., 2024): the activations against hand-written
formulas, the halved layers against the ReLU network of the same seed, forward passes by hand, CNNs, targets, the
interventions that cannot handle them."""

import numpy as np
import pytest
import torch as th

from sb3_plastic import ContinualBackprop, PlasticDQN, PlasticPPO, PlasticSAC, ReDo
from sb3_plastic.activations import CReLU, Fourier, get_activation
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.diagnostics import dormant_fraction

FAST = dict(n_steps=32, batch_size=32, n_epochs=1, seed=0)


def test_activations_match_hand_written_formulas():
    x = th.randn(5, 3, generator=th.Generator().manual_seed(0))
    assert th.equal(CReLU()(x), th.cat((x.clamp(min=0), (-x).clamp(min=0)), dim=1))
    assert th.equal(Fourier()(x), th.cat((th.sin(x), th.cos(x)), dim=1))
    img = th.randn(2, 4, 3, 3, generator=th.Generator().manual_seed(1))
    out = CReLU()(img)
    assert out.shape == (2, 8, 3, 3) and th.equal(out[:, 4:], (-img).clamp(min=0))
    assert get_activation("crelu") is CReLU and get_activation("FOURIER") is Fourier


@pytest.mark.parametrize("activation", ["crelu", "fourier"])
def test_layers_keep_half_the_units_of_the_relu_network_of_the_same_seed(activation):
    relu = PlasticPPO("MlpPolicy", "CartPole-v1", activation="relu", isometry_mode="off", optimizer="adam", **FAST)
    half = PlasticPPO("MlpPolicy", "CartPole-v1", activation=activation, isometry_mode="off", optimizer="adam", **FAST)
    r, h = relu.policy.mlp_extractor.policy_net, half.policy.mlp_extractor.policy_net
    assert (h[0].in_features, h[0].out_features, h[2].in_features, h[2].out_features) == (4, 32, 64, 32)
    assert th.equal(h[0].weight, r[0].weight[:32]) and th.equal(h[2].weight, r[2].weight[:32])
    assert th.equal(half.policy.action_net.weight, relu.policy.action_net.weight)  # the head reads 64 features
    count = [sum(p.numel() for p in m.policy.parameters()) for m in (relu, half)]
    assert count == [9155, 4675]
    optimizer_params = {id(p) for g in half.policy.optimizer.param_groups for p in g["params"]}
    assert optimizer_params == {id(p) for p in half.policy.parameters()}
    x = th.randn(7, 4, generator=th.Generator().manual_seed(2))
    act = (lambda z: th.cat((z.clamp(min=0), (-z).clamp(min=0)), 1)) if activation == "crelu" else (
        lambda z: th.cat((th.sin(z), th.cos(z)), 1))
    latent = act(h[2](act(h[0](x))))
    with th.no_grad():
        logits = half.policy.get_distribution(x).distribution.logits
        expected = half.policy.action_net(latent)
    assert th.allclose(logits, expected - expected.logsumexp(-1, keepdim=True), atol=1e-6)
    half.learn(64)


def test_targets_cnn_and_sac():
    dqn = PlasticDQN("MlpPolicy", "CartPole-v1", activation="crelu", learning_starts=16, buffer_size=200, seed=0)
    online, target = dqn.q_net.state_dict(), dqn.q_net_target.state_dict()
    assert all(th.equal(online[k], target[k]) for k in online) and online["q_net.0.weight"].shape == (32, 4)
    dqn.learn(48)
    sac = PlasticSAC("MlpPolicy", "Pendulum-v1", activation="fourier", learning_starts=16, buffer_size=200, seed=0)
    assert sac.critic.qf0[0].out_features == 128 and sac.critic_target.qf0[0].out_features == 128
    sac.learn(24)
    pytest.importorskip("minatar")
    import sb3_plastic.envs  # noqa: F401

    ppo = PlasticPPO("CnnPolicy", "sb3_plastic/PermutedMinAtar-Breakout-v0", activation="crelu", **FAST)
    extractor = ppo.policy.features_extractor
    assert extractor.cnn[0].out_channels == 8 and extractor.linear[0].out_features == 64
    ppo.learn(32)


def test_odd_widths_and_unit_replacement_are_refused_diagnostics_pair_the_features():
    with pytest.raises(ValueError, match="even layer widths"):
        PlasticPPO("MlpPolicy", "CartPole-v1", activation="crelu", policy_kwargs=dict(net_arch=[63]))
    model = PlasticPPO("MlpPolicy", "CartPole-v1", activation="crelu", isometry_mode="off", optimizer="adam", **FAST)
    with pytest.warns(UserWarning, match="nothing to act on"):
        model.learn(32, callback=ContinualBackprop())
    with pytest.warns(UserWarning, match="ReDo skips"):
        model.learn(64, callback=ReDo(period=1))
    h = th.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]])  # unit 0 = features 0, 1 (both silent); unit 1 alive
    assert dormant_fraction(h, 0.025, group_size=2) == 0.5
    hidden = find_networks(model)[0].hidden_layers()[0]
    assert hidden.group_size == 2 and hidden.n_units == 32
    out = th.randn(3, 32, generator=th.Generator().manual_seed(3))
    paired = hidden.post_activation(out)
    assert paired.shape == (3, 64) and th.equal(paired[:, 0::2], out.clamp(min=0)) and np.allclose(
        paired[:, 1::2].numpy(), (-out).clamp(min=0).numpy())


def test_save_load_rebuilds_the_halved_network(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", activation="fourier", isometry_mode="off", optimizer="adam", **FAST)
    model.learn(32)
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip")
    a, b = model.policy.state_dict(), loaded.policy.state_dict()
    assert a.keys() == b.keys() and all(th.equal(a[k], b[k]) for k in a)
    assert loaded.policy.mlp_extractor.policy_net[0].out_features == 32
