"""A user's own SB3 policy class in the plastic algorithms (issue #31, SB3's drop-in contract).

* Plasticity off: the class is SB3's, untouched, and trains bit for bit as in SB3 (all eight algorithms).
* Plasticity on: the class gets the plastic machinery of its family; a trivial subclass of the family's SB3 policy
  trains bit for bit as the plastic alias does (same isometry groups, penalty and optimizer), a policy with its own
  networks gets the penalty on every Linear layer it owns and the interventions act on it.
* A class of the wrong family is refused with what to do; a signature clash says what to change.
* save / load round-trips both kinds; an SB3 zip of a user's class loads into the plastic class as SB3 loads it.
"""

from __future__ import annotations

import pytest
import torch as th
from plastic_asserts import assert_intervention_ran, assert_same_parameters
from stable_baselines3 import PPO
from stable_baselines3.common.policies import ActorCriticPolicy
from test_sb3_parity import OFF, ON_POLICY, PAIRS, algo_kwargs, make_env, policy_name
from torch import nn

from sb3_plastic import PlasticPPO, PlasticRecurrentPPO
from sb3_plastic.optim import AdamO
from sb3_plastic.policies import PlasticPolicyMixin


def _user_class(plastic_cls: type) -> type:
    """A user's subclass of the SB3 / sb3-contrib policy class of the algorithm's MlpPolicy (module level, so it
    pickles by reference)."""
    return USER_CLASSES[plastic_cls]


USER_CLASSES = {}
for _cls, (_base, _) in PAIRS.items():
    _sb3_policy = _base.policy_aliases[policy_name(_cls, "mlp")]
    _name = f"My{_sb3_policy.__name__}"
    USER_CLASSES[_cls] = globals()[_name] = type(_name, (_sb3_policy,), {"__module__": __name__})


def _optimizers(model) -> list:
    return [model.actor.optimizer, model.critic.optimizer] if hasattr(model, "actor") else [model.policy.optimizer]


def _state(model) -> dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def _build(cls, policy, plastic_cls, seed=3, **extra):
    env = make_env(plastic_cls, "mlp")
    env.action_space.seed(0)
    return cls(policy, env, seed=seed, **algo_kwargs(plastic_cls, "mlp"), **extra)


def _steps(plastic_cls) -> int:
    return 128 if plastic_cls in ON_POLICY else 96


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_user_policy_with_plasticity_off_is_sb3_bit_for_bit(plastic_cls):
    """Fails on the old code: "PlasticX needs a plastic policy"."""
    base_cls, user = PAIRS[plastic_cls][0], _user_class(plastic_cls)
    runs = []
    for cls, extra in ((base_cls, {}), (plastic_cls, OFF)):
        model = _build(cls, user, plastic_cls, **extra)  # seeded here; learn() draws from the global generators
        runs.append((model, _state(model)))
        model.learn(_steps(plastic_cls))
    (theirs, theirs_start), (ours, ours_start) = runs
    assert type(ours.policy) is user
    assert [type(o) for o in _optimizers(ours)] == [type(o) for o in _optimizers(theirs)]
    assert list(ours_start) == list(theirs_start) and all(th.equal(ours_start[k], theirs_start[k]) for k in ours_start)
    assert any(not th.equal(v, ours_start[k]) for k, v in _state(ours).items()), "the run must train something"
    assert_same_parameters(ours, theirs)


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_user_policy_with_plasticity_on_trains_as_the_plastic_alias(plastic_cls):
    """A trivial subclass of SB3's MlpPolicy class with the library defaults (AdamO, the penalty on the hidden
    layers): the same isometry groups and the same training, bit for bit, as the plastic "MlpPolicy". Fails on the
    old code (refused)."""
    user = _user_class(plastic_cls)
    runs = []
    for policy in (user, policy_name(plastic_cls, "mlp")):
        model = _build(plastic_cls, policy, plastic_cls)
        runs.append((model, _state(model)))
        model.learn(_steps(plastic_cls))
    (ours, ours_start), (alias, alias_start) = runs
    assert isinstance(ours.policy, user) and isinstance(ours.policy, PlasticPolicyMixin)
    for mine, reference in zip(_optimizers(ours), _optimizers(alias)):
        assert type(mine) is type(reference)
        assert [g["isometry_coef"] for g in mine.param_groups] == [g["isometry_coef"] for g in reference.param_groups]
        assert mine.param_groups[0]["isometry_coef"] > 0
        assert [len(g["params"]) for g in mine.param_groups] == [len(g["params"]) for g in reference.param_groups]
    assert list(ours_start) == list(alias_start) and all(th.equal(ours_start[k], alias_start[k]) for k in ours_start)
    assert_same_parameters(ours, alias)


class CustomNetwork(nn.Module):
    """SB3's documented custom actor-critic network (two Linear layers per branch, own widths)."""

    def __init__(self, feature_dim: int, last_layer_dim_pi: int = 12, last_layer_dim_vf: int = 10):
        super().__init__()
        self.latent_dim_pi, self.latent_dim_vf = last_layer_dim_pi, last_layer_dim_vf
        self.policy_net = nn.Sequential(nn.Linear(feature_dim, 16), nn.ReLU(), nn.Linear(16, last_layer_dim_pi), nn.ReLU())
        self.value_net = nn.Sequential(nn.Linear(feature_dim, 16), nn.ReLU(), nn.Linear(16, last_layer_dim_vf), nn.ReLU())

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return self.value_net(features)


