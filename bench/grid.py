"""Spread bench/continual.py's grid of (setting, method, seed) cells over machines: one optuna study, a GridSampler.

Every worker (any number, on any machine that reaches the storage) runs ``python bench/grid.py --storage URL ...``
with the same grid arguments; each pulls the next cell that no trial has started, runs it with
:func:`continual.run_cell` (the continual run and its fresh-agent references, every part skipped whose JSON already
exists) and writes the per-run JSON files of bench/continual.py under ``<out-root>/<setting>/`` (so
``bench/continual.py --setting S --out <out-root>/S --plot-only`` builds the tables and figures). The trial's value
is the cell's mean score over the last half of its tasks. The workers stop when every cell is finished.

The storage is the one the tuning uses (``sb3-plastic train -optimize --storage``): an sqlite file on one machine,
PostgreSQL (``postgresql://user:password@host/db``) across machines. Resuming: a rerun of the same command continues
the study; a finished cell (a COMPLETE trial, or JSON files on disk) is never rerun; a cell whose worker died is
marked failed by optuna's heartbeat (``--heartbeat`` seconds) and retried once by another worker
(:func:`retry_callback`), which takes over the dead worker's run claims (``bench/continual_runs.py``'s ``claim_run``:
a run is trained by one process at a time); a worker that finds only cells other workers are running stops.

Examples::

    python bench/grid.py --storage sqlite:///bench/results/continual/grid.db --study issue14 \
        --settings minatar_intensive --methods all --seeds 0 1 2 3 4          # one worker; start more the same way
    python bench/grid.py --storage postgresql://u:p@db/grid --study issue14 --settings minatar_intensive \
        --methods all --seeds 0 1 2 3 4 --device cuda                          # a GPU worker
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

BENCH = Path(__file__).resolve().parent


def _continual() -> Any:
    if "bench_continual" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_continual", BENCH / "continual.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_continual"]


def grid_config(args: argparse.Namespace) -> dict[str, Any]:
    """What every worker of a study must agree on (stored in the study's user attributes and checked on joining)."""
    return {
        "settings": list(args.settings),
        "methods": list(args.methods),
        "seeds": list(args.seeds),
        "tasks": args.tasks,
        "change_every": args.change_every,
        "fresh": args.fresh,
        "ppo_kwarg": list(args.ppo_kwarg),
        "out_root": str(args.out_root),
    }


def grid_methods(continual: Any, methods: list[str]) -> list[str]:
    """The grid's method axis: ``methods`` (any algorithm's names, or ``all``) as :data:`continual.METHODS` names;
    a cell runs the method under its name on the cell's setting (``ppo_l2`` on a DQN setting: ``dqn_l2``). ``all``
    leaves out the PPO-only methods (:data:`continual.PPO_ONLY_METHODS`), which a DQN setting's cells could not run;
    name them to have them."""
    everything = [m for m in continual.METHODS if m not in continual.PPO_ONLY_METHODS]
    chosen = everything if "all" in methods else methods
    return list(dict.fromkeys(continual.canonical_method(m) for m in chosen))


def _retry_class() -> Any:
    """optuna's callback class that re-enqueues a trial its heartbeat declared stale
    (``RetryHeartbeatStaleTrialCallback``; ``RetryFailedTrialCallback`` before optuna 4.9)."""
    import optuna

    return getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback


def retry_callback(max_retry: int = 1) -> Any:
    """An instance of :func:`_retry_class` (its experimental-API warning silenced here only)."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _retry_class()(max_retry=max_retry)


def is_retry(trial: Any) -> bool:
    """Whether ``trial`` is the heartbeat's retry of a failed trial (its worker was declared dead)."""
    import warnings

    import optuna

    frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _retry_class().retried_trial_number(frozen) is not None


def _rdb_storage(rdb_class: Any, storage: str, heartbeat: int) -> Any:
    """``RDBStorage`` with the heartbeat and the retry callback: passed as ``heartbeat_stale_trial_callback`` where
    optuna has that name (4.9 deprecates ``failed_trial_callback`` with a FutureWarning), the heartbeat's
    experimental-API warning silenced here only (the heartbeat is what declares a dead worker's trial stale)."""
    import inspect
    import warnings

    import optuna

    name = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in
            inspect.signature(rdb_class.__init__).parameters else "failed_trial_callback")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return rdb_class(storage, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                         **{name: retry_callback(max_retry=1)})


