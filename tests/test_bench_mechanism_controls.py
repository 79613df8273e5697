"""bench/continual.py, issue #29's mechanism controls: ``ppo_vecnorm`` (SB3's running observation normalisation, the
fresh agent with its own, the statistics kept across task switches and in checkpoints) and ``ppo_fire_switch_hidden``
(FIRE at every task switch on the hidden layers, the heads untouched)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch as th
from test_bench_card_envs import _interrupt_once_at, _Interrupted
from test_bench_continual import _load
from test_bench_continual_protocol import _tiny_bandit


@pytest.fixture
def continual():
    return _load()  # (conftest sets one torch thread before every test)


def _tiny_cartpole(continual, **changes):
    ppo = dict(continual.SETTINGS["cartpole_obs"].ppo, n_steps=16, batch_size=32, n_epochs=1)
    tiny = dict(tasks=2, change_every=64, n_envs=2, ppo=ppo, monitor_every=10**6)
    return replace(continual.SETTINGS["cartpole_obs"], **{**tiny, **changes})


def _running_moments(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean and variance per column of every row seen, pooled with VecNormalize's prior (mean 0, variance 1, weight
    1e-4), written from the pooled-variance formula: the sum of both parts' squared deviations about their own means
    plus the squared distance between the means, weighted."""
    rows = np.asarray(rows, dtype=np.float64)
    prior, n = 1e-4, len(rows)
    total = prior + n
    mean_rows = rows.mean(axis=0)
    mean = n * mean_rows / total
    squares = prior * 1.0 + ((rows - mean_rows) ** 2).sum(axis=0) + mean_rows**2 * prior * n / total
    return mean, squares / total, total


