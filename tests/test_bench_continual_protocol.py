"""bench/continual.py, issue #14's protocol: the plain baseline's network on MinAtar, fresh-agent references on the
run's own task sequence (a task seed per run seed), rliable statistics against hand computations, figures and tables
that rebuild from the run JSONs alone, --plot-only that refuses to write without runs, --jobs / --device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch as th

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _tiny_bandit(continual, tasks=2):
    ppo = dict(continual.SETTINGS["bandit"].ppo, n_steps=16, batch_size=64, n_epochs=2)
    return replace(continual.SETTINGS["bandit"], tasks=tasks, change_every=64, n_envs=4, ppo=ppo, monitor_every=128)


def _layers(policy):
    return [(name, type(m).__name__, tuple(p.shape for p in m.parameters(recurse=False)))
            for name, m in policy.named_modules() if list(m.parameters(recurse=False))]


def test_a_changed_task_length_is_what_the_description_says(continual):
    """``--change-every`` (and ``--quick``) change a task's length: the description printed and written into
    summary.json says the new interval (Slippery Ant at 125 000 steps per copy x 4 is 500k steps, not 200k)."""
    base = continual.SETTINGS["slippery_ant_ppo"]
    assert "every 200k steps" in base.description
    longer = continual.resolve_setting("slippery_ant_ppo", change_every=125_000)
    assert "every 500k steps" in longer.description and "200k" not in longer.description
    assert continual.resolve_setting("slippery_ant_ppo").description == base.description
    quick = continual.resolve_setting("cartpole_obs", quick=True)
    assert f"every {quick.task_timesteps / 1000:g}k steps" in quick.description
    cchain = continual.resolve_setting("cchain_cartpole", change_every=8_000)
    assert "every 8k steps" in cchain.description


def test_minatar_plain_baseline_builds_the_plastic_runs_network(continual):
    setting = continual.resolve_setting("minatar", quick=True, overrides=dict(n_steps=32, batch_size=64, n_epochs=1))
    plain, _ = continual.build_model("ppo", setting, continual.MethodParams(), 0, "cpu", None)
    plastic, _ = continual.build_model("plastic_relu", setting, continual.MethodParams(), 0, "cpu", None)
    assert type(plain.policy.features_extractor).__name__ == "PlasticCNN"
    assert plain.policy.features_extractor.arch == plastic.policy.features_extractor.arch == "minatar"
    assert _layers(plain.policy) == _layers(plastic.policy)
    activations = {type(m).__name__ for m in plain.policy.features_extractor.modules()}
    assert "ReLU" in activations
    plain.learn(256)  # SB3's NatureCNN rejected MinAtar's boolean frames here
    assert plain.num_timesteps >= 256


@pytest.mark.parametrize("name", ["minatar_intensive", "minatar_switching", "slippery_halfcheetah_ppo",
                                  "slippery_ant_ppo", "slippery_ant_dohare", "minatar_dqn_replay",
                                  "slippery_halfcheetah_sac_replay", "cartpole_obs"])
def test_every_setting_builds_the_plain_and_a_plastic_agent(continual, name):
    setting = continual.SETTINGS[name]
    assert setting.description and setting.tasks >= 2
    for method in (continual.method_name("ppo", setting.algo), "plastic_maxmin",
                   continual.method_name("ppo_cbp_dohare", setting.algo)):
        model, callbacks = continual.build_model(method, setting, continual.MethodParams(), 0, "cpu", None)
        algo = type(model).__name__.lower()
        assert algo.endswith(setting.algo), (method, type(model))
        if method.endswith("cbp_dohare"):
            groups = model.policy.optimizer.param_groups if setting.algo != "sac" else model.actor.optimizer.param_groups
            assert groups[0]["betas"] == (0.99, 0.99) and groups[0]["weight_decay"] == 1e-4
            assert callbacks[0].maturity_threshold == 10_000 and callbacks[0].replacement_rate == 1e-4
        model.env.close()


def test_bad_methods_are_rejected_with_the_allowed_list(continual, capsys):
    with pytest.raises(SystemExit):
        continual.parse_args(["--setting", "minatar_dqn_replay", "--methods", "ppo_l2"])
    assert "not a method of the dqn setting" in capsys.readouterr().err
    assert continual.parse_args(["--setting", "minatar_dqn_replay", "--methods", "dqn_l2"]).methods == ["dqn_l2"]
    assert len(continual.parse_args(["--methods", "all"]).methods) == len(continual.METHODS)
    with pytest.raises(ValueError, match="unknown method 'sgd' for a ppo setting"):
        continual.build_model("sgd", _tiny_bandit(continual), continual.MethodParams(), 0, "cpu", None)


def test_task_sequences_differ_per_seed_and_fresh_envs_are_pinned_to_the_run_task(continual):
    setting = _tiny_bandit(continual)

    def labels_of_task(seed, task, fresh_task=None):
        env = continual.make_env(setting, seed, fresh_task)
        env.reset()
        for _ in range(task * setting.change_every + 1):
            _, _, _, infos = env.step(np.zeros(setting.n_envs, dtype=np.int64))
        assert [i["task_id"] for i in infos] == [task if fresh_task is None else fresh_task] * setting.n_envs
        labels = env.get_attr("labels")
        assert all(np.array_equal(labels[0], x) for x in labels[1:])  # copies in lockstep
        env.close()
        return labels[0]

    assert not np.array_equal(labels_of_task(0, 1), labels_of_task(1, 1))
    assert np.array_equal(labels_of_task(1, 1), labels_of_task(1, 0, fresh_task=1))  # pinned from the first step


def test_run_cell_writes_continual_and_fresh_runs_and_resumes(continual, tmp_path):
    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    record = continual.run_cell("ppo_fire", 3, setting, params, str(tmp_path))
    assert record["task"] == [0, 1] and record["task_seed"] == 3 and record["fresh_task"] is None
    assert record["diagnostics"]["plasticity/policy/ntk_cond"]  # the monitor's passes are in the JSON
    hidden, total = (np.array(record["diagnostics"][f"plasticity/policy/{k}"]) for k in ("dfi_hidden", "dfi"))
    assert hidden.shape == total.shape and np.all(hidden[:, 1] < total[:, 1])  # the heads' DfI is left out
    for k in range(setting.tasks):
        fresh = json.loads(Path(continual.run_path(str(tmp_path), "ppo_fire", 3, k)).read_text())
        assert fresh["task"] == [k] and fresh["fresh_task"] == k
        assert setting.task_timesteps <= fresh["timesteps"] < setting.total_timesteps
        assert 0.0 <= fresh["end_reward"][0] <= 1.0
    mtimes = [os.stat(p).st_mtime_ns for p in tmp_path.rglob("*.json")]
    continual.run_cell("ppo_fire", 3, setting, params, str(tmp_path))  # all parts done: nothing reruns
    assert [os.stat(p).st_mtime_ns for p in tmp_path.rglob("*.json")] == mtimes
    # a fresh FIRE agent runs without FIRE (its midpoint lies past one task): it is plain PPO on that task
    _, callbacks = continual.build_model("ppo_fire", setting, params, 3, "cpu", None, fresh_task=1)
    assert callbacks == []


def _synthetic_runs(out, setting, methods):
    """Runs with known scores: ``methods[m] = (continual seeds x tasks, fresh seeds x tasks)``."""
    for method, (cont, fresh) in methods.items():
        for seed, (c, f) in enumerate(zip(cont, fresh)):
            base = dict(method=method, seed=seed, device="cpu", wall_seconds=60.0, cpu_seconds=60.0)
            diag = {"plasticity/policy/ntk_cond": [[i * 100, 10.0 + i] for i in range(4)],
                    "plasticity/policy/dormant_fraction": [[i * 100, 0.1] for i in range(4)]}
            path = Path(out) / "runs" / method / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(base, fresh_task=None, task=list(range(len(c))), end_reward=list(c),
                                            end_return=list(c), mean_reward=list(c), diagnostics=diag)))
            for k, value in enumerate(f):
                path = Path(out) / "runs" / method / "fresh" / f"seed{seed}_task{k}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(dict(base, fresh_task=k, task=[k], end_reward=[value], end_return=[value],
                                                mean_reward=[value], diagnostics={})))


def test_summary_matches_hand_computations_and_rebuilds_from_json_alone(continual, tmp_path, capsys):
    rng = np.random.default_rng(0)
    setting = _tiny_bandit(continual, tasks=6)
    seeds = 6
    fresh = 0.8 + 0.01 * rng.standard_normal((seeds, 6))
    lost = 0.4 + 0.01 * rng.standard_normal((seeds, 6))  # clearly below its fresh agent
    kept = fresh * (1 + 0.05 * rng.standard_normal((seeds, 6)))  # overlaps its fresh agent
    _synthetic_runs(tmp_path, setting, {"ppo": (lost, fresh), "plastic_maxmin": (kept, fresh)})

    records = continual.load_records(str(tmp_path))
    result = continual.summarise(records, ["ppo", "plastic_maxmin"], setting)
    ppo, plastic = result["methods"]["ppo"], result["methods"]["plastic_maxmin"]
    np.testing.assert_allclose(ppo["plasticity_mean"], (lost / fresh).mean(axis=0))
    np.testing.assert_allclose(ppo["iqm_last_half"]["iqm"], scipy.stats.trim_mean(lost[:, 3:].ravel(), 0.25))
    np.testing.assert_allclose(ppo["iqm_plasticity_last_half"]["iqm"],
                               scipy.stats.trim_mean((lost / fresh)[:, 3:].ravel(), 0.25))
    low, high = ppo["iqm_last_half"]["low"], ppo["iqm_last_half"]["high"]
    assert low <= ppo["iqm_last_half"]["iqm"] <= high and high - low < 0.05
    assert ppo["vs_fresh"] == "below fresh (plasticity lost)" and plastic["vs_fresh"] == "not resolved"
    assert plastic["vs_plain"] == "above ppo"
    assert plastic["poi_vs_plain"]["iqm"] == 1.0  # every plastic score beats every ppo score
    assert ppo["last_half_per_seed"] == pytest.approx(lost[:, 3:].mean(axis=1).tolist())

    # a fresh clone: only the JSON files; --plot-only finds every method and rebuilds the tables and figures
    assert continual.main(["--plot-only", "--out", str(tmp_path), "--tasks", "6"]) == 0
    out = capsys.readouterr().out
    assert "| ppo | 6 |" in out and "| plastic_maxmin | 6 |" in out and "below fresh (plasticity lost)" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["methods"]) == {"ppo", "plastic_maxmin"}
    from PIL import Image

    for name in ("end_of_task.png", "plasticity.png", "diagnostics.png"):
        width, height = Image.open(tmp_path / name).size
        assert 800 <= width <= 1300 and 400 <= height <= 1400, (name, width, height)
    assert (tmp_path / "summary.md").read_text().startswith("setting=bandit")


def test_the_last_half_intervals_resample_whole_runs_each_with_all_its_tasks(continual, tmp_path):
    """A continual run is one agent over all its tasks (its sequence drawn per seed): the IQM and probability-of-
    improvement intervals resample runs, not task columns (rliable's stratified bootstrap, used until the thirtieth
    session). Reference: the same row draws, the IQM of every resample by scipy's trim_mean. Fewer than 3 runs: no
    interval (a bootstrap over two runs spans the range of their two statistics), the table says so."""
    rng = np.random.default_rng(1)
    setting = _tiny_bandit(continual, tasks=6)
    level = rng.uniform(0.2, 0.8, size=(5, 1))  # each run's level, shared by its tasks
    cont = level + 0.02 * rng.standard_normal((5, 6))
    fresh = 0.9 + 0.01 * rng.standard_normal((5, 6))
    _synthetic_runs(tmp_path, setting, {"ppo": (cont, fresh), "plastic_maxmin": (cont[:2] + 0.1, fresh[:2])})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_maxmin"], setting)
    entry = result["methods"]["ppo"]["iqm_last_half"]
    rows = np.random.default_rng(0).integers(0, 5, size=(continual.continual_report.REPS, 5))
    stats = [scipy.stats.trim_mean(cont[r, 3:].ravel(), 0.25) for r in rows]
    assert (entry["low"], entry["high"]) == pytest.approx(
        (np.quantile(stats, 0.025), np.quantile(stats, 0.975)), rel=1e-12)
    two = result["methods"]["plastic_maxmin"]
    assert two["iqm_last_half"]["iqm"] == pytest.approx(scipy.stats.trim_mean((cont[:2, 3:] + 0.1).ravel(), 0.25))
    for key in ("iqm_last_half", "iqm_fresh_last_half", "iqm_plasticity_last_half", "poi_vs_plain",
                "plasticity_ratio_last_half", "minus_fresh_last_half"):
        assert np.isnan(two[key]["low"]) and np.isnan(two[key]["high"]), key
    five = result["methods"]["ppo"]  # 5 runs: intervals
    assert all(np.isfinite(five[key][k]) for k in ("low", "high")
               for key in ("iqm_last_half", "plasticity_ratio_last_half", "minus_fresh_last_half"))
    row = next(line for line in continual.markdown_table(result, "bandit", setting).splitlines()
               if line.startswith("| plastic_maxmin |"))
    assert row.count("(< 3 runs: no CI)") == 5 and "nan" not in row, row
    assert "bootstrap over runs: each keeps its tasks" in continual.markdown_table(result, "bandit", setting)


def test_continual_against_fresh_is_judged_paired_over_the_same_cells(continual, tmp_path):
    """With a fresh agent on every task, seeds far apart in level and every continual cell 10 % below its own fresh
    agent: the two IQM intervals overlap (what decided until the thirtieth session), the paired ratio of means is 0.9
    with an interval below 1, and it decides. With negative scores (no ratio) the paired difference decides."""
    rng = np.random.default_rng(2)
    setting = _tiny_bandit(continual, tasks=6)
    fresh = rng.uniform(0.2, 1.0, size=(5, 1)) * (1 + 0.01 * rng.standard_normal((5, 6)))
    _synthetic_runs(tmp_path / "pos", setting, {"ppo": (0.9 * fresh, fresh)})
    entry = continual.summarise(continual.load_records(str(tmp_path / "pos")), ["ppo"], setting)["methods"]["ppo"]
    cont_iqm, fresh_iqm = entry["iqm_last_half"], entry["iqm_fresh_last_half"]
    assert cont_iqm["high"] > fresh_iqm["low"]  # the unpaired intervals overlap
    ratio = entry["plasticity_ratio_last_half"]
    assert ratio["ratio"] == pytest.approx(0.9) and ratio["high"] < 1
    assert entry["vs_fresh"] == "below fresh (plasticity lost)"
    _synthetic_runs(tmp_path / "neg", setting, {"ppo": (-fresh * 100 + 5, -fresh * 100)})
    entry = continual.summarise(continual.load_records(str(tmp_path / "neg")), ["ppo"], setting)["methods"]["ppo"]
    assert "plasticity_ratio_last_half" not in entry
    assert entry["minus_fresh_last_half"]["mean"] == pytest.approx(5) and entry["minus_fresh_last_half"]["low"] > 0
    assert entry["vs_fresh"] == "above fresh"


def test_a_run_of_some_methods_rewrites_the_folders_summary_from_every_method_found(continual, tmp_path, capsys):
    """``--methods X`` on a folder that holds other methods' runs: summary.json / summary.md keep every method (a
    worker running one arm must not drop the others from the committed tables)."""
    rng = np.random.default_rng(1)
    setting = _tiny_bandit(continual, tasks=6)
    fresh = 0.8 + 0.01 * rng.standard_normal((3, 6))
    _synthetic_runs(tmp_path, setting, {"ppo": (0.5 * fresh, fresh), "plastic_maxmin": (fresh, fresh)})
    os.remove(continual.run_path(str(tmp_path), "plastic_maxmin", 2, 5))  # the one cell this call trains
    assert continual.main(["--methods", "plastic_maxmin", "--seeds", "0", "1", "2", "--fresh", "all", "--tasks", "6",
                           "--change-every", "16", "--ppo-kwarg", "n_steps=16", "--ppo-kwarg", "batch_size=32",
                           "--out", str(tmp_path), "--no-diagnostics-plots"]) == 0
    assert "resuming: 20 finished runs skipped" in capsys.readouterr().out
    assert os.path.exists(continual.run_path(str(tmp_path), "plastic_maxmin", 2, 5))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["methods"]) == {"ppo", "plastic_maxmin"}
    table = (tmp_path / "summary.md").read_text()
    assert "| ppo | 3 |" in table and "| plastic_maxmin | 3 |" in table


def test_a_call_that_finishes_no_run_leaves_the_folders_tables_alone(continual, tmp_path, capsys):
    """A grid worker walks a list of (method, seed) cells most of which are done or held by the other worker; such a
    call trains nothing, so rebuilding the folder's tables and figures (minutes on a folder of many methods) would be
    work without news: it says so and leaves them. A folder without tables still gets them."""
    rng = np.random.default_rng(2)
    setting = _tiny_bandit(continual, tasks=6)
    fresh = 0.8 + 0.01 * rng.standard_normal((3, 6))
    _synthetic_runs(tmp_path, setting, {"ppo": (0.5 * fresh, fresh)})
    argv = ["--methods", "ppo", "--seeds", "0", "1", "2", "--fresh", "all", "--tasks", "6", "--out", str(tmp_path),
            "--no-diagnostics-plots"]
    assert continual.main(argv) == 0  # no tables yet: they are written
    summary = tmp_path / "summary.md"
    assert "| ppo | 3 |" in summary.read_text()
    summary.write_text("the committed tables")
    figure = (tmp_path / "end_of_task.png").stat().st_mtime_ns
    capsys.readouterr()
    assert continual.main(argv) == 0
    out = capsys.readouterr().out
    assert "resuming: 21 finished runs skipped" in out
    assert "no run finished in this call: the folder's tables and figures are left as they are" in out
    assert summary.read_text() == "the committed tables"
    assert (tmp_path / "end_of_task.png").stat().st_mtime_ns == figure
    # --plot-only still rebuilds them
    assert continual.main(["--plot-only", "--out", str(tmp_path), "--no-diagnostics-plots"]) == 0
    assert "| ppo | 3 |" in summary.read_text()


def test_plot_only_refuses_to_write_without_runs(continual, tmp_path, capsys):
    (tmp_path / "summary.json").write_text('{"committed": true}')
    assert continual.main(["--plot-only", "--out", str(tmp_path)]) == 2
    assert "no finished runs" in capsys.readouterr().err
    assert (tmp_path / "summary.json").read_text() == '{"committed": true}'
    assert sorted(os.listdir(tmp_path)) == ["summary.json"]


def _cli(tmp_path, *extra):
    cmd = [sys.executable, str(BENCH / "continual.py"), "--tasks", "2", "--change-every", "16", "--methods", "ppo",
           "plastic_relu", "--seeds", "0", "--fresh", "none", "--jobs", "2", "--out", str(tmp_path),
           "--ppo-kwarg", "n_steps=16", "--no-diagnostics-plots", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_jobs_run_in_parallel_processes(tmp_path):
    done = _cli(tmp_path)
    assert done.returncode == 0, done.stderr
    for method in ("ppo", "plastic_relu"):
        assert json.loads((tmp_path / "runs" / method / "seed0.json").read_text())["device"] == "cpu"
    assert done.stderr.count(": done") == 2


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_cuda_runs_on_the_gpu(tmp_path):
    done = _cli(tmp_path, "--device", "cuda")
    assert done.returncode == 0, done.stderr
    for method in ("ppo", "plastic_relu"):
        assert json.loads((tmp_path / "runs" / method / "seed0.json").read_text())["device"].startswith("cuda")


def test_train_scalars_are_copied_from_tensorboard_per_task_tail_and_summarised(continual, tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    setting = _tiny_bandit(continual, tasks=4)  # 256 timesteps per task, tail 20 %: (204.8, 256] of each task
    length = setting.task_timesteps
    cont = np.full((2, 4), 0.5)
    _synthetic_runs(tmp_path, setting, {"ppo": (cont, cont)})
    rng = np.random.default_rng(1)
    expected = {}
    for seed in range(2):
        folder = tmp_path / "tb" / "ppo" / f"s{seed}_1"
        writer = SummaryWriter(str(folder))
        steps = np.arange(16, setting.total_timesteps + 1, 16)
        values = -rng.uniform(0, 0.7, steps.size)  # train/entropy_loss = -entropy
        for step, value in zip(steps, values):
            writer.add_scalar("train/entropy_loss", value, int(step))
        writer.close()
        tails = [(steps > (k + 0.8) * length) & (steps <= (k + 1) * length) for k in range(4)]
        expected[seed] = [float(np.float32(values[t]).mean()) for t in tails]
    # seed 0's fresh agent of task 2 has events; the others have none and are left as they are
    writer = SummaryWriter(str(tmp_path / "tb" / "ppo" / "fresh" / "s0_task2_1"))
    for step in (100, 220, 250):
        writer.add_scalar("train/entropy_loss", -0.25 if step > 204 else -0.9, step)
    writer.close()

    assert continual.add_train_scalars(str(tmp_path), setting) == 3
    # the 7 fresh runs without events are named, not skipped silently
    assert "warning: 7 run JSONs carry no train/entropy_loss" in capsys.readouterr().out
    for seed in range(2):
        record = json.loads((tmp_path / "runs" / "ppo" / f"seed{seed}.json").read_text())
        np.testing.assert_allclose(record["train_scalars"]["train/entropy_loss"], expected[seed], rtol=1e-6)
    fresh = json.loads((tmp_path / "runs" / "ppo" / "fresh" / "seed0_task2.json").read_text())
    assert fresh["train_scalars"]["train/entropy_loss"] == [pytest.approx(-0.25)]
    assert "train_scalars" not in json.loads((tmp_path / "runs" / "ppo" / "fresh" / "seed1_task2.json").read_text())
    assert continual.add_train_scalars(str(tmp_path), setting) == 0  # copied once

    entry = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)["methods"]["ppo"]
    last_half = [-v for seed in range(2) for v in expected[seed][2:]]
    assert entry["entropy_last_half"] == pytest.approx(np.mean(last_half))
    assert entry["fresh_entropy_last_half"] == pytest.approx(0.25)
    table = continual.markdown_table({"metrics": "x", "plain": "ppo", "methods": {"ppo": entry}}, "bandit", setting)
    assert "policy entropy: continual / fresh" in table and f"{np.mean(last_half):.3f} / 0.250" in table


def test_hidden_dfi_is_rebuilt_from_tensorboard_and_checked_against_the_recorded_total(continual, tmp_path, capsys):
    """Runs made before ``dfi_hidden`` existed get it from their per-layer TensorBoard keys: the layers with a
    dormant fraction (hidden), not the heads; events that do not match the JSON's own ``dfi`` are refused, named."""
    from torch.utils.tensorboard import SummaryWriter

    setting = _tiny_bandit(continual, tasks=4)
    cont = np.full((3, 4), 0.5)
    _synthetic_runs(tmp_path, setting, {"ppo": (cont, cont)})
    rng = np.random.default_rng(2)
    steps = [100, 300, 500, 700]
    expected = {}
    for seed in range(3):
        hidden = rng.uniform(1, 50, (3, len(steps)))  # two hidden Linear layers and an LSTM matrix
        head = rng.uniform(100, 500, len(steps))  # a head: a dfi key, no dormant fraction
        total = hidden.sum(axis=0) + head
        path = tmp_path / "runs" / "ppo" / f"seed{seed}.json"
        record = json.loads(path.read_text())
        recorded = total if seed < 2 else total * 0.5  # seed 2's events belong to another run
        record["diagnostics"]["plasticity/policy/dfi"] = [[t, float(v)] for t, v in zip(steps, recorded)]
        record["diagnostics"]["plasticity/policy/ntk_cond"] = [[300, 1e3], [600, 1e5], [700, 1e7 * (seed + 1)]]
        path.write_text(json.dumps(record))
        writer = SummaryWriter(str(tmp_path / "tb" / "ppo" / f"s{seed}_1"))
        for i, t in enumerate(steps):
            for j, layer in enumerate(["mlp_extractor.policy_net.0", "mlp_extractor.value_net.0"]):
                writer.add_scalar(f"plasticity/policy/{layer}/dfi", hidden[j, i], t)
                writer.add_scalar(f"plasticity/policy/{layer}/sigma_max", 2.0, t)
                writer.add_scalar(f"plasticity/policy/{layer}/dormant_fraction", 0.1, t)
            # an LSTM matrix: a dfi, no sigma_max and no dormant fraction of its own (its cells have one): hidden
            writer.add_scalar("plasticity/policy/lstm_actor.weight_hh_l0/dfi", hidden[2, i], t)
            writer.add_scalar("plasticity/policy/lstm_actor.l0/dormant_fraction", 0.1, t)
            writer.add_scalar("plasticity/policy/value_net/dfi", head[i], t)
            writer.add_scalar("plasticity/policy/value_net/sigma_max", 9.0, t)
            writer.add_scalar("plasticity/policy/dfi", total[i], t)
        writer.close()
        expected[seed] = hidden.sum(axis=0)

    assert continual.add_hidden_dfi(str(tmp_path)) == 2
    assert "warning: 1 run JSONs carry no dfi_hidden" in capsys.readouterr().out  # seed 2, named
    for seed in range(2):
        record = json.loads((tmp_path / "runs" / "ppo" / f"seed{seed}.json").read_text())
        series = np.array(record["diagnostics"]["plasticity/policy/dfi_hidden"])
        np.testing.assert_array_equal(series[:, 0], steps)
        np.testing.assert_allclose(series[:, 1], expected[seed], rtol=1e-6)
    seed2 = json.loads((tmp_path / "runs" / "ppo" / "seed2.json").read_text())
    assert "plasticity/policy/dfi_hidden" not in seed2["diagnostics"]
    assert continual.add_hidden_dfi(str(tmp_path)) == 0  # rebuilt once

    fresh_path = tmp_path / "runs" / "ppo" / "fresh" / "seed0_task3.json"  # a last-half fresh agent: its last pass
    fresh = json.loads(fresh_path.read_text())
    fresh["diagnostics"] = {"plasticity/policy/dfi_hidden": [[100, 5.0], [200, 7.0]]}
    fresh_path.write_text(json.dumps(fresh))
    # the summary's diagnostics table: the last-half passes (steps > 2 tasks = 512) per seed, then over seeds
    entry = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)["methods"]["ppo"]
    diag = entry["diagnostics_last_half"]
    per_seed = [expected[seed][3] for seed in range(2)]  # only step 700 lies past 512
    assert diag["dfi_hidden"]["mean"] == pytest.approx(np.mean(per_seed), rel=1e-6)
    assert diag["dfi_hidden"]["min"] == pytest.approx(min(per_seed), rel=1e-6)
    assert diag["dfi_hidden"]["fresh"] == 7.0 and "fresh" not in diag["log10_ntk_cond"]
    # the condition number as its log10, averaged per seed over the last-half passes (600, 700), then over seeds
    log_cond = [np.mean([5.0, 7.0 + np.log10(seed + 1)]) for seed in range(3)]
    assert diag["log10_ntk_cond"]["mean"] == pytest.approx(np.mean(log_cond))
    assert diag["log10_ntk_cond"]["max"] == pytest.approx(max(log_cond))
    table = continual.markdown_table({"metrics": "x", "plain": "ppo", "methods": {"ppo": entry}}, "bandit", setting)
    assert "| DfI, hidden layers |" in table
    assert f"{np.mean(per_seed):.3g} [{min(per_seed):.3g}, {max(per_seed):.3g}] (2 seeds); fresh 7" in table


