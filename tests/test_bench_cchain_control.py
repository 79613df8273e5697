"""bench/continual.py's cchain_* settings (issue #29 part 2): TRAC / C-CHAIN's continual Gym control, their PPO as
SB3 allows, every rollout starting new episodes and their per-iteration score, checked against hand computations."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

NAMES = {"cchain_cartpole": "CartPole", "cchain_acrobot": "Acrobot", "cchain_lunar": "LunarLander"}


def _box2d() -> bool:
    try:
        import Box2D  # noqa: F401
        import pygame  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", list(NAMES))
def test_settings_follow_the_published_protocol(continual, name):
    s = continual.SETTINGS[name]
    assert s.env_id == f"sb3_plastic/Perturbed{NAMES[name]}-v0"
    assert (s.tasks, s.n_envs, s.change_every // s.ppo["n_steps"], s.change_every % s.ppo["n_steps"]) == (10, 1, 200, 0)
    assert s.ppo["n_steps"] == 800 and s.total_timesteps == 1_600_000
    expected = dict(batch_size=32, n_epochs=5, learning_rate=1e-3, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
                    ent_coef=0.01, vf_coef=0.5, max_grad_norm=float("inf"))
    assert {k: s.ppo[k] for k in expected} == expected
    assert s.env_kwargs == dict(scale=2.0, max_episode_steps=400)
    assert (s.net_arch, s.activation, s.reward_scale, s.rollout_reset) == ((256, 256, 256), "leaky_relu", 20.0, True)
    assert (s.score, s.tail) == ("iteration_return", 1.0)
    args = continual.parse_args(["--setting", name])
    assert args.setting == name  # the default results folder bench/results/continual/<name> names the env


def test_bad_setting_fields_name_the_value(continual):
    base = continual.SETTINGS["cchain_cartpole"]
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'leaky_relu', got 'gelu'"):
        replace(base, activation="gelu")
    with pytest.raises(ValueError, match="score must be one of .* got 'median'"):
        replace(base, score="median")
    with pytest.raises(ValueError, match="reward_scale must be a finite number > 0, got 0"):
        replace(base, reward_scale=0)
    with pytest.raises(ValueError, match="needs rollout_reset=True"):
        replace(base, rollout_reset=False)


@pytest.mark.parametrize("method", ["ppo", "ppo_trac", "ppo_cchain", "ppo_head_reset", "ppo_l2_init"])
def test_the_agents_are_their_network_and_optimizer(continual, method):
    """Separate policy and value MLPs of three hidden layers of 256 with leaky ReLU 0.1, PyTorch's default init (SB3's
    orthogonal init off), one Adam with eps 1e-8 and lr 1e-3, no gradient clipping; TRAC wraps that Adam."""
    setting = continual.SETTINGS["cchain_cartpole"]
    model, _ = continual.build_model(method, setting, continual.MethodParams(), 0, "cpu", None)
    policy = model.policy
    for net in (policy.mlp_extractor.policy_net, policy.mlp_extractor.value_net):
        linears = [m for m in net if isinstance(m, th.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == [(4, 256), (256, 256), (256, 256)]
        activations = [m for m in net if not isinstance(m, th.nn.Linear)]
        assert len(activations) == 3 and all(isinstance(m, th.nn.LeakyReLU) and m.negative_slope == 0.1
                                             for m in activations)
    assert not set(map(id, policy.mlp_extractor.policy_net.parameters())) & set(
        map(id, policy.mlp_extractor.value_net.parameters()))
    assert policy.ortho_init is False
    # PyTorch's default Linear init: uniform in +-1/sqrt(fan_in); SB3's orthogonal init gives the action head a gain of 0.01
    bound = 1 / np.sqrt(256)
    head = policy.action_net.weight.detach().abs()
    assert head.max() <= bound and head.max() > 0.5 * bound
    group = policy.optimizer.param_groups[0]
    assert (group["eps"], group["lr"]) == (1e-8, 1e-3) and isinstance(policy.optimizer, th.optim.Adam)
    assert len(policy.optimizer.param_groups) == 1 or method == "ppo_trac"
    assert model.max_grad_norm == float("inf") and model.batch_size == 32 and model.n_epochs == 5
    if method == "ppo_trac":
        assert type(policy.optimizer).__name__.lower().startswith("trac")
    model.env.close()


class _Spy(BaseCallback):
    """Per rollout: the rewards the agent trained on and the dones of env copy 0."""

    def _on_training_start(self) -> None:
        self.rollouts: list[list[tuple[float, bool]]] = []

    def _on_rollout_start(self) -> None:
        self.rollouts.append([])

    def _on_step(self) -> bool:
        self.rollouts[-1].append((float(self.locals["rewards"][0]), bool(self.locals["dones"][0])))
        return True


def test_iteration_return_and_rollout_reset_match_a_hand_computation(continual):
    """Every rollout starts new episodes; a task's score is the mean over its rollouts of the mean return of the
    rollout's episodes, the one its end cuts counted with its partial return (their itr_mean_return); the agent trains
    on rewards / 20 while the score is in the env's units."""
    setting = replace(continual.SETTINGS["cchain_cartpole"], change_every=1600, tasks=2, monitor_every=10**9,
                      ppo=dict(continual.SETTINGS["cchain_cartpole"].ppo, n_epochs=1))
    model, _ = continual.build_model("ppo", setting, continual.MethodParams(), 0, "cpu", None)
    results = {"task": [], "mean_reward": [], "end_reward": [], "end_return": [], "end_episodes": []}
    spy = _Spy()
    model.learn(setting.total_timesteps, callback=[continual._rollout_reset(), continual._task_recorder(setting, results),
                                                   spy])
    assert len(spy.rollouts) == 4 and all(len(r) == 800 for r in spy.rollouts)
    rewards = np.array([r for rollout in spy.rollouts for r, _ in rollout])
    assert np.all(rewards == np.float32(1.0 / 20.0))  # CartPole's reward 1, divided by the setting's reward_scale
    means = []
    for rollout in spy.rollouts:  # by hand: a new episode at the rollout start and after every done
        returns, current = [], 0.0
        for _, done in rollout:
            current += 1.0  # CartPole's reward in the env's units
            if done:
                returns.append(current)
                current = 0.0
        if current:
            returns.append(current)  # the episode the rollout's end cuts
        means.append(np.mean(returns))
    np.testing.assert_allclose(results["iteration_return"], [np.mean(means[:2]), np.mean(means[2:])], rtol=1e-12)
    assert results["task"] == [0, 1]
    model.env.close()


