"""PlasticityInjection (Nikishin et al., 2023): outputs unchanged at the injection, the injected head against a
hand-written forward and a hand-written draw of PyTorch's init, what trains and what is frozen, targets, repeated
injections, save / load, keywords."""

import copy
import math

import numpy as np
import pytest
import torch as th
from sb3_contrib import CrossQ
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.utils import polyak_update

from sb3_plastic import PlasticDQN, PlasticityInjection, PlasticPPO, PlasticSAC
from sb3_plastic.callbacks import load_injected
from sb3_plastic.callbacks.plasticity_injection import PlasticityInjectionConfig
from sb3_plastic.common.surgery import find_networks

NET = dict(net_arch=[16, 16])
PPO_FAST = dict(n_steps=32, batch_size=32, n_epochs=2, seed=0)
OFF_FAST = dict(learning_starts=32, buffer_size=500, batch_size=16, seed=0)


def _inject_now(model, layers=2):
    callback = PlasticityInjection(layers=layers, every=10**9)
    callback.init_callback(model)
    callback._on_training_start()
    before = callback.generator("cpu").get_state()
    callback._act(["test"])
    return callback, before


def _obs(model, n=20, seed=0):
    rng = np.random.default_rng(seed)
    space = model.observation_space
    return th.as_tensor(rng.uniform(-1, 1, size=(n, *space.shape)), dtype=th.float32)


def test_outputs_unchanged_at_injection_ppo_dqn_sac():
    ppo = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    dqn = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    sac = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(NET), **OFF_FAST)
    for model in (ppo, dqn, sac):
        model.learn(64)
    x = _obs(ppo)
    with th.no_grad():
        logits, values = ppo.policy.get_distribution(x).distribution.logits, ppo.policy.predict_values(x)
        q, q_target = dqn.q_net(x), dqn.q_net_target(x)
        xs, actions = _obs(sac), th.zeros(20, 1)
        mean, critic = sac.actor(xs, deterministic=True), sac.critic(xs, actions)
    for model in (ppo, dqn, sac):
        _inject_now(model)
    with th.no_grad():
        assert th.equal(ppo.policy.get_distribution(x).distribution.logits, logits)
        assert th.equal(ppo.policy.predict_values(x), values)
        assert th.equal(dqn.q_net(x), q) and th.equal(dqn.q_net_target(x), q_target)
        assert th.equal(sac.actor(xs, deterministic=True), mean)
        assert all(th.equal(a, b) for a, b in zip(sac.critic(xs, actions), critic))


