"""C-CHAIN (ChurnReduction): the churn losses against hand-written formulas, the gradient it puts into ``.grad`` against
a hand-computed regulariser gradient towards the previous update's network, the adaptive coefficient, the unsupported
algorithms, save / load and the keywords."""

import copy
import math

import numpy as np
import pytest
import torch as th
from sb3_contrib import CrossQ, MaskablePPO, RecurrentPPO
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.logger import configure

import sb3_plastic.envs  # noqa: F401  (registers the ids)
from sb3_plastic import ChurnReduction, L2Init, PlasticDQN, PlasticPPO, PlasticRecurrentPPO, PlasticSAC
from sb3_plastic.callbacks.churn_reduction import ChurnReductionConfig, frozen_copy, policy_churn, value_churn
from sb3_plastic.common.hooks import AfterZeroGrad

NET = dict(net_arch=[16, 16])
PPO_FAST = dict(n_steps=32, batch_size=16, n_epochs=1, seed=0)
OFF_FAST = dict(learning_starts=32, buffer_size=500, batch_size=8, seed=0)


class _Dist:
    def __init__(self, distribution):
        self.distribution = distribution


def test_policy_churn_matches_hand_written_cross_entropy_and_mean_distance():
    g = th.Generator().manual_seed(0)
    p_old = th.softmax(th.randn(5, 3, generator=g), -1)
    p_new = th.softmax(th.randn(5, 3, generator=g), -1)
    expected = sum(-sum(p_old[i, a] * math.log(p_new[i, a] + 1e-8) for a in range(3)) for i in range(5)) / 5
    got = policy_churn(_Dist(th.distributions.Categorical(probs=p_new)), _Dist(th.distributions.Categorical(probs=p_old)))
    assert math.isclose(float(got), float(expected), rel_tol=1e-5)
    m_old, m_new = th.randn(5, 2, generator=g), th.randn(5, 2, generator=g)
    normal = policy_churn(_Dist(th.distributions.Normal(m_new, 1.0)), _Dist(th.distributions.Normal(m_old, 2.0)))
    assert math.isclose(float(normal), float(((m_new - m_old) ** 2).sum() / 10), rel_tol=1e-6)
    multi = policy_churn(_Dist([th.distributions.Categorical(probs=p_new)] * 2),
                         _Dist([th.distributions.Categorical(probs=p_old)] * 2))
    assert math.isclose(float(multi), 2 * float(expected), rel_tol=1e-5)


def test_value_churn_sums_the_q_networks():
    g = th.Generator().manual_seed(1)
    a, b, c, d = (th.randn(6, 1, generator=g) for _ in range(4))
    assert math.isclose(float(value_churn((a, b), (c, d))), float(((a - c) ** 2).mean() + ((b - d) ** 2).mean()),
                        rel_tol=1e-6)
    q_new, q_old = th.randn(4, 3, 5, generator=g), th.randn(4, 3, 5, generator=g)  # TQC: (batch, critics, quantiles)
    per_critic = sum(float(((q_new[:, k] - q_old[:, k]) ** 2).mean()) for k in range(3))
    assert math.isclose(float(value_churn(q_new, q_old, critics_dim=1)), per_critic, rel_tol=1e-6)


def _grad_probe(model, optimizer):
    """Installed after the callback's hook: records, at every zero_grad of a train(), the parameters and the gradients
    the callback has just put into ``.grad``."""
    seen = []

    def record(opt):
        if model.policy.training:
            params = [p for g in opt.param_groups for p in g["params"]]
            seen.append(({id(p): p.detach().clone() for p in params},
                         {id(p): None if p.grad is None else p.grad.clone() for p in params}))

    return seen, AfterZeroGrad(optimizer, record)


def _load(module, values):
    """A copy of ``module`` with the recorded parameter values (by the original parameters' ids)."""
    out = frozen_copy(module)
    out.requires_grad_(True)
    with th.no_grad():
        for p_out, p in zip(out.parameters(), module.parameters()):
            p_out.copy_(values[id(p)])
    return out


def _numpy_draw(state, draw):
    saved = np.random.get_state()
    np.random.set_state(state)
    try:
        return draw()
    finally:
        np.random.set_state(saved)


