"""LayerReset (Nikishin et al., 2022): which layers, the fresh values against a hand-written draw of SB3's / PyTorch's
initialiser, the optimizer state and target networks, the triggers, save / load and the keywords."""

import copy
import math

import pytest
import torch as th
from sb3_contrib import QRDQN, TQC, CrossQ, MaskablePPO, RecurrentPPO
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.env_util import make_vec_env

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic import LayerReset, PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.callbacks.layer_reset import LayerResetConfig, selected_modules

PPO_FAST = dict(n_steps=32, batch_size=32, n_epochs=2, seed=0, policy_kwargs=dict(net_arch=[16, 16]))
OFF_FAST = dict(learning_starts=40, buffer_size=1000, batch_size=16, seed=0, policy_kwargs=dict(net_arch=[16, 16]))


def fast(kwargs, **overrides):
    return {**copy.deepcopy(kwargs), **overrides}


def names(model, selection):
    return [spec.layer_names[id(m)] for spec, m in selected_modules(model, selection)]


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_selections_name_the_layers_of_ppo_and_sac():
    ppo = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    assert names(ppo, 1) == names(ppo, "heads") == ["action_net", "value_net"]
    assert names(ppo, 2) == ["mlp_extractor.policy_net.2", "action_net", "mlp_extractor.value_net.2", "value_net"]
    assert names(ppo, "policy_head") == ["action_net"] and names(ppo, "value_head") == ["value_net"]
    assert names(ppo, "critic") == ["mlp_extractor.value_net.0", "mlp_extractor.value_net.2", "value_net"]
    assert names(ppo, ["mlp_extractor.policy_net.*"]) == ["mlp_extractor.policy_net.0", "mlp_extractor.policy_net.2"]
    sac = SAC("MlpPolicy", "Pendulum-v1", **fast(OFF_FAST))
    assert names(sac, "policy_head") == ["actor.mu", "actor.log_std"]
    assert names(sac, "value_head") == ["critic.qf0.4", "critic.qf1.4"]
    assert set(names(sac, "critic")) == {f"critic.qf{i}.{j}" for i in (0, 1) for j in (0, 2, 4)}
    dqn = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    assert names(dqn, "policy_head") == names(dqn, "value_head") == names(dqn, 1) == ["q_net.q_net.4"]  # the Q head
    assert len(names(dqn, "critic")) == 3  # DQN's critic is its whole Q-network


def test_bad_selections_and_no_trigger_are_clear_errors():
    with pytest.raises(ValueError, match="int >= 1"):
        LayerReset(0, every=10)
    with pytest.raises(ValueError, match="policy_head"):
        LayerReset("head", every=10)
    with pytest.raises(ValueError, match="needs a trigger"):
        LayerReset("heads")
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    with pytest.raises(ValueError, match="selects no layer.*action_net"):
        model.learn(32, callback=LayerReset(["nothing*"], every=32))
    with pytest.raises(ValueError, match="layer_reset_layers"):
        LayerResetConfig(layer_reset_layers="everything")
    with pytest.warns(UserWarning, match="layer_reset_layers=2 is ignored"):
        LayerResetConfig(layer_reset_layers=2)