def test_dqn_head_against_a_hand_written_forward_and_pytorch_init():
    """Q(x) = old_net(x) + [W2' relu(W1' h + b1') + b2'] - [W2 relu(W1 h + b1) + b2], h = relu(W0 x + b0) the input of
    the head's first layer; W', b' a fresh U(-1/sqrt(fan_in), 1/sqrt(fan_in)) draw of the callback's stream."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    model.learn(64)
    old = copy.deepcopy(model.q_net)
    _, stream = _inject_now(model, layers=2)
    head = model.q_net.q_net[4].plasticity_injection0
    with th.random.fork_rng():  # the hand-written draw: weight then bias, layer by layer, PyTorch's Linear init
        th.random.set_rng_state(stream)
        expected = []
        for fan_in, fan_out in ((16, 16), (16, 2)):
            bound = 1 / math.sqrt(fan_in)
            expected += [th.empty(fan_out, fan_in).uniform_(-bound, bound), th.empty(fan_out).uniform_(-bound, bound)]
    new = [head.new[0].weight, head.new[0].bias, head.new[2].weight, head.new[2].bias]
    assert all(th.equal(a, b) for a, b in zip(new, expected))
    with th.no_grad():  # train the new head a little by hand: its output departs from the frozen twin's
        for p in head.new.parameters():
            p.add_(0.1 * th.randn_like(p))
    x = _obs(model)
    with th.no_grad():
        h = th.relu(old.q_net[0](old.features_extractor(x)))
        branch = head.new[2](th.relu(head.new[0](h))) - head.frozen[2](th.relu(head.frozen[0](h)))
        assert th.allclose(model.q_net(x), old(x) + branch, atol=1e-6)


def test_old_head_frozen_new_head_trains_encoder_trains():
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    model.learn(64)
    _inject_now(model, layers=2)
    policy = model.policy
    old_head = {n: p.detach().clone() for n, p in policy.named_parameters()
                if n.startswith(("action_net.weight", "action_net.bias", "mlp_extractor.policy_net.2"))}
    encoder = policy.mlp_extractor.policy_net[0].weight.detach().clone()
    branch = policy.action_net.plasticity_injection0
    new_before = [p.detach().clone() for p in branch.new.parameters()]
    frozen_before = [p.detach().clone() for p in branch.frozen.parameters()]
    assert {id(p) for p in branch.new.parameters()} <= {id(p) for p in policy.optimizer.param_groups[-1]["params"]}
    model.learn(64, reset_num_timesteps=False)
    for name, value in old_head.items():
        assert th.equal(dict(policy.named_parameters())[name], value), name
    assert not th.equal(policy.mlp_extractor.policy_net[0].weight, encoder)  # the layer before the head trains
    assert any(not th.equal(a, b) for a, b in zip(branch.new.parameters(), new_before))
    assert all(th.equal(a, b) for a, b in zip(branch.frozen.parameters(), frozen_before))


def test_every_injection_adds_a_branch_and_freezes_the_last_one():
    env_model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    callback = PlasticityInjection(layers=2, every=64)
    env_model.learn(192, callback=callback)
    assert callback.event_timesteps == [64, 128, 192]
    head = env_model.policy.value_net
    names = [n for n, _ in head.named_children()]
    assert names == ["plasticity_injection0", "plasticity_injection1", "plasticity_injection2"]
    assert not any(p.requires_grad for p in head.plasticity_injection0.parameters())
    assert all(p.requires_grad for p in head.plasticity_injection2.new.parameters())
    assert [len(s.paths[0]) for s in find_networks(env_model)] == [3]  # the branches are not path layers


def test_save_load_rebuilds_the_branches(tmp_path):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_mode="off", optimizer="adam", plasticity_injection_at=64,
                       policy_kwargs=NET, **PPO_FAST)
    model.learn(128)
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip")
    a, b = model.policy.state_dict(), loaded.policy.state_dict()
    assert a.keys() == b.keys() and all(th.equal(a[k], b[k]) for k in a)
    assert len(loaded.policy.optimizer.param_groups) == len(model.policy.optimizer.param_groups)
    x = _obs(model)
    with th.no_grad():
        assert th.equal(model.policy.predict_values(x), loaded.policy.predict_values(x))
    loaded.set_parameters(tmp_path / "m.zip")  # the branches are there: nothing is added twice
    assert [n for n, _ in loaded.policy.value_net.named_children()] == ["plasticity_injection0"]
    plain = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    plain.learn(96, callback=PlasticityInjection(at=64))
    plain.save(tmp_path / "d.zip")
    with pytest.raises(RuntimeError):  # SB3's own load does not know the branches
        DQN.load(tmp_path / "d.zip")
    restored = load_injected(DQN, tmp_path / "d.zip", env=plain.get_env())
    with th.no_grad():
        assert th.equal(restored.q_net(_obs(plain)), plain.q_net(_obs(plain)))
    restored.learn(32, reset_num_timesteps=False)


def test_target_networks_follow_the_branch():
    """The target gets the same branch, so SB3's Polyak update (which zips the parameter lists) stays aligned."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    model.learn(64)
    _inject_now(model)
    model.learn(64, reset_num_timesteps=False)
    online, target = model.q_net.state_dict(), model.q_net_target.state_dict()
    assert online.keys() == target.keys()
    polyak_update(model.q_net.parameters(), model.q_net_target.parameters(), 1.0)  # DQN's hard update
    target = model.q_net_target.state_dict()
    assert all(th.equal(online[k], target[k]) for k in online)
    with th.no_grad():
        assert th.equal(model.q_net(_obs(model)), model.q_net_target(_obs(model)))


@pytest.mark.parametrize("cls, env_id, kwargs", [
    (PlasticPPO, "CartPole-v1", PPO_FAST),
    (PlasticDQN, "CartPole-v1", OFF_FAST),
    (PlasticSAC, "Pendulum-v1", OFF_FAST),
])
def test_keywords_on_the_plastic_algorithms(cls, env_id, kwargs):
    model = cls("MlpPolicy", env_id, plasticity_injection_at=0.5, policy_kwargs=dict(NET), **kwargs)
    (callback,) = model.intervention_callbacks()
    assert isinstance(callback, PlasticityInjection) and callback.layers == 2
    model.learn(128)
    assert model.plastic_state["PlasticityInjection:auto"]["count"] == 1


