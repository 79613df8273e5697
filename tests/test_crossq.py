"""PlasticCrossQ: sb3-contrib equivalence when plasticity is off, AdamO groups (Linear weights only), the
interventions around CrossQ's BatchRenorm layers (per-unit resets of their statistics, FIRE / Shrink &
Perturb restarts), save/load, bad input."""

import pytest
import torch as th
from plastic_asserts import assert_intervention_ran, assert_same_adam_moments, assert_same_parameters
from sb3_contrib import CrossQ
from sb3_contrib.common.torch_layers import BatchRenorm
from stable_baselines3.common.logger import configure
from torch import nn

from sb3_plastic import FIRE, PlasticCrossQ, ShrinkPerturb
from sb3_plastic.callbacks.cbp import GenerateAndTest
from sb3_plastic.callbacks.redo import redo_reset_
from sb3_plastic.common.surgery import find_networks, norm_affine
from sb3_plastic.optim import AdamO

OFF = dict(isometry_mode="off", optimizer="adam", activation="relu")
FAST = dict(learning_starts=50, buffer_size=2000, batch_size=32, seed=0)


def small(**extra):
    return dict(net_arch=[32, 32], **extra)


def optimizers(model):
    return [model.actor.optimizer, model.critic.optimizer]


def norms(module):
    return [m for m in module.modules() if isinstance(m, BatchRenorm)]


def norm_state(norm):
    return {k: v.detach().clone() for k, v in norm.state_dict().items()}


def trained(steps=150, **kwargs):
    """A PlasticCrossQ (AdamO) after a short learn: BatchRenorm statistics and Adam moments are non-trivial."""
    model = PlasticCrossQ("MlpPolicy", "Pendulum-v1", policy_kwargs=small(), **dict(FAST, **kwargs))
    model.learn(steps)
    return model


def critic_hidden(model):
    spec = next(s for s in find_networks(model) if s.name == "critic")
    return spec, spec.hidden_layers()


# ----------------------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("extra", [{}, dict(use_sde=True)], ids=["default", "gsde"])
def test_plasticity_off_is_crossq(extra):
    reference = CrossQ("MlpPolicy", "Pendulum-v1", policy_kwargs=small(), **FAST, **extra)
    reference.learn(150)
    plastic = PlasticCrossQ("MlpPolicy", "Pendulum-v1", policy_kwargs=small(), **OFF, **FAST, **extra)
    for ref_opt, opt in zip(optimizers(reference), optimizers(plastic)):
        assert type(opt) is th.optim.Adam
        assert opt.param_groups[0]["betas"] == ref_opt.param_groups[0]["betas"] == (0.5, 0.999)
        assert opt.param_groups[0]["eps"] == ref_opt.param_groups[0]["eps"]
    plastic.learn(150)
    assert_same_parameters(reference, plastic)  # state_dict: parameters and BatchRenorm buffers
    for ref_opt, opt in zip(optimizers(reference), optimizers(plastic)):
        assert_same_adam_moments(ref_opt, opt)
    assert all(int(n.steps) > 0 for n in norms(plastic.policy))  # the buffers did move
    assert not th.equal(plastic.critic.qf0[3].ra_mean, th.zeros(32))


# ----------------------------------------------------------------------------------------------- AdamO + isometry
@pytest.mark.parametrize("layers", ["hidden", "all"])
def test_adamo_isometry_groups_hold_linear_weights_only(layers):
    model = PlasticCrossQ(
        "MlpPolicy", "Pendulum-v1", isometry_coef=0.05, isometry_layers=layers, policy_kwargs=small(), **FAST
    )
    heads = {id(h) for h in model.policy.plastic_heads()}
    for net, opt in zip((model.actor, model.critic), optimizers(model)):
        assert isinstance(opt, AdamO)
        assert [g["isometry_coef"] for g in opt.param_groups] == [0.05, 0.0]
        assert opt.param_groups[0]["betas"] == (0.5, 0.999)  # CrossQ's betas kept for AdamO
        linear = [m for m in net.modules() if isinstance(m, nn.Linear)]
        expected = [m.weight for m in linear if layers == "all" or id(m) not in heads]
        assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in expected}
        rest = {id(p) for p in opt.param_groups[1]["params"]}
        for norm in norms(net):  # per-feature scale / shift: AdamO's group without the penalty
            assert id(norm.scale) in rest and id(norm.bias) in rest
    assert type(model.ent_coef_optimizer) is th.optim.Adam
    model.learn(120)
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


