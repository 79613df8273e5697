"""PlasticPPO / PlasticDQN / PlasticSAC: SB3 equivalence when plasticity is off, plastic training,
orthogonal init, optimizer groups, save/load, and argument errors."""

import math

import gymnasium as gym
import minatar.gym
import numpy as np
import pytest
import torch as th
from plastic_asserts import assert_same_adam_moments, assert_same_parameters
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.envs import FakeImageEnv

from sb3_plastic import AdamO, MaxMin, PlasticDQN, PlasticPPO, PlasticSAC
from sb3_plastic.envs import register_envs
from sb3_plastic.isometry import dfi_per_layer
from sb3_plastic.networks import PlasticCNN

minatar.gym.register_envs()

OFF = dict(isometry_mode="off", optimizer="adam")
PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)
OFFPOLICY_FAST = dict(learning_starts=50, buffer_size=2000, seed=0)


def image_env():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)  # FakeImageEnv draws observations from its space: make them reproducible
    return env


@pytest.mark.parametrize(
    "sb3_cls, plastic_cls, policy, env_fn, kwargs, steps",
    [
        (PPO, PlasticPPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, 128),
        (PPO, PlasticPPO, "CnnPolicy", image_env, PPO_FAST, 128),
        (DQN, PlasticDQN, "MlpPolicy", lambda: "CartPole-v1", OFFPOLICY_FAST, 300),
        (DQN, PlasticDQN, "CnnPolicy", image_env, dict(OFFPOLICY_FAST, learning_starts=20), 80),
        (SAC, PlasticSAC, "MlpPolicy", lambda: "Pendulum-v1", OFFPOLICY_FAST, 150),
    ],
)
def test_plasticity_off_is_sb3(sb3_cls, plastic_cls, policy, env_fn, kwargs, steps):
    reference = sb3_cls(policy, env_fn(), **kwargs)
    reference.learn(steps)
    # SB3: PPO MLPs use tanh, its NatureCNN (followed by no MLP layer) ReLU
    activation = "tanh" if sb3_cls is PPO and policy == "MlpPolicy" else "relu"
    plastic = plastic_cls(policy, env_fn(), activation=activation, **OFF, **kwargs)
    plastic.learn(steps)
    assert_same_parameters(reference, plastic)
    # the run really trained: parameters moved away from a fresh model's
    fresh = sb3_cls(policy, env_fn(), **kwargs)
    assert any(not th.equal(x, y) for x, y in zip(fresh.policy.parameters(), reference.policy.parameters()))


def _all_optimizers(model):
    if isinstance(model, PlasticSAC):
        return [model.actor.optimizer, model.critic.optimizer]
    return [model.policy.optimizer]


@pytest.mark.parametrize("activation", ["relu", "maxmin"])
@pytest.mark.parametrize(
    "cls, policy, env_fn, kwargs, steps",
    [
        (PlasticPPO, "MlpPolicy", lambda: "CartPole-v1", PPO_FAST, 128),
        (PlasticPPO, "CnnPolicy", image_env, PPO_FAST, 128),
        (PlasticDQN, "MlpPolicy", lambda: "CartPole-v1", OFFPOLICY_FAST, 200),
        (PlasticDQN, "CnnPolicy", image_env, dict(OFFPOLICY_FAST, learning_starts=20), 60),
        (PlasticSAC, "MlpPolicy", lambda: "Pendulum-v1", OFFPOLICY_FAST, 120),
    ],
)
def test_plastic_training_and_save_load(tmp_path, cls, policy, env_fn, kwargs, steps, activation):
    model = cls(policy, env_fn(), activation=activation, isometry_coef=0.05, **kwargs)
    for opt in _all_optimizers(model):
        assert isinstance(opt, AdamO)
        coefs = [g["isometry_coef"] for g in opt.param_groups]
        assert coefs == [0.05, 0.0]
    act_cls = MaxMin if activation == "maxmin" else th.nn.ReLU
    assert any(isinstance(m, act_cls) for m in model.policy.modules())
    model.learn(steps)
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = cls.load(path, env=model.get_env())
    assert loaded.isometry_config == model.isometry_config
    assert loaded.policy.isometry_config.activation == activation
    for opt_a, opt_b in zip(_all_optimizers(model), _all_optimizers(loaded)):
        assert isinstance(opt_b, AdamO)
        assert [g["isometry_coef"] for g in opt_b.param_groups] == [0.05, 0.0]
        assert_same_adam_moments(opt_a, opt_b)
    assert_same_parameters(model, loaded)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    loaded.learn(steps // 2, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + steps // 2
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))