@pytest.mark.skipif(not _box2d(), reason="PerturbedLunarLander needs the box2d extra")
def test_a_tiny_grid_reports_their_statistic(continual, tmp_path):
    """A tiny grid on LunarLander (2 seeds, 2 tasks of one 800-step iteration, a fresh agent per task): the JSONs carry
    the per-task iteration score, the summary the whole-run mean ± standard error over runs, continual and fresh
    (their Oracle)."""
    for name in ["cchain_lunar"]:
        setting = replace(continual.SETTINGS[name], change_every=800, tasks=2, monitor_every=10**9,
                          ppo=dict(continual.SETTINGS[name].ppo, n_epochs=1))
        out = tmp_path / name
        for seed in (0, 1):
            continual.run_cell("ppo", seed, setting, continual.MethodParams(), str(out), fresh="all")
        records = continual.load_records(str(out))
        runs = sorted((r for r in records if r["fresh_task"] is None), key=lambda r: r["seed"])
        for r in runs:
            assert r["setting"]["env_id"] == "sb3_plastic/PerturbedLunarLander-v0" and len(r["iteration_return"]) == 2
            assert all(np.isfinite(r["iteration_return"]))
        entry = continual.summarise(records, ["ppo"], setting)["methods"]["ppo"]
        per_seed = [np.mean(r["iteration_return"]) for r in runs]
        assert entry["run_average"]["per_seed"] == pytest.approx(per_seed)
        assert entry["run_average"]["se"] == pytest.approx(np.std(per_seed, ddof=1) / np.sqrt(2))
        fresh = {(r["seed"], r["fresh_task"]): r["iteration_return"][0] for r in records if r["fresh_task"] is not None}
        # task 0's fresh agent is the continual run's first task, trained alike
        assert fresh[(0, 0)] == pytest.approx(runs[0]["iteration_return"][0])
        oracle = [np.mean([fresh[(s, k)] for k in range(2)]) for s in (0, 1)]
        assert entry["fresh_run_average"]["per_seed"] == pytest.approx(oracle)
        assert entry["fresh_run_average"]["complete"]
        table = continual.markdown_table({"metrics": "x", "plain": "ppo", "methods": {"ppo": entry}}, name, setting)
        assert "TRAC / C-CHAIN's statistic" in table
        assert f"| ppo | 2 | {np.mean(per_seed):.4g} ± " in table and f"{np.mean(oracle):.4g} ± " in table
        assert json.loads(json.dumps(entry))  # summary.json stays JSON


