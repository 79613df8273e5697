"""Weight clipping (Elsayed et al., 2024): the bound against PyTorch's own initialisation, a PPO run against the
reference's algorithm written as a torch optimizer (clamp after Adam's step, walking the parameters in order), the
output layers left alone on request, SAC / DQN, the keywords, save / load and bad input."""

import math

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN, PPO, SAC
from torch import nn

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticSAC, WeightClipping
from sb3_plastic.callbacks import WeightClippingConfig
from sb3_plastic.callbacks.weight_clipping import init_bound

NET = dict(net_arch=[16, 16])  # SB3 adds keys to the policy_kwargs it gets: pass copies
PPO_FAST = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)


def test_the_bound_is_that_of_pytorchs_default_initialisation():
    th.manual_seed(0)
    for layer in (nn.Linear(50, 400), nn.Conv2d(3, 64, 5)):
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(layer.weight)
        bound = init_bound(layer.weight)
        assert bound == pytest.approx(1 / math.sqrt(fan_in))
        for param in (layer.weight, layer.bias):  # both drawn from U(-bound, bound)
            assert param.abs().max() <= bound and param.abs().max() > 0.95 * bound
    with pytest.raises(ValueError, match=r"shape \(7,\)"):
        init_bound(th.zeros(7))


class ReferenceClippedAdam(th.optim.Adam):
    """The reference's weight clipping over Adam (mohmdelsayed/weight-clipping), from its algorithm: after each step,
    walk the parameters in order; a weight (2-D / 4-D) is bounded by kappa / sqrt(its fan_in), a bias (1-D) by that of
    the weight before it."""

    kappa = 1.0

    def step(self, closure=None):
        loss = super().step(closure)
        with th.no_grad():
            previous = None
            for group in self.param_groups:
                for param in group["params"]:
                    if param.dim() >= 2:
                        previous = param
                    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(previous)
                    bound = self.kappa / math.sqrt(fan_in)
                    param.clamp_(-bound, bound)
        return loss


def _ppo(**policy_kwargs):
    return PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NET, optimizer_kwargs=dict(eps=1e-5), **policy_kwargs),
               **PPO_FAST)


def test_ppo_equals_the_reference_optimizer_bit_for_bit():
    reference = _ppo(optimizer_class=ReferenceClippedAdam)
    reference.learn(256)
    model = _ppo()
    callback = WeightClipping(kappa=1.0)
    model.learn(256, callback=callback)
    for (name, a), b in zip(reference.policy.named_parameters(), model.policy.parameters()):
        assert th.equal(a, b), name
    assert callback.state["steps"] == 4 * 2 * 2  # 4 rollouts x 2 epochs x 2 minibatches
    assert 0.05 < callback.at_bound() < 1  # the clamp acts (SB3's orthogonal init exceeds 1 / sqrt(fan_in) here)
    plain = _ppo()
    plain.learn(256)
    assert any(not th.equal(a, b) for a, b in zip(plain.policy.parameters(), model.policy.parameters()))


def test_heads_false_leaves_the_output_layers_alone():
    model = _ppo()
    callback = WeightClipping(kappa=0.5, heads=False)
    model.learn(128, callback=callback)
    policy = model.policy
    for layer in (*policy.mlp_extractor.policy_net, *policy.mlp_extractor.value_net):
        if isinstance(layer, nn.Linear):
            bound = 0.5 / math.sqrt(layer.in_features)
            assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
    # the value head (orthogonal, gain 1) keeps entries beyond its bound 0.5 / 4
    assert policy.value_net.weight.abs().max() > 0.5 / math.sqrt(16)
    names = [name for name, _, _ in callback.clipped()]
    assert not any("action_net" in n or n.endswith("value_net.weight") for n in names), names


def _within(module, kappa):
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            bound = kappa / math.sqrt(layer.in_features) * (1 + 1e-6)
            if layer.weight.abs().max() > bound or layer.bias.abs().max() > bound:
                return False
    return True


def test_sac_actor_and_critic_and_dqn_q_network_are_clipped():
    sac = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(NET), learning_starts=32, batch_size=16, seed=0)
    callback = WeightClipping(kappa=1.0)
    sac.learn(96, callback=callback)
    assert _within(sac.actor, 1.0) and _within(sac.critic, 1.0)
    assert callback.state["steps"] == 2 * (96 - 32)  # one actor and one critic step per update
    names = [name for name, _, _ in callback.clipped()]
    assert any("log_std" in n for n in names)  # SAC's log-std layer is an output Linear layer: clipped
    dqn = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NET), learning_starts=32, batch_size=16, seed=0,
              target_update_interval=10_000)
    initial_target = [p.detach().clone() for p in dqn.q_net_target.parameters()]
    dqn.learn(200, callback=WeightClipping(kappa=0.5))
    assert _within(dqn.q_net, 0.5)
    for a, b in zip(initial_target, dqn.q_net_target.parameters()):  # not trained by an optimizer: not clipped
        assert th.equal(a, b)


