"""Smoke tests of the benchmark scripts in bench/: their ``--quick`` modes run and write what they promise."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch as th
from bench_modules import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench_script(name: str) -> ModuleType:
    """Import ``bench/<name>.py`` as a module (bench/ is not a package)."""
    return load_bench(name)


def test_supervised_quick(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="bench/supervised.py reads sklearn's bundled digits (pip install -e '.[bench]')")
    supervised = load_bench_script("supervised")
    threads = th.get_num_threads()
    try:
        results = supervised.main(["--quick", "--out", str(tmp_path)])
    finally:
        th.set_num_threads(threads)
    out = capsys.readouterr().out

    for name in ("supervised_quick.json", "supervised_quick.csv", "supervised_quick.png", "supervised_quick_diagnostics.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "supervised_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    saved = json.loads((tmp_path / "supervised_quick.json").read_text())
    assert set(saved["probes"]) == set(supervised.PROBES) == {"memorise", "permuted"}
    for probe, entry in saved["probes"].items():
        n_tasks = entry["config"]["n_tasks"]
        assert set(entry["methods"]) == set(supervised.METHODS), probe
        for method, values in entry["methods"].items():
            acc = values["accuracy"]
            assert len(acc) == len(entry["seeds"]) >= 2, (probe, method)
            assert all(len(seed) == n_tasks and all(0.0 <= a <= 1.0 for a in seed) for seed in acc), (probe, method)
            assert len(values["summary"]["mean"]) == n_tasks
        # every probe prints a table with a column per method and a row per task
        section = out.split(f"## {probe}:")[1].split("## ")[0]
        header = next(line for line in section.splitlines() if line.startswith("| task"))
        for settings in saved["methods"].values():
            assert settings["label"] in header, (probe, settings["label"])
        assert f"| {n_tasks} " in section
    # Continual Backprop replaced units; the CSV has a row per probe, method, seed and task
    assert sum(saved["probes"]["memorise"]["methods"]["cbp"]["cbp_replaced"]) > 0
    rows = (tmp_path / "supervised_quick.csv").read_text().strip().splitlines()
    expected = sum(len(e["seeds"]) * e["config"]["n_tasks"] * len(e["methods"]) for e in saved["probes"].values())
    assert len(rows) == 1 + expected
    assert results["mode"] == "quick"


def _run_bench(script: str, *args: str, tmp_path: Path) -> tuple[int, str, dict]:
    """Run ``bench/<script>.py`` in a subprocess (one torch thread) with ``--json``; return (status, stdout, json)."""
    import os
    import subprocess

    out_json = tmp_path / f"{script}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), *args, "--quiet", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
        cwd=BENCH.parent,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: an entry missed its target
    return proc.returncode, proc.stdout, json.loads(out_json.read_text())


def test_overhead_quick_ab_and_event_entries(tmp_path):
    """bench/overhead.py through its thin wrapper bench/interventions.py, one repetition of an A/B entry with a
    callback (ContinualBackprop on SAC) and of an event entry (one FIRE call on PPO CNN against a 1M-step run;
    ReDo on SAC without ale-py / OpenCV): the table, the targets, the exit status and the JSON agree."""
    import importlib.util

    has_atari = all(importlib.util.find_spec(m) is not None for m in ("ale_py", "cv2"))
    event = "ppo-cnn-fire" if has_atari else "sac-mlp-redo"
    code, out, saved = _run_bench(
        "interventions", "--quick", "--only", "sac-mlp-cbp", "--only", event, "--repeats", "1", tmp_path=tmp_path
    )
    assert out.startswith("sb3_plastic overhead, mode=quick, repeats=1")
    header = next(line for line in out.splitlines() if line.startswith("| benchmark"))
    assert all(col in header for col in ("median", "cpu-time median", "best/best", "target", "status"))
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in out.splitlines() if line.startswith("| ")}
    assert {("sac-mlp-cbp", "learn fps"), ("sac-mlp-cbp", "train() speed"), ("sac-mlp-cbp", "rollout speed")} <= rows
    cbp, ev = saved["results"]["sac-mlp-cbp"], saved["results"][event]
    assert (cbp["kind"], ev["kind"]) == ("ab", "event")
    assert cbp["target"] == 0.90 and cbp["status"] in ("PASS", "FAIL")
    assert len(cbp["ratios"]["learn fps"]) == 1 and 0 < cbp["ratios"]["learn fps"][0] < 10
    assert ev["context"]["event_seconds"] > 0
    if has_atari:
        assert ev["target"] == 0.01 and ev["target_is_upper_bound"] and "< 1%" in out
        (fraction,) = ev["ratios"]["time / 1,000,000-step run"]
        assert 0 < fraction < 1 and ev["status"] == ("PASS" if fraction < 0.01 else "FAIL")
    else:
        assert ev["status"] == "-" and 0 < ev["ratios"]["projected fps"][0] <= 1
    assert code == (1 if "FAIL" in (cbp["status"], ev["status"]) else 0)


def test_overhead_event_period_counts_optimizer_steps_as_redo_does():
    """An event in gradient steps (ReDo's period) is projected with optimizer steps, as ReDo counts them: PPO's
    minibatch updates (here 2 epochs x 4 minibatches per rollout), not SB3's ``_n_updates`` (one per epoch)."""
    from stable_baselines3 import PPO

    overhead = load_bench_script("overhead")
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16, n_epochs=2, seed=0, policy_kwargs=dict(net_arch=[8]))
    run = overhead.Arm(model).run(128, threads=1)
    assert run["steps"] == 128 and model._n_updates == 4
    assert run["optimizer_steps"] == 2 * 2 * 4
    event = overhead.Event(overhead.redo_event, overhead.trigger_redo, every=1000, unit="gradient", label="x")
    assert overhead._period_steps(event, run) == 1000 * 128 / 16