def test_errors():
    with pytest.raises(ValueError, match="layers"):
        PlasticityInjection(layers=0)
    with pytest.warns(UserWarning, match="plasticity_injection_layers=3 is ignored"):
        PlasticityInjectionConfig(plasticity_injection_layers=3)
    with pytest.raises(ValueError, match="CrossQ"):
        CrossQ("MlpPolicy", "Pendulum-v1", learning_starts=8).learn(16, callback=PlasticityInjection())


def test_conv_head_with_flatten_on_minatar():
    pytest.importorskip("minatar")
    import sb3_plastic.envs  # noqa: F401

    model = PlasticDQN("CnnPolicy", "sb3_plastic/PermutedMinAtar-Breakout-v0", isometry_mode="off", optimizer="adam",
                       **OFF_FAST)
    model.learn(40)
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(8)])).float()
    with th.no_grad():
        before = model.q_net(obs)
    _inject_now(model, layers=3)  # conv -> relu -> flatten -> linear -> relu -> linear
    head = model.q_net.q_net[0].plasticity_injection0.new
    assert [type(m).__name__ for m in head] == ["Conv2d", "ReLU", "Flatten", "Linear", "ReLU", "Linear"]
    with th.no_grad():
        assert th.equal(model.q_net(obs), before)
    model.learn(40, reset_num_timesteps=False)
    from sb3_plastic.diagnostics import network_diagnostics

    out = network_diagnostics(model, find_networks(model)[0], obs, ntk_size=0)
    branch = "q_net.q_net.0.plasticity_injection0.new"
    hidden = sorted(k.removesuffix("/dormant_fraction") for k in out if k.endswith("/dormant_fraction"))
    assert hidden == sorted([*(h.name for h in find_networks(model)[0].hidden_layers()), f"{branch}.0", f"{branch}.3"])
    assert out[f"{branch}.0/srank"] >= 1 and out[f"{branch}.3/feature_norm"] > 0  # the conv's channels, the units


def test_churn_reduction_follows_an_injection():
    """C-CHAIN's shadow network is rebuilt when an injection changes the structure (no silent misalignment)."""
    from sb3_plastic import ChurnReduction

    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    churn = ChurnReduction()
    model.learn(160, callback=[PlasticityInjection(at=96), churn])
    assert sum(1 for _ in churn._shadow.parameters()) == sum(1 for _ in model.q_net.parameters())
    assert np.isfinite(churn.state["reg_losses"]).all()