def test_a_run_another_worker_holds_is_reported_as_skipped_not_failed(continual, tmp_path, capsys):
    """Two workers on one folder: a run the other (live) worker holds is a skip, named as such, not a failure."""
    import socket

    path = continual.run_path(str(tmp_path), "ppo", 0, None)
    Path(path + ".claim").parent.mkdir(parents=True, exist_ok=True)
    Path(path + ".claim").write_text(f"{socket.gethostname()} {os.getpid()}")  # a live pid: this one
    code = continual.main(["--quick", "--methods", "ppo", "--fresh", "none", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert "ppo seed 0: skipped, another worker holds it (RunClaimedError" in captured.err
    assert "FAILED" not in captured.err and "runs failed" not in captured.out
    assert "1 runs skipped: another worker holds them ([('ppo', 0, None)])" in captured.out
    assert code == 2 and not os.path.exists(path)  # nothing finished yet, so no table

def test_a_run_another_live_process_trains_is_not_touched_and_a_dead_claim_is_taken_over(continual, tmp_path):
    import socket

    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    path = continual.run_path(str(tmp_path), "ppo", 1, 0)
    tb = tmp_path / "tb" / "ppo" / "fresh" / "s1_task0_1"
    tb.mkdir(parents=True)
    (tb / "events.the_other_process").write_text("x")
    Path(path + ".claim").parent.mkdir(parents=True, exist_ok=True)
    Path(path + ".claim").write_text(f"{socket.gethostname()} {os.getpid()}")  # a live pid: this one
    with pytest.raises(continual.RunClaimedError, match=f"being trained by pid {os.getpid()}"):
        continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    assert (tb / "events.the_other_process").exists() and not os.path.exists(path)  # nothing touched
    # the grid reports it by name and goes on
    job = ("ppo", 1, 0, setting, params, str(tmp_path), "cpu", 1)
    assert "RunClaimedError" in continual._run_job(job)[4]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path(path + ".claim").write_text(f"{socket.gethostname()} {dead.pid}")  # an interrupted attempt's claim
    record = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    assert record["fresh_task"] == 0 and os.path.exists(path) and not os.path.exists(path + ".claim")
    assert not (tb / "events.the_other_process").exists()  # the interrupted attempt's events were cleared
    Path(path + ".claim").write_text(f"another-host {os.getpid()}")  # another machine's claim is respected
    os.remove(path)
    with pytest.raises(continual.RunClaimedError, match="another-host"):
        continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    # bench/grid.py's retry of a trial whose worker was declared dead takes the claim over
    record = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0, take_over=True)
    assert record["fresh_task"] == 0 and os.path.exists(path) and not os.path.exists(path + ".claim")


def test_a_claim_left_by_an_earlier_boot_is_taken_over_when_its_pid_is_reused(continual, tmp_path):
    """A session's workers die with the machine; the next boot reuses pids, so a stale claim may name a live but
    unrelated process: the claim records the process's identity (boot and start time) and only that process holds it."""
    import socket

    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    path = continual.run_path(str(tmp_path), "ppo", 1, 0)
    Path(path + ".claim").parent.mkdir(parents=True, exist_ok=True)
    me = continual.process_identity(os.getpid())
    if me is None:
        pytest.skip("no /proc here: a claim holds the pid alone")
    # this live process, as the claim's own process: held
    Path(path + ".claim").write_text(f"{socket.gethostname()} {os.getpid()} {me}")
    with pytest.raises(continual.RunClaimedError, match=f"being trained by pid {os.getpid()}"):
        continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    # the same pid, but another boot's process (an earlier session's worker): taken over
    Path(path + ".claim").write_text(f"{socket.gethostname()} {os.getpid()} 00000000-earlier-boot:{me.split(':')[1]}")
    record = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    assert record["fresh_task"] == 0 and os.path.exists(path) and not os.path.exists(path + ".claim")
    # the same boot, a process started at another time under the same pid: taken over too
    os.remove(path)
    Path(path + ".claim").write_text(f"{socket.gethostname()} {os.getpid()} {me.split(':')[0]}:1")
    record = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    assert os.path.exists(path) and not os.path.exists(path + ".claim")
    # a claim this process writes names it in full
    os.remove(path)
    claim = continual.claim_run(path)
    assert Path(claim).read_text() == f"{socket.gethostname()} {os.getpid()} {me}"


def test_fresh_agents_of_task_change_methods_are_the_plain_fresh_runs(continual, tmp_path):
    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    trained = continual.run_one("ppo_snp", 2, setting, params, str(tmp_path / "a"), "cpu", 1, fresh_task=1)
    plain = continual.run_one("ppo", 2, setting, params, str(tmp_path / "b"), "cpu", 1, fresh_task=1)
    copied = continual.run_one("ppo_fire", 2, setting, params, str(tmp_path / "b"), "cpu", 1, fresh_task=1)
    # the copy is what training would give: the S&P fresh agent trained from scratch scores exactly the plain one
    assert trained["end_reward"] == plain["end_reward"] == copied["end_reward"] and "reused_from" not in trained
    assert copied["method"] == "ppo_fire" and copied["reused_from"] == "ppo"
    assert json.loads(Path(continual.run_path(str(tmp_path / "b"), "ppo_fire", 2, 1)).read_text()) == copied
    assert not (tmp_path / "b" / "tb" / "ppo_fire").exists()  # nothing was trained
    # a method whose intervention acts within a task is never copied; nor is a run of another setting
    assert "reused_from" not in continual.run_one("ppo_l2", 2, setting, params, str(tmp_path / "b"), "cpu", 1, 1)
    other = replace(setting, tasks=3)
    assert "reused_from" not in continual.run_one("ppo_snp", 2, other, params, str(tmp_path / "b"), "cpu", 1, 1)


def test_no_verdict_from_fewer_than_three_seeds(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=4)
    fresh = np.full((2, 4), 0.9) + 0.001 * np.arange(4)
    lost = np.full((2, 4), 0.2) + 0.001 * np.arange(4)  # far below: 5 seeds of this would be resolved
    _synthetic_runs(tmp_path, setting, {"ppo": (lost, fresh), "plastic_relu": (fresh, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_relu"], setting)
    ppo, plastic = result["methods"]["ppo"], result["methods"]["plastic_relu"]
    assert ppo["vs_fresh"] == plastic["vs_fresh"] == "too few seeds (2 < 3)"
    assert plastic["vs_plain"] == "too few seeds (2 < 3)"
    _synthetic_runs(tmp_path, setting, {"ppo": (np.vstack([lost, lost[:1]]), np.vstack([fresh, fresh[:1]]))})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_relu"], setting)
    assert result["methods"]["ppo"]["vs_fresh"] == "below fresh (plasticity lost)"  # 3 seeds
    assert result["methods"]["plastic_relu"]["vs_plain"] == "too few seeds (2 < 3)"  # its own 2 seeds
    for k in range(4):  # the third seed's fresh agents not run yet: 2 runs with a paired cell
        (tmp_path / "runs" / "ppo" / "fresh" / f"seed2_task{k}.json").unlink()
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_relu"], setting)
    assert result["methods"]["ppo"]["vs_fresh"] == "too few seeds (2 < 3)"
    assert np.isnan(result["methods"]["ppo"]["plasticity_ratio_last_half"]["t_low"])


def test_vs_plain_is_welchs_t_on_the_runs_last_half_means_from_three_runs(continual, tmp_path):
    """Two IQM intervals from 3 runs each do not overlap for two methods drawn alike in 10-13 % of simulated
    experiments (bench/verdict_coverage.py), Welch's t errs at or below 5 %: "vs plain" is Welch's interval of the
    difference of the runs' last-half means (scipy's ttest_ind with equal_var=False the reference), from 3 runs of
    the method and of the plain baseline (until the thirty-third session: the IQM rule, from 4)."""
    import scipy.stats

    setting = _tiny_bandit(continual, tasks=4)
    rng = np.random.default_rng(8)
    fresh = 0.9 + 0.001 * rng.standard_normal((4, 4))
    low, high = 0.2 + 0.001 * rng.standard_normal((4, 4)), 0.8 + 0.001 * rng.standard_normal((4, 4))
    _synthetic_runs(tmp_path / "three", setting, {"ppo": (low[:3], fresh[:3]), "plastic_relu": (high, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path / "three")), ["ppo", "plastic_relu"], setting)
    plastic = result["methods"]["plastic_relu"]
    assert plastic["vs_plain"] == "above ppo"  # the baseline's 3 runs (the IQM rule waited for a fourth)
    ref = scipy.stats.ttest_ind(high[:, 2:].mean(axis=1), low[:3, 2:].mean(axis=1), equal_var=False)
    welch = plastic["welch_vs_plain"]
    assert welch["p"] == pytest.approx(ref.pvalue, rel=1e-6) and welch["tasks"] == 2
    assert (welch["low"], welch["high"]) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-6)
    assert result["methods"]["ppo"]["vs_fresh"] == "below fresh (plasticity lost)"
    assert "above ppo (+0.6 [" in continual.markdown_table(result, "bandit", setting)
    # alike: the difference's interval holds 0
    _synthetic_runs(tmp_path / "alike", setting, {"ppo": (low, fresh), "plastic_relu": (low[::-1], fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path / "alike")), ["ppo", "plastic_relu"], setting)
    assert result["methods"]["plastic_relu"]["vs_plain"] == "not resolved"


def test_a_control_is_set_beside_its_arm_by_welchs_t_and_the_paired_differences(continual, tmp_path):
    """A control (``plastic_maxmin_off``, the conv arm without its penalty) is read against its arm as a method is
    against plain PPO: Welch's t on the runs' last-half means (scipy the reference), a verdict from 3 runs of each,
    and the per-seed differences of the seeds both ran (they share a task sequence); a method whose arm has no run
    gets nothing, and the table lists the pair."""
    import scipy.stats

    setting = _tiny_bandit(continual, tasks=4)
    rng = np.random.default_rng(11)
    fresh = 0.9 + 0.001 * rng.standard_normal((4, 4))
    plain, arm, control = (level + 0.01 * rng.standard_normal((4, 4)) for level in (0.3, 0.8, 0.5))
    _synthetic_runs(tmp_path, setting, {"ppo": (plain, fresh), "plastic_maxmin_conv": (arm, fresh),
                                        "plastic_maxmin_off": (control[:3], fresh[:3]),
                                        "ppo_policy_head_reset": (control, fresh)})  # its arm, ppo_head_reset, absent
    methods = ["ppo", "plastic_maxmin_conv", "plastic_maxmin_off", "ppo_policy_head_reset"]
    result = continual.summarise(continual.load_records(str(tmp_path)), methods, setting)
    entry = result["methods"]["plastic_maxmin_off"]
    vs = entry["welch_vs_arm"]
    ref = scipy.stats.ttest_ind(control[:3, 2:].mean(axis=1), arm[:, 2:].mean(axis=1), equal_var=False)
    assert vs["arm"] == "plastic_maxmin_conv" and vs["p"] == pytest.approx(ref.pvalue, rel=1e-6)
    assert (vs["low"], vs["high"]) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-6)
    expected = control[:3, 2:].mean(axis=1) - arm[:3, 2:].mean(axis=1)
    assert list(vs["paired"]) == ["0", "1", "2"]
    np.testing.assert_allclose(list(vs["paired"].values()), expected, rtol=1e-9)
    assert entry["vs_arm"] == "below plastic_maxmin_conv"
    assert "welch_vs_arm" not in result["methods"]["ppo_policy_head_reset"]  # no run of its arm
    assert "welch_vs_arm" not in result["methods"]["plastic_maxmin_conv"]  # its arm (plastic_maxmin) did not run
    table = continual.markdown_table(result, "bandit", setting)
    row = next(line for line in table.splitlines() if line.startswith("| plastic_maxmin_off | plastic_maxmin_conv |"))
    assert "below plastic_maxmin_conv (-0.296 [" in row and "| 3 / 4 |" in row and "0: -0.291, 1: -0.297" in row
    # two runs of the control: the interval is computed, no verdict
    _synthetic_runs(tmp_path / "two", setting, {"plastic_maxmin_conv": (arm, fresh),
                                                "plastic_maxmin_off": (control[:2], fresh[:2])})
    result = continual.summarise(continual.load_records(str(tmp_path / "two")),
                                 ["plastic_maxmin_conv", "plastic_maxmin_off"], setting)
    assert result["methods"]["plastic_maxmin_off"]["vs_arm"] == "too few seeds (2 < 3)"


def test_the_vs_plain_cell_prints_welchs_interval_only_with_a_verdict(continual, tmp_path):
    """2 runs of a method against 3 of plain PPO: Welch's interval exists (2 runs with spread), but no verdict is
    given from 2 runs, so the table's "vs plain" cell prints none (as the other cells print "no CI")."""
    setting = _tiny_bandit(continual, tasks=4)
    rng = np.random.default_rng(9)
    fresh = 0.9 + 0.01 * rng.standard_normal((3, 4))
    low, high = 0.2 + 0.01 * rng.standard_normal((3, 4)), 0.8 + 0.01 * rng.standard_normal((2, 4))
    _synthetic_runs(tmp_path, setting, {"ppo": (low, fresh), "plastic_relu": (high, fresh[:2])})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "plastic_relu"], setting)
    assert np.isfinite(result["methods"]["plastic_relu"]["welch_vs_plain"]["low"])
    row = next(line for line in continual.markdown_table(result, "bandit", setting).splitlines()
               if line.startswith("| plastic_relu |"))
    assert row.split(" | ")[8] == "too few seeds (2 < 3)"


