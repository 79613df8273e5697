"""bench/weight_norm_table.py: the weight-growth table, against hand computations on synthetic run JSONs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bench_modules import load_bench


@pytest.fixture
def table():
    return load_bench("weight_norm_table")


def _write_run(folder: Path, method: str, seed: int, returns: list[float], passes: list[list[float]]) -> None:
    path = folder / "runs" / method / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(method=method, seed=seed, end_return=returns, setting=dict(change_every=100, n_envs=2),
                  diagnostics={"plasticity/policy/weight_norm": passes})
    path.write_text(json.dumps(record))


def test_rows_against_hand_computations(table, tmp_path):
    rng = np.random.default_rng(4)
    # 4 tasks of 200 env steps; passes every 50 steps, one exactly at each task's end (after a switch intervention)
    steps = list(range(0, 801, 50))
    expected = {}
    for method in ("ppo", "ppo_snp"):
        per_seed = []
        for seed in (0, 1, 2):
            returns = rng.uniform(0, 30, size=4).tolist()
            norms = rng.uniform(10, 200, size=len(steps)).tolist()
            _write_run(tmp_path, method, seed, returns, [[s, n] for s, n in zip(steps, norms)])
            # task 0 ends at 200 (pass at 150 is the last strictly before), task 3 at 800 (pass at 750)
            per_seed.append((norms[steps.index(150)], norms[steps.index(750)], np.mean(returns[2:])))
        expected[method] = np.mean(per_seed, axis=0)
    fresh = tmp_path / "runs" / "ppo" / "fresh"
    fresh.mkdir()
    (fresh / "seed0_task3.json").write_text("{}")  # a fresh agent: not read

    rows = table.table_rows(table.load_runs(str(tmp_path), [0, 3]))
    assert {r["method"] for r in rows} == {"ppo", "ppo_snp"}
    assert rows[0]["last_half"] >= rows[1]["last_half"]  # highest last-half return first
    for r in rows:
        np.testing.assert_allclose([*r["norms"], r["last_half"]], expected[r["method"]], rtol=1e-12)
        assert r["seeds"] == [0, 1, 2]
    text = table.markdown(rows, [0, 3])
    assert "| method | seeds | norm, end of task 0 | norm, end of task 3 | last-half return (mean) |" in text
    ppo = next(r for r in rows if r["method"] == "ppo")
    assert f"| ppo | 3 | {ppo['norms'][0]:.1f} | {ppo['norms'][1]:.1f} | {ppo['last_half']:.1f} |" in text


def test_bad_input_is_named(table, tmp_path):
    with pytest.raises(ValueError, match="no continual runs in"):
        table.load_runs(str(tmp_path), [0])
    _write_run(tmp_path, "ppo", 0, [1.0, 2.0], [[0, 1.0]])
    with pytest.raises(ValueError, match=r"has 2 tasks; task indices \[5\] are not among them"):
        table.load_runs(str(tmp_path), [0, 5])
    with pytest.raises(ValueError, match=r"no continual runs of 'ppo_cbp' in the folder; its methods: \['ppo'\]"):
        table.table_rows(table.load_runs(str(tmp_path), [0]), ["ppo_cbp"])
    # a run without monitor passes before a task's end reads NaN, not a number from after it
    assert np.isnan(table.norm_before([[400, 3.0]], 200))
