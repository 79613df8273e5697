"""bench/stationary.py --quick: both arms of the smallest setting train, the run files and the table are written,
the table rebuilds from the run files alone, finished runs are skipped, and the statistics behave."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch as th
from bench_modules import load_bench


def _load():
    return load_bench("stationary")


def test_stationary_quick_runs_both_arms_and_rebuilds_the_table(tmp_path, capsys):
    stationary = _load()
    threads = th.get_num_threads()
    try:
        assert stationary.main(["--quick", "--out", str(tmp_path)]) == 0
        first = capsys.readouterr().out
        folder = tmp_path / stationary.QUICK_SETTING
        runs = {(arm, seed): folder / f"{arm}_seed{seed}.json" for arm in stationary.ARMS for seed in (0, 1)}
        mtimes = {key: os.stat(path).st_mtime_ns for key, path in runs.items()}
        assert stationary.main(["--quick", "--out", str(tmp_path), "--no-summary"]) == 0  # resumes: nothing reruns
        second = capsys.readouterr().out
    finally:
        th.set_num_threads(threads)
    assert {key: os.stat(path).st_mtime_ns for key, path in runs.items()} == mtimes
    assert second.count("skip ") == len(runs)

    for (arm, seed), path in runs.items():
        record = json.loads(path.read_text())
        assert (record["arm"], record["seed"], record["setting"]) == (arm, seed, stationary.QUICK_SETTING)
        assert record["timesteps"] >= stationary.QUICK_OVERRIDES["timesteps"] == record["timesteps_requested"]
        assert len(record["final_episode_returns"]) == stationary.QUICK_OVERRIDES["final_episodes"]
        assert 0.0 <= record["final_return"] <= 100.0  # identity task: 1 per correct step, 100 steps
        assert record["curve"] and all(step > 0 for step, _ in record["curve"])
        assert record["wall_s"] > 0 and record["cpu_s"] > 0 and len(record["initial_params_sha1"]) == 40
        resolved = record["resolved"]
        assert resolved["parts"]["mlp_extractor"]  # the activation of the MLP was found
        if arm == "plastic":
            assert resolved["algorithm"] == "PlasticMaskablePPO"
            assert {"activation", "isometry_coef", "optimizer"} <= set(resolved["isometry_config"])
        else:
            assert resolved["algorithm"] == "MaskablePPO" and "isometry_config" not in resolved
            assert resolved["parts"]["mlp_extractor"] == ["Tanh"]  # SB3's own default
    random = json.loads((folder / "random.json").read_text())
    assert 0 < random["mean"] < 30  # a random valid action is right 1 time in 15

    summary = json.loads((tmp_path / "summary.json").read_text())
    cell = summary["cells"][stationary.QUICK_SETTING]
    assert cell["paired_seeds"] == [0, 1] and len(cell["diff"]) == 2
    assert cell["verdict"].startswith("no verdict")  # two seeds are too few
    assert cell["same_initial_params"].endswith("/2 seeds")  # hashes of both arms' initial networks compared
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "summary.md").read_text()
    assert f"| {stationary.QUICK_SETTING} |" in table and table.strip() in first

    # a run file without the initial-parameter hash gets it back from a rebuild of the model at its seed
    path = runs[("plastic", 1)]
    record = json.loads(path.read_text())
    digest = record.pop("initial_params_sha1")
    record["git"]["commit"] = stationary._git_state()["commit"]  # the library this process imports
    path.write_text(json.dumps(record))
    try:
        assert stationary.main(["--quick", "--out", str(tmp_path), "--backfill-init-hash"]) == 0
    finally:
        th.set_num_threads(threads)
    record = json.loads(path.read_text())
    assert record["initial_params_sha1"] == digest and record["initial_params_sha1_backfilled"] is True

    # the table rebuilds from the run files alone
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.md").unlink()
    assert stationary.main(["--summarise", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "summary.md").read_text() == table
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_stationary_statistics_and_verdicts():
    stationary = _load()
    lo, hi = stationary.bootstrap_mean_ci(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert 1.0 < lo < 3.0 < hi < 5.0
    margin = 1.0
    assert stationary.verdict((-0.5, 2.0), margin) == "no harm resolved"
    assert stationary.verdict((-3.0, -1.5), margin) == "harm"
    assert stationary.verdict((-3.0, 0.5), margin) == "not resolved"
    # the stratified bootstrap resamples runs within each task; a constant matrix has a zero-width CI
    point, low, high = stationary.stratified_bootstrap(lambda x: float(x.mean()), np.ones((5, 3)), reps=50)
    assert point == low == high == 1.0
    iqm, poi, _ = stationary._metrics()
    assert iqm(np.arange(8.0)[:, None]) == pytest.approx(3.5)
    assert poi(np.full((5, 1), 2.0), np.full((5, 1), 1.0)) == 1.0


def test_stationary_rejects_bad_arguments(capsys):
    stationary = _load()
    for argv in (["--timesteps", "cartpole=10"], ["--settings", "atari"], ["--timesteps", "cartpole_ppo="]):
        with pytest.raises(SystemExit) as exc:
            stationary.parse_args(argv)
        assert exc.value.code == 2
    assert stationary.parse_args(["--timesteps", "cartpole_ppo=2e4"]).timestep_overrides == {"cartpole_ppo": 20_000}
    with pytest.raises(SystemExit):  # the default folder holds the library defaults only
        stationary.parse_args(["--plastic-kwarg", "isometry_coef=0.01"])
    args = stationary.parse_args(["--plastic-kwarg", "isometry_coef=0.01", "--out", "/tmp/x"])
    assert args.plastic_overrides == {"isometry_coef": 0.01}
    assert "SETTING=N" in capsys.readouterr().err


def test_stationary_vectorised_iqm_matches_rliable_metric():
    stationary = _load()
    iqm, _, _ = stationary._metrics()
    rng = np.random.default_rng(1)
    for n in (2, 5, 7, 10, 13):
        x = rng.normal(size=(4, n))
        assert np.allclose(stationary.iqm_rows(x), [iqm(row[:, None]) for row in x])
    scores = {"a": rng.normal(size=(6, 3))}
    point, low, high = stationary._iqm_ci(scores, reps=300)["a"]
    assert point == pytest.approx(iqm(scores["a"])) and low <= point <= high
