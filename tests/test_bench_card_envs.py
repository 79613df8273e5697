"""bench/continual.py for the card's environments (issue #28): fresh agents on a sample of the late tasks, the paired
ratio-of-means estimator (issue #29, part 3), and the output head's per-task statistics."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch as th
from test_bench_continual_protocol import _synthetic_runs, _tiny_bandit

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def rl_stats():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_rl_stats_card", BENCH / "rl_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratio_of_means_matches_a_hand_written_paired_bootstrap(rl_stats):
    rng = np.random.default_rng(3)
    cont = rng.uniform(1, 2, size=(5, 4))
    fresh = rng.uniform(2, 3, size=(5, 4))
    cont[1, 2] = np.nan  # a cell without a continual score: left out of both sums
    fresh[4, 0] = np.nan  # a cell without a fresh agent: left out of both sums
    point, low, high = rl_stats.ratio_of_means_ci(cont, fresh, n_boot=500, seed=7)
    both = np.isfinite(cont) & np.isfinite(fresh)
    assert point == pytest.approx(cont[both].sum() / fresh[both].sum())
    # the same bootstrap written out: runs resampled with replacement, each run's cells kept in both sums
    draw = np.random.default_rng(7).integers(0, 5, size=(500, 5))
    ratios = []
    for rows in draw:
        num = sum(np.nansum(np.where(both[r], cont[r], np.nan)) for r in rows)
        den = sum(np.nansum(np.where(both[r], fresh[r], np.nan)) for r in rows)
        ratios.append(num / den)
    assert (low, high) == pytest.approx((np.quantile(ratios, 0.025), np.quantile(ratios, 0.975)))
    assert low < point < high


def test_ratio_of_means_errors_and_one_run(rl_stats):
    with pytest.raises(ValueError, match="runs x cells arrays of one shape"):
        rl_stats.ratio_of_means_ci(np.ones((2, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="no cell is finite"):
        rl_stats.ratio_of_means_ci(np.full((2, 2), np.nan), np.ones((2, 2)))
    point, low, high = rl_stats.ratio_of_means_ci(np.array([[1.0, 3.0]]), np.array([[2.0, 2.0]]))
    assert point == 1.0 and np.isnan(low) and np.isnan(high)


def test_fresh_sample_is_late_distinct_per_seed_and_shared_by_methods(continual):
    setting = continual.SETTINGS["minatar_intensive"]
    samples = {seed: continual.fresh_sample(setting, seed) for seed in range(5)}
    for tasks in samples.values():
        assert len(tasks) == continual.FRESH_SAMPLE == len(set(tasks)) and tasks == sorted(tasks)
        assert all(setting.tasks // 2 <= k < setting.tasks for k in tasks)
    assert len({tuple(t) for t in samples.values()}) > 1  # independent draws per seed
    assert continual.fresh_sample(setting, 3) == samples[3]  # deterministic
    assert continual.run_parts(setting, "sample", 3) == [None, *samples[3]]
    small = _tiny_bandit(continual, 6)
    assert continual.fresh_sample(small, 0, size=10) == [3, 4, 5]  # the whole last half when it is smaller
    with pytest.raises(ValueError, match="needs the run's seed"):
        continual.run_parts(setting, "sample")
    with pytest.raises(ValueError, match="'all', 'sample', 'none'"):
        continual.run_parts(setting, "some")


def test_summary_of_a_fresh_sample_uses_the_paired_ratio_of_means(continual, tmp_path):
    rng = np.random.default_rng(1)
    setting = _tiny_bandit(continual, tasks=8)
    seeds = 5
    fresh = 0.8 + 0.01 * rng.standard_normal((seeds, 8))
    lost = 0.6 + 0.01 * rng.standard_normal((seeds, 8))
    _synthetic_runs(tmp_path, setting, {"ppo": (lost, fresh)})
    sampled = {s: continual.fresh_sample(setting, s, size=2) for s in range(seeds)}
    for s in range(seeds):  # keep only the sampled fresh agents
        for k in range(8):
            if k not in sampled[s]:
                (tmp_path / "runs" / "ppo" / "fresh" / f"seed{s}_task{k}.json").unlink()
    entry = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)["methods"]["ppo"]
    cont_cells = np.array([[lost[s, k] for k in sampled[s]] for s in range(seeds)])
    fresh_cells = np.array([[fresh[s, k] for k in sampled[s]] for s in range(seeds)])
    ratio = entry["plasticity_ratio_last_half"]
    assert ratio["ratio"] == pytest.approx(cont_cells.sum() / fresh_cells.sum())
    assert ratio["cells"] == 2 * seeds and ratio["complete"] is False and ratio["high"] < 1
    assert entry["vs_fresh"] == "below fresh (plasticity lost)"
    assert entry["minus_fresh_last_half"]["mean"] == pytest.approx((cont_cells - fresh_cells).mean())
    import scipy.stats

    assert entry["iqm_fresh_last_half"]["iqm"] == pytest.approx(scipy.stats.trim_mean(fresh_cells.ravel(), 0.25))
    assert entry["iqm_sampled_last_half"]["iqm"] == pytest.approx(scipy.stats.trim_mean(cont_cells.ravel(), 0.25))
    assert entry["fresh_complete"] is False and entry["plasticity_mean"] is None
    table = continual.markdown_table(continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting),
                                     "bandit", setting)
    assert f"{ratio['ratio']:.3g} [" in table and "(sample)" in table


def test_the_paired_cell_counts_the_runs_on_each_side_of_their_fresh_agents(continual, tmp_path):
    """Beside the t interval the table gives the runs' signs: how many runs' continual scores sum below / above their
    fresh agents' over the paired cells (a tie is neither), in both the ratio's and the difference's entries."""
    rng = np.random.default_rng(4)
    setting = _tiny_bandit(continual, tasks=6)
    fresh = 0.8 + 0.01 * rng.standard_normal((5, 6))
    cont = fresh.copy()
    cont[:3, 3:] -= 0.1  # seeds 0-2 below on the last half
    cont[3, 3:] += 0.05  # seed 3 above
    cont[4, 3] += 0.02  # seed 4 a tie over the last half (+0.02 - 0.02)
    cont[4, 4] -= 0.02
    _synthetic_runs(tmp_path, setting, {"ppo": (cont, fresh), "plastic_maxmin": (cont - 0.3, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_maxmin"], setting)
    diff = (cont - fresh)[:, 3:].sum(axis=1)
    below, above = int((diff < 0).sum()), int((diff > 0).sum())
    assert (below, above) == (3, 1)  # seed 4's two differences cancel exactly: a tie
    for key in ("plasticity_ratio_last_half", "minus_fresh_last_half"):
        entry = result["methods"]["ppo"][key]
        assert (entry["runs_below"], entry["runs_above"], entry["paired_runs"]) == (3, 1, 5)
        lower = result["methods"]["plastic_maxmin"][key]
        assert (lower["runs_below"], lower["runs_above"], lower["paired_runs"]) == (5, 0, 5)
    table = continual.markdown_table(result, "bandit", setting)
    assert "; 3 below, 1 above (of 5 runs) |" in table and "; 5 of 5 runs below |" in table
    assert "'k of n runs below'" in table


def test_a_seed_with_every_fresh_agent_enters_the_estimator_with_its_sample_and_is_reported_as_the_check(
        continual, tmp_path):
    """Issue #28's estimator check: seed 0 has a fresh agent on every task, the other seeds on their sample of the late
    tasks. The paired ratio of means weighs every seed alike (seed 0 on its own sample only); seed 0's extra fresh
    agents go into the sample check: the fresh level over its sample against the level over every late task."""
    import scipy.stats

    rng = np.random.default_rng(2)
    setting = _tiny_bandit(continual, tasks=12)
    seeds, late = 4, list(range(6, 12))
    fresh = 0.8 + 0.01 * rng.standard_normal((seeds, 12))
    lost = 0.6 + 0.01 * rng.standard_normal((seeds, 12))
    sampled = {s: continual.fresh_sample(setting, s) for s in range(seeds)}
    outside = [k for k in late if k not in sampled[0]]
    fresh[0, outside] = 3.0  # seed 0's fresh agents off its sample: they would move the estimator if counted
    _synthetic_runs(tmp_path, setting, {"ppo": (lost, fresh)})
    for s in range(1, seeds):
        for k in range(12):
            if k not in sampled[s]:
                (tmp_path / "runs" / "ppo" / "fresh" / f"seed{s}_task{k}.json").unlink()
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    cont_cells = np.array([[lost[s, k] for k in sampled[s]] for s in range(seeds)])
    fresh_cells = np.array([[fresh[s, k] for k in sampled[s]] for s in range(seeds)])
    ratio = entry["plasticity_ratio_last_half"]
    assert ratio["ratio"] == pytest.approx(cont_cells.sum() / fresh_cells.sum())
    assert ratio["cells"] == continual.FRESH_SAMPLE * seeds
    assert entry["minus_fresh_last_half"]["mean"] == pytest.approx((cont_cells - fresh_cells).mean())
    k = outside[0]  # the per-task fresh level keeps every agent
    assert entry["fresh_mean"][k] == pytest.approx(np.mean([fresh[s, k] for s in range(seeds) if s == 0 or k in sampled[s]]))
    (check,) = entry["fresh_sample_check"]
    assert check["seed"] == 0 and check["sample"] == sampled[0] and check["late_tasks"] == late
    assert check["fresh_sample_mean"] == pytest.approx(fresh[0, sampled[0]].mean())
    assert check["fresh_late_mean"] == pytest.approx(fresh[0, late].mean())
    assert check["fresh_late_sd"] == pytest.approx(fresh[0, late].std(ddof=1))
    assert check["ratio_sample"] == pytest.approx(lost[0, sampled[0]].sum() / fresh[0, sampled[0]].sum())
    assert check["ratio_late"] == pytest.approx(lost[0, late].sum() / fresh[0, late].sum())
    table = continual.markdown_table(result, "bandit", setting)
    assert "Fresh-sample check" in table and f"{check['fresh_late_mean']:.3g}" in table
    # the check in progress: seed 0 with one late fresh agent beyond its sample enters with its sample, no check yet
    assert len(outside) == 2
    for k in outside[1:]:
        (tmp_path / "runs" / "ppo" / "fresh" / f"seed0_task{k}.json").unlink()
    entry = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)["methods"]["ppo"]
    assert entry["plasticity_ratio_last_half"]["ratio"] == pytest.approx(cont_cells.sum() / fresh_cells.sum())
    assert "fresh_sample_check" not in entry
    assert entry["iqm_fresh_last_half"]["iqm"] == pytest.approx(scipy.stats.trim_mean(fresh_cells.ravel(), 0.25))
    # a --fresh all grid in progress (no run holds exactly its sample): the runs enter with every fresh agent they have
    _synthetic_runs(tmp_path / "progress", setting, {"ppo": (lost, fresh)})
    for k in late[:3]:
        (tmp_path / "progress" / "runs" / "ppo" / "fresh" / f"seed3_task{k}.json").unlink()
    entry = continual.summarise(continual.load_records(str(tmp_path / "progress")), ["ppo"], setting)["methods"]["ppo"]
    assert "fresh_sample_check" not in entry
    assert entry["plasticity_ratio_last_half"]["cells"] == seeds * len(late) - 3
    # every seed with every fresh agent (--fresh all): nothing is restricted and there is no check
    _synthetic_runs(tmp_path / "all", setting, {"ppo": (lost, fresh)})
    entry = continual.summarise(continual.load_records(str(tmp_path / "all")), ["ppo"], setting)["methods"]["ppo"]
    assert "fresh_sample_check" not in entry
    assert entry["plasticity_ratio_last_half"]["cells"] == seeds * len(late)


def test_a_fresh_all_grid_in_progress_reports_the_fresh_level_of_its_complete_runs(continual, tmp_path):
    """While one seed of a ``--fresh all`` grid still lacks some late fresh agents, the fresh column is the IQM over
    the runs whose late fresh agents are all there (stated in the table), not a blank."""
    import scipy.stats

    rng = np.random.default_rng(4)
    setting = _tiny_bandit(continual, tasks=8)
    seeds, late = 5, list(range(4, 8))
    fresh = 0.8 + 0.05 * rng.standard_normal((seeds, 8))
    lost = 0.6 + 0.05 * rng.standard_normal((seeds, 8))
    _synthetic_runs(tmp_path, setting, {"ppo": (lost, fresh)})
    for k in late[:2]:
        (tmp_path / "runs" / "ppo" / "fresh" / f"seed2_task{k}.json").unlink()
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    complete = [s for s in range(seeds) if s != 2]
    point = entry["iqm_fresh_last_half"]
    assert point["iqm"] == pytest.approx(scipy.stats.trim_mean(fresh[complete][:, late].ravel(), 0.25))
    assert point["runs"] == 4 and point["of"] == 5 and point["low"] <= point["iqm"] <= point["high"]
    assert "fresh_sample_check" not in entry
    row = next(line for line in continual.markdown_table(result, "bandit", setting).splitlines()
               if line.startswith("| ppo | 5 |"))
    assert f"{point['iqm']:.3g} [" in row and "(4 of 5 runs)" in row
    # complete again: the IQM over every run, with no note
    _synthetic_runs(tmp_path / "all", setting, {"ppo": (lost, fresh)})
    entry = continual.summarise(continual.load_records(str(tmp_path / "all")), ["ppo"], setting)["methods"]["ppo"]
    assert "runs" not in entry["iqm_fresh_last_half"]


def test_head_statistics_match_the_policy_distribution_and_q_values(continual):
    from stable_baselines3 import DQN, PPO

    th.manual_seed(0)
    obs = [np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32) for _ in range(3)]
    ppo = PPO("MlpPolicy", "CartPole-v1", seed=0)
    stats = continual.head_statistics(ppo, obs)
    with th.no_grad():
        dist = ppo.policy.get_distribution(th.as_tensor(np.concatenate(obs)))
        probs = dist.distribution.probs.double()
        logits = dist.distribution.logits.double()
    assert stats["head_entropy"] == pytest.approx(float(dist.entropy().double().mean()), rel=1e-5)
    assert stats["head_max_prob"] == pytest.approx(float(probs.max(dim=1).values.mean()), rel=1e-6)
    assert stats["head_logit_std"] == pytest.approx(float(logits.std(dim=1).mean()), rel=1e-6)
    dqn = DQN("MlpPolicy", "CartPole-v1", seed=0)
    stats = continual.head_statistics(dqn, obs)
    with th.no_grad():
        q = dqn.q_net(th.as_tensor(np.concatenate(obs))).double()
    assert stats == pytest.approx({"head_q_std": float(q.std(dim=1).mean()), "head_q_max": float(q.max(1).values.mean())})
    assert continual.head_statistics(ppo, []) == {}
    # a diagonal Gaussian policy (PPO on a continuous env): its standard deviation and |mean action|
    gaussian = PPO("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs=dict(log_std_init=-0.5))
    states = [np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)]
    stats = continual.head_statistics(gaussian, states)
    with th.no_grad():
        mean = gaussian.policy.get_distribution(th.as_tensor(states[0])).distribution.mean.double()
    assert stats["head_action_std"] == pytest.approx(np.exp(-0.5), rel=1e-6)
    assert stats["head_mean_abs"] == pytest.approx(float(mean.abs().mean()), rel=1e-6) and stats["head_mean_abs"] > 0


def test_a_run_records_head_statistics_per_task_without_changing_training(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=2)
    record = continual.run_one("ppo", 0, setting, continual.MethodParams(), str(tmp_path), "cpu", 1)
    assert len(record["head_entropy"]) == len(record["task"]) == 2
    assert all(0 < p <= 1 for p in record["head_max_prob"]) and all(v > 0 for v in record["head_logit_std"])
    # the probe draws no random numbers: a run without it (the recorder's head statistics off) trains identically
    saved = json.loads(Path(continual.run_path(str(tmp_path), "ppo", 0)).read_text())
    recorder = continual.continual_recorder  # where the recorder reads it
    recorder.HEAD_PROBE_STEPS, old = 0, recorder.HEAD_PROBE_STEPS
    try:
        again = continual.run_one("ppo", 0, setting, continual.MethodParams(), str(tmp_path / "b"), "cpu", 1)
    finally:
        recorder.HEAD_PROBE_STEPS = old
    assert again["end_reward"] == saved["end_reward"] and "head_entropy" not in again
    assert "switch_head_entropy" not in again and len(record["switch_head_entropy"]) == 2


def test_a_run_records_the_head_as_each_task_finds_it(continual):
    """``switch_head_*``: the head's statistics over each task's first HEAD_PROBE_STEPS steps, each step read with the
    network of that step. With a learning rate of 0 every step's network is the initial one, so the reading must be
    head_statistics over those steps' observations, collected here by hand."""
    from stable_baselines3.common.callbacks import BaseCallback

    tiny = _tiny_bandit(continual, tasks=3)
    setting = replace(tiny, ppo=dict(tiny.ppo, learning_rate=0.0))

    class FirstSteps(BaseCallback):
        def _on_training_start(self) -> None:
            self.obs: dict[int, list[np.ndarray]] = {}

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            if 1 <= info["task_step"] <= continual.continual_recorder.HEAD_PROBE_STEPS:
                self.obs.setdefault(int(info["task_id"]), []).append(self.locals["new_obs"].copy())
            return True

    model, _ = continual.build_model("ppo", setting, continual.MethodParams(), 0, "cpu", None)
    initial = [p.detach().clone() for p in model.policy.parameters()]
    results = {"task": [], "mean_reward": [], "end_reward": [], "end_return": [], "end_episodes": []}
    spy = FirstSteps()
    model.learn(setting.total_timesteps, callback=[continual._task_recorder(setting, results), spy])
    assert all(th.equal(a, b) for a, b in zip(initial, model.policy.parameters()))  # lr 0: the network never moved
    assert results["task"] == [0, 1, 2] and sorted(spy.obs) == [0, 1, 2]
    for k in range(3):
        assert len(spy.obs[k]) == continual.continual_recorder.HEAD_PROBE_STEPS
        expected = continual.head_statistics(model, spy.obs[k])
        for key in ("head_entropy", "head_max_prob", "head_logit_std"):
            assert results["switch_" + key][k] == pytest.approx(expected[key], rel=1e-9)
    # the initial policy (SB3's action head at gain 0.01) is close to uniform over the bandit's actions
    n_actions = model.action_space.n
    assert results["switch_head_entropy"][0] == pytest.approx(np.log(n_actions), rel=1e-3)
    model.env.close()


def test_a_per_task_key_missing_for_the_first_tasks_is_padded_to_stay_aligned(continual):
    """A run resumed from a checkpoint written before a key existed reads it from the resumed task on: the earlier
    tasks get NaN, so the key's list stays aligned with the tasks."""
    results = {"task": [0, 1, 2]}
    continual._append_per_task(results, "switch_head_entropy", 0.5)
    assert np.isnan(results["switch_head_entropy"][:2]).all() and results["switch_head_entropy"][2] == 0.5
    results["task"].append(3)
    continual._append_per_task(results, "switch_head_entropy", 0.25)
    assert results["switch_head_entropy"][3] == 0.25 and len(results["switch_head_entropy"]) == 4


def test_adam_equal_betas_method_is_the_plain_agent_with_equal_betas(continual):
    setting = continual.SETTINGS["minatar_intensive"]
    plain, _ = continual.build_model("ppo", setting, continual.MethodParams(), 0, "cpu", None)
    model, callbacks = continual.build_model("ppo_adam_equal_betas", setting, continual.MethodParams(), 0, "cpu", None)
    assert callbacks == [] and type(model) is type(plain)
    groups, plain_groups = model.policy.optimizer.param_groups, plain.policy.optimizer.param_groups
    assert [g["betas"] for g in groups] == [(0.99, 0.99)] and [g["betas"] for g in plain_groups] == [(0.9, 0.999)]
    assert groups[0]["eps"] == plain_groups[0]["eps"] == 1e-5
    for a, b in zip(model.policy.parameters(), plain.policy.parameters()):
        assert th.equal(a, b)  # same seed, same network: only the optimizer differs


def test_dohare_slippery_ant_is_his_design_and_his_regularised_agents(continual):
    from sb3_plastic import ShrinkPerturb

    setting = continual.SETTINGS["slippery_ant_dohare"]
    # cfg/sant/std.yml: 20 M steps, a new friction every 2 M, rollouts of 2048 in 16 minibatches, 10 epochs, lr 1e-4
    assert setting.task_timesteps == 2_000_000 and setting.total_timesteps == 20_000_000
    rollout = setting.n_envs * setting.ppo["n_steps"]
    assert rollout == 2048 and rollout // setting.ppo["batch_size"] == 16
    assert (setting.ppo["n_epochs"], setting.ppo["learning_rate"], setting.net_arch) == (10, 1e-4, (256, 256))
    assert "every 2M steps" in setting.description and setting.env_id == continual.SETTINGS["slippery_ant_ppo"].env_id
    assert continual.SETTINGS["slippery_ant_ppo"].ppo["batch_size"] == 64  # the interval runs' minibatch, unchanged
    params = continual.MethodParams()
    plain, _ = continual.build_model("ppo", setting, params, 0, "cpu", None)
    # his gym 0.23 Ant-v3 on mujoco-py 2.1 saw no contact forces (84 entries, always 0 there) and paid no contact cost:
    # Ant-v5 without them (27 observations; the interval runs kept Ant-v5's 105) and 84 zeros, so that his networks'
    # 111 inputs, and their LeCun bound sqrt(3 / 111) on the first layer, are ours (twenty-ninth session)
    assert plain.observation_space.shape == (111,)
    first = [m for name, m in plain.policy.named_modules() if name.endswith(("policy_net.0", "value_net.0"))]
    assert len(first) == 2 and all(m.in_features == 111 for m in first)
    for m in first:
        assert (3 / 111) ** 0.5 * 0.95 < float(m.weight.abs().max()) <= (3 / 111) ** 0.5
    assert plain.action_space.high.max() == 1e6  # raw_actions: his raw Gaussian sample reaches the env, cost included
    # his PPO (lop/algos/rl/ppo.py): no gradient clipping, the value loss unweighted, Adam eps 1e-8, LeCun init
    assert (plain.max_grad_norm, plain.vf_coef) == (float("inf"), 1.0)
    assert plain.policy.optimizer.param_groups[0]["eps"] == 1e-8
    for name, weight in plain.policy.named_parameters():
        if weight.dim() == 2:  # U(+-sqrt(3 / fan_in)): within the bound, standard deviation 1 / sqrt(fan_in)
            bound = (3.0 / weight.shape[1]) ** 0.5
            assert float(weight.abs().max()) <= bound and abs(float(weight.std()) * weight.shape[1] ** 0.5 - 1) < 0.1
            assert not plain.policy.get_parameter(name.replace("weight", "bias")).any()
    assert continual.SETTINGS["slippery_ant_ppo"].env_kwargs == {}
    # his advantages normalised once per 2048-step batch, his time limit a terminal state (tests/test_bench_dohare_ppo.py)
    assert (setting.advantage_norm, setting.time_limit_terminal) == ("rollout", True)
    assert type(plain.env.envs[0]).__name__ == "TruncationAsTermination"
    ant = plain.env.envs[0].unwrapped
    assert ant._contact_cost_weight == 0.0 and not ant._include_cfrc_ext_in_observation
    expected = {"ppo_l2_dohare": 1e-3, "ppo_snp_continual": 0.0}
    for method, weight_decay in expected.items():
        for fresh_task in (None, 3):  # both act on every step: their fresh agents run them too
            model, callbacks = continual.build_model(method, setting, params, 0, "cpu", None, fresh_task=fresh_task)
            (group,) = model.policy.optimizer.param_groups
            assert group["betas"] == (0.99, 0.99) and group["weight_decay"] == weight_decay
            assert group["eps"] == 1e-8 and model.batch_size == 128
            if method == "ppo_snp_continual":
                (snp,) = callbacks
                assert isinstance(snp, ShrinkPerturb) and snp.mode == "continual"
                assert (snp.weight_decay, snp.noise_std, snp.weight_decay_mode) == (1e-4, 1e-5, "coupled")
            else:
                assert callbacks == []
            for a, b in zip(model.policy.parameters(), plain.policy.parameters()):
                assert th.equal(a, b)
            model.env.close()
    assert not set(continual.DOHARE_METHODS) & set(continual.DEFAULT_METHODS)


class _Interrupted(RuntimeError):
    pass


def _interrupt_once_at(continual, monkeypatch, step):
    """Make the next run built by ``build_model`` stop with an exception at ``num_timesteps >= step`` (a session
    that ends), and the runs after it train normally."""
    from stable_baselines3.common.callbacks import BaseCallback

    build, fired = continual.build_model, []

    class Stop(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= step:
                fired.append(self.num_timesteps)
                raise _Interrupted(f"stopped at {self.num_timesteps}")
            return True

    def build_model(*args, **kwargs):
        model, callbacks = build(*args, **kwargs)
        return model, callbacks + ([] if fired else [Stop()])

    monkeypatch.setattr(continual.continual_runs, "build_model", build_model)  # where a run builds its model
    return fired


def _dqn_bandit(continual):
    dqn = dict(buffer_size=1_000, learning_starts=64, batch_size=16, train_freq=1, gradient_steps=1,
               target_update_interval=50, exploration_fraction=0.2)
    return replace(_tiny_bandit(continual, tasks=3), algo="dqn", ppo=dqn)


@pytest.mark.parametrize("method", ["ppo", "ppo_fire_switch", "ppo_snp", "ppo_cbp", "plastic_maxmin", "dqn_l2_init",
                                    "ppo_injection", "ppo_trac", "ppo_cchain", "ppo_vecnorm", "ppo_crelu", "ppo_fourier",
                                    "ppo_layernorm", "ppo_parseval", "ppo_nap", "ppo_spectral", "ppo_head2_reset",
                                    "ppo_redo", "ppo_adam_equal_betas", "plastic_relu", "dqn_cchain", "dqn_redo"])
def test_an_interrupted_run_resumes_from_its_checkpoint_exactly(continual, tmp_path, monkeypatch, method):
    setting = _dqn_bandit(continual) if method.startswith("dqn") else _tiny_bandit(continual, tasks=3)
    params = continual.MethodParams(cbp_rate=0.05, cbp_maturity=5)  # CBP replaces units within the tiny run
    whole = continual.run_one(method, 0, setting, params, str(tmp_path / "whole"), "cpu", 1)
    assert "resumed_at" not in whole
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint at every rollout start
    # inside task 1. Late in it for an injection (at the rollout start after the switch's rollout: in the checkpoint
    # resumed from) and C-CHAIN (whose coefficient restarts at a switch: a checkpoint within the task carries an
    # adaptation still pending)
    late = method in ("ppo_injection", "ppo_cchain")
    cut = setting.task_timesteps + (setting.task_timesteps - 20 if late else 100)
    fired = _interrupt_once_at(continual, monkeypatch, step=cut)
    out = str(tmp_path / "cut")
    with pytest.raises(_Interrupted):
        continual.run_one(method, 0, setting, params, out, "cpu", 1)
    assert fired and not Path(continual.run_path(out, method, 0)).exists()
    root = continual.checkpoint_root(out, method, 0)
    assert continual.run_checkpoint.latest(root) is not None
    resumed = continual.run_one(method, 0, setting, params, out, "cpu", 1)
    assert 0 < resumed["resumed_at"][0] <= fired[0]
    if late:
        assert resumed["resumed_at"][0] > setting.task_timesteps + setting.ppo["n_steps"] * setting.n_envs
    for key in ("task", "end_reward", "end_return", "mean_reward", "end_episodes", "diagnostics", "timesteps"):
        assert resumed[key] == whole[key], key
    head = [k for k in whole if k.startswith("head_")]
    assert head and all(resumed[k] == whole[k] for k in head)
    # the cut falls inside task 1's first HEAD_PROBE_STEPS steps: its switch reading is resumed, not restarted
    switch = [k for k in whole if k.startswith("switch_head_")]
    assert switch and all(np.array_equal(resumed[k], whole[k], equal_nan=True) for k in switch)
    assert not Path(root).exists()  # removed with the finished run
    # SB3's training scalars of the train() call before the checkpoint are written too (its logger's unwritten values
    # are in the checkpoint), and what the interrupted attempt wrote past its checkpoint is purged: the two runs'
    # TensorBoard curves are the same, as TensorBoard reads them and as the bench reads them
    assert _events(tmp_path / "cut", method) == _events(tmp_path / "whole", method)
    assert _scalars(continual, tmp_path / "cut", method) == _scalars(continual, tmp_path / "whole", method)


@pytest.mark.parametrize("method", ["ppo", "dqn"])
def test_a_run_resumed_in_a_fresh_checkout_keeps_its_training_scalars(continual, tmp_path, monkeypatch, method):
    """The TensorBoard events are not committed: a run resumed in another checkout has lost the events of its earlier
    pieces. Its JSON's training scalars (PPO's policy entropy per task) come from the run's own capture of SB3's
    logger, carried by the checkpoint: the same as the uninterrupted run's, and as the events give them (float32
    there). A checkpoint written before the capture existed leaves them to the events (add_train_scalars)."""
    setting = _dqn_bandit(continual) if method == "dqn" else _tiny_bandit(continual, tasks=3)
    params = continual.MethodParams()
    whole = continual.run_one(method, 0, setting, params, str(tmp_path / "whole"), "cpu", 1)
    from_events = continual.continual_recorder.train_scalars_per_task(_events_dir(tmp_path / "whole", method),
                                                                      setting, setting.tasks)
    if method == "dqn":  # no entropy: nothing to keep, as from the events
        assert whole["train_scalars"] == from_events == {}
    else:
        (entropy,) = whole["train_scalars"].values()
        assert len(entropy) == setting.tasks and all(v is not None and v < 0 for v in entropy)
        np.testing.assert_allclose(entropy, from_events["train/entropy_loss"], rtol=1e-6)
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)
    for old_checkpoint in (False, True):
        out = tmp_path / f"cut{old_checkpoint}"
        _interrupt_once_at(continual, monkeypatch, step=setting.task_timesteps + 100)
        with pytest.raises(_Interrupted):
            continual.run_one(method, 0, setting, params, str(out), "cpu", 1)
        shutil.rmtree(out / "tb")  # another checkout: the events of the interrupted piece are gone
        if old_checkpoint:
            load = continual.continual_runs.run_checkpoint.load

            def load_without_capture(*args, _load=load):
                model, saved = _load(*args)
                saved.pop("train_scalars_logged")
                return model, saved

            monkeypatch.setattr(continual.continual_runs.run_checkpoint, "load", load_without_capture)
        resumed = continual.run_one(method, 0, setting, params, str(out), "cpu", 1)
        assert resumed["resumed_at"] and resumed["end_reward"] == whole["end_reward"]
        if old_checkpoint:
            assert "train_scalars" not in resumed
        else:
            assert resumed["train_scalars"] == whole["train_scalars"]


def _events_dir(out, method):
    (events_dir,) = Path(out, "tb", method).glob("s0_*")
    return str(events_dir)


def _events(out, method, tag=None):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(_events_dir(out, method), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag or _train_tag(method))]