def test_dqn_gradient_is_coef_times_the_hand_computed_value_churn_gradient():
    """Update 2 starts from theta_b (after update 1) and regularises towards theta_a (before update 1):
    grad = 3 * d/d theta_b mean_{s, a} (Q_b(s, a) - Q_a(s, a))^2 on the callback's own replay batch."""
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    model.learn(64)
    callback = ChurnReduction(coef=3.0, target_scale=0.0)
    callback.init_callback(model)
    callback._on_training_start()
    seen, probe = _grad_probe(model, model.policy.optimizer)
    theta_a = frozen_copy(model.policy.q_net)
    model.train(gradient_steps=1, batch_size=8)  # the first update has no previous network: nothing added
    stream = copy.deepcopy(callback.state["np_rng"])
    model.train(gradient_steps=1, batch_size=8)
    probe.remove()
    assert all(g is None for g in seen[0][1].values())
    batch = _numpy_draw(stream, lambda: model.replay_buffer.sample(8))
    theta_b = _load(model.policy.q_net, seen[1][0])
    loss = ((theta_b(batch.observations) - theta_a(batch.observations).detach()) ** 2).mean()
    expected = th.autograd.grad(3.0 * loss, list(theta_b.parameters()))
    for e, p in zip(expected, model.policy.q_net.parameters()):
        assert th.allclose(seen[1][1][id(p)], e, atol=1e-8, rtol=1e-5)
        assert e.abs().sum() > 0


def test_ppo_gradient_is_coef_times_the_hand_computed_policy_churn_gradient():
    """Minibatch 2 regularises theta_b towards theta_a (before minibatch 1): grad = 2 * d/d theta_b of
    mean_s -sum_a pi_a(a|s) log(pi_b(a|s) + 1e-8) on rows of the callback's own permutation of the rollout."""
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    callback = ChurnReduction(coef=2.0, target_scale=0.0)
    model.learn(32, callback=callback)
    callback.state["previous"] = None  # forget theta_{t-1} of the learn() call (it is kept across calls)
    callback._on_training_start()  # rebind for a train() called by hand
    seen, probe = _grad_probe(model, model.policy.optimizer)
    theta_a = frozen_copy(model.policy)
    stream = copy.deepcopy(callback.state["np_rng"])
    model.train()  # 2 minibatches of 16: the first without a previous network
    probe.remove()
    assert len(seen) == 2 and all(g is None for g in seen[0][1].values())
    rows = _numpy_draw(stream, lambda: np.random.permutation(32))[:16]
    obs = model.rollout_buffer._get_samples(rows).observations
    theta_b = _load(model.policy, seen[1][0])
    p_a = theta_a.get_distribution(obs).distribution.probs.detach()
    p_b = theta_b.get_distribution(obs).distribution.probs
    loss = -(p_a * th.log(p_b + 1e-8)).sum(-1).mean()
    params = list(theta_b.parameters())
    expected = th.autograd.grad(2.0 * loss, params, allow_unused=True)
    touched = 0
    for e, p in zip(expected, model.policy.parameters()):
        got = seen[1][1][id(p)]
        if e is None:
            assert got is None  # the value head: the policy churn does not reach it
            continue
        assert th.allclose(got, e, atol=1e-8, rtol=1e-5)
        touched += int(e.abs().sum() > 0)
    assert touched >= 4


def test_coef_adapts_to_the_target_scale_and_restarts_at_a_task_change():
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    model.set_logger(configure(None, []))
    callback = ChurnReduction(warmup=2, window=3, task_loss_entropy=False)
    callback.init_callback(model)
    callback._on_training_start()
    assert callback.settings["target_scale"] == 1e4 and callback.state["coef"] == 1.0  # discrete PPO's reference
    for task_loss, regs in ((0.02, [0.5, 0.7]), (-0.04, [0.6]), (0.03, [0.9, 0.3]), (0.01, [0.2])):
        model.logger.record("train/policy_gradient_loss", task_loss)
        callback._call_updates, callback._call_reg = len(regs) + 1, list(regs)
        callback._adapt()
    # windows of the last 3 iterations: |L| = 0.04, 0.03, 0.01; reg means = 0.6, 0.6, 0.2
    expected = max(1e4 * (0.04 + 0.03 + 0.01) / 3 / ((0.6 + 0.6 + 0.2) / 3 + 1e-8), 1.0)
    assert math.isclose(callback.state["coef"], expected, rel_tol=1e-9)
    callback.locals = {"infos": [{"task_id": 0}]}
    callback._on_step()
    callback.locals = {"infos": [{"task_id": 1}]}
    callback._on_step()
    assert callback.state["coef"] == 1.0 and callback.state["task_losses"] == [] and callback.state["since_reset"] == 0


