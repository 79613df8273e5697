"""bench/single_task_table.py: the single-task probe table, against hand computations on synthetic run JSONs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from bench_modules import load_bench


@pytest.fixture
def table():
    return load_bench("single_task_table")


def _write_run(folder: Path, method: str, seed: int, ret: float, norm: float, dfi: float, logit_std: float,
               tasks: int = 1) -> None:
    path = folder / "runs" / method / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(method=method, seed=seed, end_return=[ret] * tasks, head_logit_std=[logit_std] * tasks,
                  diagnostics={"plasticity/policy/weight_norm": [[1024, 17.0], [126976, norm]],
                               "plasticity/policy/dfi_hidden": [[1024, 0.0], [126976, dfi]]})
    path.write_text(json.dumps(record))


def test_rows_against_hand_computations(table, tmp_path):
    rng = np.random.default_rng(3)
    values = {m: rng.uniform(5, 25, size=(3, 4)) for m in ("ppo", "arm_b", "arm_a")}
    for m, rows in values.items():
        for seed, (ret, norm, dfi, lstd) in enumerate(rows):
            _write_run(tmp_path, m, seed, ret, norm, dfi, lstd)
    (tmp_path / "runs" / "ppo" / "seed3.json.claim").write_text("held")  # not a run
    fresh = tmp_path / "runs" / "ppo" / "fresh"
    fresh.mkdir()
    (fresh / "seed0_task0.json").write_text("{}")  # a fresh agent: not a row of the table

    rows = table.table_rows(table.load_arms(str(tmp_path)))
    assert [r["method"] for r in rows] == ["ppo", "arm_a", "arm_b"]  # plain first, then by name
    for r in rows:
        v = values[r["method"]]
        assert r["seeds"] == [0, 1, 2] and r["returns"] == pytest.approx(v[:, 0].tolist())
        assert r["mean"] == pytest.approx(v[:, 0].mean())
        assert (r["norm"], r["dfi_hidden"], r["logit_std"]) == pytest.approx(tuple(v[:, 1:].mean(axis=0)))
    assert rows[0]["vs_plain"] is None
    test = scipy.stats.ttest_ind(values["arm_a"][:, 0], values["ppo"][:, 0], equal_var=False)
    ci = test.confidence_interval(0.95)
    vs = rows[1]["vs_plain"]
    assert vs["difference"] == pytest.approx(values["arm_a"][:, 0].mean() - values["ppo"][:, 0].mean())
    assert (vs["low"], vs["high"], vs["p"]) == pytest.approx((ci.low, ci.high, test.pvalue))
    # the order asked for, another plain arm
    rows = table.table_rows(table.load_arms(str(tmp_path)), plain="arm_b", methods=["arm_a", "arm_b"])
    assert [r["method"] for r in rows] == ["arm_a", "arm_b"] and rows[1]["vs_plain"] is None
    text = table.markdown(rows, "arm_b")
    assert text.splitlines()[0].startswith("| arm | end-of-task return per seed | mean | vs arm_b")
    assert len(text.splitlines()) == 4
    # a subset of the seeds: the same rows as a folder holding only those runs
    rows = table.table_rows(table.load_arms(str(tmp_path), seeds=[0, 2]))
    for r in rows:
        assert r["seeds"] == [0, 2] and r["returns"] == pytest.approx(values[r["method"]][[0, 2], 0].tolist())


def test_bad_input_is_named(table, tmp_path):
    with pytest.raises(ValueError, match="no single-task runs in"):
        table.load_arms(str(tmp_path))
    _write_run(tmp_path, "arm_a", 0, 10.0, 20.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"no runs of 'ppo' in the folder; its arms: \['arm_a'\]"):
        table.table_rows(table.load_arms(str(tmp_path)))
    _write_run(tmp_path, "ppo", 0, 10.0, 20.0, 1.0, 1.0, tasks=20)
    with pytest.raises(ValueError, match="seed0.json is a run of 20 tasks"):
        table.load_arms(str(tmp_path))
