"""bench/continual.py --quick: every method runs, the grid resumes, the table, JSONs and plots are written."""

from __future__ import annotations

import json
import os

import torch as th
from bench_modules import load_bench


def _load():
    return load_bench("continual")


def test_continual_quick_grid_resumes_and_reports(tmp_path, capsys):
    continual = _load()
    threads = th.get_num_threads()
    try:
        assert continual.main(["--quick", "--out", str(tmp_path), "--tb-plots"]) == 0
        first = capsys.readouterr().out
        runs = {m: tmp_path / "runs" / m / "seed0.json" for m in continual.DEFAULT_METHODS}
        mtimes = {m: os.stat(p).st_mtime_ns for m, p in runs.items()}
        # a second call finds every run finished: nothing is trained again
        assert continual.main(["--quick", "--out", str(tmp_path), "--no-diagnostics-plots"]) == 0
        second = capsys.readouterr().out
    finally:
        th.set_num_threads(threads)
    assert f"resuming: {3 * len(runs)} finished runs skipped" in second  # each: the continual run, 2 fresh agents
    assert {m: os.stat(p).st_mtime_ns for m, p in runs.items()} == mtimes
    for method, path in runs.items():
        record = json.loads(path.read_text())
        assert record["method"] == method and record["task"] == [0, 1]
        assert all(0.0 <= r <= 1.0 for r in record["end_reward"] + record["mean_reward"])
        assert record["timesteps"] >= 2 * record["setting"]["change_every"] * record["setting"]["n_envs"]
        assert any(
            name.startswith("events.out.tfevents") for _, _, files in os.walk(tmp_path / "tb" / method) for name in files
        )
        assert f"| {method} " in first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["methods"]) == set(continual.DEFAULT_METHODS)
    for name in ("end_of_task.png", "plasticity.png", "diagnostics.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    plots = os.listdir(tmp_path / "plots")
    assert "return_curve.png" in plots and any("dormant_fraction" in p for p in plots) and any("ntk_cond" in p for p in plots)


def test_continual_rejects_bad_arguments(capsys):
    continual = _load()
    for argv in (["--tasks", "0"], ["--methods", "sgd"], ["--jobs", "-1"], ["--ppo-kwarg", "entcoef=0.1"]):
        try:
            continual.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(argv)
    err = capsys.readouterr().err
    assert "--tasks must be >= 1, got 0" in err and "invalid choice: 'sgd'" in err
    assert "KEY a PPO keyword" in err and "'entcoef=0.1'" in err
    assert continual.parse_args(["--ppo-kwarg", "ent_coef=0.01"]).ppo_overrides == {"ent_coef": 0.01}


def test_denormals_script_counts_and_validates(capsys):
    module = load_bench("denormals")
    assert module.count_denormal([th.tensor([0.0, 1e-40, -1e-39, 1e-30, 1.0])]) == 2
    threads = th.get_num_threads()
    try:
        module.main(["--method", "ppo", "--tasks", "1"])
    finally:
        th.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "ppo, seed 0, flush_denormal=False" in out and "task 0:" in out and "denormal weights" in out
    try:
        module.main(["--tasks", "0"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--tasks 0 accepted")
    assert "--tasks must be >= 1, got 0" in capsys.readouterr().err