def _sigmas(layer):
    return th.linalg.svdvals(layer.weight.detach().reshape(layer.weight.shape[0], -1))


def test_maxmin_orthogonal_init_survives_sb3_ortho_init():
    model = PlasticPPO("CnnPolicy", image_env(), activation="maxmin", policy_kwargs=dict(net_arch=[64, 64]), **PPO_FAST)
    policy = model.policy
    hidden = [m for m in policy.features_extractor.modules() if isinstance(m, (th.nn.Linear, th.nn.Conv2d))]
    hidden += [m for m in policy.mlp_extractor.modules() if isinstance(m, th.nn.Linear)]
    assert len(hidden) == 4 + 4
    for layer in hidden:  # gain 1, not SB3's sqrt(2)
        assert th.allclose(_sigmas(layer), th.ones(1), atol=1e-4)
        assert th.all(layer.bias == 0)
    assert th.allclose(_sigmas(policy.action_net), th.full((1,), 0.01), atol=1e-6)
    assert max(dfi_per_layer(policy.mlp_extractor).values()) < 1e-8
    # SB3's own init (ReLU, no orthogonal_init) keeps sqrt(2)
    relu = PlasticPPO("MlpPolicy", "CartPole-v1", activation="relu", **PPO_FAST)
    assert th.allclose(_sigmas(relu.policy.mlp_extractor.policy_net[0]), th.full((1,), math.sqrt(2)), atol=1e-4)


@pytest.mark.parametrize("cls, env", [(PlasticDQN, "CartPole-v1"), (PlasticSAC, "Pendulum-v1")])
def test_orthogonal_init_syncs_targets(cls, env):
    model = cls("MlpPolicy", env, activation="maxmin", seed=1)
    targets = model.policy.plastic_targets()
    assert targets
    for target, online in targets:
        for (name, a), b in zip(online.state_dict().items(), target.state_dict().values()):
            assert th.equal(a, b), name
    head = model.policy.plastic_heads()[0]
    assert th.allclose(_sigmas(head), th.ones(1), atol=1e-4)


def test_heads_excluded_and_layer_patterns():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", **PPO_FAST)
    regularised = {id(p) for p in model.policy.optimizer.param_groups[0]["params"]}
    assert id(model.policy.action_net.weight) not in regularised
    assert id(model.policy.value_net.weight) not in regularised
    assert id(model.policy.mlp_extractor.policy_net[0].weight) in regularised
    assert len(regularised) == 4
    everything = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_layers="all", **PPO_FAST)
    assert len(everything.policy.optimizer.param_groups[0]["params"]) == 6
    only_pi = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_layers=["mlp_extractor.policy_net.*"], **PPO_FAST)
    names = {id(p): n for n, p in only_pi.policy.named_parameters()}
    assert sorted(names[id(p)] for p in only_pi.policy.optimizer.param_groups[0]["params"]) == [
        "mlp_extractor.policy_net.0.weight",
        "mlp_extractor.policy_net.2.weight",
    ]


def test_sac_actor_and_critic_adamo_entropy_adam():
    model = PlasticSAC("MlpPolicy", "Pendulum-v1", isometry_coef=0.01)
    assert isinstance(model.actor.optimizer, AdamO) and isinstance(model.critic.optimizer, AdamO)
    assert type(model.ent_coef_optimizer) is th.optim.Adam
    critic_reg = {id(p) for p in model.critic.optimizer.param_groups[0]["params"]}
    for q_net in model.critic.q_networks:
        assert id(q_net[-1].weight) not in critic_reg and id(q_net[0].weight) in critic_reg
    assert id(model.actor.mu.weight) not in {id(p) for p in model.actor.optimizer.param_groups[0]["params"]}


