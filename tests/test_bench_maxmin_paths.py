"""bench/maxmin_paths.py: the forced paths, the verdict rule and one tiny measured run."""

from __future__ import annotations

import json
import time

import pytest
import torch as th
from bench_modules import load_bench

from sb3_plastic import activations
from sb3_plastic.activations import MaxMin

maxmin_paths = load_bench("maxmin_paths")


def test_forced_paths_switch_and_restore_the_bounds():
    bounds = activations.BITWISE_MIN_PLANE, activations.BITWISE_MIN_NUMEL
    mlp = th.empty(4, 8, 3)
    with maxmin_paths.forced("bitwise"):
        assert activations._takes_bitwise_path(mlp)
    with maxmin_paths.forced("gather"):
        assert not activations._takes_bitwise_path(th.empty(256, 16, 8, 8))
    assert (activations.BITWISE_MIN_PLANE, activations.BITWISE_MIN_NUMEL) == bounds
    with pytest.raises(ValueError, match="'scatter'"), maxmin_paths.forced("scatter"):
        pass


def test_the_bitwise_path_is_taken_on_the_cpu_only_unless_forced():
    """On an H200 (bench/results/step_cost/gpu_2026-12-04) the gather path was faster on every shape, conv maps at
    batch 256 included (0.27-0.50 of the bitwise path's time): the bitwise path is a CPU path."""
    conv = (256, 16, 8, 8)
    assert activations._takes_bitwise_path(th.empty(conv))
    assert not activations._takes_bitwise_path(th.empty(conv, device="meta"))
    with maxmin_paths.forced("bitwise"):
        assert activations._takes_bitwise_path(th.empty(conv, device="meta"))
    assert not activations._takes_bitwise_path(th.empty(conv, device="meta"))
    # a meta tensor goes through MaxMin on the gather path (the bitwise path's views need real storage to be tested)
    assert MaxMin()(th.empty(conv, device="meta")).shape == conv


def test_verdict_only_where_the_band_resolves_it():
    assert maxmin_paths.verdict(1.5, 1.1) == "bitwise faster"
    assert maxmin_paths.verdict(0.5, 1.1) == "gather faster"
    assert maxmin_paths.verdict(1.05, 1.1) == "not resolved"


def test_a_tiny_run_reports_every_shape_and_work(tmp_path, capsys):
    out = tmp_path / "paths.json"
    assert maxmin_paths.main(["--rounds", "1", "--min-run-time", "0.01", "--only", "1", "7", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["name"], r["work"]) for r in results] == [
        ("minatar conv, rollout", "train"), ("minatar conv, rollout", "forward"),
        ("mlp 256, batch 256", "train"), ("mlp 256, batch 256", "forward")]
    assert all(r["chosen"] == "gather" for r in results)  # both below the bitwise bounds
    assert all(len(r["ratios"]) == 1 and r["band"] >= 1.0 for r in results)
    assert "| minatar conv, rollout | (8, 16, 8, 8) | train |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        maxmin_paths.main(["--only", "99"])


def test_a_gpu_run_reads_a_clock_that_waits_for_the_device(monkeypatch):
    assert maxmin_paths.clock_of("cpu") is time.process_time
    synced = []
    monkeypatch.setattr(th.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(th.accelerator, "synchronize", lambda *a, **k: synced.append(1))
    maxmin_paths.clock_of("cuda")()
    assert synced == [1]


def test_bad_devices_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        maxmin_paths.main(["--device", "gpu0"])
    assert "'gpu0' is not a torch device" in capsys.readouterr().err
    if not th.cuda.is_available():
        with pytest.raises(SystemExit):
            maxmin_paths.main(["--device", "cuda"])
        assert "no CUDA device is available" in capsys.readouterr().err
