"""What the grid workers have left, and its CPU-hours: the runs that bench/card_envs_grid.sh and bench/protocol_grid.sh
would still train, read from the scripts themselves (``GRID_PLAN=1`` makes their ``run`` print each call's arguments
instead of running it) and from the run JSONs and checkpoints on disk.

Per call of the list, in its order: the continual runs and fresh agents not yet written, how far the ones in progress
are (their latest checkpoint), and the CPU-hours they need, estimated from the finished runs of the same folder and
method (the median ``cpu_seconds`` of its continual runs, of its fresh agents), else of the folder's plain agent, else
(a call writing to another folder with the setting's own hyperparameters, e.g. ``--tasks 40``) per env step from the
setting's own folder, else marked unknown. A fresh agent of a method told of the task switch is the plain agent's
(reused, no cost). A run listed by both scripts (bench/protocol_grid.sh ends by walking the card's list) is counted
once, where it comes first. Nothing is trained or written.

    python bench/queue_status.py --assume cchain_lunar=63   # both scripts, every call with work left
    python bench/queue_status.py --factor dqn_cchain=1.6     # a method costlier than the plain agent, before its runs
    python bench/queue_status.py --scripts bench/card_envs_grid.sh --all
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import continual
import run_checkpoint
from continual_methods import TASK_CHANGE_METHODS, canonical_method, method_name
from continual_runs import checkpoint_root, run_parts, run_path

SCRIPTS = ("bench/card_envs_grid.sh", "bench/protocol_grid.sh")
RESULTS = Path("bench", "results", "continual")  # a setting's own folder: RESULTS / <setting>


def planned_calls(script: str) -> list[list[str]]:
    """The argument lists of the bench/continual.py calls ``script`` makes, in order (``GRID_PLAN=1``).

    :raises ValueError: for a grid script (``script`` or one beside it, which it may call) without the plan mode:
        it would train instead of printing.
    """
    for grid in {Path(script), *Path(script).parent.glob("*_grid.sh")}:
        if "GRID_PLAN" not in grid.read_text():
            raise ValueError(f"{grid} has no GRID_PLAN mode: running it would train runs, not list them")
    done = subprocess.run(["bash", script], env={**os.environ, "GRID_PLAN": "1"}, capture_output=True, text=True,
                          check=True)
    return [shlex.split(line[len("PLAN "):]) for line in done.stdout.splitlines() if line.startswith("PLAN ")]


@functools.cache
def _median_cpu(out: str, method: str, fresh: bool) -> Optional[float]:
    folder = Path(out, "runs", method, "fresh") if fresh else Path(out, "runs", method)
    seconds = []
    for path in folder.glob("seed*.json"):
        record = json.loads(path.read_text())
        if "reused_from" not in record and record.get("cpu_seconds"):
            seconds.append(float(record["cpu_seconds"]))
    return statistics.median(seconds) if seconds else None


@functools.cache
def _checkpoint_rate(out: str) -> Optional[float]:
    """CPU seconds per timestep of the runs in progress under ``out`` (their latest checkpoints), or ``None``."""
    rates = []
    for latest in Path(out, "ckpt").glob("*/*/latest"):
        folder = run_checkpoint.latest(str(latest.parent))
        if folder is None:
            continue
        with open(os.path.join(folder, "state.pkl"), "rb") as f:
            state = pickle.load(f)
        step = int(os.path.basename(folder).removeprefix("step"))
        if isinstance(state, dict) and state.get("cpu_seconds") and step:
            rates.append(float(state["cpu_seconds"]) / step)
    return statistics.median(rates) if rates else None


def _cost(out: str, method: str, plain: str, fresh: bool, task_share: float, factor: float = 1.0) -> Optional[float]:
    """CPU seconds of one run: finished runs of ``method``, else of the plain agent times ``factor`` (the method's cost
    relative to it), in ``out``; a fresh agent without finished fresh runs costs a continual run's ``task_share`` (one
    task of its steps) (``None`` when no finished run gives it)."""

    def median(fresh_runs: bool) -> Optional[float]:
        own = _median_cpu(out, method, fresh_runs)
        plain_cost = _median_cpu(out, plain, fresh_runs)
        return own if own is not None else None if plain_cost is None else plain_cost * factor

    cost = median(fresh)
    if cost is None and fresh:
        continual_cost = median(False)
        cost = None if continual_cost is None else continual_cost * task_share
    return cost


def _done_fraction(out: str, method: str, seed: int, fresh_task: Optional[int], timesteps: int) -> float:
    latest = run_checkpoint.latest(checkpoint_root(out, method, seed, fresh_task))
    if latest is None:
        return 0.0
    step = int(os.path.basename(latest).removeprefix("step"))
    return min(step / timesteps, 1.0)


def call_status(argv: list[str], seen: set[tuple[str, str, int, Optional[int]]],
                assume: Optional[dict[str, float]] = None,
                factors: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """The work left of one bench/continual.py call: runs left (continual, fresh), the fraction of them already
    trained (checkpoints), and the CPU-hours left (runs whose cost nothing gives are counted in ``unknown``). Cells in
    ``seen`` (counted by an earlier call) are skipped and the call's own cells are added to it. ``assume`` gives the
    CPU-minutes of one continual run of a setting that has no finished or checkpointed run yet (e.g. from
    bench/setting_cost.py); ``factors`` a method's cost relative to the plain agent's, for a method with no finished
    run of its own in the folder (its cost is then the plain agent's times the factor: e.g. ``dqn_cchain``'s 1.6 on
    C-MinAtar, measured by bench/setting_cost.py)."""
    args = continual.parse_args(argv)
    setting = continual.resolve_setting(args.setting, args.quick, args.tasks, args.change_every, args.ppo_overrides)
    out = args.out or str(RESULTS / args.setting)
    # a call writing elsewhere with the setting's network and hyperparameters (e.g. more tasks) is priced per env step
    # from the setting's own folder until it has runs of its own
    own = continual.resolve_setting(args.setting, args.quick)
    own_out = None if args.ppo_overrides or Path(out) == RESULTS / args.setting else str(RESULTS / args.setting)
    methods = args.methods or [method_name(m, setting.algo) for m in continual.DEFAULT_METHODS]
    seeds = args.seeds if args.seeds is not None else [0, 1, 2]
    plain = method_name("ppo", setting.algo)
    left = {"continual": 0, "fresh": 0}
    hours, unknown = 0.0, 0
    for seed in seeds:
        for method in methods:
            for task in run_parts(setting, args.fresh, seed):
                if task is None and args.fresh_only:
                    continue
                key = (out, method, seed, task)
                if key in seen or os.path.exists(run_path(out, method, seed, task)):
                    continue
                seen.add(key)
                fresh = task is not None
                if fresh and canonical_method(method) in TASK_CHANGE_METHODS:
                    continue  # the plain agent's fresh run, copied
                left["fresh" if fresh else "continual"] += 1
                timesteps = setting.task_timesteps if fresh else setting.total_timesteps
                remaining = 1.0 - _done_fraction(out, method, seed, task, timesteps)
                factor = (factors or {}).get(method, 1.0)
                cost = _cost(out, method, plain, fresh, setting.task_timesteps / setting.total_timesteps, factor)
                if cost is None and own_out is not None:
                    own_cost = _cost(own_out, method, plain, fresh, own.task_timesteps / own.total_timesteps, factor)
                    own_steps = own.task_timesteps if fresh else own.total_timesteps
                    cost = None if own_cost is None else own_cost * timesteps / own_steps
                if cost is None:
                    rate = _checkpoint_rate(out)
                    cost = None if rate is None else rate * timesteps * factor
                if cost is None and assume and args.setting in assume:
                    cost = assume[args.setting] * 60 * (timesteps / setting.total_timesteps) * factor
                if cost is None:
                    unknown += 1
                else:
                    hours += remaining * cost / 3600
    return {"call": " ".join(argv), "out": out, "left": left, "cpu_hours": hours, "unknown": unknown}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), help="the grid scripts, in the order to count")
    parser.add_argument("--all", action="store_true", help="list the calls with nothing left too")
    parser.add_argument("--assume", nargs="+", default=[], metavar="SETTING=CPU_MIN",
                        help="CPU-minutes of a continual run of a setting with no run yet (fresh agents: one task's "
                             "share), e.g. cchain_lunar=63 (bench/setting_cost.py)")
    parser.add_argument("--factor", nargs="+", default=[], metavar="METHOD=X",
                        help="a method's cost relative to the plain agent's where it has no finished run of its own, "
                             "e.g. dqn_cchain=1.6 (bench/setting_cost.py)")
    args = parser.parse_args(argv)
    pairs = {}
    for option, values in (("--assume", args.assume), ("--factor", args.factor)):
        try:
            pairs[option] = {k: float(v) for k, v in (a.split("=", 1) for a in values)}
        except ValueError:
            parser.error(f"{option} takes NAME=NUMBER pairs, got {values}")
        bad = {k: v for k, v in pairs[option].items() if not v > 0}
        if bad:
            parser.error(f"{option} takes positive numbers, got {bad}")
    assume, factors = pairs["--assume"], pairs["--factor"]
    os.chdir(Path(__file__).resolve().parent.parent)  # the scripts' and the results' paths are the repository's
    calls = {script: planned_calls(script) for script in args.scripts}
    planned = [continual.parse_args(call) for script_calls in calls.values() for call in script_calls]
    unused = sorted(set(factors) - {m for a in planned for m in (a.methods or [])})
    unused += sorted(set(assume) - {a.setting for a in planned})
    if unused:
        parser.error(f"--assume / --factor name no setting or method of the scripts' calls: {unused}")
    seen: set[tuple[str, str, int, Optional[int]]] = set()
    total_hours, total_unknown = 0.0, 0
    for script in args.scripts:
        hours, unknown, runs = 0.0, 0, 0
        print(f"{script}:")
        for call in calls[script]:
            status = call_status(call, seen, assume, factors)
            n = status["left"]["continual"] + status["left"]["fresh"]
            hours += status["cpu_hours"]
            unknown += status["unknown"]
            runs += n
            if n or args.all:
                cost = f"~{status['cpu_hours']:.1f} CPU-h" + (f" + {status['unknown']} of unknown cost"
                                                              if status["unknown"] else "")
                print(f"  {status['left']['continual']} continual + {status['left']['fresh']} fresh left, {cost}: "
                      f"{status['call']}")
        print(f"  {script}: {runs} runs left, ~{hours:.1f} CPU-hours" + (f" + {unknown} runs of unknown cost"
                                                                          if unknown else ""))
        total_hours += hours
        total_unknown += unknown
    print(f"total: ~{total_hours:.1f} CPU-hours" + (f" + {total_unknown} runs of unknown cost" if total_unknown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