def test_a_run_with_an_unscored_task_is_no_unit_of_the_vs_plain_test(continual, tmp_path):
    """A run whose last half holds a task without a score (NaN) has no last-half mean: Welch's test runs on the other
    runs, says how many it left out, and gives no verdict when fewer than 3 remain (it raised before)."""
    import scipy.stats

    setting = _tiny_bandit(continual, tasks=4)
    rng = np.random.default_rng(10)
    fresh = 0.9 + 0.01 * rng.standard_normal((4, 4))
    low, high = 0.2 + 0.01 * rng.standard_normal((3, 4)), 0.8 + 0.01 * rng.standard_normal((4, 4))
    high[1, 3] = np.nan
    _synthetic_runs(tmp_path / "four", setting, {"ppo": (low, fresh[:3]), "plastic_relu": (high, fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path / "four")), ["ppo", "plastic_relu"], setting)
    welch = result["methods"]["plastic_relu"]["welch_vs_plain"]
    kept = np.delete(high, 1, axis=0)[:, 2:].mean(axis=1)
    assert welch["unscored_runs"] == 1
    assert welch["p"] == pytest.approx(scipy.stats.ttest_ind(kept, low[:, 2:].mean(axis=1), equal_var=False).pvalue)
    assert result["methods"]["plastic_relu"]["vs_plain"] == "above ppo"
    _synthetic_runs(tmp_path / "three", setting, {"ppo": (low, fresh[:3]), "plastic_relu": (high[:3], fresh[:3])})
    result = continual.summarise(continual.load_records(str(tmp_path / "three")), ["ppo", "plastic_relu"], setting)
    assert result["methods"]["plastic_relu"]["vs_plain"] == "too few seeds (2 < 3)"