def test_maxmin_orthogonal_linear_layers_and_untouched_batchrenorm():
    model = PlasticCrossQ("MlpPolicy", "Pendulum-v1", activation="maxmin", policy_kwargs=small(), **FAST)
    for opt in optimizers(model):
        for p in opt.param_groups[0]["params"]:
            assert th.allclose(th.linalg.svdvals(p.detach()), th.ones(1), atol=1e-4)
    for norm in norms(model.policy):
        assert th.equal(norm.scale, th.ones_like(norm.scale)) and th.equal(norm.bias, th.zeros_like(norm.bias))
    model.learn(100)
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


# ----------------------------------------------------------------------------------------------- structure
def test_find_networks_maps_each_hidden_layer_to_its_batchrenorm():
    model = PlasticCrossQ("MlpPolicy", "Pendulum-v1", policy_kwargs=small())
    specs = {s.name: s for s in find_networks(model)}
    assert set(specs) == {"actor", "critic"} and specs["critic"].target is None
    latent = model.actor.latent_pi
    actor = specs["actor"].hidden_layers()
    assert [h.layer for h in actor] == [latent[1], latent[4]]
    assert [h.norm for h in actor] == [latent[3], latent[6]]
    assert all(isinstance(h.activation, nn.ReLU) and h.norm_after_activation for h in actor)
    assert [c.layer for c in actor[1].consumers] == [model.actor.mu, model.actor.log_std]
    for q_net in model.critic.q_networks:
        mine = [h for h in specs["critic"].hidden_layers() if h.layer in (q_net[1], q_net[4])]
        assert [h.norm for h in mine] == [q_net[3], q_net[6]]
        assert [c.layer for h in mine for c in h.consumers] == [q_net[4], q_net[7]]
    owned = {id(h.norm) for s in specs.values() for h in s.hidden_layers()}
    assert id(latent[0]) not in owned and id(model.critic.qf0[0]) not in owned  # input normalisation


# ----------------------------------------------------------------------------------------------- unit resets
def _assert_feature_reset(norm, before, unit, optimizer):
    others = th.ones(norm.num_features, dtype=th.bool)
    others[unit] = False
    assert float(norm.ra_mean[unit]) == 0.0 and float(norm.ra_var[unit]) == 1.0
    assert float(norm.scale.detach()[unit]) == 1.0 and float(norm.bias.detach()[unit]) == 0.0
    for key, tensor in (("ra_mean", norm.ra_mean), ("ra_var", norm.ra_var), ("scale", norm.scale), ("bias", norm.bias)):
        assert th.equal(tensor.detach()[others], before[key][others]), key  # untouched units keep theirs
    assert th.equal(norm.steps, before["steps"])  # the layer's warm-up counter is not per unit
    for param in (norm.scale, norm.bias):
        state = optimizer.state[param]
        for moment in ("exp_avg", "exp_avg_sq"):
            assert float(state[moment][unit]) == 0.0
            assert bool((state[moment][others] != 0).any())


def test_cbp_replacement_resets_the_units_batchrenorm_feature_and_absorbs_its_mean():
    model = trained()
    spec, hidden = critic_hidden(model)
    engine = GenerateAndTest(hidden, spec.optimizer, replacement_rate=0.5, maturity_threshold=0, bias_absorption=True)
    first = hidden[0]
    h = th.relu(th.randn(64, 32)) + 0.5
    for _ in range(3):
        engine.update({first.name: h})
    norm, consumer = first.norm, first.consumers[0].layer
    assert norm is model.critic.qf0[3] and float(norm.ra_var[5]) != 1.0
    before = norm_state(norm)
    unit = 5
    gain, shift = norm_affine(norm)
    f_hat = engine.bias_corrected_mean_activation(first.name)[unit, 0]
    expected = consumer.bias.detach() + consumer.weight.detach()[:, unit] * (gain[unit] * f_hat + shift[unit])
    engine.replace(first.name, th.tensor([unit]))
    _assert_feature_reset(norm, before, unit, spec.optimizer)
    assert th.allclose(consumer.bias.detach(), expected, atol=1e-6)  # mean taken through the BatchRenorm map
    assert th.equal(consumer.weight.detach()[:, unit], th.zeros(consumer.weight.shape[0]))