def _train_tag(method):
    return "train/loss" if method.startswith("dqn") else "train/entropy_loss"


def _scalars(continual, out, method, tag=None):
    return continual.continual_recorder.scalar_steps(_events_dir(out, method), tag or _train_tag(method))


@pytest.fixture
def stop_signal(continual):
    """A stop request (SIGUSR1) is process-wide: forgotten, and the signal's handler put back, after the test."""
    import signal

    previous = signal.getsignal(continual.run_checkpoint.STOP_SIGNAL)
    continual.run_checkpoint.clear_stop()
    yield continual.run_checkpoint
    continual.run_checkpoint.clear_stop()
    signal.signal(continual.run_checkpoint.STOP_SIGNAL, previous)


def _signal_at(continual, monkeypatch, step):
    """Make the next run built by ``build_model`` send this process the stop signal once ``num_timesteps >= step``."""
    import os

    from stable_baselines3.common.callbacks import BaseCallback

    build, fired = continual.build_model, []

    class Signal(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= step and not fired:
                fired.append(self.num_timesteps)
                os.kill(os.getpid(), continual.run_checkpoint.STOP_SIGNAL)
            return True

    def build_model(*args, **kwargs):
        model, callbacks = build(*args, **kwargs)
        return model, callbacks + ([] if fired else [Signal()])

    monkeypatch.setattr(continual.continual_runs, "build_model", build_model)
    return fired


@pytest.mark.parametrize("method", ["ppo", "dqn_l2_init"])
def test_a_run_stopped_on_request_checkpoints_then_resumes_exactly(continual, tmp_path, monkeypatch, stop_signal,
                                                                   method):
    """The end of a session: SIGUSR1 makes a run save a checkpoint at its next rollout start and stop, so nothing
    since its last periodic checkpoint is lost (none here: the period is far longer than the run)."""
    setting = _dqn_bandit(continual) if method.startswith("dqn") else _tiny_bandit(continual, tasks=3)
    params = continual.MethodParams()
    whole = continual.run_one(method, 0, setting, params, str(tmp_path / "whole"), "cpu", 1)
    stop_signal.install_stop_handler()
    fired = _signal_at(continual, monkeypatch, step=setting.task_timesteps + 100)  # inside task 1
    out = str(tmp_path / "cut")
    with pytest.raises(stop_signal.RunStopped, match="stopped on request at step .*checkpoint"):
        continual.run_one(method, 0, setting, params, out, "cpu", 1)
    path = continual.run_path(out, method, 0)
    assert fired and not Path(path).exists() and not Path(path + ".claim").exists()
    latest = stop_signal.latest(continual.checkpoint_root(out, method, 0))
    assert latest is not None and int(Path(latest).name.removeprefix("step")) >= fired[0]
    # asked to stop, the process starts nothing more
    with pytest.raises(stop_signal.RunStopped, match="not started"):
        continual.run_one(method, 1, setting, params, out, "cpu", 1)
    assert not Path(continual.run_path(out, method, 1) + ".claim").exists()
    assert not Path(continual.checkpoint_root(out, method, 1)).exists()
    stop_signal.clear_stop()
    resumed = continual.run_one(method, 0, setting, params, out, "cpu", 1)
    assert resumed["resumed_at"] == [int(Path(latest).name.removeprefix("step"))]
    for key in ("task", "end_reward", "end_return", "mean_reward", "end_episodes", "diagnostics", "timesteps"):
        assert resumed[key] == whole[key], key


def test_the_cli_stopped_on_request_leaves_its_tables_and_starts_no_other_run(continual, tmp_path, monkeypatch,
                                                                              stop_signal, capsys):
    out = tmp_path / "grid"
    setting = continual.resolve_setting("bandit", True, None, None, {})
    _signal_at(continual, monkeypatch, step=setting.task_timesteps + 100)
    code = continual.main(["--quick", "--methods", "ppo", "--seeds", "0", "1", "--fresh", "none", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 3
    assert "stopped on request: 2 runs not finished ([('ppo', 0, None), ('ppo', 1, None)])" in captured.out
    assert "ppo seed 1: stopped (RunStopped: not started" in captured.err and "FAILED" not in captured.err
    assert stop_signal.latest(continual.checkpoint_root(str(out), "ppo", 0)) is not None
    assert not Path(continual.checkpoint_root(str(out), "ppo", 1)).exists()
    assert not (out / "summary.md").exists()


def test_a_checkpoint_that_cannot_be_written_warns_and_the_run_goes_on(continual, tmp_path, monkeypatch):
    setting = _tiny_bandit(continual, tasks=2)
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)

    def broken(*args, **kwargs):
        raise TypeError("cannot pickle this env")

    monkeypatch.setattr(continual.run_checkpoint, "save", broken)
    with pytest.warns(UserWarning, match="checkpoint of .* failed .*cannot pickle this env.*checkpointing is off"):
        record = continual.run_one("ppo", 0, setting, continual.MethodParams(), str(tmp_path), "cpu", 1)
    assert len(record["end_reward"]) == 2


def _tiny_cminatar(continual):
    dqn = dict(continual.SETTINGS["cminatar"].ppo, buffer_size=500, learning_starts=50, target_update_interval=40)
    return replace(continual.SETTINGS["cminatar"], change_every=150, ppo=dqn, monitor_every=200, exploration_steps=100,
                   eval_every=100, eval_episodes=2, random_steps_per_task=100,
                   env_kwargs=dict(continual.SETTINGS["cminatar"].env_kwargs, idle_episode_steps=60))


def test_cminatar_starts_every_game_with_random_untrained_steps_and_trains_on_mse(continual, tmp_path, monkeypatch):
    """C-CHAIN's runs start every game with 10 k uniformly random actions and no update (their INIT_RANDOM_STEPS) and
    train on the squared TD error: after each switch (steps 151 and 301 here) the agent acts at random and does not
    train for random_steps_per_task steps, then trains again; the fresh agents keep learning_starts."""
    from sb3_plastic import PlasticDQN

    assert continual.SETTINGS["cminatar"].random_steps_per_task == 10_000
    assert continual.SETTINGS["cminatar"].ppo["td_loss"] == "mse"
    setting = _tiny_cminatar(continual)
    trained, train = [], PlasticDQN.train

    def spying(self, *args, **kwargs):
        trained.append(int(self.num_timesteps))
        assert self.td_loss == "mse"
        return train(self, *args, **kwargs)

    monkeypatch.setattr(PlasticDQN, "train", spying)
    continual.run_one("dqn", 0, setting, continual.MethodParams(), str(tmp_path), "cpu", 1)
    assert trained[0] == 51 and 150 in trained and 300 in trained and trained[-1] == 450
    assert not [t for t in trained if 151 <= t <= 251 or 301 <= t <= 401]
    assert 252 in trained and 402 in trained
    with pytest.raises(ValueError, match="random_steps_per_task"):
        replace(setting, algo="ppo")


def test_cminatar_plain_agent_is_double_dqn_with_an_absolute_epsilon_schedule(continual):
    setting = continual.SETTINGS["cminatar"]
    assert setting.env_kwargs["games"] == ("space_invaders", "asterix", "seaquest") and setting.tasks == 3
    model, _ = continual.build_model("dqn", setting, continual.MethodParams(), 0, "cpu", None)
    fresh, _ = continual.build_model("dqn", setting, continual.MethodParams(), 0, "cpu", None, fresh_task=2)
    assert type(model).__name__ == "PlasticDQN" and model.double_q and model.isometry_config.isometry_mode == "off"
    assert model.isometry_config.optimizer == "adam" and model.max_grad_norm == float("inf")
    # epsilon reaches its final value after exploration_steps env steps in the continual run and in a fresh agent
    for agent, steps in ((model, setting.total_timesteps), (fresh, setting.task_timesteps)):
        assert agent.exploration_fraction * steps == pytest.approx(110_000)
        assert agent.exploration_schedule(1 - 109_000 / steps) > 0.1
        assert agent.exploration_schedule(1 - 111_000 / steps) == pytest.approx(0.1)
    assert continual.run_parts(setting, "sample", 4) == [None, 1, 2]  # fresh agents of the 2nd and 3rd game


def test_cminatar_run_records_greedy_evaluations_and_resumes_them_exactly(continual, tmp_path, monkeypatch):
    setting = _tiny_cminatar(continual)
    whole = continual.run_one("dqn", 0, setting, continual.MethodParams(), str(tmp_path / "whole"), "cpu", 1)
    evals = whole["evaluations"]
    # every eval_every timesteps, the game just trained (a boundary eval: the finished game), and a zero-shot one at
    # every game's first step (C-CHAIN's evaluation at each game's start)
    assert [e[0] for e in evals] == [1, 100, 151, 200, 300, 301, 400]
    assert [e[1] for e in evals] == [0, 0, 1, 1, 1, 2, 2]
    monkeypatch.setattr(continual.continual_runs, "CHECKPOINT_SECONDS", 0.0)
    _interrupt_once_at(continual, monkeypatch, step=230)
    out = str(tmp_path / "cut")
    with pytest.raises(_Interrupted):
        continual.run_one("dqn", 0, setting, continual.MethodParams(), out, "cpu", 1)
    resumed = continual.run_one("dqn", 0, setting, continual.MethodParams(), out, "cpu", 1)
    assert resumed["end_return"] == whole["end_return"] and resumed["diagnostics"] == whole["diagnostics"]
    assert resumed["resumed_at"] and resumed["evaluations"] == evals


def test_evaluation_summary_is_the_run_mean_over_evaluations_then_mean_and_se_over_seeds(continual):
    runs = [{"evaluations": [[1, 0, 1.0], [2, 0, 3.0], [3, 1, 5.0]]},
            {"evaluations": [[1, 0, 2.0], [2, 1, 4.0], [3, 1, 6.0]]}]
    out = continual.evaluation_summary(runs, 2)
    per_seed = [3.0, 4.0]
    assert out["per_seed"] == per_seed and out["mean"] == 3.5
    assert out["se"] == pytest.approx(np.std(per_seed, ddof=1) / np.sqrt(2))
    assert out["per_task"] == [pytest.approx((2.0 + 2.0) / 2), pytest.approx((5.0 + 5.0) / 2)]
    assert continual.evaluation_summary([{"task": [0]}], 2) == {}


def test_the_logged_statistic_drops_a_tasks_last_evaluation_where_the_next_tasks_first_shares_its_step(continual):
    """C-CHAIN's wandb history keyed by the global step keeps one value where two evaluations share a step: the end
    of game k and the zero-shot start of game k + 1 (ours one step apart). Written out by hand."""
    evals = [[0, 0, 1.0], [50, 0, 2.0], [100, 0, 9.0], [101, 1, 3.0], [150, 1, 4.0], [200, 1, 7.0], [201, 2, 5.0],
             [250, 2, 6.0], [300, 2, 8.0]]
    kept = continual.one_per_logged_step(evals)
    assert kept == [e for e in evals if e[0] not in (100, 200)]
    out = continual.evaluation_summary([{"evaluations": evals}, {"evaluations": [[0, 0, 2.0], [5, 0, 4.0]]}], 3)
    by_hand = [np.mean([1, 2, 3, 4, 5, 6, 8]), 3.0]
    assert out["logged_mean"] == pytest.approx(np.mean(by_hand)) and out["logged_points"] == 7
    assert out["logged_se"] == pytest.approx(np.std(by_hand, ddof=1) / np.sqrt(2))
    assert out["mean"] == pytest.approx(np.mean([np.mean([e[2] for e in evals]), 3.0]))


def test_a_replay_buffer_is_saved_compactly_and_comes_back_equal(continual, tmp_path):
    from stable_baselines3.common.buffers import ReplayBuffer

    setting = replace(_tiny_cminatar(continual), eval_every=0)
    model, _ = continual.build_model("dqn", setting, continual.MethodParams(), 0, "cpu", None)
    model.learn(300)
    buffer = model.replay_buffer
    assert isinstance(buffer, ReplayBuffer) and buffer.observations.dtype == bool
    continual.run_checkpoint.save_buffer(buffer, str(tmp_path / "b"))
    back = continual.run_checkpoint.load_buffer(str(tmp_path / "b"))
    assert type(back) is type(buffer) and set(vars(back)) == set(vars(buffer))
    for key, value in vars(buffer).items():
        if isinstance(value, np.ndarray):
            assert vars(back)[key].dtype == value.dtype and np.array_equal(vars(back)[key], value), key
        else:
            assert vars(back)[key] == value, key
    np.random.seed(0)
    a = buffer.sample(8)
    np.random.seed(0)
    b = back.sample(8)
    assert all(th.equal(x, y) for x, y in zip(a, b) if isinstance(x, th.Tensor))


def test_the_summary_counts_the_late_cells_at_the_floor_that_the_iqm_drops(continual, tmp_path):
    """A setting with a floor (CartPole's collapsed policy) reports how many last-half cells sit below it, for the
    continual runs and the fresh agents, beside the IQM (which trims the lowest quarter of the cells)."""
    import scipy.stats

    assert continual.SETTINGS["cartpole_obs"].floor_below == 20.0
    assert continual.SETTINGS["cchain_cartpole"].floor_below == 20.0
    assert continual.SETTINGS["cchain_acrobot"].floor_below == -399.0
    assert continual.SETTINGS["cchain_lunar"].floor_below is None and continual.SETTINGS["bandit"].floor_below is None
    rng = np.random.default_rng(5)
    setting = replace(_tiny_bandit(continual, tasks=8), floor_below=20.0)
    fresh = rng.uniform(300, 500, size=(5, 8))
    ends = rng.uniform(300, 500, size=(5, 8))
    floor_cells = [(0, 4), (1, 6), (3, 7), (4, 5)]  # 4 of the 20 late cells collapse: within the IQM's trimmed quarter
    for seed, task in floor_cells:
        ends[seed, task] = 9.3
    fresh[2, 6] = 9.4
    _synthetic_runs(tmp_path, setting, {"ppo": (ends, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    assert entry["at_floor_last_half"] == {"cells": 4, "of": 20}
    assert entry["fresh_at_floor_last_half"] == {"cells": 1, "of": 20}
    # the IQM does not see them: it is the trimmed mean of the late cells, far above the floor
    assert entry["iqm_last_half"]["iqm"] == pytest.approx(scipy.stats.trim_mean(ends[:, 4:].ravel(), 0.25))
    assert entry["iqm_last_half"]["iqm"] > 300
    table = continual.markdown_table(result, "tiny", setting)
    assert "| continual | at the floor: continual / fresh | plasticity |" in table
    assert "below 20 (a collapsed policy's score" in table
    row = next(line for line in table.splitlines() if line.startswith("| ppo | 5 |"))
    assert "| 4 of 20 / 1 of 20 |" in row
    # a setting without a floor has no such column
    plain = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], replace(setting, floor_below=None))
    assert "at_floor_last_half" not in plain["methods"]["ppo"]
    assert "at the floor" not in continual.markdown_table(plain, "tiny", replace(setting, floor_below=None))


def test_slippery_summaries_show_each_runs_friction_per_task_as_mujoco_runs_it(continual):
    """The per-run table of a Slippery setting: each task's friction for a run seed, as the env writes it into
    MuJoCo's model when that task runs (read back from ``geom_friction``), beside each run's score on that task;
    settings whose tasks draw no parameters get no such table."""
    import gymnasium as gym

    setting = replace(continual.SETTINGS["slippery_ant_ppo"], tasks=3)
    scores = {0: [10.0, 20.0, 30.0], 2: [1.0, 2.0, 3.0]}
    records = [dict(method="ppo", seed=s, fresh_task=None, end_reward=v, end_return=v, mean_reward=v)
               for s, v in scores.items()]
    extra = continual.continual_report.per_run_task_parameters(records, ["ppo"], setting)
    assert extra["per_run_scores"] == {"ppo": {"0": scores[0], "2": scores[2]}}
    for seed in scores:
        env = gym.make(setting.env_id, change_every=setting.change_every, task_seed=seed, **setting.env_kwargs)
        for task, params in enumerate(extra["task_parameters"][str(seed)]):
            env.unwrapped.model.geom_friction[:, 0] = -1.0
            env.get_wrapper_attr("pin_task")(task)
            env.reset(seed=0)
            assert np.all(env.unwrapped.model.geom_friction[:, 0] == pytest.approx(params["friction"], rel=1e-12))
        env.close()
    assert extra["task_parameters"]["0"] != extra["task_parameters"]["2"]  # independent sequences per seed
    assert continual.continual_report.per_run_task_parameters(records, ["ppo"], _tiny_bandit(continual)) == {}
    result = dict(metrics="-", plain="ppo", methods={"ppo": dict(
        seeds=[0, 2], tasks=3, iqm_last_half=None, cpu_seconds_mean=60.0, end_reward_mean=[5.5, 11.0, 16.5])}, **extra)
    table = continual.continual_report.markdown_table(result, "slippery_ant_ppo", setting)
    f = extra["task_parameters"]["2"]
    assert f"| 2 | friction | {f[0]['friction']:.3g} | {f[1]['friction']:.3g} | {f[2]['friction']:.3g} |" in table
    assert "| 2 | ppo | 1 | 2 | 3 |" in table and "| 0 | ppo | 10 | 20 | 30 |" in table


def test_lecun_init_is_dohares_and_only_for_a_ppo_mlp_setting(continual):
    """lecun_init_ against a hand-written draw from the same generator state: lop's ``lecun_init`` (every Linear layer,
    U(+-sqrt(3 / fan_in)), biases 0), in the order of the extractor's layers, then the heads; log_std untouched."""
    import math
    from dataclasses import replace

    from stable_baselines3 import PPO
    from torch import nn

    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[16, 8]), seed=3, device="cpu")
    policy = model.policy
    layers = [m for part in (policy.mlp_extractor, policy.action_net, policy.value_net) for m in part.modules()
              if isinstance(m, nn.Linear)]
    th.manual_seed(11)
    expected = [th.empty_like(m.weight).uniform_(-math.sqrt(3 / m.in_features), math.sqrt(3 / m.in_features))
                for m in layers]
    th.manual_seed(11)
    continual.lecun_init_(policy)
    for layer, weight in zip(layers, expected):
        assert th.equal(layer.weight, weight) and not layer.bias.any()
    assert not policy.log_std.any()
    model.env.close()
    base = continual.SETTINGS["slippery_ant_ppo"]
    assert base.init == "default"
    with pytest.raises(ValueError, match="init must be one of 'default', 'lecun', got 'he'"):
        replace(base, init="he")
    with pytest.raises(ValueError, match="init='lecun' is for a PPO setting with an MLP policy"):
        replace(continual.SETTINGS["minatar_intensive"], init="lecun")


def test_the_parameter_adjusted_trend_recovers_a_planted_decline_and_its_absence(continual):
    """Scores built as seed level - 40 per task + a quadratic in log10 friction (+ small seeded noise): the adjusted
    slope finds -40 where a plain slope over tasks would not (the frictions are drawn per seed), its seed bootstrap
    interval holds it, every seed's own fit too; without the planted decline the slope is ~0; one seed has no interval;
    task 0 and missing tasks are left out."""
    rng = np.random.default_rng(3)
    parameters, declining, flat = {}, {}, {}
    for seed in range(5):
        friction = 10 ** rng.uniform(np.log10(0.02), np.log10(2.0), size=10)
        parameters[str(seed)] = [{"friction": float(f)} for f in friction]
        x = np.log10(friction)
        level = 1000 * seed + 500 * x - 300 * x ** 2 + rng.normal(0, 1, size=10)
        declining[str(seed)] = list(level - 40 * np.arange(10))
        flat[str(seed)] = list(level)
        declining[str(seed)][0] = flat[str(seed)][0] = -1e6  # task 0 is not used
    out = continual_report_trend(continual, declining, parameters)
    assert out["slope"] == pytest.approx(-40, abs=0.5) and out["low"] < -40 < out["high"] and out["high"] < 0
    assert all(v == pytest.approx(-40, abs=1.5) for v in out["per_seed"].values()) and out["seeds"] == 5
    assert set(out["tasks"].values()) == {9}
    # the unadjusted slope over the same cells is far from -40: the frictions, not the tasks, move these scores
    ks = np.tile(np.arange(1, 10), 5)
    ys = np.concatenate([np.asarray(declining[str(s)][1:]) - np.mean(declining[str(s)][1:]) for s in range(5)])
    assert abs(np.polyfit(ks, ys, 1)[0] + 40) > 5
    none = continual_report_trend(continual, flat, parameters)
    assert abs(none["slope"]) < 0.5 and none["low"] < 0 < none["high"]
    one = continual_report_trend(continual, {"0": declining["0"][:8] + [float("nan")] * 2}, parameters)
    assert one["low"] is None and one["tasks"] == {"0": 7} and one["slope"] == pytest.approx(-40, abs=1.5)
    assert continual_report_trend(continual, {"0": declining["0"][:5]}, parameters) is None  # 4 tasks, 4 coefficients


def continual_report_trend(continual, scores, parameters):
    import continual_report

    return continual_report.parameter_adjusted_trend(scores, parameters)


def _trend_data(rng, seeds, slope, seed_slope_sd=0.0, noise=350.0):
    """Per seed 10 tasks with log-uniform frictions: level + (slope + the seed's own deviation) x task + a quadratic
    in log10 friction + noise."""
    parameters, scores = {}, {}
    for seed in range(seeds):
        friction = 10 ** rng.uniform(-2, 0.3, size=10)
        x = np.log10(friction)
        own = slope + rng.normal(0, seed_slope_sd)
        y = 2000 + rng.normal(0, 300) + own * np.arange(10) + 400 * x - 300 * x ** 2 + rng.normal(0, noise, 10)
        parameters[str(seed)] = [{"friction": float(f)} for f in friction]
        scores[str(seed)] = [float(v) for v in y]
    return scores, parameters


def test_the_trend_interval_is_the_cluster_robust_one(continual):
    """The slope's 95 % interval: the CR1 cluster-robust standard error with the seeds as clusters and t on seeds - 1
    degrees of freedom. Reference: the same from the Frisch-Waugh-Lovell form (the task index residualised on the
    seed intercepts and friction terms; the slope's cluster scores are sums of residual x residual), and statsmodels'
    OLS with cov_type='cluster' where it is installed."""
    import scipy.stats

    rng = np.random.default_rng(11)
    scores, parameters = _trend_data(rng, seeds=5, slope=-50.0, seed_slope_sd=40.0)
    out = continual_report_trend(continual, scores, parameters)
    seeds = sorted(scores, key=int)
    k = np.tile(np.arange(1, 10), 5).astype(float)
    group = np.repeat(np.arange(5), 9)
    x = np.concatenate([np.log10([t["friction"] for t in parameters[s][1:]]) for s in seeds])
    y = np.concatenate([scores[s][1:] for s in seeds])
    others = np.column_stack([(group == g).astype(float) for g in range(5)] + [x, x ** 2])
    residual_k = k - others @ np.linalg.lstsq(others, k, rcond=None)[0]
    residual_y = y - others @ np.linalg.lstsq(others, y, rcond=None)[0]
    slope = residual_k @ residual_y / (residual_k @ residual_k)
    e = residual_y - slope * residual_k
    cluster_sums = np.array([residual_k[group == g] @ e[group == g] for g in range(5)])
    n, params = len(y), others.shape[1] + 1
    var = 5 / 4 * (n - 1) / (n - params) * (cluster_sums ** 2).sum() / (residual_k @ residual_k) ** 2
    half = scipy.stats.t.ppf(0.975, 4) * np.sqrt(var)
    assert out["slope"] == pytest.approx(slope, rel=1e-9)
    assert (out["low"], out["high"]) == pytest.approx((slope - half, slope + half), rel=1e-9)
    statsmodels = pytest.importorskip("statsmodels.api")
    fit = statsmodels.OLS(y, np.column_stack([k, others])).fit(cov_type="cluster", cov_kwds={"groups": group},
                                                                 use_t=True)
    assert tuple(fit.conf_int()[0]) == pytest.approx((out["low"], out["high"]), rel=1e-9)


def test_the_trend_interval_holds_the_true_slope_near_95_percent_of_the_time(continual):
    """200 seeded 5-seed experiments with seed-to-seed slope differences: the interval holds the true slope in
    90-99 % of them (the seed bootstrap it replaced: ~84 % in bench/README's simulation)."""
    rng = np.random.default_rng(12)
    held = 0
    for _ in range(200):
        out = continual_report_trend(continual, *_trend_data(rng, seeds=5, slope=-50.0, seed_slope_sd=60.0))
        held += out["low"] <= -50 <= out["high"]
    assert 0.9 <= held / 200 <= 0.99


@pytest.mark.parametrize("width", [32, 512])
def test_width_probe_settings_change_only_the_linear_layer(continual, width):
    """``minatar_intensive_width<w>`` (thirty-eighth session's probe) gives plain PPO and ReLU + AdamO the CNN's linear
    layer at ``w`` features and nothing else: the same conv layer and PPO keywords; ``plastic_relu_linear`` there
    penalises that layer alone. The setting's own network keeps its 128 features."""
    base = continual.SETTINGS["minatar_intensive"]
    setting = continual.SETTINGS[f"minatar_intensive_width{width}"]
    assert setting.ppo == base.ppo and setting.change_every == base.change_every and setting.tasks == base.tasks
    params = continual.MethodParams()
    plain, _ = continual.build_model("ppo", setting, params, 0, "cpu", None)
    default, _ = continual.build_model("ppo", base, params, 0, "cpu", None)
    linear, _ = continual.build_model("plastic_relu_linear", setting, params, 0, "cpu", None)
    for model, features in ((plain, width), (default, 128), (linear, width)):
        extractor = model.policy.features_extractor
        assert extractor.linear[0].weight.shape == (features, 1024)
        assert extractor.cnn[0].weight.shape == default.policy.features_extractor.cnn[0].weight.shape
        assert model.policy.action_net.weight.shape[1] == features
    assert type(plain.policy.features_extractor) is type(default.policy.features_extractor)
    assert plain.policy.features_extractor_kwargs == dict(default.policy.features_extractor_kwargs, features_dim=width)
    penalised = {id(p) for p in linear.policy.regularised_parameters()}
    assert penalised == {id(linear.policy.features_extractor.linear[0].weight)}
    for model in (plain, default, linear):
        model.env.close()



@pytest.mark.parametrize("method,side,layers", [
    ("plastic_relu_linear_floor", "floor", "linear"), ("plastic_relu_linear_ceiling", "ceiling", "linear"),
    ("plastic_relu_floor", "floor", "hidden"), ("plastic_relu_ceiling", "ceiling", "hidden"),
    ("plastic_relu_ceiling_s16", "ceiling", "hidden"), ("plastic_relu_ceiling_s64", "ceiling", "hidden"),
])
def test_one_sided_probe_arms_build_the_penalty_they_name(continual, method, side, layers):
    """The thirty-ninth session's arms: ``plastic_relu`` with ``isometry_side`` on the CNN's linear layer alone or on
    every hidden layer; every other keyword is ``plastic_relu``'s."""
    setting = continual.SETTINGS["minatar_intensive"]
    params = continual.MethodParams()
    model, _ = continual.build_model(method, setting, params, 0, "cpu", None)
    reference, _ = continual.build_model("plastic_relu", setting, params, 0, "cpu", None)
    def penalised(m):
        ids = {id(p) for p in m.policy.regularised_parameters()}
        return {name for name, p in m.policy.named_parameters() if id(p) in ids}

    expected = {"features_extractor.linear.0.weight"} if layers == "linear" else penalised(reference)
    assert penalised(model) == expected and "features_extractor.cnn.0.weight" in penalised(reference)
    groups = [g for g in model.policy.optimizer.param_groups if g["isometry_coef"] > 0]
    assert groups and all(g["isometry_side"] == side for g in groups)
    assert all(g["isometry_side"] == "both" for g in reference.policy.optimizer.param_groups)
    assert model.isometry_config.isometry_coef == reference.isometry_config.isometry_coef
    scale = float(method.rpartition("_s")[2]) if method.endswith(("_s16", "_s64")) else 1.0
    assert all(g["isometry_scale"] == scale for g in groups)
    # SB3's own init for ReLU (orthogonal init off): the scale moves only the target, not the starting weights
    for a, b in zip(model.policy.parameters(), reference.policy.parameters()):
        th.testing.assert_close(a, b)
    for m in (model, reference):
        m.env.close()


def test_maxmin_without_the_penalty_is_the_conv_arms_network_and_init_with_adam(continual):
    """``plastic_maxmin_off`` (forty-first session): the control of ``plastic_maxmin_conv`` (MaxMin + AdamO with the
    conv layer's penalty alone), MaxMin and the library's orthogonal init on the same network with no penalty and
    Adam: the same starting weights as the conv arm, nothing penalised, no warning about ignored options."""
    import warnings

    setting = continual.SETTINGS["minatar_intensive"]
    params = continual.MethodParams()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, callbacks = continual.build_model("plastic_maxmin_off", setting, params, 0, "cpu", None)
    conv, _ = continual.build_model("plastic_maxmin_conv", setting, params, 0, "cpu", None)
    assert callbacks == []
    assert model.isometry_config.isometry_mode == "off" and model.isometry_config.activation == "maxmin"
    # plain torch Adam, no isometry step; the conv arm's AdamO penalises the conv layer alone
    assert type(model.policy.optimizer) is th.optim.Adam
    assert all("isometry_coef" not in g for g in model.policy.optimizer.param_groups)
    assert {id(p) for p in conv.policy.regularised_parameters()} == {id(conv.policy.features_extractor.cnn[0].weight)}
    names = [type(m).__name__ for m in model.policy.modules()]
    assert names == [type(m).__name__ for m in conv.policy.modules()] and "MaxMin" in names
    for a, b in zip(model.policy.state_dict().values(), conv.policy.state_dict().values()):
        th.testing.assert_close(a, b)
    for m in (model, conv):
        m.env.close()


def test_the_no_penalty_controls_split_the_maxmin_controls_activation_from_its_init(continual):
    """The 2 x 2 around ``plastic_maxmin_off`` (forty-third session): ``plastic_maxmin_off_sb3init`` is its network
    (MaxMin) with SB3's init, ``plastic_relu_off_ortho`` ReLU with its init; both train with plain Adam and no penalty.
    Independent reference, the SVD: the library's orthogonal init gives every hidden layer's (reshaped) weight
    singular values 1, SB3's ``ortho_init`` (plain PPO's) sqrt(2); the four cells share one network shape."""
    import warnings

    setting = continual.SETTINGS["minatar_intensive"]
    params = continual.MethodParams()
    built = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in ("plastic_maxmin_off", "plastic_maxmin_off_sb3init", "plastic_relu_off_ortho", "ppo"):
            built[method], callbacks = continual.build_model(method, setting, params, 0, "cpu", None)
            assert callbacks == []

    def hidden_singular_values(model):
        extractor = model.policy.features_extractor
        layers = [m for m in extractor.modules() if isinstance(m, (th.nn.Conv2d, th.nn.Linear))]
        assert len(layers) == 2  # the MinAtar CNN: one conv layer, one linear layer
        return [th.linalg.svdvals(m.weight.detach().reshape(m.weight.shape[0], -1)) for m in layers]

    def activations(model):
        return {type(m).__name__ for m in model.policy.modules()} & {"MaxMin", "ReLU"}

    for method, gain, activation in (("plastic_maxmin_off", 1.0, "MaxMin"), ("plastic_maxmin_off_sb3init", 2 ** 0.5, "MaxMin"),
                                     ("plastic_relu_off_ortho", 1.0, "ReLU"), ("ppo", 2 ** 0.5, "ReLU")):
        model = built[method]
        assert activations(model) == {activation}, method
        for values in hidden_singular_values(model):
            th.testing.assert_close(values, th.full_like(values, gain), rtol=1e-4, atol=1e-4)
        if method != "ppo":
            assert model.isometry_config.isometry_mode == "off"
            assert type(model.policy.optimizer) is th.optim.Adam
            assert all("isometry_coef" not in g for g in model.policy.optimizer.param_groups)
    # one network shape for the four cells (MaxMin keeps a layer's width): only the activation and the init differ
    shapes = {m: [tuple(p.shape) for p in built[m].policy.parameters()] for m in built}
    assert all(shape == shapes["ppo"] for shape in shapes.values())
    arm_of = continual.continual_report.ARM_OF
    assert arm_of["plastic_relu_off_ortho"] == arm_of["plastic_maxmin_off_sb3init"] == "plastic_maxmin_off"
    for m in built.values():
        m.env.close()


def test_the_crelu_control_has_maxmins_two_properties_with_sb3s_init_and_adam(continual):
    """``ppo_crelu`` on ``minatar_intensive`` (forty-fifth session), read against ``plastic_maxmin_off_sb3init``: the
    same training (plain Adam, no penalty, SB3's init: every hidden layer's singular values sqrt(2), by SVD) and the
    same feature widths into the heads, with CReLU's half the units per layer. The two properties it shares with
    MaxMin, checked by hand on a seeded batch: every pre-activation gets a nonzero gradient (no dead unit) and the
    activation keeps each row's norm; plain PPO's ReLU has neither."""
    from sb3_plastic.activations import CReLU, MaxMin

    setting = continual.SETTINGS["minatar_intensive"]
    crelu, callbacks = continual.build_model("ppo_crelu", setting, continual.MethodParams(), 0, "cpu", None)
    maxmin, _ = continual.build_model("plastic_maxmin_off_sb3init", setting, continual.MethodParams(), 0, "cpu", None)
    assert callbacks == []
    assert crelu.isometry_config.isometry_mode == "off" and type(crelu.policy.optimizer) is th.optim.Adam
    assert {type(m).__name__ for m in crelu.policy.modules()} & {"CReLU", "MaxMin", "ReLU"} == {"CReLU"}
    layers = [m for m in crelu.policy.features_extractor.modules() if isinstance(m, (th.nn.Conv2d, th.nn.Linear))]
    reference = [m for m in maxmin.policy.features_extractor.modules() if isinstance(m, (th.nn.Conv2d, th.nn.Linear))]
    assert [m.weight.shape[0] * 2 for m in layers] == [m.weight.shape[0] for m in reference] == [16, 128]
    for layer in layers:
        values = th.linalg.svdvals(layer.weight.detach().reshape(layer.weight.shape[0], -1))
        th.testing.assert_close(values, th.full_like(values, 2 ** 0.5), rtol=1e-4, atol=1e-4)
    assert crelu.policy.features_extractor.features_dim == maxmin.policy.features_extractor.features_dim == 128
    assert continual.continual_report.ARM_OF["ppo_crelu"] == "plastic_maxmin_off_sb3init"

    generator = th.Generator().manual_seed(0)
    z = th.randn(64, 128, generator=generator, requires_grad=True)
    for activation, keeps in ((CReLU(), True), (MaxMin(), True), (th.nn.ReLU(), False)):
        out = activation(z)
        norms_kept = th.allclose(out.norm(dim=1), z.norm(dim=1))
        weights = th.randn(out.shape, generator=generator)  # a loss that weighs every output differently
        (grad,) = th.autograd.grad((weights * out).sum(), z)
        no_dead = bool((grad != 0).all())
        assert norms_kept == no_dead == keeps, type(activation).__name__
    for m in (crelu, maxmin):
        m.env.close()
