"""bench/queue_status.py: the grid scripts' plan mode lists their calls without running them; the runs left and
their CPU-hours against a hand count on a folder of synthetic runs and a checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def queue_status():
    from bench_modules import load_bench

    return load_bench("queue_status")


@pytest.mark.parametrize("script", ["bench/card_envs_grid.sh", "bench/protocol_grid.sh"])
def test_plan_mode_lists_every_call_and_runs_none(queue_status, script):
    start = time.time()
    calls = queue_status.planned_calls(str(ROOT / script))
    assert time.time() - start < 20 and len(calls) > 20  # nothing trains: a real call takes minutes
    continual = sys.modules["continual"]
    for call in calls:
        args = continual.parse_args(call)
        assert args.setting in continual.SETTINGS and args.methods
    if script.endswith("protocol_grid.sh"):  # it ends by walking the card's list, in plan mode too
        card = queue_status.planned_calls(str(ROOT / "bench/card_envs_grid.sh"))
        assert any(calls[i:i + len(card)] == card for i in range(len(calls) - len(card) + 1))


def test_a_script_without_plan_mode_is_refused(queue_status, tmp_path):
    script = tmp_path / "other_grid.sh"
    script.write_text("python bench/continual.py --setting bandit\n")
    with pytest.raises(ValueError, match="no GRID_PLAN mode"):
        queue_status.planned_calls(str(script))


def _record(path: Path, seconds: float, fresh_task=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(cpu_seconds=seconds, fresh_task=fresh_task)))


def test_runs_left_and_hours_against_a_hand_count(queue_status, tmp_path):
    continual = sys.modules["continual"]
    out = tmp_path / "out"
    base = ["--setting", "bandit", "--tasks", "6", "--out", str(out), "--fresh", "sample"]
    setting = continual.resolve_setting("bandit", False, 6, None, {})
    sample = continual.continual_runs.fresh_sample(setting, 0)
    assert sample == [3, 4, 5]  # the whole last half of 6 tasks
    _record(out / "runs/ppo/seed0.json", 3600.0)
    for task in sample:
        _record(out / f"runs/ppo/fresh/seed0_task{task}.json", 600.0, task)
    # seed 1's continual run is half done (its checkpoint), seed 2 has not started
    folder = out / "ckpt/ppo/s1" / f"step{setting.total_timesteps // 2}"
    folder.mkdir(parents=True)
    (folder / "state.pkl").write_bytes(pickle.dumps({"cpu_seconds": 1800.0}))
    (folder.parent / "latest").write_text(folder.name)
    seen: set = set()
    status = queue_status.call_status([*base, "--methods", "ppo", "--seeds", "0", "1", "2"], seen)
    assert status["left"] == {"continual": 2, "fresh": 6} and status["unknown"] == 0
    assert status["cpu_hours"] == pytest.approx((0.5 * 3600 + 3600 + 6 * 600) / 3600)
    again = queue_status.call_status([*base, "--methods", "ppo", "--seeds", "1"], seen)  # counted once
    assert again["left"] == {"continual": 0, "fresh": 0} and again["cpu_hours"] == 0
    # a method told of the switch reuses the plain fresh agents; its cost is the plain agent's until it has runs
    told = queue_status.call_status([*base, "--methods", "ppo_fire_switch", "--seeds", "3"], set())
    assert told["left"] == {"continual": 1, "fresh": 0} and told["cpu_hours"] == pytest.approx(1.0)
    # a setting with no run: unknown, unless assumed (a fresh agent: one task's share of a continual run)
    other = ["--setting", "bandit", "--tasks", "6", "--out", str(tmp_path / "empty"), "--fresh", "sample",
             "--methods", "ppo", "--seeds", "0"]
    assert queue_status.call_status(other, set())["unknown"] == 4
    assumed = queue_status.call_status(other, set(), {"bandit": 60.0})
    assert assumed["unknown"] == 0 and assumed["cpu_hours"] == pytest.approx(1.0 + 3 / 6)
    # a method costlier than the plain agent (--factor): the plain agent's cost times its factor until it has runs
    costly = [*base, "--methods", "ppo_cchain", "--seeds", "3"]
    assert queue_status.call_status(costly, set(), factors={"ppo_cchain": 1.6})["cpu_hours"] == pytest.approx(
        1.6 * (1.0 + 3 * 600 / 3600))
    _record(out / "runs/ppo_cchain/seed0.json", 9000.0)  # its own finished run: the factor no longer scales it
    queue_status._median_cpu.cache_clear()  # the folder's costs are read once per command
    assert queue_status.call_status(costly, set(), factors={"ppo_cchain": 1.6})["cpu_hours"] == pytest.approx(
        2.5 + 1.6 * 3 * 600 / 3600)  # its fresh agents: still the plain agent's times the factor
    assert queue_status.call_status(other, set(), {"bandit": 60.0}, {"ppo": 2.0})["cpu_hours"] == pytest.approx(3.0)


def test_bad_assume_or_factor_values_are_refused_by_name():
    for option, value, allowed in (("--factor", "dqn_cchain", "NAME=NUMBER pairs"),
                                   ("--factor", "dqn_cchain=-1", "positive numbers"),
                                   ("--assume", "cminatar=x", "NAME=NUMBER pairs")):
        done = subprocess.run([sys.executable, str(ROOT / "bench/queue_status.py"), option, value],
                              capture_output=True, text=True)
        assert done.returncode == 2 and f"{option} takes {allowed}" in done.stderr
        assert value.split("=")[0] in done.stderr
    # a name that matches no call of the scripts would be ignored: refused by name
    done = subprocess.run([sys.executable, str(ROOT / "bench/queue_status.py"), "--factor", "dqn_chain=1.6"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "name no setting or method" in done.stderr and "dqn_chain" in done.stderr


def test_the_command_prints_a_total(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/queue_status.py"), "--scripts", "bench/card_envs_grid.sh"],
                          capture_output=True, text=True, check=True, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "bench/card_envs_grid.sh:" in done.stdout and done.stdout.strip().splitlines()[-1].startswith("total: ~")


def test_a_longer_run_of_a_setting_is_priced_from_the_settings_own_folder(queue_status, tmp_path, monkeypatch):
    """A call that writes elsewhere (``--out``) with more tasks, and no run of its own yet, is priced per env step
    from the setting's own folder (the same network and hyperparameters); one with changed PPO keywords is not."""
    continual = sys.modules["continual"]
    results = tmp_path / "results"
    monkeypatch.setattr(queue_status, "RESULTS", results)
    queue_status._median_cpu.cache_clear()
    default = continual.resolve_setting("bandit", False, None, None, {})
    _record(results / "bandit/runs/ppo/seed0.json", 3600.0)
    longer = ["--setting", "bandit", "--tasks", str(2 * default.tasks), "--out", str(tmp_path / "longer"),
              "--fresh", "none", "--methods", "ppo", "--seeds", "0"]
    status = queue_status.call_status(longer, set())
    assert status["unknown"] == 0 and status["cpu_hours"] == pytest.approx(2.0)
    changed = [*longer, "--ppo-kwarg", "n_epochs=20"]  # another update budget: its cost per step is not the folder's
    assert queue_status.call_status(changed, set())["unknown"] == 1
