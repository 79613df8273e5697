"""One seed of every method of a continual-RL folder, side by side (the "hints, not findings" tables of bench/README:
the methods' first seed on a setting whose grid is still running).

Per method with a continual run of the seed, over the run's last half of the tasks: the mean and the lowest
end-of-task score, the ratio of means sum(continual) / sum(fresh) over the seed's fresh sample
(``continual.fresh_sample``, the tasks every method of the grid has; a run without all of them: the late tasks it has
fresh agents on) with those fresh scores (a task-change method's fresh agents are plain PPO's, copied into its
folder), the output head's entropy at the tasks' ends (``head_entropy``) and, for runs that recorded it, as the tasks
found it (``switch_head_entropy``: saturated by the switch, or while training), and the CPU minutes of the run.
Everything is read from the committed run JSONs (``bench/continual.py``'s ``runs/``)::

    python bench/seed_table.py --setting minatar_intensive --seed 0
    python bench/seed_table.py --setting cchain_cartpole --seed 0 --write   # also writes <out>/seed0.md
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import continual


def _late_mean(values: Optional[list[float]], late: slice) -> Optional[float]:
    if not values:
        return None
    cells = np.asarray(values[late], dtype=float)
    cells = cells[np.isfinite(cells)]
    return float(cells.mean()) if cells.size else None


def seed_rows(records: list[dict], setting: continual.Setting, seed: int) -> list[dict[str, Any]]:
    """The table's rows (one per method with a continual run of ``seed``), in the order of
    :data:`continual.ALL_METHOD_NAMES`."""
    order = {m: i for i, m in enumerate(continual.ALL_METHOD_NAMES)}
    runs = sorted((r for r in records if r["seed"] == seed and r.get("fresh_task") is None),
                  key=lambda r: order.get(r["method"], len(order)))
    rows = []
    for run in runs:
        scores = continual._score(run, setting)
        n = len(scores)
        late = slice(n // 2, n)
        fresh = {r["fresh_task"]: continual._score(r, setting)[0] for r in records
                 if r["method"] == run["method"] and r["seed"] == seed and r.get("fresh_task") is not None
                 and n // 2 <= r["fresh_task"] < n}
        sample = continual.fresh_sample(setting, seed)
        tasks = sample if set(sample) <= set(fresh) else sorted(fresh)  # the grid's sample, where the run has it
        ratio = (sum(scores[k] for k in tasks) / sum(fresh[k] for k in tasks)
                 if tasks and sum(fresh[k] for k in tasks) > 0 else None)
        rows.append({
            "method": run["method"],
            "tasks": n,
            "late_mean": float(np.mean(scores[late])),
            "late_min": float(np.min(scores[late])),
            "fresh_tasks": tasks,
            "fresh": [float(fresh[k]) for k in tasks],
            "ratio_of_means": ratio,
            "head_entropy": _late_mean(run.get("head_entropy"), late),
            "switch_head_entropy": _late_mean(run.get("switch_head_entropy"), late),
            "cpu_min": float(run["cpu_seconds"]) / 60,
        })
    return rows


def _text(value: Optional[float], fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[dict[str, Any]], setting_name: str, setting: continual.Setting, seed: int) -> str:
    score = continual.SCORE_LABELS[setting.score]
    n = max(r["tasks"] for r in rows)
    lines = [f"setting={setting_name}, seed {seed}: {score}, tasks {n // 2}-{n - 1} (one seed: hints, not findings). "
             "Ratio of means: sum(continual) / sum(fresh) over the seed's fresh sample (the tasks in brackets). "
             "Head entropy: mean over those tasks of the policy's entropy at a task's end / as the task found it "
             "(its first steps; '-' for runs that did not record it).", "",
             "| method | mean | lowest | fresh agents (tasks) | ratio of means | head entropy: end / switch | CPU-min |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fresh = (", ".join(f"{v:.3g}" for v in r["fresh"]) + f" ({' '.join(map(str, r['fresh_tasks']))})"
                 if r["fresh"] else "-")
        lines.append(f"| {r['method']} | {r['late_mean']:.3g} | {r['late_min']:.3g} | {fresh} | "
                     f"{_text(r['ratio_of_means'])} | {_text(r['head_entropy'], '.2g')} / "
                     f"{_text(r['switch_head_entropy'], '.2g')} | {r['cpu_min']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setting", required=True, choices=sorted(continual.SETTINGS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="results folder (default bench/results/continual/<setting>)")
    p.add_argument("--write", action="store_true", help="also write <out>/seed<k>.md")
    args = p.parse_args(argv)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "continual", args.setting)
    setting = continual.SETTINGS[args.setting]
    rows = seed_rows(continual.load_records(out), setting, args.seed)
    if not rows:
        print(f"error: no continual run of seed {args.seed} under {os.path.join(out, 'runs')}", file=sys.stderr)
        return 1
    text = markdown(rows, args.setting, setting, args.seed)
    print(text, end="")
    if args.write:
        with open(os.path.join(out, f"seed{args.seed}.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