def test_coef_zero_leaves_dqn_bit_identical_and_gradient_hooks_fire_once():
    """With a zero coefficient C-CHAIN adds nothing: the run (with L2-init's post-accumulate-grad hooks) is bit for bit
    the plain one. A regulariser computed with backward() would have fired L2-init's hook a second time."""
    runs = []
    for churn in (False, True):
        model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
        callbacks = [L2Init(0.1)] + ([ChurnReduction(coef=0.0, target_scale=0.0)] if churn else [])
        model.learn(200, callback=callbacks)
        runs.append([p.detach().clone() for p in model.policy.parameters()])
    for a, b in zip(*runs):
        assert th.equal(a, b)


def test_regulariser_gradient_keeps_the_parameter_layout_on_a_channels_last_cnn():
    """On MinAtar's channels-last observations the CNN's input is a permuted view, so ``autograd.grad`` returns the
    first convolution's weight gradient in another memory layout. Put into ``.grad`` as it came, the task loss's
    ``backward()`` then accumulated onto a gradient that breaks autograd's layout contract (a UserWarning on every
    C-MinAtar run, and the slower strided accumulation); the regulariser's gradient must take the parameter's layout."""
    import warnings

    import minatar.gym

    minatar.gym.register_envs()
    model = PlasticDQN("CnnPolicy", "MinAtar/Breakout-v1", learning_starts=32, buffer_size=500, batch_size=8, seed=0)
    model.learn(64)
    callback = ChurnReduction(coef=3.0, target_scale=0.0)
    callback.init_callback(model)
    callback._on_training_start()
    seen, probe = _grad_probe(model, model.policy.optimizer)
    model.train(gradient_steps=1, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the layout warning of AccumulateGrad
        model.train(gradient_steps=1, batch_size=8)
    probe.remove()
    params = [p for g in model.policy.optimizer.param_groups for p in g["params"]]
    grads = seen[1][1]
    assert all(grads[id(p)] is not None for p in params)
    for p in params:
        assert p.grad.stride() == p.stride(), p.shape


def test_unsupported_algorithms_say_why():
    with pytest.raises(ValueError, match="RecurrentPPO.*LSTM states"):
        RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16).learn(16, callback=ChurnReduction())
    with pytest.raises(ValueError, match="CrossQ.*running statistics"):
        CrossQ("MlpPolicy", "Pendulum-v1", learning_starts=8).learn(8, callback=ChurnReduction())
    with pytest.raises(ValueError, match="churn_reduction_window"):
        ChurnReductionConfig(churn_reduction=True, churn_reduction_window=0)
    with pytest.warns(UserWarning, match="churn_reduction_coef=2.0 is ignored"):
        ChurnReductionConfig(churn_reduction_coef=2.0)
    model = PlasticRecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16, churn_reduction=True)
    with pytest.raises(ValueError, match="RecurrentPPO"):
        model.learn(16)


def test_maskable_ppo_regularises_the_masked_distribution():
    model = MaskablePPO("MlpPolicy", "sb3_plastic/InvalidActionDiscrete-v0", policy_kwargs=NET, **PPO_FAST)
    callback = ChurnReduction()
    model.learn(64, callback=callback)
    assert callback.kind == "policy_discrete" and callback.state["reg_losses"]
    assert all(np.isfinite(callback.state["reg_losses"]))


def test_state_survives_save_load(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST)
    model.learn(200, callback=ChurnReduction(warmup=5, window=20))
    state = model.plastic_state["ChurnReduction"]
    assert len(state["reg_losses"]) == 20 and state["coef"] != 50.0
    model.save(tmp_path / "m.zip")
    loaded = DQN.load(tmp_path / "m.zip")
    restored = loaded.plastic_state["ChurnReduction"]
    assert restored["coef"] == state["coef"] and restored["reg_losses"] == state["reg_losses"]
    assert np.array_equal(restored["np_rng"][1], state["np_rng"][1])