def make_study(storage: str, study_name: str, config: dict[str, Any], heartbeat: int) -> Any:
    """The study on ``storage`` (created, or joined when it exists with the same grid)."""
    import optuna
    from optuna.storages import RDBStorage

    continual = _continual()
    space = {"setting": config["settings"], "method": grid_methods(continual, config["methods"]), "seed": config["seeds"]}
    for attempt in range(5):  # workers started together race to create the schema / the study: the loser retries
        try:
            rdb = _rdb_storage(RDBStorage, storage, heartbeat)
            study = optuna.create_study(storage=rdb, study_name=study_name, load_if_exists=True,
                                        direction="maximize", sampler=optuna.samplers.GridSampler(space, seed=0))
            break
        except Exception as exc:  # sqlalchemy's IntegrityError / OperationalError, optuna's DuplicatedStudyError
            if attempt == 4:
                raise
            print(f"joining study {study_name!r} failed ({type(exc).__name__}), retrying", file=sys.stderr)
            time.sleep(1.0 + attempt)
    stored = study.user_attrs.get("grid")
    if stored is None:
        study.set_user_attr("grid", config)
    elif stored != config:
        raise ValueError(f"study {study_name!r} on {storage} holds another grid: {stored}; this worker's: {config}")
    return study


def objective_for(args: argparse.Namespace) -> Any:
    import optuna

    continual = _continual()
    params = continual.MethodParams()

    def objective(trial: optuna.Trial) -> float:
        name = trial.suggest_categorical("setting", args.settings)
        canonical = trial.suggest_categorical("method", grid_methods(continual, args.methods))
        seed = trial.suggest_categorical("seed", args.seeds)
        method = continual.method_name(canonical, continual.SETTINGS[name].algo)
        # Once every cell has started, GridSampler hands out a random cell: one another worker is running, or one
        # already finished (its files are on disk, but a second COMPLETE trial would count the cell twice). Either
        # way nothing is left for this worker: stop here.
        states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
        taken = [t for t in trial.study.get_trials(deepcopy=False, states=states)
                 if t.number != trial.number and t.params == trial.params]
        if taken:
            trial.study.stop()
            how = "running" if taken[0].state == optuna.trial.TrialState.RUNNING else "finished"
            raise optuna.TrialPruned(f"cell {how} in trial {taken[0].number}")
        overrides = continual.parse_ppo_kwargs(args.ppo_kwarg, continual.SETTINGS[name].algo)
        setting = continual.resolve_setting(name, tasks=args.tasks, change_every=args.change_every, overrides=overrides)
        out = os.path.join(args.out_root, name)
        start = time.time()
        # a retry runs after optuna's heartbeat declared the first worker dead: its run claims are taken over
        record = continual.run_cell(method, seed, setting, params, out, args.device, args.threads, args.fresh,
                                    take_over=is_retry(trial))
        score = np.asarray(continual._score(record, setting), dtype=float)
        trial.set_user_attr("out", out)
        trial.set_user_attr("seconds", time.time() - start)
        trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
        trial.set_user_attr("method_name", method)
        return float(np.nan_to_num(score[len(score) // 2:].mean(), nan=-np.inf))

    return objective


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    continual = _continual()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage", required=True, help="optuna storage URL: sqlite:///file.db or postgresql://...")
    p.add_argument("--study", required=True, help="study name (every worker of a grid uses the same)")
    p.add_argument("--settings", nargs="+", required=True, choices=sorted(continual.SETTINGS))
    p.add_argument("--methods", nargs="+", default=list(continual.DEFAULT_METHODS),
                   choices=[*continual.ALL_METHOD_NAMES, "all"], help="methods (PPO names are mapped per setting)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--tasks", type=int, help="number of tasks (default: each setting's)")
    p.add_argument("--change-every", type=int, help="task length per env copy (default: each setting's)")
    p.add_argument("--fresh", choices=continual.FRESH_CHOICES, default="all")
    p.add_argument("--ppo-kwarg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out-root", default=os.path.join("bench", "results", "continual"),
                   help="the runs of setting S go to <out-root>/S (bench/continual.py's layout)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--heartbeat", type=int, default=60, help="seconds between a worker's heartbeats")
    p.add_argument("--max-cells", type=int, help="stop this worker after that many cells")
    args = p.parse_args(argv)
    for name in ("tasks", "change_every", "threads", "heartbeat", "max_cells"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    import optuna

    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = make_study(args.storage, args.study, grid_config(args), args.heartbeat)
    study.optimize(objective_for(args), n_trials=args.max_cells, catch=(Exception,))
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    print(json.dumps({"study": args.study, "trials": len(states), **{s: states.count(s) for s in sorted(set(states))}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