class CustomActorCriticPolicy(ActorCriticPolicy):
    """SB3's documented way to give PPO its own networks."""

    def __init__(self, *args, **kwargs):
        kwargs["ortho_init"] = False
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = CustomNetwork(self.features_dim)


def test_user_policy_with_its_own_networks_gets_the_penalty_and_the_interventions():
    """The penalty covers every Linear layer the user's networks own (and nothing else), the user's activations are
    kept, the isometry step acts, and FIRE (keyword) fires on the user's layers."""
    model = PlasticPPO(CustomActorCriticPolicy, "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0,
                       isometry_coef=0.5, fire_at=0.5)
    names = {id(p): n for n, p in model.policy.named_parameters()}
    optimizer = model.policy.optimizer
    assert isinstance(optimizer, AdamO) and isinstance(model.policy, CustomActorCriticPolicy)
    regularised = sorted(names[id(p)] for p in optimizer.param_groups[0]["params"])
    assert optimizer.param_groups[0]["isometry_coef"] == 0.5
    assert regularised == [f"mlp_extractor.{branch}.{i}.weight" for branch in ("policy_net", "value_net") for i in (0, 2)]
    assert {type(m) for m in model.policy.mlp_extractor.modules() if isinstance(m, (nn.ReLU, nn.Tanh))} == {nn.ReLU}
    # the isometry step: one update with the task gradient zero moves a regularised weight by -lr * coef * grad R
    layer = model.policy.mlp_extractor.policy_net[0]
    before = layer.weight.detach().clone()
    for p in model.policy.parameters():
        p.grad = th.zeros_like(p)
    optimizer.step()
    from sb3_plastic.isometry import isometry_penalty_grad

    lr = optimizer.param_groups[0]["lr"]
    expected = before - lr * 0.5 * isometry_penalty_grad(before, 1.0)
    assert th.allclose(layer.weight.detach(), expected, atol=1e-7) and not th.equal(layer.weight.detach(), before)
    model.learn(256)
    assert_intervention_ran(model, dict(fire_at=0.5))


def test_user_policy_of_another_family_with_plasticity_on_says_what_to_do():
    user = _user_class(PlasticPPO)  # an ActorCriticPolicy, not a RecurrentActorCriticPolicy
    with pytest.raises(ValueError, match=r"RecurrentActorCriticPolicy.*derive it from.*isometry_mode='off', optimizer='adam'"):
        PlasticRecurrentPPO(user, "CartPole-v1", n_steps=32)


class HardCodedOptimizerPolicy(ActorCriticPolicy):
    def __init__(self, observation_space, action_space, lr_schedule, **kwargs):
        super().__init__(observation_space, action_space, lr_schedule, optimizer_class=th.optim.SGD, **kwargs)


def test_a_user_policy_that_cannot_take_the_plastic_keywords_says_what_to_change():
    with pytest.raises(TypeError, match=r"HardCodedOptimizerPolicy cannot take the plastic keywords.*optimizer_class"):
        PlasticPPO(HardCodedOptimizerPolicy, "CartPole-v1", n_steps=32)
    PlasticPPO(HardCodedOptimizerPolicy, "CartPole-v1", n_steps=32, **OFF)  # SB3's behaviour with plasticity off


@pytest.mark.parametrize("plasticity", ["off", "on"])
def test_user_policy_save_load_round_trip(tmp_path, plasticity):
    """Plastic zip of a user's class: load gives the same class (the plastic one built on it with plasticity on), the
    same weights and optimizer groups, and the continued run equals the uninterrupted one."""
    extra = OFF if plasticity == "off" else {}
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]))
    model = PlasticPPO(CustomActorCriticPolicy, "CartPole-v1", seed=0, **kwargs, **extra)
    model.learn(64)
    model.save(tmp_path / "model.zip")
    loaded = PlasticPPO.load(tmp_path / "model.zip", env=make_env(PlasticPPO, "mlp"))
    model.set_env(make_env(PlasticPPO, "mlp"))  # a fresh env of its own too (force_reset, as load)
    assert type(loaded.policy).__name__ == type(model.policy).__name__
    assert isinstance(loaded.policy, CustomActorCriticPolicy)
    assert isinstance(loaded.policy, PlasticPolicyMixin) == (plasticity == "on")
    assert loaded.isometry_config == model.isometry_config
    assert_same_parameters(loaded, model)
    assert [g.get("isometry_coef") for g in loaded.policy.optimizer.param_groups] == [
        g.get("isometry_coef") for g in model.policy.optimizer.param_groups
    ]
    for m in (model, loaded):
        m.set_random_seed(5)
        m.learn(64, reset_num_timesteps=False)
    assert_same_parameters(loaded, model)


def test_sb3_zip_of_a_user_policy_loads_with_plasticity_off_and_continues_as_sb3(tmp_path):
    """``PlasticPPO.load`` of ``PPO(MyPolicy).save``: the user's class, SB3's optimizer, and the same continued run as
    ``PPO.load``. Fails on the old code (refused, "build the PlasticPPO ... and call set_parameters")."""
    user = _user_class(PlasticPPO)
    PPO(user, "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(32).save(tmp_path / "custom.zip")
    runs = []
    for cls in (PPO, PlasticPPO):
        model = cls.load(tmp_path / "custom.zip", env=make_env(PlasticPPO, "mlp"))
        model.set_random_seed(5)
        model.learn(64, reset_num_timesteps=False)
        runs.append(model)
    theirs, ours = runs
    assert type(ours.policy) is user and ours.isometry_config.isometry_mode == "off"
    assert type(ours.policy.optimizer) is th.optim.Adam
    assert_same_parameters(ours, theirs)