def test_cbp_utility_weighs_by_the_batchrenorm_gain():
    model = trained()
    spec, hidden = critic_hidden(model)
    first = hidden[0]
    engine = GenerateAndTest([first], spec.optimizer, replacement_rate=0.0)
    with th.no_grad():
        first.norm.ra_var.fill_(1.0 - first.norm.eps)
        first.norm.scale.fill_(1.0)
        first.norm.scale[3] = 4.0  # feature 3 reaches the consumer four times as strongly
    h = th.ones(16, 32)
    engine.update({first.name: h})
    u = engine.state[first.name]["utility"]
    out = first.consumers[0].layer.weight.detach().abs().mean(dim=0)
    assert th.allclose(u[3] / out[3], 4 * u[0] / out[0], rtol=1e-5)


def test_redo_reset_resets_the_units_batchrenorm_feature():
    model = trained()
    spec, hidden = critic_hidden(model)
    second = hidden[1]
    before = norm_state(second.norm)
    redo_reset_(second, th.tensor([7]), [spec.optimizer])
    _assert_feature_reset(second.norm, before, 7, spec.optimizer)


# ----------------------------------------------------------------------------------------------- FIRE / S&P
def _hidden_and_input_norms(model):
    fed = [h.norm for spec in find_networks(model) for h in spec.hidden_layers()]
    inputs = [model.actor.latent_pi[0], *(q[0] for q in model.critic.q_networks)]
    return fed, inputs


@pytest.mark.parametrize("which", ["fire", "shrink_perturb"])
def test_fire_and_shrink_perturb_event_restart_batchrenorm_statistics(which):
    model = trained()
    model.set_logger(configure(None, [""]))
    fed, inputs = _hidden_and_input_norms(model)
    before = {id(n): norm_state(n) for n in fed + inputs}
    assert all(int(n.steps) > 0 for n in fed)
    if which == "fire":
        callback = FIRE(at=0.5)
        callback.init_callback(model)
        callback._fire(["test"])
    else:
        callback = ShrinkPerturb("event", every=10)
        callback.init_callback(model)
        callback.apply()
    for norm in fed:
        assert th.equal(norm.ra_mean, th.zeros_like(norm.ra_mean)) and th.equal(norm.ra_var, th.ones_like(norm.ra_var))
        assert int(norm.steps) == 0  # warm-up restarts: batch statistics until the running ones re-converge
        assert th.equal(norm.scale.detach(), before[id(norm)]["scale"])  # learnt scale / shift kept
        assert th.equal(norm.bias.detach(), before[id(norm)]["bias"])
    for norm in inputs:  # the input normalisation is fed by no rewritten layer
        for key, value in norm_state(norm).items():
            assert th.equal(value, before[id(norm)][key]), key


# ----------------------------------------------------------------------------------------------- interventions
INTERVENTIONS = [
    dict(fire_at=0.5),
    dict(replacement_rate=0.05, maturity_threshold=5),
    dict(redo_period=5, redo_tau=0.1),
    dict(shrink_perturb="continual"),
    dict(shrink_perturb="event", shrink_perturb_every=100),
]


@pytest.mark.parametrize("intervention", INTERVENTIONS, ids=lambda d: "-".join(str(v) for v in d.values()))
def test_intervention_keywords_train(intervention):
    model = PlasticCrossQ(
        "MlpPolicy",
        "Pendulum-v1",
        activation="maxmin",
        policy_kwargs=small(),
        **dict(FAST, learning_starts=20),
        **intervention,
    )
    assert len(model.intervention_callbacks()) == 1
    model.learn(220)
    assert_intervention_ran(model, intervention)
    assert all(th.isfinite(b).all() for b in model.policy.buffers())
    state = model.plastic_state
    if intervention.get("shrink_perturb") == "event":
        assert state["ShrinkPerturb:auto"]["events"] == 2
    if intervention.get("shrink_perturb") == "continual":
        assert state["ShrinkPerturb:auto"]["noise_steps"] > 0


