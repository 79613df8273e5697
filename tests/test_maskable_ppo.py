"""PlasticMaskablePPO: sb3-contrib equivalence when plasticity is off, plastic training with AdamO groups,
action masks, save/load with optimizer state, and the intervention keywords."""

import pytest
import torch as th
from plastic_asserts import assert_same_adam_moments, assert_same_parameters
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

from sb3_plastic.activations import MaxMin
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.contrib_policies import PlasticMaskableActorCriticPolicy
from sb3_plastic.maskable_ppo import PlasticMaskablePPO
from sb3_plastic.optim import AdamO

OFF = dict(activation="tanh", isometry_mode="off", optimizer="adam")
FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)


def make_env():
    return InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)


def test_policy_mro_keeps_maskable_methods():
    cls = PlasticMaskableActorCriticPolicy
    assert cls.__mro__.index(MaskableActorCriticPolicy) > 1  # the plastic mixin comes first
    for name in ("forward", "predict", "_predict", "evaluate_actions", "get_distribution"):
        assert getattr(cls, name) is getattr(MaskableActorCriticPolicy, name), name


def test_plasticity_off_is_contrib():
    reference = MaskablePPO("MlpPolicy", make_env(), **FAST)
    reference.learn(128)
    plastic = PlasticMaskablePPO("MlpPolicy", make_env(), **OFF, **FAST)
    assert type(plastic.policy.optimizer) is th.optim.Adam
    assert plastic.policy.optimizer.param_groups[0]["eps"] == reference.policy.optimizer.param_groups[0]["eps"] == 1e-5
    plastic.learn(128)
    assert_same_parameters(reference, plastic)
    fresh = MaskablePPO("MlpPolicy", make_env(), **FAST)
    assert any(not th.equal(x, y) for x, y in zip(fresh.policy.parameters(), reference.policy.parameters()))


def _assert_masks_respected(model, env):
    obs, _ = env.reset(seed=3)
    for _ in range(30):
        masks = env.action_masks()
        action, _ = model.predict(obs, action_masks=masks, deterministic=False)
        assert masks[int(action)], int(action)
        action, _ = model.predict(obs, action_masks=masks, deterministic=True)
        assert masks[int(action)], int(action)
        obs, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            obs, _ = env.reset()


@pytest.mark.parametrize("activation", ["relu", "maxmin"])
def test_plastic_training_masks_and_save_load(tmp_path, activation):
    model = PlasticMaskablePPO("MlpPolicy", make_env(), activation=activation, isometry_coef=0.05, **FAST)
    opt = model.policy.optimizer
    assert isinstance(opt, AdamO)
    assert [g["isometry_coef"] for g in opt.param_groups] == [0.05, 0.0]
    head_ids = {id(p) for head in (model.policy.action_net, model.policy.value_net) for p in head.parameters()}
    assert not head_ids & {id(p) for p in opt.param_groups[0]["params"]}
    act_cls = MaxMin if activation == "maxmin" else th.nn.ReLU
    assert any(isinstance(m, act_cls) for m in model.policy.modules())
    model.learn(128)
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    _assert_masks_respected(model, make_env())

    path = tmp_path / "model.zip"
    model.save(path)
    loaded = PlasticMaskablePPO.load(path, env=model.get_env())
    assert loaded.isometry_config == model.isometry_config
    assert isinstance(loaded.policy, PlasticMaskableActorCriticPolicy)
    opt_b = loaded.policy.optimizer
    assert isinstance(opt_b, AdamO)
    assert [g["isometry_coef"] for g in opt_b.param_groups] == [0.05, 0.0]
    assert_same_adam_moments(opt, opt_b)
    assert_same_parameters(model, loaded)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + 64
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))
    _assert_masks_respected(loaded, make_env())


def test_maxmin_orthogonal_init_heads():
    model = PlasticMaskablePPO("MlpPolicy", make_env(), activation="maxmin", seed=1)
    action_net, value_net = model.policy.plastic_heads()
    assert action_net is model.policy.action_net and value_net is model.policy.value_net
    assert th.allclose(th.linalg.svdvals(action_net.weight.detach()), th.full((1,), 0.01), atol=1e-5)
    assert th.allclose(th.linalg.svdvals(value_net.weight.detach()), th.ones(1), atol=1e-4)
    for p in model.policy.optimizer.param_groups[0]["params"]:
        assert th.allclose(th.linalg.svdvals(p.detach()), th.ones(1), atol=1e-4)


def test_find_networks_handles_maskable_policy():
    model = PlasticMaskablePPO("MlpPolicy", make_env(), activation="relu", seed=0)
    (spec,) = find_networks(model)
    assert spec.optimizer is model.policy.optimizer


@pytest.mark.parametrize(
    "intervention", [dict(fire_at=0.5), dict(replacement_rate=0.01, maturity_threshold=5)], ids=lambda d: next(iter(d))
)
def test_intervention_keywords(intervention):
    model = PlasticMaskablePPO("MlpPolicy", make_env(), activation="maxmin", **FAST, **intervention)
    assert len(model.intervention_callbacks()) == 1
    model.learn(256)
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    state = model.plastic_state
    if "fire_at" in intervention:
        assert state["FIRE:auto"]["count"] == 1
    if "replacement_rate" in intervention:
        replaced = sum(int(v["replaced"]) for layers in state["ContinualBackprop:auto"].values() for v in layers.values())
        assert replaced > 0
    _assert_masks_respected(model, make_env())