def test_fresh_agent_of_task_0_reads_what_the_continual_run_reads_on_task_0(continual, tmp_path):
    """A fresh agent of task 0 and the continual run's task 0 are the same training (same seed, task and steps up
    to the task's end), so their task-0 readings must be equal. The fresh agent's last rollout runs past the task's
    length (``change_every`` is not a multiple of ``n_steps``); those steps are not part of the task and must not be
    read (before the fix, an episode ending in them entered the fresh agent's end-of-task return)."""
    ppo = dict(continual.SETTINGS["cartpole_obs"].ppo, n_steps=16, batch_size=32, n_epochs=1)
    setting = replace(continual.SETTINGS["cartpole_obs"], tasks=2, change_every=100, n_envs=2, ppo=ppo,
                      monitor_every=10**6, tail=0.5)
    assert setting.change_every % ppo["n_steps"]  # the last rollout of a task runs past its end
    params = continual.MethodParams()
    cont = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1)
    fresh = continual.run_one("ppo", 1, setting, params, str(tmp_path), "cpu", 1, fresh_task=0)
    assert fresh["timesteps"] > setting.task_timesteps  # the overshoot happened
    for key in ("mean_reward", "end_reward", "end_return", "end_episodes"):
        assert fresh[key] == [cont[key][0]], key


