"""PlasticMaskablePPO: sb3-contrib equivalence when plasticity is off (MLP and CNN), plastic training with
AdamO groups (MLP, CNN and Dict observations), action masks, save/load with optimizer state, the
intervention keywords, and the registered masked env ``sb3_plastic/InvalidActionDiscrete-v0``."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gym_check_env
from plastic_asserts import assert_intervention_ran, assert_same_adam_moments, assert_same_parameters
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from sb3_plastic.activations import MaxMin
from sb3_plastic.common.surgery import find_networks
from sb3_plastic.contrib_policies import (
    PlasticMaskableActorCriticCnnPolicy,
    PlasticMaskableActorCriticPolicy,
    PlasticMaskableMultiInputActorCriticPolicy,
)
from sb3_plastic.envs.masking import InvalidActionDiscreteEnv
from sb3_plastic.maskable_ppo import PlasticMaskablePPO
from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor
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
    assert_intervention_ran(model, intervention)
    _assert_masks_respected(model, make_env())


# --------------------------------------------------------------------------- image and Dict observations
class MaskedImageEnv(gym.Env):
    """A tiny seeded env with 36x36x1 uint8 images (optionally inside a Dict with a vector) and action masks.

    Reward 1 when the action equals a hidden target (always valid); 3 of the 6 actions are masked per step.
    """

    N_ACTIONS = 6

    def __init__(self, dict_obs: bool = False, ep_length: int = 20) -> None:
        image = spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8)
        self.dict_obs = dict_obs
        self.observation_space = (
            spaces.Dict({"image": image, "vec": spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)}) if dict_obs else image
        )
        self.action_space = spaces.Discrete(self.N_ACTIONS)
        self.ep_length = ep_length

    def _draw(self):
        self.target = int(self.np_random.integers(self.N_ACTIONS))
        others = [a for a in range(self.N_ACTIONS) if a != self.target]
        self.invalid = self.np_random.choice(others, 3, replace=False)
        image = self.np_random.integers(0, 256, (36, 36, 1), dtype=np.uint8)
        image[: 6 * (self.target + 1), :4] = 255  # the target is visible
        if not self.dict_obs:
            return image
        return {"image": image, "vec": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == self.target)
        self.t += 1
        return self._draw(), reward, False, self.t >= self.ep_length, {}

    def action_masks(self) -> np.ndarray:
        masks = np.ones(self.N_ACTIONS, dtype=bool)
        masks[self.invalid] = False
        return masks


def _assert_rollout_respected_masks(model):
    buffer = model.rollout_buffer
    actions = buffer.actions.reshape(-1).astype(int)
    masks = buffer.action_masks.reshape(len(actions), -1).astype(bool)  # stored as float32
    assert masks.shape[1] == MaskedImageEnv.N_ACTIONS and (~masks).any()  # masks were collected, some invalid
    assert masks[np.arange(len(actions)), actions].all()


def _hidden_weights(module):
    return [m.weight for m in module.modules() if isinstance(m, (th.nn.Linear, th.nn.Conv2d))]


def test_cnn_policy_plasticity_off_is_contrib():
    env_kwargs = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)
    reference = MaskablePPO("CnnPolicy", MaskedImageEnv(), **env_kwargs)
    reference.learn(128)
    # sb3-contrib's CnnPolicy is NatureCNN (ReLU) with no MLP layer after it
    plastic = PlasticMaskablePPO("CnnPolicy", MaskedImageEnv(), **dict(OFF, activation="relu"), **env_kwargs)
    assert isinstance(plastic.policy.features_extractor, PlasticCNN)
    assert type(plastic.policy.optimizer) is th.optim.Adam
    plastic.learn(128)
    assert_same_parameters(reference, plastic)
    fresh = MaskablePPO("CnnPolicy", MaskedImageEnv(), **env_kwargs)
    assert any(not th.equal(x, y) for x, y in zip(fresh.policy.parameters(), reference.policy.parameters()))


@pytest.mark.parametrize(
    "policy, dict_obs, policy_cls",
    [
        ("CnnPolicy", False, PlasticMaskableActorCriticCnnPolicy),
        ("MultiInputPolicy", True, PlasticMaskableMultiInputActorCriticPolicy),
    ],
)
def test_image_and_dict_policies_train_with_masks_and_save_load(tmp_path, policy, dict_obs, policy_cls):
    model = PlasticMaskablePPO(policy, MaskedImageEnv(dict_obs), activation="maxmin", isometry_coef=0.05, **FAST)
    assert type(model.policy) is policy_cls
    extractor = model.policy.features_extractor
    if dict_obs:
        assert isinstance(extractor, PlasticCombinedExtractor)
        assert isinstance(extractor.extractors["image"], PlasticCNN)
    else:
        assert isinstance(extractor, PlasticCNN)
    assert any(isinstance(m, MaxMin) for m in extractor.modules())
    opt = model.policy.optimizer
    assert isinstance(opt, AdamO)
    assert [g["isometry_coef"] for g in opt.param_groups] == [0.05, 0.0]
    regularised = {id(p) for p in opt.param_groups[0]["params"]}
    hidden = _hidden_weights(extractor) + _hidden_weights(model.policy.mlp_extractor)
    assert any(p.dim() == 4 for p in hidden)  # the conv kernels are among them
    if dict_obs:
        assert any(p.dim() == 2 for p in _hidden_weights(model.policy.mlp_extractor))  # and MLP layers
    assert {id(p) for p in hidden} <= regularised
    heads = {id(p) for head in (model.policy.action_net, model.policy.value_net) for p in head.parameters()}
    assert not heads & regularised

    model.learn(256)
    _assert_rollout_respected_masks(model)
    for p in model.policy.parameters():
        assert th.isfinite(p).all()
    _assert_masks_respected(model, MaskedImageEnv(dict_obs))

    path = tmp_path / "model.zip"
    model.save(path)
    loaded = PlasticMaskablePPO.load(path, env=model.get_env())
    assert type(loaded.policy) is policy_cls and loaded.isometry_config == model.isometry_config
    assert isinstance(loaded.policy.optimizer, AdamO)
    assert_same_adam_moments(opt, loaded.policy.optimizer)
    assert_same_parameters(model, loaded)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    loaded.learn(64, reset_num_timesteps=False)
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))
    _assert_rollout_respected_masks(loaded)
    _assert_masks_respected(loaded, MaskedImageEnv(dict_obs))


# --------------------------------------------------------------------------- the registered masked env
MASKED_ID = "sb3_plastic/InvalidActionDiscrete-v0"


def test_registered_invalid_action_env_passes_checkers_and_is_seeded():
    import sb3_plastic.envs  # noqa: F401  (registers the id)

    assert MASKED_ID in gym.registry
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checker's "wrapped env" warning
        gym_check_env(gym.make(MASKED_ID), skip_render_check=True)
    sb3_check_env(gym.make(MASKED_ID))

    def rollout(env):
        obs, _ = env.reset(seed=5)
        out = [(obs, env.get_wrapper_attr("action_masks")().tolist())]
        for action in range(40):
            obs, reward, terminated, truncated, _ = env.step(action % 16)
            out.append((obs, reward, terminated, truncated, env.get_wrapper_attr("action_masks")().tolist()))
        return out

    first = rollout(gym.make(MASKED_ID))
    assert rollout(gym.make(MASKED_ID)) == first
    masks = np.array(first[0][1])
    assert masks.dtype == bool and masks.sum() == 16 - 8 and masks[first[0][0]]  # the correct action stays valid
    env = gym.make(MASKED_ID, dim=4, n_invalid_actions=3, ep_length=5)
    obs, _ = env.reset(seed=0)
    assert env.get_wrapper_attr("action_masks")().tolist() == [a == obs for a in range(4)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=1), "dim must be an int >= 2"),
        (dict(ep_length=0), "ep_length must be an int >= 1"),
        (dict(dim=4, n_invalid_actions=4), r"n_invalid_actions must be an int in \[0, dim - 1\] = \[0, 3\], got 4"),
    ],
)
def test_invalid_action_env_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InvalidActionDiscreteEnv(**kwargs)