def test_vecnorm_policy_sees_observations_standardised_by_running_statistics_over_every_task(continual):
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    setting = _tiny_cartpole(continual)
    model, callbacks = continual.build_model("ppo_vecnorm", setting, continual.MethodParams(), 0, "cpu", None)
    env = model.get_env()
    assert callbacks == [] and isinstance(env, VecNormalize)
    assert env.norm_obs and not env.norm_reward and env.training
    raw, tasks = [], []

    class Record(BaseCallback):  # the raw observations, in the order the policy receives them
        def _on_training_start(self):
            raw.append(self.training_env.get_original_obs().copy())

        def _on_step(self):
            raw.append(self.training_env.get_original_obs().copy())
            tasks.append(self.locals["infos"][0]["task_id"])
            return True

    model.learn(setting.total_timesteps, callback=Record())
    steps = len(raw) - 1
    assert set(tasks) == {0, 1}  # the run crossed a task switch
    offsets = np.stack(raw[1:])[np.array(tasks) == 1].mean(axis=(0, 1)) - np.stack(raw[1:])[np.array(tasks) == 0].mean(
        axis=(0, 1))
    assert np.abs(offsets).max() > 0.3  # task 1 shifts the raw observations
    # the statistics cover every observation of both tasks: one wrapper for the run, never restarted at the switch
    mean, var, count = _running_moments(np.concatenate(raw))
    assert env.obs_rms.count == pytest.approx(count, rel=1e-12)
    # (SB3 averages each float32 batch in float32: agreement to float32 rounding)
    np.testing.assert_allclose(env.obs_rms.mean, mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(env.obs_rms.var, var, rtol=1e-6)

    def standardised(t):  # the observation of step t: statistics updated with it first, then applied
        m, v, _ = _running_moments(np.concatenate(raw[: t + 1]))
        return np.clip((raw[t] - m) / np.sqrt(v + 1e-8), -10.0, 10.0)

    np.testing.assert_allclose(model._last_obs, standardised(steps), rtol=1e-5, atol=1e-6)
    n_steps = setting.ppo["n_steps"]
    buffer = model.rollout_buffer  # the last rollout's policy inputs: steps - n_steps ... steps - 1
    assert buffer.generator_ready  # (flattened by train(): env-major; back to steps x envs)
    seen = buffer.observations.reshape(setting.n_envs, n_steps, -1).swapaxes(0, 1)
    for i in range(n_steps):
        np.testing.assert_allclose(seen[i], standardised(steps - n_steps + i), rtol=1e-5, atol=1e-6)
    assert not np.allclose(seen[-1], raw[steps - 1], atol=1e-2)  # (what the plain agent would see)


def test_vecnorm_fresh_agent_has_its_own_normaliser_and_is_not_the_plain_fresh_agent(continual):
    from stable_baselines3.common.vec_env import VecNormalize

    setting = _tiny_cartpole(continual)
    assert "ppo_vecnorm" not in continual.TASK_CHANGE_METHODS  # it acts within a task: never a copy of plain PPO's
    assert "ppo_vecnorm" in continual.METHODS and "dqn_vecnorm" in continual.ALL_METHOD_NAMES
    model, _ = continual.build_model("ppo_vecnorm", setting, continual.MethodParams(), 0, "cpu", None, fresh_task=1)
    env = model.get_env()
    assert isinstance(env, VecNormalize) and env.training and env.obs_rms.count == pytest.approx(1e-4)
    model.learn(64)
    assert env.obs_rms.count == pytest.approx(1e-4 + 2 * (64 // 2 + 1))  # its own statistics, from its first step
    plain, _ = continual.build_model("ppo", setting, continual.MethodParams(), 0, "cpu", None, fresh_task=1)
    assert not isinstance(plain.get_env(), VecNormalize)


def test_a_vecnormalize_env_survives_the_checkpoint_pickle(continual):
    import cloudpickle

    setting = _tiny_cartpole(continual)
    env = continual.normalise_observations(continual.make_env(setting, 3))
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(rng.integers(0, 2, size=2))
    assert cloudpickle.loads(cloudpickle.dumps(env)).venv is None  # SB3 pickles the statistics without the env
    back = continual.run_checkpoint.loads_env(continual.run_checkpoint.dumps_env(env))
    assert back.venv is not None and back.obs_rms.count == env.obs_rms.count
    np.testing.assert_array_equal(back.obs_rms.mean, env.obs_rms.mean)
    np.testing.assert_array_equal(back.returns, env.returns)
    for _ in range(40):  # the same episodes, the same task, the same statistics from here on
        actions = rng.integers(0, 2, size=2)
        a, b = env.step(actions), back.step(actions)
        for x, y in zip(a[:3], b[:3]):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(back.obs_rms.var, env.obs_rms.var)
    plain = continual.make_env(setting, 3)  # a plain env is written as before (old checkpoints read the same way)
    assert type(continual.run_checkpoint.loads_env(cloudpickle.dumps(plain))) is type(plain)


def test_an_interrupted_vecnorm_run_with_evaluations_resumes_exactly(continual, tmp_path, monkeypatch):
    """The normaliser's statistics come back from a checkpoint, in the training env and in the evaluation env (before
    run_checkpoint.dumps_env the resumed run had an env without the env it wraps)."""
    setting = _tiny_cartpole(continual, tasks=3, eval_every=64, eval_episodes=2)
    params = continual.MethodParams()
    whole = continual.run_one("ppo_vecnorm", 0, setting, params, str(tmp_path / "whole"), "cpu", 1)
    assert len(whole["evaluations"]) >= 4
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)
    fired = _interrupt_once_at(continual, monkeypatch, step=setting.task_timesteps + 40)  # inside task 1
    out = str(tmp_path / "cut")
    with pytest.raises(_Interrupted):
        continual.run_one("ppo_vecnorm", 0, setting, params, out, "cpu", 1)
    assert fired and continual.run_checkpoint.latest(continual.checkpoint_root(out, "ppo_vecnorm", 0))
    resumed = continual.run_one("ppo_vecnorm", 0, setting, params, out, "cpu", 1)
    assert resumed["resumed_at"]
    for key in ("task", "end_reward", "end_return", "mean_reward", "diagnostics", "timesteps", "evaluations",
                "head_entropy"):
        assert resumed[key] == whole[key], key
    assert not Path(continual.checkpoint_root(out, "ppo_vecnorm", 0)).exists()


def test_fire_hidden_rewrites_the_hidden_layers_at_each_switch_and_leaves_the_heads_bit_identical(continual):
    from stable_baselines3.common.callbacks import BaseCallback

    from sb3_plastic import FIRE

    setting = _tiny_bandit(continual, tasks=3)
    params = continual.MethodParams()
    assert "ppo_fire_switch_hidden" in continual.TASK_CHANGE_METHODS
    model, (fire,) = continual.build_model("ppo_fire_switch_hidden", setting, params, 0, "cpu", None)
    assert isinstance(fire, FIRE) and fire.layers == "hidden" and fire.on_task_change and fire.at is None
    assert continual.build_model("ppo_fire_switch_hidden", setting, params, 0, "cpu", None, fresh_task=1)[1] == []
    policy = model.policy
    heads = {"action_net.weight", "action_net.bias", "value_net.weight", "value_net.bias"}
    snaps: dict[str, list] = {"before": [], "after": []}

    class Snapshot(BaseCallback):  # parameters and the heads' Adam moments at each rollout start
        def __init__(self, key):
            super().__init__()
            self.key = key

        def _on_step(self):
            return True

        def _on_rollout_start(self):
            state = policy.optimizer.state
            moments = {n: state[p]["exp_avg"].clone() for n, p in policy.named_parameters() if n in heads and p in state}
            params_now = {n: p.detach().clone() for n, p in policy.named_parameters()}
            snaps[self.key].append((fire.fire_count, params_now, moments))

    model.learn(setting.total_timesteps, callback=[Snapshot("before"), fire, Snapshot("after")])
    assert fire.fire_count == 2  # at the two switches
    fired = 0
    for (count_before, before, moments_before), (count_after, after, moments_after) in zip(snaps["before"],
                                                                                            snaps["after"]):
        changed = {n for n in before if not th.equal(before[n], after[n])}
        assert count_after == count_before + bool(changed)  # a change between the two snapshots is FIRE's
        if not changed:
            continue
        fired += 1
        hidden = {n for n in before if n.startswith("mlp_extractor.") and n.endswith(".weight")}
        assert changed == hidden  # every hidden weight, no bias, no head
        for n in heads:
            assert th.equal(before[n], after[n]) and th.equal(moments_before[n], moments_after[n]), n
        for n in hidden:  # the scaled polar factor: every singular value sqrt(out / in)
            w = after[n].double()
            sigma = th.linalg.svdvals(w)
            assert th.allclose(sigma, th.full_like(sigma, (w.shape[0] / w.shape[1]) ** 0.5), atol=1e-5), n
    assert fired == 2


def test_tanh_control_is_the_plain_agent_with_bounded_hidden_features(continual):
    """``ppo_tanh``: plain PPO's network, optimizer and initial scheme with Tanh where plain PPO has ReLU (the control
    for deep Fourier features' bounded features); its fresh agent runs it; refused on a CNN setting."""
    from torch import nn

    setting = _tiny_cartpole(continual)
    params = continual.MethodParams()
    plain, _ = continual.build_model("ppo", setting, params, 0, "cpu", None)
    tanh, callbacks = continual.build_model("ppo_tanh", setting, params, 0, "cpu", None)
    assert callbacks == [] and "ppo_tanh" in continual.METHODS and "ppo_tanh" not in continual.TASK_CHANGE_METHODS

    def kinds(model):
        return [type(m) for m in model.policy.mlp_extractor.modules() if not isinstance(m, (nn.Sequential, nn.Linear))][1:]

    assert kinds(plain) == [nn.ReLU] * 4 and kinds(tanh) == [nn.Tanh] * 4
    # the same parameters at the start (the activation draws no random numbers) and the same optimizer
    for (name, a), (_, b) in zip(plain.policy.named_parameters(), tanh.policy.named_parameters()):
        assert th.equal(a, b), name
    assert plain.policy.optimizer.defaults == tanh.policy.optimizer.defaults
    x = th.randn(5, 4)
    hidden = tanh.policy.mlp_extractor.forward_actor(100 * x)
    assert hidden.abs().max() <= 1.0  # bounded, however far the input moves
    with pytest.raises(ValueError, match="'MlpPolicy'"):
        continual.build_model("ppo_tanh", continual.SETTINGS["minatar_intensive"], params, 0, "cpu", None)


@pytest.mark.parametrize("setting_name", ["minatar_intensive", "cartpole_obs"])
def test_leaky_relu_control_is_the_plain_agent_with_no_dead_unit_and_no_kept_norm(continual, setting_name, tmp_path):
    """``ppo_leaky_relu`` (forty-seventh session): plain PPO's network, widths, init and Adam with LeakyReLU (slope
    0.01) in every hidden layer, the MinAtar CNN's included; read against ``ppo_crelu``. With the slope set to 0 the
    network computes plain PPO's function exactly; every pre-activation passes gradient but the norm is not kept
    (checked by hand on a seeded batch)."""
    from torch import nn

    setting = continual.SETTINGS[setting_name] if setting_name == "minatar_intensive" else _tiny_cartpole(continual)
    params = continual.MethodParams()
    plain, _ = continual.build_model("ppo", setting, params, 0, "cpu", None)
    leaky, callbacks = continual.build_model("ppo_leaky_relu", setting, params, 0, "cpu", None)
    assert callbacks == [] and "ppo_leaky_relu" in continual.METHODS
    assert "ppo_leaky_relu" not in continual.TASK_CHANGE_METHODS  # acts within a task: its fresh agent runs it
    assert continual.continual_report.ARM_OF["ppo_leaky_relu"] == "ppo_crelu"

    def activations(model):
        return [type(m) for m in model.policy.modules() if isinstance(m, (nn.ReLU, nn.LeakyReLU, nn.Tanh))]

    kinds = activations(plain)
    assert len(kinds) == (2 if setting_name == "minatar_intensive" else 4) and set(kinds) == {nn.ReLU}
    assert activations(leaky) == [nn.LeakyReLU] * len(kinds)
    if setting_name == "minatar_intensive":
        cnn = [type(m) for m in leaky.policy.features_extractor.modules() if isinstance(m, nn.LeakyReLU)]
        assert len(cnn) == 2  # the conv layer's and the linear layer's (the heads read the CNN's features)
    # the same parameters at the start (the activation draws no random numbers) and the same optimizer
    for (name, a), (_, b) in zip(plain.policy.named_parameters(), leaky.policy.named_parameters(), strict=True):
        assert a.shape == b.shape and th.equal(a, b), name
    assert plain.policy.optimizer.defaults == leaky.policy.optimizer.defaults
    slopes = {m.negative_slope for m in leaky.policy.modules() if isinstance(m, nn.LeakyReLU)}
    assert slopes == {0.01}

    generator = th.Generator().manual_seed(0)
    # the model's own activation (slope 0.01): gradient through every pre-activation, the norm not kept
    act = next(m for m in leaky.policy.modules() if isinstance(m, nn.LeakyReLU))
    z = th.randn(64, 128, generator=generator, requires_grad=True)
    out = act(z)
    (grad,) = th.autograd.grad((th.randn(out.shape, generator=generator) * out).sum(), z)
    assert bool((grad != 0).all()) and not th.allclose(out.norm(dim=1), z.norm(dim=1))
    leaky.observation_space.seed(0)
    obs = th.as_tensor(np.stack([leaky.observation_space.sample() for _ in range(16)])).float()
    with th.no_grad():
        differs = not th.allclose(plain.policy.predict_values(obs), leaky.policy.predict_values(obs))
        for m in leaky.policy.modules():
            if isinstance(m, nn.LeakyReLU):
                m.negative_slope = 0.0
        th.testing.assert_close(plain.policy.predict_values(obs), leaky.policy.predict_values(obs))  # ReLU's function
        th.testing.assert_close(plain.policy.get_distribution(obs).distribution.logits,
                                leaky.policy.get_distribution(obs).distribution.logits)
    assert differs
    leaky.save(tmp_path / "leaky.zip")  # a checkpoint rebuilds the same network (the runs resume from one)
    loaded = type(leaky).load(tmp_path / "leaky.zip", device="cpu")
    assert activations(loaded) == [nn.LeakyReLU] * len(kinds)
    for m in (plain, leaky):
        m.env.close()


def test_leaky_relu_control_is_refused_where_the_plain_agent_is_not_relu(continual):
    """C-CHAIN's Gym-control agents already have leaky ReLU (slope 0.1): ``ppo_leaky_relu`` would silently change
    their slope, so it is refused with the setting's activation named."""
    with pytest.raises(ValueError, match="'leaky_relu'.*allowed: 'relu'"):
        continual.build_model("ppo_leaky_relu", continual.SETTINGS["cchain_cartpole"], continual.MethodParams(), 0,
                              "cpu", None)