@pytest.mark.parametrize("cls, env_id", [(PlasticPPO, "CartPole-v1"), (PlasticDQN, "CartPole-v1"),
                                         (PlasticSAC, "Pendulum-v1")])
def test_keywords_on_the_plastic_algorithms(cls, env_id, tmp_path):
    extra = PPO_FAST if cls is PlasticPPO else dict(learning_starts=16, batch_size=16, seed=0)
    model = cls("MlpPolicy", env_id, isometry_mode="off", optimizer="adam", weight_clipping=True,
                weight_clipping_kappa=2.0, policy_kwargs=dict(NET), **extra)
    (callback,) = model.intervention_callbacks()
    assert isinstance(callback, WeightClipping) and callback.kappa == 2.0 and callback.heads
    model.learn(64)
    steps = model.plastic_state["WeightClipping:auto"]["steps"] if "WeightClipping:auto" in model.plastic_state \
        else model.plastic_state["WeightClipping"]["steps"]
    assert steps > 0
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip")
    assert loaded.intervention_configs["weight_clipping"] == WeightClippingConfig(True, 2.0, True)
    key = next(k for k in loaded.plastic_state.keys() if k.startswith("WeightClipping"))
    assert loaded.plastic_state[key]["steps"] == steps


def test_bad_input_says_what_is_allowed():
    for bad in (0, -1.0, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ValueError, match=r"weight_clipping_kappa must be a finite number > 0, got"):
            WeightClippingConfig(weight_clipping=True, weight_clipping_kappa=bad)
    with pytest.raises(ValueError, match=r"kappa must be a finite number > 0, got -2"):
        WeightClipping(kappa=-2)
    with pytest.raises(ValueError, match=r"heads must be True or False, got 'no'"):
        WeightClipping(heads="no")
    with pytest.raises(ValueError, match=r"weight_clipping must be True or False, got 1"):
        WeightClippingConfig(weight_clipping=1)
    with pytest.warns(UserWarning, match="weight_clipping_kappa=2.0 is ignored"):
        WeightClippingConfig(weight_clipping_kappa=2.0)
    assert WeightClippingConfig().make_callback() is None
    np.testing.assert_equal(WeightClippingConfig().to_kwargs(), dict(weight_clipping=False, weight_clipping_kappa=3.0,
                                                                       weight_clipping_heads=True))


def _algorithms():
    from sb3_contrib import QRDQN, TQC, CrossQ, MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, TD3

    from sb3_plastic import PlasticCrossQ, PlasticRecurrentPPO

    off = dict(learning_starts=32, batch_size=16, seed=0)
    return [
        (A2C, "CartPole-v1", dict(n_steps=8, seed=0)),
        (RecurrentPPO, "CartPole-v1", dict(n_steps=32, batch_size=16, n_epochs=1, seed=0)),
        (PlasticRecurrentPPO, "CartPole-v1", dict(n_steps=32, batch_size=16, n_epochs=1, seed=0)),
        (MaskablePPO, "sb3_plastic/InvalidActionDiscrete-v0", dict(n_steps=32, batch_size=16, n_epochs=1, seed=0)),
        (QRDQN, "CartPole-v1", off),
        (TQC, "Pendulum-v1", off),
        (TD3, "Pendulum-v1", off),
        (CrossQ, "Pendulum-v1", off),
        (PlasticCrossQ, "Pendulum-v1", off),
        (PlasticPPO, "CartPole-v1", dict(PPO_FAST, n_steps=32)),  # AdamO, the isometry step inside its step()
    ]


@pytest.mark.parametrize("cls, env_id, kwargs", _algorithms(), ids=lambda v: getattr(v, "__name__", None))
def test_every_algorithm_ends_each_update_inside_the_bounds(cls, env_id, kwargs):
    import sb3_plastic.envs  # noqa: F401  (registers the masking env)

    model = cls(get_policy(cls), env_id, policy_kwargs=dict(NET), **kwargs)
    callback = WeightClipping(kappa=0.5)
    model.learn(64, callback=callback)
    clipped = callback.clipped()
    assert clipped and callback.state["steps"] > 0
    for name, param, bound in clipped:
        assert param.abs().max() <= bound * (1 + 1e-6), name
    assert callback.at_bound() > 0


def get_policy(cls):
    """SB3's policy alias for ``cls``."""
    return "MlpLstmPolicy" if "Recurrent" in cls.__name__ else "MlpPolicy"