def test_optimizer_choices_and_modes():
    coupled = PlasticPPO("MlpPolicy", "CartPole-v1", optimizer="adam", isometry_mode="coupled", **PPO_FAST)
    assert coupled.policy.optimizer.param_groups[0]["isometry_mode"] == "coupled"
    equal = PlasticDQN("MlpPolicy", "CartPole-v1", optimizer="adam_equal_betas", isometry_mode="off")
    assert type(equal.policy.optimizer) is th.optim.Adam
    assert equal.policy.optimizer.param_groups[0]["betas"] == (0.99, 0.99)
    adamo_off = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", **PPO_FAST)
    assert all(g["isometry_coef"] == 0.0 for g in adamo_off.policy.optimizer.param_groups)
    assert adamo_off.policy.optimizer.param_groups[0]["eps"] == 1e-5  # SB3's PPO epsilon
    # the default: the exact AdamO step (1); "auto": ceil(1024 / batch_size) clipped to [1, 64]
    assert adamo_off.policy.optimizer.param_groups[0]["isometry_interval"] == 1
    auto = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", isometry_interval="auto", **PPO_FAST)
    assert auto.policy.optimizer.param_groups[0]["isometry_interval"] == 32  # PPO_FAST's batch of 32
    assert auto.isometry_config.isometry_interval == 32
    for cls, kwargs, expected in [
        (PlasticPPO, {}, 16),  # SB3's PPO batch_size default: 64
        (PlasticPPO, dict(batch_size=256), 4),
        (PlasticPPO, dict(batch_size=100), 11),
        (PlasticPPO, dict(batch_size=4096), 1),
        (PlasticPPO, dict(batch_size=8, n_steps=8), 64),  # clipped
        (PlasticDQN, {}, 32),  # SB3's DQN batch_size default: 32
        (PlasticSAC, {}, 4),  # 256
    ]:
        env = "Pendulum-v1" if cls is PlasticSAC else "CartPole-v1"
        kwargs = dict(kwargs, isometry_interval="auto")
        model = cls("MlpPolicy", env, buffer_size=1000, **kwargs) if cls is not PlasticPPO else cls("MlpPolicy", env, **kwargs)
        optimizers = [model.actor.optimizer, model.critic.optimizer] if cls is PlasticSAC else [model.policy.optimizer]
        groups = [g for opt in optimizers for g in opt.param_groups if g.get("isometry_coef", 0) > 0]
        assert groups and all(g["isometry_interval"] == expected for g in groups), (cls, kwargs)
    exact = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_interval=1, **PPO_FAST)
    assert all(g["isometry_interval"] == 1 for g in exact.policy.optimizer.param_groups)
    with pytest.raises(ValueError, match="isometry_interval must be an int >= 1 or 'auto', got 0"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_interval=0)
    with pytest.raises(ValueError, match="isometry_interval must be an int >= 1 or 'auto', got 'fast'"):
        PlasticPPO("MlpPolicy", "CartPole-v1", isometry_interval="fast")


def test_minatar_small_cnn_with_maxmin():
    model = PlasticPPO("CnnPolicy", gym.make("MinAtar/Breakout-v1"), activation="maxmin", **PPO_FAST)
    extractor = model.policy.features_extractor
    assert isinstance(extractor, PlasticCNN) and extractor.arch == "minatar" and extractor.channels_last
    model.learn(64)


@pytest.mark.parametrize("env_id", ["sb3_plastic/SwitchingMinAtar-v0", "sb3_plastic/PermutedMinAtar-Seaquest-v0"])
def test_square_minatar_frames_are_read_channels_last(env_id):
    # (10, 10, 10): SB3's smallest-axis rule breaks the tie towards the first axis and reads image rows as channels
    register_envs()
    env = gym.make(env_id)
    assert env.observation_space.shape == (10, 10, 10)
    model = PlasticPPO("CnnPolicy", env, **PPO_FAST)
    extractor = model.policy.features_extractor
    assert extractor.channels_last
    th.manual_seed(0)
    obs = th.rand(3, 10, 10, 10) > 0.5
    with th.no_grad():
        conv = extractor.cnn[0]
        expected = extractor.linear(extractor.cnn(obs.float().permute(0, 3, 1, 2)))
        assert th.equal(extractor(obs.float()), expected)
        # a permutation of the channel axis (what PermutedMinAtar does) is a permutation of the conv's inputs
        perm = th.randperm(10)
        swapped = th.nn.functional.conv2d(obs.float().permute(0, 3, 1, 2)[:, perm], conv.weight[:, perm], conv.bias)
        assert th.allclose(swapped, conv(obs.float().permute(0, 3, 1, 2)), atol=1e-5)