def test_cbp_sees_one_minibatch_per_optimizer_step():
    """Critic: the training-mode forward of the critic loss; actor: every policy_delay-th update (the critic
    forward inside the actor loss and the no-grad next-action forward feed nothing extra)."""
    model = PlasticCrossQ(
        "MlpPolicy", "Pendulum-v1", replacement_rate=1e-4, maturity_threshold=10**6, policy_kwargs=small(), **FAST
    )
    model.learn(120)
    cbp = model.plastic_state["ContinualBackprop:auto"]
    n = model._n_updates
    assert n > 0
    for layer in cbp["critic"].values():
        assert th.equal(layer["age"], th.full_like(layer["age"], n))
    for layer in cbp["actor"].values():
        assert th.equal(layer["age"], th.full_like(layer["age"], n // model.policy_delay))


# ----------------------------------------------------------------------------------------------- save / load
def test_save_load_learn_keeps_optimizer_and_plastic_state(tmp_path):
    model = trained(replacement_rate=0.02, maturity_threshold=5)
    path = tmp_path / "crossq.zip"
    model.save(path)
    loaded = PlasticCrossQ.load(path, env=model.get_env())
    assert loaded.isometry_config == model.isometry_config
    assert_same_parameters(model, loaded)  # BatchRenorm buffers included
    for opt_a, opt_b in zip(optimizers(model), optimizers(loaded)):
        assert isinstance(opt_b, AdamO)
        assert [g["isometry_coef"] for g in opt_b.param_groups] == [g["isometry_coef"] for g in opt_a.param_groups]
        assert opt_b.param_groups[0]["betas"] == (0.5, 0.999)
        assert_same_adam_moments(opt_a, opt_b)
    saved, restored = model.plastic_state["ContinualBackprop:auto"], loaded.plastic_state["ContinualBackprop:auto"]
    for net in saved:
        for layer in saved[net]:
            assert th.equal(saved[net][layer]["age"], restored[net][layer]["age"])
            assert th.equal(saved[net][layer]["utility"], restored[net][layer]["utility"])
    assert loaded.intervention_configs["cbp"].replacement_rate == 0.02
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    steps_before = int(loaded.critic.qf0[3].steps)
    loaded.learn(60, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + 60
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))
    assert int(loaded.critic.qf0[3].steps) > steps_before


# ----------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(isometry_layers=["nomatch.*"]), "selects no weight matrix.*match no parameter name"),
        (dict(isometry_layers=["actor.latent_pi.0.*"]), "not weight matrices"),
        (dict(activation="swish"), "Unknown activation 'swish'"),
        (dict(policy="CnnPolicy"), "Unknown policy 'CnnPolicy'.*MlpPolicy"),
        (dict(policy_kwargs=dict(isometry_coef=1.0)), "must be top-level keywords"),
        (dict(replacement_rate=2.0), "replacement_rate must be a number in"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, match):
    kwargs = dict(kwargs)
    policy = kwargs.pop("policy", "MlpPolicy")
    with pytest.raises(ValueError, match=match):
        PlasticCrossQ(policy, "Pendulum-v1", **kwargs)


def test_cbp_critic_statistics_use_the_current_state_rows_of_the_joint_forward(monkeypatch):
    """CrossQ's critic runs ``cat([obs, next_obs])`` in one forward (joint BatchRenorm statistics); the next-state half
    feeds only the (detached) target, as SAC's no-grad target forward does, which Continual Backprop never records.
    The critic's utilities and mean activations therefore take the first ``batch_size`` rows of that forward: the
    rows of the loss. Reference: the activation modules' own full outputs, captured by forward hooks."""
    model = PlasticCrossQ(
        "MlpPolicy", "Pendulum-v1", replacement_rate=1e-4, maturity_threshold=10**6, policy_kwargs=small(), **FAST
    )
    _, hidden = critic_hidden(model)
    full: dict[str, th.Tensor] = {}
    handles = []
    for layer in hidden:
        def record(module, inputs, output, name=layer.name):
            if module.training and th.is_grad_enabled():
                full[name] = output.detach().clone()
        handles.append(layer.activation.register_forward_hook(record))
    seen: list[tuple[str, th.Tensor, th.Tensor]] = []
    original = GenerateAndTest.update

    def update(self, activations):
        if any(name in full for name in activations) and set(activations) <= {h.name for h in hidden}:
            seen.extend((name, h.clone(), full[name]) for name, h in activations.items())
        return original(self, activations)

    monkeypatch.setattr(GenerateAndTest, "update", update)
    model.learn(80)
    for handle in handles:
        handle.remove()
    batch = FAST["batch_size"]
    assert len(seen) == len(hidden) * model._n_updates > 0
    for name, recorded, joint in seen:
        assert joint.shape[0] == 2 * batch
        assert th.equal(recorded, joint[:batch]), name


@pytest.mark.parametrize("rows", [0, -3, 2.5, True])
def test_cbp_loss_rows_must_be_a_positive_int(rows):
    _, hidden = critic_hidden(trained(steps=60))
    with pytest.raises(ValueError, match=r"loss_rows must be None or an int >= 1, got"):
        GenerateAndTest(hidden, loss_rows=rows)