def test_diagnostics_measure_the_injected_branch_from_its_draw():
    """The diagnostics read an injected branch as layers of the network: its hidden layer's units (dormant fraction
    against a hand-written ReDo score, counted in the network's fraction), its layers' weight metrics, and their
    distance from their draw at the injection (the frozen twin), without a warning about missing initial values."""
    import warnings

    from sb3_plastic.diagnostics import network_diagnostics, spec_parameters

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    spec = find_networks(model)[0]
    initial = {k: v.clone() for k, v in spec_parameters(spec).items()}
    model.learn(32)
    _inject_now(model)
    model.learn(96, reset_num_timesteps=False)
    spec = find_networks(model)[0]
    obs = _obs(model, n=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = network_diagnostics(model, spec, obs, initial=initial, ntk_size=4)
    policy = model.policy
    for head in ("action_net", "value_net"):
        branch = getattr(policy, head).plasticity_injection0
        extractor = policy.mlp_extractor.policy_net if head == "action_net" else policy.mlp_extractor.value_net
        with th.no_grad():
            h = branch.new[1](branch.new[0](extractor[:2](obs))).abs().mean(0)  # Linear, Tanh of the branch
        score = h / h.mean()
        name = f"{head}.plasticity_injection0.new"
        assert out[f"{name}.0/dormant_fraction"] == pytest.approx(float((score <= 0.025).float().mean()))
        for i in (0, 2):
            new, twin = branch.new[i], branch.frozen[i]
            assert not th.equal(new.weight, twin.weight)
            assert out[f"{name}.{i}/dist_from_init"] == pytest.approx(float((new.weight - twin.weight).norm()), rel=1e-5)
            assert out[f"{name}.{i}/weight_norm"] == pytest.approx(float(new.weight.norm()), rel=1e-5)
    hidden = [k for k in out if k.endswith("/dormant_fraction")]
    assert len(hidden) == 6  # two per path and the branch's hidden layer of each head
    units = 16 * 6
    dormant = sum(out[k] * 16 for k in hidden)
    assert out["dormant_fraction"] == pytest.approx(dormant / units)


def _editors():
    from sb3_plastic.callbacks import FIRE, ContinualBackprop, LayerReset, ReDo, ShrinkPerturb

    return [lambda: LayerReset(at=32), lambda: FIRE(at=32), lambda: ShrinkPerturb(every=32),
            lambda: ContinualBackprop(replacement_rate=0.1, maturity_threshold=1), lambda: ReDo()]


@pytest.mark.parametrize("editor", _editors(), ids=["LayerReset", "FIRE", "ShrinkPerturb", "ContinualBackprop", "ReDo"])
def test_layer_editing_interventions_are_refused_with_an_injection_before_anything_changes(editor, tmp_path):
    """An intervention that edits layers in place would re-initialise / shrink the injection's frozen head (which
    never trains again) and miss its branch: refused at learn()'s start, in either order, and on a model that
    carries branches (a loaded one); an earlier learn()'s callbacks do not count, and penalties combine."""
    from sb3_plastic.callbacks import L2Init, WeightClipping
    from sb3_plastic.callbacks.base import has_injected_branches

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NET), **PPO_FAST)
    before = copy.deepcopy(model.policy.state_dict())
    for callbacks in ([PlasticityInjection(at=64), editor()], [editor(), PlasticityInjection(at=64)]):
        with pytest.raises(ValueError, match="plasticity injection freezes the old head"):
            model.learn(128, callback=callbacks)
        assert all(th.equal(v, model.policy.state_dict()[k]) for k, v in before.items())
    model.learn(64, callback=[editor()])  # alone, in an earlier call: fine, and it does not block a later injection
    kept = editor()  # kept alive: an earlier call's callback object still exists
    model.learn(64, callback=[kept])
    model.learn(64, callback=[PlasticityInjection(at=32), L2Init(1e-3), WeightClipping()])
    assert has_injected_branches(model)
    path = tmp_path / "injected.zip"
    model.save(path)
    loaded = load_injected(PPO, path, env=model.get_env())
    with pytest.raises(ValueError, match="carries injected branches"):
        loaded.learn(64, callback=[editor()])


def test_plastic_keywords_combining_an_injection_and_a_reset_are_refused_at_learn():
    model = PlasticPPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NET), plasticity_injection_at=0.5,
                       fire_at=0.5, **PPO_FAST)
    with pytest.raises(ValueError, match="FIRE and PlasticityInjection|PlasticityInjection and FIRE"):
        model.learn(64)


def _pair_norm(module):
    return float(th.sqrt(sum(p.detach().double().pow(2).sum() for p in (module.weight, module.bias))))


@pytest.mark.parametrize("project", ["normalized", "all"])
def test_nap_projects_the_injected_branch_from_its_first_step_to_its_norm_at_the_injection(project):
    """NaP keeps each normalised layer at its norm at initialisation; an injected branch's layers are initialised at
    the injection, so they are held there from their first optimizer step (the frozen twin holds that draw), in the
    learn() of the injection and in the next one; the frozen layers are left as they are."""
    th.manual_seed(0)
    model = PlasticPPO("MlpPolicy", "CartPole-v1", activation="relu", nap=True, nap_project=project, isometry_mode="off",
                       optimizer="adam", learning_rate=3e-2, **PPO_FAST)
    model.learn(256, callback=PlasticityInjection(at=64))
    for _ in range(2):
        for head in (model.policy.action_net, model.policy.value_net):
            branch = head.plasticity_injection0
            new, twin = branch.new[0], branch.frozen[0]
            assert not th.equal(new.weight, twin.weight)  # the branch trained
            assert _pair_norm(new) == pytest.approx(_pair_norm(twin), rel=1e-5)
            out, out_twin = branch.new[3], branch.frozen[3]  # the output layer: projected with project="all" only
            assert (_pair_norm(out) == pytest.approx(_pair_norm(out_twin), rel=1e-5)) == (project == "all")
            new_norm, twin_norm = branch.new[1], branch.frozen[1]  # the (scale, offset) pair before the ReLU
            assert not th.equal(new_norm.weight, twin_norm.weight)
            assert _pair_norm(new_norm) == pytest.approx(math.sqrt(new_norm.weight.numel()), rel=1e-5)
            assert th.equal(twin_norm.weight, th.ones_like(twin_norm.weight))
        model.learn(64, reset_num_timesteps=False)


