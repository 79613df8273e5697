"""How far each method's policy weights grow over a continual run, beside what the run returns (bench/README.md, the
card's section: "Weight growth is not the loss"). For every method of a ``bench/continual.py`` folder, over its
continual runs (fresh agents are not read): the policy's weight norm (the monitor's ``plasticity/policy/weight_norm``)
at its last pass before the end of chosen tasks, and the run's mean end-of-task return over its last half of tasks,
each the mean over the seeds. Everything is read from the committed run JSONs::

    python bench/weight_norm_table.py bench/results/continual/minatar_intensive
    python bench/weight_norm_table.py bench/results/continual/minatar_intensive --tasks 0 9 19 --methods ppo ppo_snp
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Any, Optional

import numpy as np

#: the monitor's key the table reads
NORM = "plasticity/policy/weight_norm"


def norm_before(passes: list[list[float]], step: float) -> float:
    """The weight norm of the monitor's last pass strictly before env step ``step`` (a pass at a task's last step
    may already see what a task-change intervention did to the next task's weights), NaN where there is none."""
    before = [value for at, value in passes if at < step]
    return float(before[-1]) if before else float("nan")


def load_runs(folder: str, tasks: list[int]) -> dict[str, list[dict[str, Any]]]:
    """``method -> [one dict per seed, by seed]``: ``seed``, ``norms`` (one per task of ``tasks``, read at
    ``(task + 1) * change_every * n_envs`` env steps) and ``last_half`` (the mean end-of-task return over the run's
    last half of tasks).

    :raises ValueError: for a folder without continual runs, or a task index the run does not have (naming both)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "runs", "*", "seed*.json"))):
        with open(path) as f:
            record = json.load(f)
        returns = record["end_return"]
        bad = [t for t in tasks if not 0 <= t < len(returns)]
        if bad:
            raise ValueError(f"{path} has {len(returns)} tasks; task indices {bad} are not among them")
        setting = record["setting"]
        task_steps = setting["change_every"] * setting["n_envs"]
        passes = record.get("diagnostics", {}).get(NORM) or []
        runs.setdefault(record["method"], []).append(dict(
            seed=int(record["seed"]),
            norms=[norm_before(passes, (t + 1) * task_steps) for t in tasks],
            last_half=float(np.mean(returns[len(returns) // 2:])),
        ))
    if not runs:
        raise ValueError(f"no continual runs in {os.path.join(folder, 'runs')} (expected <method>/seed<N>.json)")
    return {m: sorted(r, key=lambda x: x["seed"]) for m, r in runs.items()}


def table_rows(runs: dict[str, list[dict[str, Any]]], methods: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """One row per method (``methods`` in their order, default: by last-half return, highest first): ``seeds``,
    ``norms`` (the seeds' mean per task) and ``last_half`` (the seeds' mean).

    :raises ValueError: for a requested method without runs (naming it and the methods there are)."""
    names = methods or sorted(runs, key=lambda m: -np.mean([r["last_half"] for r in runs[m]]))
    for name in names:
        if name not in runs:
            raise ValueError(f"no continual runs of {name!r} in the folder; its methods: {sorted(runs)}")
    return [dict(method=name, seeds=[r["seed"] for r in runs[name]],
                 norms=np.mean([r["norms"] for r in runs[name]], axis=0).tolist(),
                 last_half=float(np.mean([r["last_half"] for r in runs[name]])))
            for name in names]


def markdown(rows: list[dict[str, Any]], tasks: list[int]) -> str:
    """The rows as the markdown table of bench/README.md."""
    heads = " | ".join(f"norm, end of task {t}" for t in tasks)
    lines = [f"| method | seeds | {heads} | last-half return (mean) |", "|---|---|" + "---|" * len(tasks) + "---|"]
    for r in rows:
        norms = " | ".join(f"{x:.1f}" for x in r["norms"])
        lines.append(f"| {r['method']} | {len(r['seeds'])} | {norms} | {r['last_half']:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a bench/continual.py output folder")
    parser.add_argument("--tasks", nargs="+", type=int, default=[0, 9, 19], help="task indices (default 0 9 19)")
    parser.add_argument("--methods", nargs="+", help="the methods, in this order (default: by last-half return)")
    args = parser.parse_args(argv)
    print("policy weight norm (the monitor's last pass before each task's end), mean over seeds")
    print(markdown(table_rows(load_runs(args.folder, args.tasks), args.methods), args.tasks))


if __name__ == "__main__":
    main()
