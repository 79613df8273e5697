"""Parseval regularisation (Chung et al., 2024): the gradient against autograd of the hand-written penalty for every
shape, its identity with the coupled isometry mode (the same run), the layers, keywords."""

import pytest
import torch as th
from stable_baselines3 import DQN, SAC

from sb3_plastic import ParsevalRegularisation, PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.callbacks.parseval import ParsevalConfig, parseval_penalty_grad

NET = dict(net_arch=[16, 16])
PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)
OFF_FAST = dict(learning_starts=32, buffer_size=500, batch_size=16, seed=0)


@pytest.mark.parametrize("shape", [(3, 7), (5, 5), (9, 4), (6, 3, 2, 2)])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_gradient_is_autograd_of_the_hand_written_penalty(shape, scale):
    w = th.randn(*shape, generator=th.Generator().manual_seed(sum(shape)), dtype=th.float64, requires_grad=True)
    m = w.reshape(shape[0], -1)
    penalty = ((m @ m.T - scale * th.eye(shape[0], dtype=th.float64)) ** 2).sum()  # ||W W^T - s I||_F^2
    (expected,) = th.autograd.grad(penalty, w)
    assert th.allclose(parseval_penalty_grad(w.detach(), scale), expected, rtol=1e-10, atol=1e-12)


def test_same_run_as_the_coupled_isometry_mode():
    """parseval_coef=lambda on Adam == isometry_mode='coupled', isometry_coef=2 lambda, optimizer='adam' (module
    docstring; the isometry penalty is 1/2 ||Gram - sI||^2 in its authors' convention): the same gradient on the same
    layers, so the same training."""
    kwargs = dict(activation="relu", optimizer="adam", policy_kwargs=dict(NET), **PPO_FAST)
    runs = []
    for extra in (dict(isometry_mode="coupled", isometry_coef=0.1, isometry_scale=2.0),
                  dict(isometry_mode="off", parseval_coef=0.05, parseval_scale=2.0)):
        model = PlasticPPO("MlpPolicy", "CartPole-v1", **extra, **kwargs)  # built and trained in turn: SB3 seeds torch
        model.learn(192)
        runs.append(model)
    coupled, parseval = runs
    for (name, a), b in zip(coupled.policy.named_parameters(), parseval.policy.parameters()):
        assert th.equal(a, b), name
    plain = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", **kwargs)
    plain.learn(192)
    assert not th.allclose(plain.policy.mlp_extractor.policy_net[0].weight,
                           parseval.policy.mlp_extractor.policy_net[0].weight, atol=1e-4)


def test_hidden_layers_only_and_the_penalty_falls():
    model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(NET), **OFF_FAST)
    callback = ParsevalRegularisation(coef=0.1)
    callback.init_callback(model)
    names = [n for n, _ in callback.weights()]
    assert "actor:actor.latent_pi.0" in names and "critic:critic.qf1.2" in names
    assert not any(n.endswith(("mu", "log_std", "qf0.4", "qf1.4")) for n in names)
    before = callback.penalty()
    model.learn(400, callback=callback)
    assert callback.penalty() < before


def test_plain_dqn_gradient_includes_the_penalty_once():
    """The callback's hook adds coef * grad exactly once per backward (inside, before clipping)."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    model.learn(64)
    callback = ParsevalRegularisation(coef=0.3, scale=1.5)
    callback.init_callback(model)
    callback._on_training_start()
    model.policy.set_training_mode(True)
    layer = model.q_net.q_net[2]
    x = th.randn(8, 4, generator=th.Generator().manual_seed(0))
    model.policy.optimizer.zero_grad()
    model.q_net(x).sum().backward()
    with_penalty = layer.weight.grad.clone()
    callback._on_training_end()  # hooks removed
    model.policy.optimizer.zero_grad()
    model.q_net(x).sum().backward()
    assert th.allclose(with_penalty - layer.weight.grad, 0.3 * parseval_penalty_grad(layer.weight.detach(), 1.5))
    head = model.q_net.q_net[4]
    assert all(id(head.weight) != id(w) for _, w in callback.weights())


@pytest.mark.parametrize("cls, env_id, kwargs", [
    (PlasticPPO, "CartPole-v1", PPO_FAST), (PlasticDQN, "CartPole-v1", OFF_FAST), (PlasticSAC, "Pendulum-v1", OFF_FAST)])
def test_keywords(cls, env_id, kwargs):
    model = cls("MlpPolicy", env_id, isometry_mode="off", optimizer="adam", parseval_coef=1e-3,
                policy_kwargs=dict(NET), **kwargs)
    (callback,) = model.intervention_callbacks()
    assert isinstance(callback, ParsevalRegularisation) and callback.coef == 1e-3 and callback.scale == 1.0
    model.learn(64)


def test_errors():
    with pytest.raises(ValueError, match="scale"):
        ParsevalRegularisation(scale=0.0)
    with pytest.raises(ValueError, match="layers"):
        ParsevalRegularisation(layers="heads")
    with pytest.warns(UserWarning, match="parseval_scale=2.0 is ignored"):
        ParsevalConfig(parseval_scale=2.0)