def _penalties():
    from sb3_plastic import L2Init, ParsevalRegularisation, SpectralRegularisation

    return [lambda: L2Init(1e-3), lambda: SpectralRegularisation(1e-3), lambda: ParsevalRegularisation(1e-3)]


@pytest.mark.parametrize("make", _penalties(), ids=["L2Init", "SpectralRegularisation", "ParsevalRegularisation"])
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_penalties_reach_the_injected_branch_from_its_first_update_and_survive_the_next_learn(make, algo, monkeypatch):
    """A penalty passed with an injection regularises the new trainable branch in the learn() of the injection (its
    gradient hook fires on the branch's parameters), L2-init pulls the branch towards its values at the injection
    (its frozen twin), and the next learn() starts (L2Init raised: theta_0 had no entry for the branch)."""
    penalty = make()
    fired: set[str] = set()
    original = type(penalty)._add_penalty_grad

    def spy(self, key, param, grad):
        fired.add(key)
        return original(self, key, param, grad)

    monkeypatch.setattr(type(penalty), "_add_penalty_grad", spy)
    th.manual_seed(0)
    if algo == "ppo":
        model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
        total, at = 192, 64
    else:
        model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
        total, at = 160, 96
    model.learn(total, callback=[PlasticityInjection(at=at), penalty])
    assert any("plasticity_injection0.new" in key for key in fired), sorted(fired)
    assert not any("plasticity_injection0.frozen" in key for key in fired)
    if "theta0" in penalty.state:
        named = {**{f"policy.{n}": p for n, p in model.policy.named_parameters()}, **dict(model.policy.named_parameters())}
        branch = [key for key in penalty.state["theta0"] if ".new." in key]
        assert branch
        for key in branch:
            assert th.equal(penalty.state["theta0"][key], named[key.replace(".new.", ".frozen.")])
    fired.clear()
    model.learn(64, callback=[penalty], reset_num_timesteps=False)
    assert any("plasticity_injection0.new" in key for key in fired)


@pytest.mark.parametrize("layers", ["hidden", "all"])
def test_adamo_regularises_the_branch_as_isometry_layers_says(layers):
    """The injected branch joins AdamO with the isometry penalty on the weights ``isometry_layers`` selects: under
    "hidden" (the default) its hidden layer's weight and not its output layer's (a head), under "all" both."""
    model = PlasticPPO("MlpPolicy", "CartPole-v1", isometry_layers=layers, policy_kwargs=NET, **PPO_FAST)
    model.learn(32)
    _inject_now(model)
    optimizer = model.policy.optimizer
    coef = {id(p): g["isometry_coef"] for g in optimizer.param_groups for p in g["params"]}
    default = optimizer.defaults["isometry_coef"]
    assert default > 0
    for head in (model.policy.action_net, model.policy.value_net):
        branch = head.plasticity_injection0.new
        assert coef[id(branch[0].weight)] == default
        assert coef[id(branch[2].weight)] == (default if layers == "all" else 0.0)
        assert optimizer.is_regularised(branch[0].weight, {"isometry_coef": coef[id(branch[0].weight)]})
    model.learn(64, reset_num_timesteps=False)


def test_save_load_keeps_adamo_groups_of_the_branch(tmp_path):
    """Under AdamO the branch's two groups (penalised hidden weights, unpenalised output layer) come back from a save
    with their coefficients and Adam moments, and training goes on."""
    model = PlasticPPO("MlpPolicy", "CartPole-v1", plasticity_injection_at=64, policy_kwargs=NET, **PPO_FAST)
    model.learn(128)
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip")

    def groups(m):
        return [(g["isometry_coef"], [tuple(p.shape) for p in g["params"]]) for g in m.policy.optimizer.param_groups]

    assert groups(loaded) == groups(model) and len(groups(model)) > 2
    branches = [m.policy.action_net.plasticity_injection0.new for m in (model, loaded)]
    for p, q in zip(branches[0].parameters(), branches[1].parameters()):
        assert th.equal(model.policy.optimizer.state[p]["exp_avg"], loaded.policy.optimizer.state[q]["exp_avg"])
    loaded.set_env(model.get_env())
    loaded.learn(32, reset_num_timesteps=False)
