"""bench/seed_table.py: one seed of every method of a continual folder, against hand computations on synthetic runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from test_bench_continual_protocol import _synthetic_runs, _tiny_bandit

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def seed_table(continual):
    spec = importlib.util.spec_from_file_location("bench_seed_table", BENCH / "seed_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seed_rows_match_hand_computations(seed_table, continual, tmp_path):
    rng = np.random.default_rng(7)
    setting = _tiny_bandit(continual, tasks=12)
    ends = {m: rng.uniform(0.2, 0.9, size=(2, 12)) for m in ("ppo", "ppo_l2")}
    fresh = {m: rng.uniform(0.5, 0.9, size=(2, 12)) for m in ("ppo", "ppo_l2")}
    _synthetic_runs(tmp_path, setting, {m: (ends[m], fresh[m]) for m in ends})
    # ppo_l2 has fresh agents on its sample only (as --fresh sample), ppo on every task (as --fresh all)
    sample = continual.fresh_sample(setting, 1)
    assert len(sample) == 4 and all(6 <= k < 12 for k in sample)
    for k in range(12):
        if k not in sample:
            (tmp_path / "runs" / "ppo_l2" / "fresh" / f"seed1_task{k}.json").unlink()
    # the head's entropy of ppo's seed 1, and a switch reading that starts at task 8 (a resumed run: NaN before)
    path = tmp_path / "runs" / "ppo" / "seed1.json"
    record = json.loads(path.read_text())
    record["head_entropy"] = list(np.linspace(0.1, 1.2, 12))
    record["switch_head_entropy"] = [float("nan")] * 8 + [0.5, 0.25, 0.0, 0.25]
    path.write_text(json.dumps(record))

    rows = seed_table.seed_rows(continual.load_records(str(tmp_path)), setting, 1)
    assert [r["method"] for r in rows] == ["ppo", "ppo_l2"]
    for r in rows:
        e, f = ends[r["method"]][1], fresh[r["method"]][1]
        assert r["late_mean"] == pytest.approx(e[6:].mean()) and r["late_min"] == pytest.approx(e[6:].min())
        assert r["fresh_tasks"] == sample  # both on the grid's sample, though ppo has every late fresh agent
        assert r["ratio_of_means"] == pytest.approx(e[sample].sum() / f[sample].sum())
        assert r["fresh"] == pytest.approx(f[sample].tolist())
        assert r["cpu_min"] == pytest.approx(1.0)
    ppo, l2 = rows
    assert ppo["head_entropy"] == pytest.approx(np.linspace(0.1, 1.2, 12)[6:].mean())
    assert ppo["switch_head_entropy"] == pytest.approx(0.25)  # the mean of the late tasks that have a reading
    assert l2["head_entropy"] is None and l2["switch_head_entropy"] is None
    # a run whose fresh agents miss part of the sample: the late tasks it has
    (tmp_path / "runs" / "ppo_l2" / "fresh" / f"seed1_task{sample[0]}.json").unlink()
    l2 = seed_table.seed_rows(continual.load_records(str(tmp_path)), setting, 1)[1]
    assert l2["fresh_tasks"] == sample[1:]
    text = seed_table.markdown(rows, "tiny", setting, 1)
    assert "| ppo | " in text and f"({' '.join(map(str, sample))})" in text and "tasks 6-11" in text
    assert "| 0.95 / 0.25 |" in text


def test_cli_writes_the_table_and_refuses_a_missing_seed(seed_table, continual, tmp_path, capsys):
    rng = np.random.default_rng(8)
    setting = _tiny_bandit(continual, tasks=4)
    _synthetic_runs(tmp_path, setting, {"ppo": (rng.uniform(size=(1, 4)), rng.uniform(0.5, 1, size=(1, 4)))})
    assert seed_table.main(["--setting", "bandit", "--seed", "0", "--out", str(tmp_path), "--write"]) == 0
    written = (tmp_path / "seed0.md").read_text()
    assert written == capsys.readouterr().out and "| ppo | " in written and "tasks 2-3" in written
    assert seed_table.main(["--setting", "bandit", "--seed", "3", "--out", str(tmp_path)]) == 1
    assert "no continual run of seed 3" in capsys.readouterr().err