def test_an_interrupted_run_resumes_exactly_with_rollout_resets(continual, tmp_path, monkeypatch):
    """A run of a cchain setting cut inside its second task and resumed from its checkpoint gives the uninterrupted
    run's scores: the rollout resets, the reward scale and the iteration score's state survive the checkpoint."""
    from test_bench_card_envs import _interrupt_once_at, _Interrupted

    base = continual.SETTINGS["cchain_cartpole"]
    setting = replace(base, change_every=1600, tasks=2, monitor_every=10**9, ppo=dict(base.ppo, n_epochs=1))
    params = continual.MethodParams()
    whole = continual.run_one("ppo", 0, setting, params, str(tmp_path / "whole"), "cpu", 1)
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint at every rollout start
    fired = _interrupt_once_at(continual, monkeypatch, step=setting.task_timesteps + 100)
    out = str(tmp_path / "cut")
    with pytest.raises(_Interrupted):
        continual.run_one("ppo", 0, setting, params, out, "cpu", 1)
    resumed = continual.run_one("ppo", 0, setting, params, out, "cpu", 1)
    assert 0 < resumed["resumed_at"][0] <= fired[0]
    for key in ("task", "iteration_return", "end_return", "mean_reward", "end_episodes", "timesteps"):
        assert resumed[key] == whole[key], key


