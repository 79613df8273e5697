"""bench/grid.py: one optuna study with a GridSampler spreads bench/continual.py's (setting, method, seed) cells
over workers; two local workers share one sqlite study (PostgreSQL as tests/test_zoo.py sets it up), every cell
runs once, and a finished cell is never rerun (neither by the same study nor by a new one over the same files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from bench_modules import load_bench
from test_zoo import _postgres_url

BENCH = Path(__file__).resolve().parent.parent / "bench"
GRID = ["--settings", "bandit", "--methods", "ppo", "plastic_relu", "--seeds", "0", "1", "--tasks", "2",
        "--change-every", "16", "--ppo-kwarg", "n_steps=16", "--heartbeat", "5"]


def _worker(storage, study, out, *extra):
    cmd = [sys.executable, str(BENCH / "grid.py"), "--storage", storage, "--study", study, "--out-root", str(out),
           *GRID, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _finish(*procs):
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]


def _two_workers(storage, study, tmp_path):
    out = tmp_path / "results"
    _finish(_worker(storage, study, out), _worker(storage, study, out))
    trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    cells = {(t.params["setting"], t.params["method"], t.params["seed"]) for t in done}
    assert cells == {("bandit", m, s) for m in ("ppo", "plastic_relu") for s in (0, 1)} and len(done) == 4
    files = sorted((out / "bandit" / "runs").rglob("*.json"))
    assert len(files) == 4 * 3  # per cell: the continual run and the fresh agents of its 2 tasks
    for t in done:
        record = json.loads((out / "bandit" / "runs" / t.params["method"] / f"seed{t.params['seed']}.json").read_text())
        assert t.value == pytest.approx(sum(record["end_reward"][1:]) / 1)
    mtimes = {p: os.stat(p).st_mtime_ns for p in files}

    _finish(_worker(storage, study, out))  # the grid is finished: nothing is trained again
    assert {p: os.stat(p).st_mtime_ns for p in (out / "bandit" / "runs").rglob("*.json")} == mtimes
    _finish(_worker(storage, study + "-again", out))  # a new study over the same files: every part is on disk
    assert {p: os.stat(p).st_mtime_ns for p in (out / "bandit" / "runs").rglob("*.json")} == mtimes
    again = optuna.load_study(study_name=study + "-again", storage=storage).get_trials()
    assert sorted(t.value for t in again) == sorted(t.value for t in done)

    # another grid under the same study name is refused, naming both
    proc = _worker(storage, study, out, "--fresh", "none")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "holds another grid" in err


def test_two_workers_share_one_sqlite_study(tmp_path):
    _two_workers(f"sqlite:///{tmp_path / 'grid.db'}?timeout=60", "grid", tmp_path)


def test_two_workers_share_one_postgres_study(tmp_path):
    url = _postgres_url()
    name = f"grid-{os.getpid()}-{tmp_path.name}"
    try:
        _two_workers(url, name, tmp_path)
    finally:  # the server outlives the test: its studies go (_two_workers makes two)
        for study in (name, name + "-again"):
            try:
                optuna.delete_study(study_name=study, storage=url)
            except KeyError:
                pass
    assert not {name, name + "-again"} & set(optuna.get_all_study_names(storage=url))


def test_a_cell_finished_by_another_worker_is_not_run_again(tmp_path, monkeypatch):
    """The race behind a duplicate COMPLETE trial: once every cell has started, optuna's GridSampler hands a worker
    a random cell, possibly one another worker has already finished; that cell must be pruned, not rerun."""
    grid = load_bench("grid")
    args = grid.parse_args(["--storage", "sqlite://", "--study", "s", "--out-root", str(tmp_path), *GRID])
    continual = grid._continual()
    monkeypatch.setattr(continual, "run_cell", lambda *a, **k: pytest.fail("a finished cell was run again"))
    study = optuna.create_study(direction="maximize")
    cell = {"setting": "bandit", "method": "ppo", "seed": 0}
    dists = {"setting": optuna.distributions.CategoricalDistribution(["bandit"]),
             "method": optuna.distributions.CategoricalDistribution(["ppo", "plastic_relu"]),
             "seed": optuna.distributions.CategoricalDistribution([0, 1])}
    study.add_trial(optuna.trial.create_trial(params=cell, distributions=dists, value=0.5))
    study.enqueue_trial(cell)
    study.optimize(grid.objective_for(args), n_trials=1)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]


def test_a_retried_trial_takes_over_the_dead_workers_run_claims(tmp_path, monkeypatch):
    """A worker that dies leaves its run's claim file; optuna's heartbeat marks its trial failed and the retry
    callback enqueues a retry, which must take the claim over (a first attempt respects claims)."""
    grid = load_bench("grid")
    args = grid.parse_args(["--storage", "sqlite://", "--study", "s", "--out-root", str(tmp_path), *GRID])
    continual = grid._continual()
    calls = []

    def run_cell(*a, **k):
        calls.append(k["take_over"])
        if not k["take_over"]:
            raise continual.RunClaimedError("claimed by pid 1 on a host that is gone")
        return {"end_reward": [0.5]}

    monkeypatch.setattr(continual, "run_cell", run_cell)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"setting": "bandit", "method": "ppo", "seed": 0})
    study.optimize(grid.objective_for(args), n_trials=1, catch=(continual.RunClaimedError,))
    assert calls == [False] and study.trials[0].state == optuna.trial.TrialState.FAIL
    grid.retry_callback(max_retry=1)(study, study.trials[0])  # what the heartbeat's callback does
    study.optimize(grid.objective_for(args), n_trials=1)
    assert calls == [False, True]  # the retry takes the claims over
    assert study.trials[1].state == optuna.trial.TrialState.COMPLETE


def test_make_study_warns_nothing_it_could_avoid(tmp_path):
    """optuna >= 4.9 deprecates ``failed_trial_callback`` (a FutureWarning in every worker's log): the study passes the
    stale-trial callback under its current name, and the heartbeat's experimental-API warning is expected and silenced."""
    import warnings

    grid = load_bench("grid")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = grid.make_study(f"sqlite:///{tmp_path / 'g.db'}", "s",
                                grid.grid_config(grid.parse_args(["--storage", "x", "--study", "s", *GRID])), 5)
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
    assert [str(w.message) for w in caught if "heartbeat" in str(w.message)] == []
    storage = study._storage._backend if hasattr(study._storage, "_backend") else study._storage
    assert storage.heartbeat_interval == 5 and storage.failed_trial_callback is not None