@pytest.mark.parametrize("cls, env_id, kwargs", [(PPO, "CartPole-v1", PPO_FAST), (DQN, "CartPole-v1", dict(
    learning_starts=0, train_freq=4, target_update_interval=50, seed=0))], ids=["PPO", "DQN"])
def test_a_plasticity_injections_new_branch_is_clipped_from_its_first_step(cls, env_id, kwargs):
    """The branch an injection adds mid-run joins the clipped set at the next optimizer step (each layer with its own
    ``kappa / sqrt(fan_in)``, against a hand-computed bound); its frozen twin and the frozen old head do not move."""
    from sb3_plastic.callbacks import PlasticityInjection
    from sb3_plastic.callbacks.plasticity_injection import BRANCH_PREFIX

    kappa = 0.2
    model = cls("MlpPolicy", env_id, policy_kwargs=dict(NET), **kwargs)
    clipping = WeightClipping(kappa=kappa)
    model.learn(128, callback=[PlasticityInjection(at=64), clipping])
    branches = [(name, m) for name, m in model.policy.named_modules() if name.split(".")[-1].startswith(BRANCH_PREFIX)]
    assert branches
    new_layers = [m for _, b in branches for m in b.new.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad]
    assert new_layers  # (a DQN target's copies of the branch are frozen)
    for layer in new_layers:
        bound = kappa / math.sqrt(layer.in_features)
        for param in (layer.weight, layer.bias):
            assert param.abs().max() <= bound * (1 + 1e-6)
    # the clamp acted (the hidden layer's initial weights lie beyond 0.2 / sqrt(fan_in); biases start at 0)
    assert any((m.weight.abs() >= kappa / math.sqrt(m.in_features) * (1 - 1e-6)).any() for m in new_layers)
    clipped = {id(p) for _, p, _ in clipping.clipped()}
    assert all(id(p) in clipped for layer in new_layers for p in layer.parameters())
    frozen = [p for _, b in branches for p in b.frozen.parameters()]
    assert frozen and not any(id(p) in clipped for p in frozen)
    # the twin keeps the values it had at the injection (not clipped): new - frozen was zero there, not after clamping
    twin = [m for _, b in branches for m in b.frozen.modules() if isinstance(m, nn.Linear)]
    assert any(m.weight.abs().max() > kappa / math.sqrt(m.in_features) * 1.01 for m in twin)


def _norm_of(layer):
    return float(th.sqrt(layer.weight.detach().double().pow(2).sum() + layer.bias.detach().double().pow(2).sum()))


@pytest.mark.parametrize("clip_last", [True, False], ids=["clip-last", "nap-last"])
def test_with_nap_the_later_post_step_hook_has_the_last_word(clip_last):
    """Weight clipping and NaP both rewrite weights after each optimizer step; the hooks run in callback order
    (sb3_plastic.common.hooks): clipping last keeps every entry inside its bound (a projected norm may fall below
    its target), NaP last keeps every projected norm (an entry may leave its bound)."""
    from sb3_plastic.callbacks import NormalizeAndProject, insert_layer_norms_
    from sb3_plastic.callbacks.nap import add_norm_parameters_to_optimizers

    model = PPO("MlpPolicy", "CartPole-v1", learning_rate=3e-3, policy_kwargs=dict(NET), **PPO_FAST)
    add_norm_parameters_to_optimizers(insert_layer_norms_(model.policy), [model.policy.optimizer])
    clip, nap = WeightClipping(kappa=0.3), NormalizeAndProject(project_affine=False)  # Tanh: no affine to project
    model.learn(128, callback=[nap, clip] if clip_last else [clip, nap])
    projected = nap.projected_layers()
    off_target = [abs(_norm_of(layer) / nap.state["norms"][key] - 1) for key, layer, _ in projected]
    excess = [float(param.abs().max()) / bound - 1 for _, param, bound in clip.clipped()]
    if clip_last:
        assert max(excess) <= 1e-6
        assert max(off_target) > 1e-3  # the clamp moved some projected norm off its target
    else:
        assert max(off_target) <= 1e-5
        assert max(excess) > 1e-3  # the projection pushed some entry past its bound


def test_with_nap_by_keyword_clipping_acts_last():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", optimizer="adam", nap=True,
                       weight_clipping=True, weight_clipping_kappa=0.3, learning_rate=3e-3,
                       policy_kwargs=dict(NET), **PPO_FAST)
    model.learn(128)
    (clip,) = [c for c in model.intervention_callbacks() if isinstance(c, WeightClipping)]
    clip.init_callback(model)  # only to read the bound tensors of the trained model
    for name, param, bound in clip.clipped():
        assert float(param.detach().abs().max()) <= bound * (1 + 1e-6), name
