"""PlasticQRDQN / PlasticTQC: sb3-contrib equivalence when plasticity is off, plastic training, optimizer
groups, orthogonal init with target sync, save/load, and the intervention keywords."""

import pytest
import torch as th
from plastic_asserts import assert_intervention_ran, assert_same_adam_moments, assert_same_parameters
from sb3_contrib import QRDQN, TQC
from stable_baselines3.common.envs import FakeImageEnv

from sb3_plastic.activations import MaxMin
from sb3_plastic.optim import AdamO
from sb3_plastic.qrdqn import PlasticQRDQN
from sb3_plastic.tqc import PlasticTQC

OFF = dict(isometry_mode="off", optimizer="adam", activation="relu")
FAST = dict(learning_starts=50, buffer_size=2000, batch_size=32, seed=0)
SMALL = dict(net_arch=[64, 64])


def image_env():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)  # FakeImageEnv draws observations from its space: make them reproducible
    return env


def optimizers(model):
    if isinstance(model, TQC):
        return [model.actor.optimizer, model.critic.optimizer]
    return [model.policy.optimizer]


def _sigmas(layer):
    return th.linalg.svdvals(layer.weight.detach().reshape(layer.weight.shape[0], -1))


@pytest.mark.parametrize(
    "contrib_cls, plastic_cls, policy, env_fn, kwargs, policy_kwargs, steps",
    [
        (QRDQN, PlasticQRDQN, "MlpPolicy", lambda: "CartPole-v1", FAST, None, 200),
        (QRDQN, PlasticQRDQN, "CnnPolicy", image_env, dict(FAST, learning_starts=20), None, 60),
        (TQC, PlasticTQC, "MlpPolicy", lambda: "Pendulum-v1", FAST, SMALL, 150),
        (TQC, PlasticTQC, "MlpPolicy", lambda: "Pendulum-v1", dict(FAST, use_sde=True), SMALL, 100),
    ],
)
def test_plasticity_off_is_contrib(contrib_cls, plastic_cls, policy, env_fn, kwargs, policy_kwargs, steps):
    def pk():  # sb3 algorithms write into the caller's policy_kwargs: a fresh copy each time
        return None if policy_kwargs is None else dict(policy_kwargs)

    reference = contrib_cls(policy, env_fn(), policy_kwargs=pk(), **kwargs)
    reference.learn(steps)
    plastic = plastic_cls(policy, env_fn(), policy_kwargs=pk(), **OFF, **kwargs)
    assert [type(o) for o in optimizers(plastic)] == [th.optim.Adam] * len(optimizers(plastic))
    for ref_opt, opt in zip(optimizers(reference), optimizers(plastic)):
        assert ref_opt.param_groups[0]["eps"] == opt.param_groups[0]["eps"]
    plastic.learn(steps)
    assert_same_parameters(reference, plastic)
    fresh = contrib_cls(policy, env_fn(), policy_kwargs=pk(), **kwargs)
    assert any(not th.equal(x, y) for x, y in zip(fresh.policy.parameters(), reference.policy.parameters()))


