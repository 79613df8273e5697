"""Interventions reached through the plastic algorithms' top-level keywords (one implementation behind
both routes), their persistence across save/load, and the model-structure discovery they rely on."""

import pytest
import torch as th
from stable_baselines3 import PPO, TD3
from stable_baselines3.common.envs import SimpleMultiObsEnv

from sb3_plastic import FIRE, ContinualBackprop, PlasticDQN, PlasticPPO, PlasticSAC, ReDo, ShrinkPerturb
from sb3_plastic.common.surgery import find_networks

PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)


def test_keywords_build_the_same_callback_classes():
    model = PlasticPPO(
        "MlpPolicy",
        "CartPole-v1",
        fire_at=0.5,
        replacement_rate=0.05,
        maturity_threshold=3,
        redo_period=2,
        shrink_perturb="continual",
        **PPO_FAST,
    )
    callbacks = model.intervention_callbacks()
    assert [type(c) for c in callbacks] == [FIRE, ContinualBackprop, ReDo, ShrinkPerturb]
    cbp = callbacks[1]
    assert cbp.replacement_rate == 0.05 and cbp.maturity_threshold == 3
    model.learn(256)
    state = model.plastic_state
    assert state["FIRE:auto"]["count"] == 1
    replaced = sum(int(v["replaced"]) for layers in state["ContinualBackprop:auto"].values() for v in layers.values())
    assert replaced > 0
    assert state["ReDo:auto"]["events"] > 0
    for p in model.policy.parameters():
        assert th.isfinite(p).all()


def test_defaults_enable_no_intervention():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", **PPO_FAST)
    assert model.intervention_callbacks() == []


def test_fire_keyword_on_dqn_syncs_target_and_survives_save_load(tmp_path):
    model = PlasticDQN("MlpPolicy", "CartPole-v1", learning_starts=20, fire_at=0.5, seed=0)
    model.learn(200)
    assert model.plastic_state["FIRE:auto"]["count"] == 1
    # the target (updated only every 10 000 steps by DQN) was re-synced when FIRE orthogonalised the
    # online net: most singular values of its square 64x64 hidden layer are 1 (10 Newton-Schulz steps leave
    # the smallest ones short of 1, as in the reference); PyTorch's init has median ~0.6
    assert model.target_update_interval > 200
    fresh = PlasticDQN("MlpPolicy", "CartPole-v1", isometry_mode="off", optimizer="adam", seed=0)
    assert th.linalg.svdvals(fresh.policy.q_net_target.q_net[2].weight.detach()).median() < 0.8
    sigmas = th.linalg.svdvals(model.policy.q_net_target.q_net[2].weight.detach())
    assert abs(float(sigmas.median()) - 1.0) < 1e-3
    path = tmp_path / "dqn.zip"
    model.save(path)
    loaded = PlasticDQN.load(path, env=model.get_env())
    assert loaded.intervention_configs["fire"].fire_at == 0.5
    loaded.learn(100, reset_num_timesteps=False)
    assert loaded.plastic_state["FIRE:auto"]["count"] == 1  # the midpoint of this run was already passed


def test_cbp_keyword_state_survives_save_load(tmp_path):
    model = PlasticSAC("MlpPolicy", "Pendulum-v1", learning_starts=20, replacement_rate=0.01, maturity_threshold=5, seed=0)
    model.learn(80)
    ages = {
        (net, layer): entry["age"].clone()
        for net, layers in model.plastic_state["ContinualBackprop:auto"].items()
        for layer, entry in layers.items()
    }
    assert ages and all(int(a.max()) > 0 for a in ages.values())
    path = tmp_path / "sac.zip"
    model.save(path)
    loaded = PlasticSAC.load(path, env=model.get_env())
    restored = loaded.plastic_state["ContinualBackprop:auto"]
    for (net, layer), age in ages.items():
        assert th.equal(restored[net][layer]["age"], age)
    loaded.learn(20, reset_num_timesteps=False)
    grown = loaded.plastic_state["ContinualBackprop:auto"]
    assert any(int(grown[n][lyr]["age"].max()) > int(a.max()) for (n, lyr), a in ages.items())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(fire_at=1.5), "1.5"),
        (dict(replacement_rate=-0.1), "-0.1"),
        (dict(cbp_utility="usefulness"), "usefulness"),
        (dict(redo_tau=0.0), "0.0"),
        (dict(shrink_perturb="sometimes"), "sometimes"),
    ],
)
def test_bad_intervention_keywords(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_misspelt_keyword_is_a_clear_type_error():
    with pytest.raises(TypeError, match="replacment_rate"):
        PlasticPPO("MlpPolicy", "CartPole-v1", replacment_rate=0.1)


def test_dict_observation_offsets_in_concat():
    model = PPO("MultiInputPolicy", SimpleMultiObsEnv(random_start=False))
    (spec,) = find_networks(model)
    extractor_out = spec.module.features_extractor.extractors["img"].linear[0]
    hidden = {id(h.layer): h for h in spec.hidden_layers()}
    consumers = hidden[id(extractor_out)].consumers
    assert {id(c.layer) for c in consumers} == {
        id(model.policy.mlp_extractor.policy_net[0]),
        id(model.policy.mlp_extractor.value_net[0]),
    }
    # img comes first in the concat (keys are sorted): its 256 features start at column 0
    assert [c.offset for c in consumers] == [0, 0]
    assert len(consumers[0].columns(th.arange(256))) == 256


def test_td3_structure_known():
    nets = find_networks(TD3("MlpPolicy", "Pendulum-v1"))
    assert [n.name for n in nets] == ["actor", "critic"]
    assert all(n.target is not None for n in nets)
    assert len(nets[0].hidden_layers()) == 2 and len(nets[1].heads()) == 2


def test_load_applies_intervention_keywords_and_rejects_isometry_ones(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", **PPO_FAST)
    path = tmp_path / "ppo.zip"
    model.save(path)
    loaded = PlasticPPO.load(path, replacement_rate=0.01, maturity_threshold=7)
    assert loaded.intervention_configs["cbp"].replacement_rate == 0.01
    assert [type(c) for c in loaded.intervention_callbacks()] == [ContinualBackprop]
    with pytest.raises(ValueError, match="isometry_coef"):
        PlasticPPO.load(path, isometry_coef=0.5)
    with pytest.raises(ValueError, match="-1"):
        PlasticPPO.load(path, replacement_rate=-1.0)