def test_ppo_heads_get_a_fresh_draw_of_sb3s_orthogonal_init():
    """Hand-written reference: SB3's ortho_init gives action_net gain 0.01, value_net gain 1, biases 0; the draw
    comes from the callback's private generator, weight by weight in the order of the selection."""
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    model.learn(64)
    policy = model.policy
    hidden = snapshot(policy.mlp_extractor)
    callback = LayerReset("heads", every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    before = callback.generator("cpu").get_state()
    callback.reset()
    with th.random.fork_rng():
        th.random.set_rng_state(before)
        w_pi = th.nn.init.orthogonal_(th.empty(2, 16), gain=0.01)
        w_vf = th.nn.init.orthogonal_(th.empty(1, 16), gain=1.0)
    assert th.equal(policy.action_net.weight, w_pi) and th.equal(policy.value_net.weight, w_vf)
    assert not policy.action_net.bias.any() and not policy.value_net.bias.any()
    for key, value in policy.mlp_extractor.state_dict().items():
        assert th.equal(value, hidden[key]), key


def test_global_rng_untouched_by_a_reset():
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    callback = LayerReset("all", every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    state = th.random.get_rng_state()
    callback.reset()
    assert th.equal(th.random.get_rng_state(), state)


def test_dqn_head_gets_pytorchs_default_init_target_gets_the_head_only():
    """Hand-written reference of PyTorch's Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias. The
    target network receives the reset head and keeps its (lagging) hidden layers."""
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST, target_update_interval=10**6))
    model.learn(200)
    online, target = model.policy.q_net.q_net, model.policy.q_net_target.q_net
    target_hidden = snapshot(target[0])
    assert not th.equal(online[0].weight, target[0].weight)  # the target lags
    callback = LayerReset("heads", every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    before = callback.generator("cpu").get_state()
    callback.reset()
    bound = 1 / math.sqrt(16)
    with th.random.fork_rng():
        th.random.set_rng_state(before)
        weight = th.empty(2, 16).uniform_(-bound, bound)
        bias = th.empty(2).uniform_(-bound, bound)
    assert th.equal(online[4].weight, weight) and th.equal(online[4].bias, bias)
    assert th.equal(target[4].weight, weight) and th.equal(target[4].bias, bias)
    for key, value in target[0].state_dict().items():
        assert th.equal(value, target_hidden[key])


def test_optimizer_state_of_touched_tensors_restarts_the_rest_keeps_its_own():
    model = DQN("MlpPolicy", "CartPole-v1", **fast(OFF_FAST))
    model.learn(200)
    optimizer = model.policy.optimizer
    head, hidden = model.policy.q_net.q_net[4], model.policy.q_net.q_net[0]
    kept = {k: v.clone() for k, v in optimizer.state[hidden.weight].items()}
    assert head.weight in optimizer.state
    callback = LayerReset(1, every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    callback.reset()
    assert head.weight not in optimizer.state and head.bias not in optimizer.state
    for key, value in optimizer.state[hidden.weight].items():
        assert th.equal(value, kept[key]), key
    model.train(gradient_steps=1, batch_size=16)
    assert int(optimizer.state[head.weight]["step"]) == 1  # Adam treats the head as new: bias correction restarts
    assert int(optimizer.state[hidden.weight]["step"]) == int(kept["step"]) + 1


def test_on_task_change_resets_between_rollouts_of_ppo():
    env = make_vec_env("sb3_plastic/PerturbedCartPole-v0", n_envs=2, seed=0, env_kwargs=dict(change_every=50, task_seed=0))
    model = PPO("MlpPolicy", env, **fast(PPO_FAST))
    callback = LayerReset("heads", on_task_change=True)
    model.learn(320, callback=callback)
    # tasks change at timesteps 100, 200, 300 (50 env steps of each of 2 copies); PPO acts at the next rollout start
    assert callback.event_timesteps == [128, 256, 320]
    assert model.plastic_state["LayerReset"]["reasons"] == ["task_change"] * 3


def test_continuous_policy_head_resets_log_std():
    model = PPO("MlpPolicy", "Pendulum-v1", **fast(PPO_FAST, policy_kwargs=dict(net_arch=[16], log_std_init=-1.0)))
    model.learn(128)
    assert not th.allclose(model.policy.log_std, th.full_like(model.policy.log_std, -1.0))
    callback = LayerReset("policy_head", every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    value_net = snapshot(model.policy.value_net)
    callback.reset()
    assert th.equal(model.policy.log_std, th.full_like(model.policy.log_std, -1.0))
    assert model.policy.log_std not in model.policy.optimizer.state
    assert all(th.equal(v, value_net[k]) for k, v in model.policy.value_net.state_dict().items())


def test_state_and_private_stream_survive_save_load(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", **fast(PPO_FAST))
    model.learn(128, callback=LayerReset("heads", every=64))
    state = model.plastic_state["LayerReset"]
    assert state["count"] == 2 and "cpu" in state["rng"]["states"]
    saved = state["rng"]["states"]["cpu"].clone()
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=model.get_env())
    callback = LayerReset("heads", every=64)
    loaded.learn(64, callback=callback, reset_num_timesteps=False)
    assert loaded.plastic_state["LayerReset"]["count"] == 3
    with th.random.fork_rng():  # the resumed reset drew from the saved stream
        th.random.set_rng_state(saved)
        w_pi = th.nn.init.orthogonal_(th.empty(2, 16), gain=0.01)
    assert th.equal(loaded.policy.action_net.weight, w_pi)
    assert loaded.plastic_state["LayerReset"]["timesteps"] == [64, 128, 192]
    assert not th.equal(loaded.plastic_state["LayerReset"]["rng"]["states"]["cpu"], saved)  # the stream went on


@pytest.mark.parametrize("cls, env_id, kwargs", [
    (PlasticPPO, "CartPole-v1", PPO_FAST),
    (PlasticDQN, "CartPole-v1", OFF_FAST),
    (PlasticSAC, "Pendulum-v1", OFF_FAST),
])
def test_keywords_on_the_plastic_algorithms(cls, env_id, kwargs):
    model = cls("MlpPolicy", env_id, layer_reset_every=64, layer_reset_layers="value_head", **fast(kwargs))
    (callback,) = model.intervention_callbacks()
    assert isinstance(callback, LayerReset) and callback.layers == "value_head" and callback.every == 64
    model.learn(128)
    assert model.plastic_state["LayerReset:auto"]["count"] == 2


@pytest.mark.parametrize("cls, env_id, kwargs, selection", [
    (QRDQN, "CartPole-v1", OFF_FAST, "heads"),
    (TQC, "Pendulum-v1", OFF_FAST, "critic"),
    (CrossQ, "Pendulum-v1", OFF_FAST, 2),
    (RecurrentPPO, "CartPole-v1", dict(PPO_FAST, policy_kwargs=dict(net_arch=[16], lstm_hidden_size=8)), ["lstm_actor"]),
    (MaskablePPO, "sb3_plastic/InvalidActionDiscrete-v0", PPO_FAST, "policy_head"),
])
def test_reset_on_the_contrib_algorithms(cls, env_id, kwargs, selection):
    model = cls("MlpLstmPolicy" if cls is RecurrentPPO else "MlpPolicy", env_id, **fast(kwargs))
    model.learn(64)
    chosen = [m for _, m in selected_modules(model, selection)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in chosen]
    others = {k: v.clone() for k, v in model.policy.state_dict().items()}
    callback = LayerReset(selection, every=10**9)
    callback.init_callback(model)
    callback._bind_private_rng()
    touched = callback.reset()
    assert touched
    for module, old in zip(chosen, before):
        assert any(not th.equal(v, old[k]) for k, v in module.state_dict().items() if v.is_floating_point())
    ids = {id(t) for t in touched}
    changed = [k for k, v in model.policy.state_dict().items() if not th.equal(v, others[k])]
    own = {k for k, v in model.policy.state_dict(keep_vars=True).items() if id(v) in ids}
    assert changed and all(k in own or "target" in k or "ra_" in k or "steps" in k for k in changed), changed