def test_setting_cost_extrapolates_a_piece_to_the_full_run(tmp_path, capsys):
    """bench/setting_cost.py: a piece of 1 600 steps with a monitor pass every 800; the full run's estimate is the
    piece's CPU time without the monitor scaled to 1.6 M steps, plus the full run's 21 monitor passes."""
    from bench_modules import load_bench

    cost = load_bench("setting_cost")
    path = tmp_path / "cost.json"
    assert cost.main(["--settings", "cchain_cartpole", "--steps", "1600", "--monitor-every", "800",
                      "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == row
    assert (row["setting"], row["method"], row["steps"]) == ("cchain_cartpole", "ppo", 1600)
    assert row["monitor_passes"] >= 2 and 0 < row["monitor_seconds"] < row["wall_seconds"]
    train = row["cpu_seconds"] - row["monitor_seconds"]
    per_pass = row["monitor_seconds"] / row["monitor_passes"]
    assert row["full_run_cpu_min"] == pytest.approx((train * 1_600_000 / 1600 + per_pass * 21) / 60)
    assert row["cpu_min_per_1m_steps"] == pytest.approx(train / 1600 * 1e6 / 60)
    assert len(row["score"]) == 1 and np.isfinite(row["score"][0])


def test_runs_recorded_before_the_new_setting_fields_still_match_their_setting(continual):
    """A run JSON written before ``activation``, ``policy_kwargs``, ``reward_scale`` and ``rollout_reset`` existed is
    the same setting at their defaults (FIRE / S&P / head reset copy such plain fresh agents instead of retraining);
    one that differs in a new field is not."""
    setting = continual.SETTINGS["cartpole_obs"]
    old = json.loads(json.dumps(continual.asdict(setting)))
    for name in ("activation", "policy_kwargs", "reward_scale", "rollout_reset", "floor_below"):
        del old[name]
    assert continual.same_setting(old, setting)
    assert not continual.same_setting(dict(old, policy_kwargs={"ortho_init": False}), setting)
    # floor_below only changes how runs are summarised, not how they run: a run with another floor is the same run
    assert continual.same_setting(dict(old, floor_below=5.0), setting)


def test_summary_records_the_new_fields_only_where_they_are_set(continual):
    """summary.json's setting_config of a setting from before issue #29 is what it was (its tables rebuild byte for
    byte); a cchain setting's names its activation, policy keywords, reward scale and rollout reset."""
    old = continual.setting_config(continual.SETTINGS["bandit"])
    assert not set(continual.LATE_FIELDS) & set(old)
    assert old == {k: v for k, v in continual.asdict(continual.SETTINGS["bandit"]).items()
                   if k not in continual.LATE_FIELDS}
    new = continual.setting_config(continual.SETTINGS["cchain_lunar"])
    assert (new["activation"], new["reward_scale"], new["rollout_reset"]) == ("leaky_relu", 20.0, True)
    assert new["policy_kwargs"] == {"ortho_init": False, "optimizer_kwargs": {"eps": 1e-8}}
    assert "floor_below" not in new  # LunarLander has no floor
    # a floor is recorded where a setting has one (the cartpole_obs summaries were rebuilt with it)
    assert continual.setting_config(continual.SETTINGS["cchain_cartpole"])["floor_below"] == 20.0
    for name in ("bandit", "minatar_intensive", "slippery_ant_ppo"):  # their committed summaries rebuild as they were
        assert "floor_below" not in continual.setting_config(continual.SETTINGS[name])
    results = Path(__file__).parent.parent / "bench/results/continual"
    for name in ("minatar_intensive", "cchain_acrobot"):
        committed = json.loads((results / name / "summary.json").read_text())
        assert committed["setting_config"] == json.loads(json.dumps(continual.setting_config(continual.SETTINGS[name])))


def _their_episode_targets(rewards, values, last_value, gamma, lam):
    """C-CHAIN's ``Episode.end_episode`` written out here: GAE(gamma, lam) advantages and the discounted
    return-to-go, both bootstrapped with ``last_value`` (0 at a termination)."""
    rewards = [*rewards, last_value]
    values = [*values, last_value]
    advantages, returns, gae, ret = [], [], 0.0, last_value
    for t in reversed(range(len(rewards) - 1)):
        delta = rewards[t] + gamma * values[t + 1] - values[t]
        gae = delta + gamma * lam * gae
        ret = rewards[t] + gamma * ret
        advantages.append(gae)
        returns.append(ret)
    return advantages[::-1], returns[::-1]


class _BufferSpy(BaseCallback):
    """What the agent trains on: the rollout buffer after every other callback's on_rollout_end, with the
    rollout's last values and dones."""

    def _on_training_start(self) -> None:
        self.rollouts: list[dict] = []

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        self.rollouts.append(dict(rewards=buf.rewards[:, 0].copy(), values=buf.values[:, 0].copy(),
                                  starts=buf.episode_starts[:, 0].copy(), advantages=buf.advantages[:, 0].copy(),
                                  returns=buf.returns[:, 0].copy(), last_value=float(self.locals["values"][0]),
                                  last_done=bool(self.locals["dones"][0])))

    def _on_step(self) -> bool:
        return True


def test_cchain_vanilla_trains_on_their_targets_written_out_by_hand(continual):
    """``ppo_cchain_vanilla``: per rollout, the advantages are their per-episode GAE normalised over the whole rollout
    (numpy std + 1e-5) and the value targets their discounted return-to-go, bootstrapped at the rollout's cut; SB3's
    per-minibatch normalisation is off. Plain ``ppo`` keeps SB3's targets (GAE(0.95) returns)."""
    setting = replace(continual.SETTINGS["cchain_cartpole"], change_every=1600, tasks=1, monitor_every=10**9,
                      ppo=dict(continual.SETTINGS["cchain_cartpole"].ppo, n_epochs=1))
    gamma, lam = setting.ppo["gamma"], setting.ppo["gae_lambda"]
    trained = {}
    for method in ("ppo_cchain_vanilla", "ppo"):
        model, callbacks = continual.build_model(method, setting, continual.MethodParams(), 0, "cpu", None)
        spy = _BufferSpy()
        model.learn(setting.total_timesteps, callback=[continual._rollout_reset(), *callbacks, spy])
        trained[method] = (model, spy)
        assert len(spy.rollouts) == 2
        for r in spy.rollouts:
            assert r["starts"][0] == 1.0  # rollout_reset: the rollout starts a new episode
            cuts = [*np.flatnonzero(r["starts"]), len(r["rewards"])]
            advantages, returns = [], []
            for begin, end in itertools.pairwise(cuts):
                terminated = end < len(r["rewards"]) or r["last_done"]  # the next step starts a new episode
                last_value = 0.0 if terminated else r["last_value"]
                a, g = _their_episode_targets(r["rewards"][begin:end], r["values"][begin:end], last_value, gamma, lam)
                advantages += a
                returns += g
            advantages = np.array(advantages)
            if method == "ppo_cchain_vanilla":
                np.testing.assert_allclose(r["returns"], returns, rtol=1e-4, atol=1e-5)
                expected = (advantages - advantages.mean()) / (advantages.std() + 1e-5)
                np.testing.assert_allclose(r["advantages"], expected, rtol=1e-4, atol=1e-5)
            else:  # SB3's: unnormalised GAE, and the GAE(lambda) return as the value target
                np.testing.assert_allclose(r["advantages"], advantages, rtol=1e-4, atol=1e-6)
                np.testing.assert_allclose(r["returns"], advantages + r["values"], rtol=1e-4, atol=1e-6)
                assert not np.allclose(r["returns"], returns, rtol=1e-3, atol=1e-4)
        model.env.close()
    assert trained["ppo_cchain_vanilla"][0].normalize_advantage is False
    assert trained["ppo"][0].normalize_advantage is True


def test_cchain_vanilla_is_a_ppo_method_only(continual):
    dqn_setting = continual.SETTINGS["cminatar"]
    assert "dqn_cchain_vanilla" not in continual.methods_of("dqn") and "ppo_cchain_vanilla" in continual.methods_of("ppo")
    for name in ("ppo_cchain_vanilla", "dqn_cchain_vanilla"):
        with pytest.raises(ValueError, match=f"unknown method '{name}' for a dqn setting; allowed: dqn, "):
            continual.build_model(name, dqn_setting, continual.MethodParams(), 0, "cpu", None)
    with pytest.raises(SystemExit):
        continual.parse_args(["--setting", "cminatar", "--methods", "dqn_cchain_vanilla"])
    assert "dqn_cchain_vanilla" not in continual.parse_args(["--setting", "cminatar", "--methods", "all"]).methods


def test_their_statistic_counts_the_later_tasks_at_the_floor(continual, tmp_path):
    """Their whole-run average moves by whole (seed, task) cells that leave CartPole's floor: the table beside it
    counts the cells of every task after the first that sit at the floor (here 3 runs x 5 later tasks, 2 recovered)."""
    from test_bench_continual_protocol import _synthetic_runs

    setting = replace(continual.SETTINGS["cchain_cartpole"], tasks=6)
    ends = np.full((3, 6), 9.3)
    ends[:, 0] = [370.0, 360.0, 380.0]  # task 0 learnt by every run
    ends[0, 2] = ends[2, 4] = 400.0  # two later cells recover to the cap
    fresh = np.full((3, 6), 300.0)
    _synthetic_runs(tmp_path, setting, {"ppo": (ends, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    assert entry["later_at_floor"] == {"cells": 13, "of": 15}
    assert entry["run_average"]["per_seed"] == pytest.approx(ends.mean(axis=1))
    table = continual.markdown_table(result, "cchain_cartpole", setting)
    assert "later tasks at the floor: the cells of tasks 1-5 scoring below 20" in table
    assert "| method | runs | continual, whole run | fresh agents (tasks) | later tasks at the floor |" in table
    assert f"| ppo | 3 | {ends.mean(axis=1).mean():.4g} ± " in table and "| 13 of 15 |" in table
    # a Gym-control setting without a floor (LunarLander) has no such column
    lunar = replace(continual.SETTINGS["cchain_lunar"], tasks=6)
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], lunar)
    assert "later_at_floor" not in result["methods"]["ppo"]
    assert "later tasks at the floor" not in continual.markdown_table(result, "cchain_lunar", lunar)


def test_cchain_arm_takes_the_gym_references_task_loss_on_their_settings_only(continual):
    """``ppo_cchain`` on the cchain_* settings: the library's reference values for discrete PPO (the Gym-control code:
    the entropy bonus in the task loss, 11 warm-up iterations); on the toy settings whose rows were run before those
    values (bandit, cartpole_obs) the values of those runs (the surrogate alone, 10 iterations)."""
    from sb3_plastic import ChurnReduction

    for name, (entropy, warmup) in (("cchain_cartpole", (True, 11)), ("cartpole_obs", (False, 10)),
                                    ("bandit", (False, 10))):
        model, callbacks = continual.build_model("ppo_cchain", continual.SETTINGS[name], continual.MethodParams(), 0,
                                                 "cpu", None)
        (churn,) = [c for c in callbacks if isinstance(c, ChurnReduction)]
        churn.init_callback(model)
        churn._on_training_start()
        assert (churn.settings["task_loss_entropy"], churn.settings["warmup"]) == (entropy, warmup), name
        churn._remove_hooks()
        model.env.close()


def test_cchain_arm_on_the_card_settings_takes_the_closest_references_values(continual):
    """``ppo_cchain`` on image PPO (``minatar_intensive``) takes C-CHAIN's ProcGen PPO values (coefficient 10, adapted
    after 21 iterations over the last 200, the surrogate alone) and on continuous PPO (``slippery_ant_dohare``) the DMC
    reference's (100 / 0.05 / 50 / 100). Both had silently taken the toy settings' values (10 warm-up iterations at
    coefficient 1, :data:`continual_methods.CCHAIN_BEFORE_29`)."""
    from sb3_plastic import ChurnReduction

    expected = {"minatar_intensive": dict(coef=10.0, target_scale=1e4, warmup=21, window=200, task_loss_entropy=False),
                "slippery_ant_dohare": dict(coef=100.0, target_scale=0.05, warmup=50, window=100,
                                            task_loss_entropy=False)}
    for name, values in expected.items():
        model, callbacks = continual.build_model("ppo_cchain", continual.SETTINGS[name], continual.MethodParams(), 0,
                                                 "cpu", None)
        (churn,) = [c for c in callbacks if isinstance(c, ChurnReduction)]
        churn.init_callback(model)
        churn._on_training_start()
        assert {k: churn.settings[k] for k in values} == values, name
        churn._remove_hooks()
        model.env.close()


def test_cchain_arm_on_a_dqn_setting_takes_the_c_minatar_references_values(continual):
    """``dqn_cchain`` on C-MinAtar: C-CHAIN's own Double DQN values (``double_dqn_c_chain.py``: coefficient 50, target
    scale 0.01, adapted after 10 000 updates over the last 50 000). The toy settings' PPO values (10 warm-up
    iterations, :data:`continual_methods.CCHAIN_BEFORE_29`) had been passed to every non-Gym-control setting, so the
    DQN agent adapted its coefficient after 10 updates."""
    from sb3_plastic import ChurnReduction

    model, callbacks = continual.build_model("dqn_cchain", continual.SETTINGS["cminatar"], continual.MethodParams(), 0,
                                             "cpu", None)
    (churn,) = [c for c in callbacks if isinstance(c, ChurnReduction)]
    churn.init_callback(model)
    churn._on_training_start()
    got = {k: churn.settings[k] for k in ("coef", "target_scale", "warmup", "window", "task_loss_entropy")}
    assert got == dict(coef=50.0, target_scale=0.01, warmup=10_000, window=50_000, task_loss_entropy=False)
    churn._remove_hooks()
    model.env.close()