def test_head_reset_methods_reset_their_heads_at_switches_and_reuse_plain_fresh_agents(continual, tmp_path):
    """The head-reset controls (issue #29) are LayerReset at every task change; their fresh agent is plain PPO's."""
    from sb3_plastic import LayerReset

    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    for method, layers in (("ppo_head_reset", "heads"), ("ppo_policy_head_reset", "policy_head"),
                           ("ppo_value_head_reset", "value_head")):
        assert method in continual.TASK_CHANGE_METHODS and method not in continual.DEFAULT_METHODS
        _, callbacks = continual.build_model(method, setting, params, 0, "cpu", None)
        (callback,) = callbacks
        assert isinstance(callback, LayerReset) and callback.layers == layers and callback.on_task_change
        assert continual.build_model(method, setting, params, 0, "cpu", None, fresh_task=1)[1] == []
    assert "dqn_head_reset" in continual.ALL_METHOD_NAMES  # on a DQN setting: the Q head
    from sb3_plastic import PlasticityInjection

    (injection,) = continual.build_model("ppo_injection", setting, params, 0, "cpu", None)[1]
    assert isinstance(injection, PlasticityInjection) and injection.on_task_change and injection.at is None
    assert continual.build_model("ppo_injection", setting, params, 0, "cpu", None, fresh_task=1)[1] == []
    # the injection's control re-draws exactly the layers an injection freezes and replaces
    model, (reset,) = continual.build_model("ppo_head2_reset", setting, params, 0, "cpu", None)
    assert isinstance(reset, LayerReset) and reset.layers == 2 and reset.on_task_change
    assert "ppo_head2_reset" in continual.TASK_CHANGE_METHODS
    reset.init_callback(model)
    from sb3_plastic.callbacks.plasticity_injection import head_chains
    from sb3_plastic.common.surgery import find_networks

    injected = [id(layer) for spec in find_networks(model) for chain in head_chains(spec, 2) for layer in chain]
    assert sorted(id(layer) for _, layer in reset.selected()) == sorted(injected) and len(injected) == 4
    record = continual.run_one("ppo_head_reset", 1, setting, params, str(tmp_path), "cpu", 1)
    assert record["task"] == [0, 1]