def test_the_previous_network_survives_a_second_learn_and_save_load(tmp_path):
    """The regulariser's previous network (theta_{t-1}) and an adaptation still pending belong to the persistent
    state: learn() in two calls is bit for bit learn() in one, and a loaded model regularises its first update towards
    the network saved (not towards nothing)."""
    whole = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    whole.learn(128, callback=ChurnReduction(warmup=1, window=3))
    split = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    callback = ChurnReduction(warmup=1, window=3)
    split.learn(64, callback=callback)
    split.learn(64, callback=callback, reset_num_timesteps=False)
    for a, b in zip(whole.policy.parameters(), split.policy.parameters()):
        assert th.equal(a, b)
    assert callback.state["coef"] == whole.plastic_state["ChurnReduction"]["coef"]
    previous = [p.detach().clone() for p in callback._shadow.parameters()]
    assert any(not th.equal(a, b) for a, b in zip(previous, split.policy.parameters()))  # theta_{t-1}, not theta_t
    split.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=split.get_env())
    loaded.set_logger(configure(None, []))
    resumed = ChurnReduction(warmup=1, window=3)
    resumed.init_callback(loaded)
    resumed._on_training_start()
    assert resumed._has_previous
    for a, b in zip(previous, resumed._shadow.parameters()):
        assert th.equal(a, b)
    resumed._remove_hooks()


def test_an_adaptation_pending_at_a_save_happens_after_load(tmp_path):
    """A model saved at a rollout start by a callback before ChurnReduction's (a run's checkpoint) has not yet adapted
    to the train() call that just ended: the pending updates and regulariser losses are saved, and the loaded model
    adapts to them as the uninterrupted run did, given the call's logged task loss; without it, it says so."""
    from stable_baselines3.common.callbacks import BaseCallback

    seen = {}

    class Around(BaseCallback):
        def __init__(self, after):
            super().__init__()
            self.after = after

        def _on_rollout_start(self):
            if self.num_timesteps == 64:
                if self.after:  # what the uninterrupted run's adaptation made of the call
                    seen["state"] = copy.deepcopy(self.model.plastic_state["ChurnReduction"])
                else:
                    seen["loss"] = self.model.logger.name_to_value["train/policy_gradient_loss"]
                    seen["entropy"] = self.model.logger.name_to_value["train/entropy_loss"]
                    self.model.save(tmp_path / "m.zip")

        def _on_step(self):
            return True

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    model.learn(96, callback=[Around(False), ChurnReduction(warmup=1, window=3), Around(True)])
    for with_loss in (True, False):
        loaded = PPO.load(tmp_path / "m.zip", env=model.get_env())
        assert loaded.plastic_state["ChurnReduction"]["pending"]["updates"] == 2
        loaded.set_logger(configure(None, []))
        callback = ChurnReduction(warmup=1, window=3)
        callback.init_callback(loaded)
        callback._on_training_start()
        if with_loss:
            loaded.logger.record("train/policy_gradient_loss", seen["loss"])
            loaded.logger.record("train/entropy_loss", seen["entropy"])
            callback._on_rollout_start()
            for key in ("coef", "task_losses", "reg_losses", "since_reset"):
                assert callback.state[key] == seen["state"][key], key
        else:
            with pytest.warns(UserWarning, match="train/policy_gradient_loss.*not in the logger"):
                callback._on_rollout_start()
            assert callback.state["task_losses"] == seen["state"]["task_losses"][:-1]
        assert callback.state["pending"] == {"updates": 0, "regs": []}
        callback._remove_hooks()


@pytest.mark.parametrize("cls, env_id, kwargs, kind", [
    (PlasticPPO, "CartPole-v1", PPO_FAST, "policy_discrete"),
    (PlasticPPO, "Pendulum-v1", PPO_FAST, "policy_continuous"),
    (PlasticDQN, "CartPole-v1", OFF_FAST, "q_values"),
    (PlasticSAC, "Pendulum-v1", OFF_FAST, "critic"),
])
def test_keywords_on_the_plastic_algorithms(cls, env_id, kwargs, kind):
    model = cls("MlpPolicy", env_id, churn_reduction=True, churn_reduction_coef=5.0, policy_kwargs=dict(NET), **kwargs)
    (callback,) = model.intervention_callbacks()
    assert isinstance(callback, ChurnReduction) and callback.options["coef"] == 5.0
    model.learn(64)
    state = model.plastic_state["ChurnReduction:auto"]
    assert state["reg_losses"] and all(np.isfinite(state["reg_losses"]))
    assert model.intervention_configs["churn_reduction"].churn_reduction


def test_sac_critic_churn_uses_the_replay_actions():
    model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(NET), **OFF_FAST)
    callback = ChurnReduction()
    model.learn(48, callback=callback)
    assert callback.kind == "critic" and callback.state["coef"] == 1.0  # CHAIN's fixed coefficient
    assert callback.state["reg_losses"][-1] > 0