def test_channel_layout_of_other_boxes_and_its_errors():
    binary = gym.spaces.Box(0, 1, (10, 10, 12), dtype=bool)  # MinAtar-like, more channels than rows
    assert PlasticCNN(binary).channels_last and PlasticCNN(binary).cnn[0].in_channels == 12
    octax = gym.spaces.Box(0, 1, (4, 32, 64), dtype=bool)
    assert not PlasticCNN(octax).channels_last and PlasticCNN(octax).cnn[0].in_channels == 4
    floats = gym.spaces.Box(-1.0, 1.0, (10, 10, 10), dtype=np.float32)
    with pytest.warns(UserWarning, match=r"\(10, 10, 10\) reads as \(C, H, W\) or as \(H, W, C\)"):
        assert not PlasticCNN(floats, normalized_image=True).channels_last
    assert PlasticCNN(floats, normalized_image=True, channels_last=True).channels_last
    assert not PlasticCNN(binary, channels_last=False).channels_last
    image = gym.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
    with pytest.raises(ValueError, match="channels_last=True for the uint8 image space"):
        PlasticCNN(image, channels_last=True)
    with pytest.raises(ValueError, match="channels_last must be None, True or False, got 'hwc'"):
        PlasticCNN(binary, channels_last="hwc")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(activation="gelu"), "Unknown activation 'gelu'"),
        (dict(isometry_coef=-0.1), "isometry_coef must be a finite number >= 0, got -0.1"),
        (dict(isometry_mode="sometimes"), "Unknown isometry_mode 'sometimes'.*decoupled"),
        (dict(optimizer="sgd"), "Unknown optimizer 'sgd'"),
        (dict(optimizer="adam"), "isometry_mode='decoupled' is what AdamO does"),
        (dict(isometry_layers="heads"), "Unknown isometry_layers 'heads'"),
        (dict(activation="maxmin", policy_kwargs=dict(net_arch=[64, 33])), r"even layer widths.*33"),
        (dict(policy_kwargs=dict(isometry_coef=0.1)), "top-level keywords"),
        (dict(activation="maxmin", policy_kwargs=dict(activation_fn=th.nn.Tanh)), "conflicts"),
        (  # a user's optimizer_class gets the isometry step (tests/test_sb3_parity.py); adam_equal_betas refuses one
            dict(optimizer="adam_equal_betas", isometry_mode="coupled", policy_kwargs=dict(optimizer_class=th.optim.SGD)),
            "adam_equal_betas.*optimizer_class=SGD",
        ),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PlasticPPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_sb3_alias_class_means_the_alias():
    """SB3's class of an alias (``PPO.policy_aliases["MlpPolicy"]``) resolves to the plastic class of the alias (issue
    #31; it was refused); something that is not a policy class is refused, naming what is allowed."""
    from stable_baselines3.common.policies import ActorCriticPolicy

    from sb3_plastic.policies import PlasticActorCriticPolicy

    assert type(PlasticPPO(ActorCriticPolicy, "CartPole-v1").policy) is PlasticActorCriticPolicy
    with pytest.raises(ValueError, match="policy alias .*'MlpPolicy'.* or a policy class"):
        PlasticPPO(dict, "CartPole-v1")


def test_positional_sb3_arguments_pass_through():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", 1e-3, 32, 16, activation="maxmin")
    assert model.learning_rate == 1e-3 and model.n_steps == 32 and model.batch_size == 16
    assert np.isclose(model.policy.optimizer.param_groups[0]["lr"], 1e-3)


def test_sac_gsde_mean_head_is_a_head():
    model = PlasticSAC("MlpPolicy", "Pendulum-v1", use_sde=True, activation="maxmin")
    head = model.actor.mu[0]  # SB3 wraps the mean layer as Sequential(Linear, Hardtanh) under gSDE
    assert id(head.weight) not in {id(p) for p in model.actor.optimizer.param_groups[0]["params"]}
    assert any(head is h for h in model.policy.plastic_heads())