def test_field_methods_build_their_callbacks_and_keep_them_in_fresh_agents(continual):
    """The field's methods of issue #30 act within a task: their fresh agents run them too."""
    from sb3_plastic import ChurnReduction

    setting = _tiny_bandit(continual)
    params = continual.MethodParams()
    assert "ppo_cchain" in continual.METHODS and "ppo_cchain" not in continual.TASK_CHANGE_METHODS
    for fresh_task in (None, 1):
        _, callbacks = continual.build_model("ppo_cchain", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert [type(c) for c in callbacks] == [ChurnReduction]
        _, callbacks = continual.build_model("ppo_parseval", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert [(type(c).__name__, c.coef) for c in callbacks] == [("ParsevalRegularisation", params.parseval_coef)]
        model, callbacks = continual.build_model("ppo_trac", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert type(model.policy.optimizer).__name__ == "TRACAdam" and callbacks == []
        plain, _ = continual.build_model("ppo", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert _layers(model.policy) == _layers(plain.policy)  # the plain agent's network
        model, callbacks = continual.build_model("ppo_layernorm", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert callbacks == [] and model.intervention_callbacks() == []  # the norms alone, no projection
        assert type(model.policy.mlp_extractor.policy_net[1]).__name__ == "LayerNorm"
        model, _ = continual.build_model("ppo_adam_equal_betas", setting, params, 0, "cpu", None, fresh_task=fresh_task)
        assert model.policy.optimizer.param_groups[0]["betas"] == (0.99, 0.99)
        for method, act in (("ppo_crelu", "CReLU"), ("ppo_fourier", "Fourier")):
            model, callbacks = continual.build_model(method, setting, params, 0, "cpu", None, fresh_task=fresh_task)
            assert callbacks == [] and type(model.policy.mlp_extractor.policy_net[1]).__name__ == act
            assert model.policy.mlp_extractor.policy_net[0].out_features == setting.net_arch[0] // 2


def test_plot_only_refuses_runs_made_with_another_setting(continual, tmp_path, capsys):
    """Runs made with --change-every 1000 summarised at the setting's default (2000) would be cut into tasks
    elsewhere, silently: the rebuild names the field and the flag and writes nothing; with the runs' value it builds."""
    rng = np.random.default_rng(0)
    bandit = continual.SETTINGS["bandit"]
    cont, fresh = rng.uniform(0.2, 0.9, size=(3, bandit.tasks)), rng.uniform(0.8, 0.9, size=(3, bandit.tasks))
    _synthetic_runs(tmp_path, bandit, {"ppo": (cont, fresh)})
    recorded = dict(env_id=bandit.env_id, tasks=bandit.tasks, change_every=1000, n_envs=bandit.n_envs,
                    score=bandit.score, tail=bandit.tail)
    for path in (tmp_path / "runs").rglob("*.json"):
        path.write_text(json.dumps(dict(json.loads(path.read_text()), setting=recorded)))
    args = ["--setting", "bandit", "--out", str(tmp_path), "--plot-only", "--no-diagnostics-plots"]
    assert continual.main(args) == 2
    err = capsys.readouterr().err
    assert "change_every=1000" in err and "change_every=2000" in err and "--change-every" in err
    assert not (tmp_path / "summary.json").exists()
    assert continual.main([*args, "--change-every", "1000"]) == 0
    assert (tmp_path / "summary.json").exists()


def test_fresh_only_trains_the_fresh_agents_alone_and_the_report_waits_for_their_continual_run(continual, tmp_path,
                                                                                                capsys):
    """``--fresh-only`` (fresh agents spread over cores the continual runs do not use): the fresh agents of the cells
    are written, the continual run is not, the folder's tables are left alone; a rebuild of a folder that holds such
    fresh agents without their continual run summarises the complete cells and is not broken by them."""
    argv = ["--methods", "ppo", "--seeds", "0", "--fresh", "all", "--tasks", "2", "--change-every", "16",
            "--ppo-kwarg", "n_steps=16", "--ppo-kwarg", "batch_size=32", "--out", str(tmp_path),
            "--no-diagnostics-plots"]
    assert continual.main([*argv, "--fresh-only"]) == 0
    assert "--fresh-only: the folder's tables" in capsys.readouterr().out
    for task in (0, 1):
        record = json.loads(Path(continual.run_path(str(tmp_path), "ppo", 0, task)).read_text())
        assert record["fresh_task"] == task and len(record["end_return"]) == 1
    assert not os.path.exists(continual.run_path(str(tmp_path), "ppo", 0))
    assert not (tmp_path / "summary.md").exists()
    # the continual run later (another worker, another machine): its fresh agents are found, not trained again
    assert continual.main(argv) == 0
    assert "resuming: 2 finished runs skipped" in capsys.readouterr().out
    assert os.path.exists(continual.run_path(str(tmp_path), "ppo", 0))
    assert "| ppo | 1 |" in (tmp_path / "summary.md").read_text()
    # a fresh agent of a seed whose continual run is not there yet does not break a rebuild nor enter its tables
    orphan = Path(continual.run_path(str(tmp_path), "ppo", 1, 0))
    orphan.write_text(Path(continual.run_path(str(tmp_path), "ppo", 0, 0)).read_text().replace('"seed": 0',
                                                                                                '"seed": 1'))
    assert json.loads(orphan.read_text())["seed"] == 1
    before = (tmp_path / "summary.md").read_text()
    assert continual.main(["--plot-only", "--out", str(tmp_path), "--tasks", "2", "--change-every", "16",
                           "--no-diagnostics-plots"]) == 0
    assert (tmp_path / "summary.md").read_text() == before


@pytest.mark.parametrize("extra", [["--fresh", "none"], ["--fresh", "all", "--plot-only"]])
def test_fresh_only_without_fresh_agents_to_train_is_refused(continual, capsys, extra):
    with pytest.raises(SystemExit) as exc:
        continual.parse_args(["--fresh-only", *extra])
    assert exc.value.code == 2
    assert "--fresh-only trains the fresh agents of --fresh all or sample" in capsys.readouterr().err


def test_runs_train_without_distribution_checks_and_with_the_same_numbers(continual, tmp_path, monkeypatch):
    """A run trains with torch.distributions' argument checks off (a few % of its CPU time) and records what the same
    run with them on records; the default is restored after it."""
    runs = continual.continual_runs
    setting = replace(continual.SETTINGS["cchain_cartpole"], tasks=2, change_every=800, monitor_every=1600,
                      net_arch=(16, 16))
    train, seen = runs._train_run, []

    def spying(*args, **kwargs):
        seen.append(th.distributions.Distribution._validate_args)
        return train(*args, **kwargs)

    th.distributions.Distribution.set_default_validate_args(True)
    checked = train("ppo", 0, setting, continual.MethodParams(), str(tmp_path / "on"), "cpu", 1, None)
    monkeypatch.setattr(runs, "_train_run", spying)
    unchecked = runs.run_one("ppo", 0, setting, continual.MethodParams(), str(tmp_path / "off"), "cpu", 1)
    assert seen == [False] and th.distributions.Distribution._validate_args is True
    timing = ("cpu_seconds", "wall_seconds")
    assert {k: v for k, v in checked.items() if k not in timing} == {k: v for k, v in unchecked.items() if k not in timing}


def test_the_paired_verdict_reads_the_t_interval_not_the_narrower_bootstrap(continual, tmp_path):
    """Five runs whose continual / fresh ratios are 0.80, 0.85, 0.90, 0.95 and 1.05 (every cell of a run alike): the
    paired bootstrap's interval lies below 1 (the verdict until the thirty-second session: "below fresh"), the
    Student-t interval of the linearised ratio (here scipy's one-sample t interval of the five ratios) holds 1, and the
    verdict follows it. The table prints both intervals; with negative scores the paired difference does the same."""
    import scipy.stats

    setting = _tiny_bandit(continual, tasks=6)
    ratios = np.array([0.80, 0.85, 0.90, 0.95, 1.05])
    fresh = np.full((5, 6), 0.5)
    _synthetic_runs(tmp_path / "pos", setting, {"ppo": (fresh * ratios[:, None], fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path / "pos")), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    ratio = entry["plasticity_ratio_last_half"]
    assert ratio["high"] < 1  # the bootstrap alone would call it
    ci = scipy.stats.ttest_1samp(ratios, 0.0).confidence_interval(0.95)
    assert (ratio["t_low"], ratio["t_high"]) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert ratio["t_low"] < 1 < ratio["t_high"]
    assert entry["vs_fresh"] == "not resolved"
    row = next(line for line in continual.markdown_table(result, "bandit", setting).splitlines()
               if line.startswith("| ppo |"))
    assert f"[{ratio['low']:.3g}, {ratio['high']:.3g}], t [{ci.low:.3g}, {ci.high:.3g}]" in row
    _synthetic_runs(tmp_path / "neg", setting, {"ppo": (-100 * fresh + (ratios[:, None] - 1) * 50, -100 * fresh)})
    result = continual.summarise(continual.load_records(str(tmp_path / "neg")), ["ppo"], setting)
    entry = result["methods"]["ppo"]
    minus = entry["minus_fresh_last_half"]
    assert "plasticity_ratio_last_half" not in entry and minus["high"] < 0
    ci = scipy.stats.ttest_1samp((ratios - 1) * 50, 0.0).confidence_interval(0.95)
    assert (minus["t_low"], minus["t_high"]) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert entry["vs_fresh"] == "not resolved"
    row = next(line for line in continual.markdown_table(result, "bandit", setting).splitlines()
               if line.startswith("| ppo |"))
    assert f"c - f: {minus['mean']:.3g} [" in row


def test_the_output_heads_statistics_are_summarised_over_the_last_half(continual, tmp_path):
    """Issue #28's "output head's logit scale per task": the run JSONs' per-task head statistics, averaged over the
    continual runs x last-half tasks and over the fresh agents of those tasks (NaN tasks and runs that did not record
    a key left out), and printed as a table, continual / fresh."""
    setting = _tiny_bandit(continual, tasks=4)
    rng = np.random.default_rng(9)
    _synthetic_runs(tmp_path, setting, {"ppo": (rng.uniform(0.2, 0.4, (3, 4)), rng.uniform(0.8, 0.9, (3, 4)))})
    logit = rng.uniform(1, 5, size=(3, 4))
    logit[1, 3] = np.nan
    for seed in range(3):
        path = tmp_path / "runs" / "ppo" / f"seed{seed}.json"
        run = json.loads(path.read_text())
        run["head_logit_std"] = [None if np.isnan(v) else float(v) for v in logit[seed]]
        if seed != 2:  # seed 2 recorded no entropy as found
            run["switch_head_entropy"] = [0.7, 0.6, 0.5 - 0.1 * seed, 0.4]
        path.write_text(json.dumps(run))
        for k in range(4):
            path = tmp_path / "runs" / "ppo" / "fresh" / f"seed{seed}_task{k}.json"
            fresh = json.loads(path.read_text())
            fresh["head_logit_std"] = [10.0 * seed + k]
            path.write_text(json.dumps(fresh))
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo"], setting)
    head = result["methods"]["ppo"]["head_last_half"]
    late = logit[:, 2:]
    assert head["head_logit_std"]["continual"] == pytest.approx(np.nanmean(late))
    # fresh agents of tasks 2 and 3 only (the last half); task 0's fresh run is the continual run's start
    assert head["head_logit_std"]["fresh"] == pytest.approx(np.mean([10.0 * s + k for s in range(3) for k in (2, 3)]))
    assert head["switch_head_entropy"] == {"continual": pytest.approx(np.mean([0.5, 0.4, 0.4, 0.4])), "fresh": None}
    assert set(head) == {"head_logit_std", "switch_head_entropy"}
    text = continual.markdown_table(result, "bandit", setting)
    assert "| method | logit std | entropy, as found |" in text
    assert f"| ppo | {np.nanmean(late):.3g} / {head['head_logit_std']['fresh']:.3g} | 0.425 / - |" in text


def test_every_name_of_the_arm_and_preregistered_tables_is_a_method(continual):
    """``ARM_OF`` and ``PREREGISTERED`` name methods by hand: a misspelt name would drop a control's comparison or a
    pre-registered test from Holm's family without a word. Every name is one the grid runs."""
    from continual_methods import ARM_OF, PREREGISTERED

    named = set(ARM_OF) | set(ARM_OF.values()) | {m for family in PREREGISTERED.values() for m in family}
    assert named and named <= set(continual.continual_report.ALL_METHOD_NAMES), named - set(
        continual.continual_report.ALL_METHOD_NAMES)
    assert all(len(set(family)) == len(family) for family in PREREGISTERED.values())