def _adapted_coef(model, callback, iterations):
    """Feed ``callback`` iterations of logged losses ``(pg, entropy_loss, regs)`` as SB3's train() would; the coef."""
    for pg, entropy_loss, regs in iterations:
        model.logger.record("train/policy_gradient_loss", pg)
        model.logger.record("train/entropy_loss", entropy_loss)
        callback._call_updates, callback._call_reg = len(regs) + 1, list(regs)
        callback._adapt()
    return callback.state["coef"]


ITERATIONS = ((0.02, -0.69, [0.5, 0.7]), (-0.04, -0.65, [0.6]), (0.03, -0.6, [0.9, 0.3]), (0.01, -0.5, [0.2]))


def test_discrete_ppo_task_loss_carries_the_entropy_bonus_as_the_gym_reference():
    """C-CHAIN's Gym-control reference (crl_gym_classic_control/basic_utils.py) adapts to the mean of
    ``clipped surrogate - c1 * entropy`` (c1 = 0.01), i.e. SB3's ``policy_gradient_loss + ent_coef * entropy_loss``;
    ``task_loss_entropy=False`` (the ProcGen reference) and continuous PPO (the DMC reference) use the surrogate alone."""
    expected = {}
    for entropy in (True, False):
        terms = [abs(pg + 0.01 * ent) if entropy else abs(pg) for pg, ent, _ in ITERATIONS[1:]]
        regs = [np.mean(r) for _, _, r in ITERATIONS[1:]]
        expected[entropy] = max(1e4 * np.mean(terms) / (np.mean(regs) + 1e-8), 1.0)
    assert not math.isclose(expected[True], expected[False], rel_tol=1e-3)
    for option, want in ((None, expected[True]), (True, expected[True]), (False, expected[False])):
        model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, ent_coef=0.01, **PPO_FAST)
        model.set_logger(configure(None, []))
        callback = ChurnReduction(warmup=2, window=3, task_loss_entropy=option)
        callback.init_callback(model)
        callback._on_training_start()
        assert math.isclose(_adapted_coef(model, callback, ITERATIONS), want, rel_tol=1e-9), option
        callback._remove_hooks()
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=NET, ent_coef=0.01, **PPO_FAST)
    model.set_logger(configure(None, []))
    callback = ChurnReduction(coef=1.0, warmup=2, window=3, min_coef=1.0, target_scale=1e4)
    callback.init_callback(model)
    callback._on_training_start()
    assert callback.settings["task_loss_entropy"] is False
    assert math.isclose(_adapted_coef(model, callback, ITERATIONS), expected[False], rel_tol=1e-9)
    callback._remove_hooks()


def test_discrete_ppo_warmup_is_the_gym_references_eleven_iterations():
    """The Gym reference appends iteration ``ite``'s losses, then adapts when ``ite - level_start >= 10`` (``ite``
    0-based): 11 iterations run at the initial coefficient. Written out, and the callback's default against it."""
    reference_first = next(ite for ite in range(100) if ite - 0 >= 10) + 1  # iterations before the first adaptation
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **PPO_FAST)
    model.set_logger(configure(None, []))
    callback = ChurnReduction()
    callback.init_callback(model)
    callback._on_training_start()
    coefs = [_adapted_coef(model, callback, [(0.05, -0.6, [0.01])]) for _ in range(reference_first)]
    assert coefs[:-1] == [1.0] * (reference_first - 1) and coefs[-1] > 1.0 and reference_first == 11
    callback._remove_hooks()


def test_task_loss_entropy_bad_values_and_agents_without_an_entropy_term():
    with pytest.raises(ValueError, match="task_loss_entropy must be None, True or False, got 'yes'"):
        ChurnReduction(task_loss_entropy="yes")
    with pytest.raises(ValueError, match="churn_reduction_task_loss_entropy must be None, True or False, got 1"):
        ChurnReductionConfig(churn_reduction=True, churn_reduction_task_loss_entropy=1)
    with pytest.raises(ValueError, match="task_loss_entropy=True.*DQN.*no entropy"):
        DQN("MlpPolicy", "CartPole-v1", policy_kwargs=NET, **OFF_FAST).learn(8, callback=ChurnReduction(
            task_loss_entropy=True))
    model = PlasticPPO("MlpPolicy", "CartPole-v1", churn_reduction=True, churn_reduction_task_loss_entropy=False,
                       policy_kwargs=dict(NET), **PPO_FAST)
    (callback,) = model.intervention_callbacks()
    assert callback.options["task_loss_entropy"] is False