@pytest.mark.parametrize("activation", ["relu", "maxmin"])
@pytest.mark.parametrize(
    "cls, policy, env_fn, kwargs, steps",
    [
        (PlasticQRDQN, "MlpPolicy", lambda: "CartPole-v1", FAST, 200),
        (PlasticQRDQN, "CnnPolicy", image_env, dict(FAST, learning_starts=20), 50),
        (PlasticTQC, "MlpPolicy", lambda: "Pendulum-v1", dict(FAST, policy_kwargs=SMALL), 150),
    ],
)
def test_plastic_training_and_save_load(tmp_path, cls, policy, env_fn, kwargs, steps, activation):
    kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
    model = cls(policy, env_fn(), activation=activation, isometry_coef=0.05, **kwargs)
    for opt in optimizers(model):
        assert isinstance(opt, AdamO)
        assert [g["isometry_coef"] for g in opt.param_groups] == [0.05, 0.0]
    if cls is PlasticQRDQN:  # sb3-contrib's QR-DQN epsilon survives the switch to AdamO
        assert all(g["eps"] == 0.01 / model.batch_size for g in model.policy.optimizer.param_groups)
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
    for opt_a, opt_b in zip(optimizers(model), optimizers(loaded)):
        assert isinstance(opt_b, AdamO)
        assert [g["isometry_coef"] for g in opt_b.param_groups] == [0.05, 0.0]
        assert [g["eps"] for g in opt_b.param_groups] == [g["eps"] for g in opt_a.param_groups]
        assert_same_adam_moments(opt_a, opt_b)
    assert_same_parameters(model, loaded)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    loaded.learn(steps // 2, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + steps // 2
    assert any(not th.equal(a, b) for a, b in zip(before, loaded.policy.parameters()))


@pytest.mark.parametrize(
    "cls, env, kwargs",
    [
        (PlasticQRDQN, "CartPole-v1", {}),
        (PlasticTQC, "Pendulum-v1", dict(policy_kwargs=SMALL)),
        (PlasticTQC, "Pendulum-v1", dict(policy_kwargs=SMALL, use_sde=True)),
    ],
)
def test_maxmin_orthogonal_init_syncs_targets(cls, env, kwargs):
    kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
    model = cls("MlpPolicy", env, activation="maxmin", seed=1, **kwargs)
    targets = model.policy.plastic_targets()
    assert targets
    for target, online in targets:
        for (name, a), b in zip(online.state_dict().items(), target.state_dict().values()):
            assert th.equal(a, b), name
    for head in model.policy.plastic_heads():
        assert isinstance(head, th.nn.Linear)
        assert th.allclose(_sigmas(head), th.ones(1), atol=1e-4)
    head_ids = {id(h.weight) for h in model.policy.plastic_heads()}
    for opt in optimizers(model):
        regularised = opt.param_groups[0]["params"]
        assert regularised and not head_ids & {id(p) for p in regularised}
        for p in regularised:  # hidden layers are orthogonal with gain 1
            assert th.allclose(th.linalg.svdvals(p.detach()), th.ones(1), atol=1e-4)


def test_tqc_heads_gsde_and_entropy_adam():
    model = PlasticTQC("MlpPolicy", "Pendulum-v1", use_sde=True, policy_kwargs=dict(SMALL))
    assert isinstance(model.actor.mu, th.nn.Sequential)  # Linear + Hardtanh (clip_mean)
    heads = model.policy.plastic_heads()
    assert heads[0] is model.actor.mu[0] and len(heads) == 1 + model.critic.n_critics
    actor_reg = {id(p) for p in model.actor.optimizer.param_groups[0]["params"]}
    assert id(model.actor.mu[0].weight) not in actor_reg and id(model.actor.latent_pi[0].weight) in actor_reg
    assert id(model.actor.log_std) not in actor_reg
    critic_reg = {id(p) for p in model.critic.optimizer.param_groups[0]["params"]}
    for q_net in model.critic.q_networks:
        assert id(q_net[-1].weight) not in critic_reg and id(q_net[0].weight) in critic_reg
    assert type(model.ent_coef_optimizer) is th.optim.Adam


def test_qrdqn_user_optimizer_choices():
    # a user optimizer_class is used as given (sb3-contrib then skips its epsilon) when plasticity is off ...
    own = PlasticQRDQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=th.optim.Adam), **OFF)
    reference = QRDQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=th.optim.Adam))
    assert own.policy.optimizer.param_groups[0]["eps"] == reference.policy.optimizer.param_groups[0]["eps"] == 1e-8
    # ... and with the penalty on it keeps its own update (and epsilon) with AdamO's isometry step on top (issue #12)
    plastic = PlasticQRDQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=th.optim.Adam))
    assert isinstance(plastic.policy.optimizer, th.optim.Adam) and not isinstance(plastic.policy.optimizer, AdamO)
    assert [g["isometry_coef"] for g in plastic.policy.optimizer.param_groups] == [0.02, 0.0]
    assert plastic.policy.optimizer.param_groups[0]["eps"] == 1e-8
    # sb3-contrib's own class of the alias means the alias (issue #31; it was refused)
    assert type(PlasticQRDQN(QRDQN.policy_aliases["MlpPolicy"], "CartPole-v1").policy) is PlasticQRDQN.policy_aliases[
        "MlpPolicy"
    ]


INTERVENTIONS = [
    dict(fire_at=0.5),
    dict(replacement_rate=0.01, maturity_threshold=5),
    dict(redo_period=5),
    dict(shrink_perturb="continual"),
]


@pytest.mark.parametrize("intervention", INTERVENTIONS, ids=lambda d: next(iter(d)))
@pytest.mark.parametrize(
    "cls, env, kwargs",
    [
        (PlasticQRDQN, "CartPole-v1", dict(learning_starts=20, policy_kwargs=SMALL)),
        (PlasticTQC, "Pendulum-v1", dict(learning_starts=20, batch_size=32, policy_kwargs=dict(net_arch=[32, 32]))),
    ],
)
def test_intervention_keywords(cls, env, kwargs, intervention):
    kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
    model = cls("MlpPolicy", env, activation="maxmin", buffer_size=2000, seed=0, **intervention, **kwargs)
    assert len(model.intervention_callbacks()) == 1
    model.learn(200)
    assert_intervention_ran(model, intervention)
    if "fire_at" in intervention:
        if cls is PlasticQRDQN:  # FIRE re-synced the target (not updated by QR-DQN within 200 steps)
            assert model.target_update_interval > 200
            sigmas = th.linalg.svdvals(model.policy.quantile_net_target.quantile_net[2].weight.detach())
            assert abs(float(sigmas.median()) - 1.0) < 1e-3
