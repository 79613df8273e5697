"""The single-task probe table of bench/README.md ("Why the penalty's fresh agents learn slowly here"): for every arm
of a ``--tasks 1`` folder of ``bench/continual.py`` (fresh agents on each seed's first task), the end-of-task return
of each seed and their mean, Welch's t of the arm's returns against the plain agent's (``rl_stats.welch_t_ci``), and
what the monitor's last pass and the recorder read at the task's end: the policy's weight norm, its hidden layers'
DfI (``||Gram - s I||_F^2``, ``s`` the arm's ``isometry_scale``) and the output head's logit std, each the mean over
the seeds. Everything is read from the committed run JSONs::

    python bench/single_task_table.py bench/results/continual/minatar_intensive_task0
    python bench/single_task_table.py bench/results/continual/minatar_intensive_task0 --plain ppo --methods ppo plastic_relu
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_stats import welch_t_ci

#: the monitor's keys the table reads (their last pass)
NORM, DFI_HIDDEN = "plasticity/policy/weight_norm", "plasticity/policy/dfi_hidden"


def _last(diagnostics: dict[str, Any], key: str) -> float:
    passes = diagnostics.get(key) or []
    return float(passes[-1][1]) if passes else float("nan")


def load_arms(folder: str, seeds: Optional[list[int]] = None) -> dict[str, list[dict[str, Any]]]:
    """``method -> [one dict per seed, by seed]`` for the single-task continual runs in ``folder``/runs (fresh agents
    and claim files are not runs of the table), only those of ``seeds`` where given (a table written at 3 seeds stays
    rebuildable after more seeds join the folder).

    :raises ValueError: for a folder without such runs, or a run of more than one task (naming the file)."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "runs", "*", "seed*.json"))):
        with open(path) as f:
            record = json.load(f)
        if seeds is not None and int(record["seed"]) not in seeds:
            continue
        if len(record["end_return"]) != 1:
            raise ValueError(f"{path} is a run of {len(record['end_return'])} tasks; this table reads --tasks 1 folders")
        arms.setdefault(record["method"], []).append(dict(
            seed=int(record["seed"]),
            ret=float(record["end_return"][0]),
            norm=_last(record.get("diagnostics", {}), NORM),
            dfi_hidden=_last(record.get("diagnostics", {}), DFI_HIDDEN),
            logit_std=float((record.get("head_logit_std") or [float("nan")])[0]),
        ))
    if not arms:
        raise ValueError(f"no single-task runs in {os.path.join(folder, 'runs')} (expected <method>/seed<N>.json)")
    return {m: sorted(runs, key=lambda r: r["seed"]) for m, runs in arms.items()}


def table_rows(arms: dict[str, list[dict[str, Any]]], plain: str = "ppo",
               methods: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """One row per arm (``methods`` in their order, default every arm, the plain one first): ``returns``, ``mean``,
    ``vs_plain`` (:func:`rl_stats.welch_t_ci`; ``None`` for the plain arm) and the seeds' means of ``norm``,
    ``dfi_hidden`` and ``logit_std``.

    :raises ValueError: where ``plain`` or a requested method has no runs (naming it and the arms there are)."""
    names = methods or [plain, *sorted(m for m in arms if m != plain)]
    for name in [plain, *names]:
        if name not in arms:
            raise ValueError(f"no runs of {name!r} in the folder; its arms: {sorted(arms)}")
    base = np.array([r["ret"] for r in arms[plain]])
    rows = []
    for name in names:
        runs = arms[name]
        returns = np.array([r["ret"] for r in runs])
        rows.append(dict(
            method=name,
            seeds=[r["seed"] for r in runs],
            returns=returns.tolist(),
            mean=float(returns.mean()),
            vs_plain=None if name == plain else welch_t_ci(returns, base),
            **{key: float(np.mean([r[key] for r in runs])) for key in ("norm", "dfi_hidden", "logit_std")},
        ))
    return rows


def markdown(rows: list[dict[str, Any]], plain: str) -> str:
    """The rows as the markdown table of bench/README.md."""
    lines = [f"| arm | end-of-task return per seed | mean | vs {plain} (Welch's t, 95 %) | policy weight norm | "
             "DfI, hidden layers | head logit std |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["vs_plain"]
        vs = "-" if v is None else f"{v['difference']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}], p {v['p']:.3f}"
        per_seed = " / ".join(f"{x:.1f}" for x in r["returns"])
        lines.append(f"| {r['method']} | {per_seed} | {r['mean']:.1f} | {vs} | {r['norm']:.1f} | "
                     f"{r['dfi_hidden']:.3g} | {r['logit_std']:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a bench/continual.py output folder of --tasks 1 runs")
    parser.add_argument("--plain", default="ppo", help="the arm the others are tested against (default ppo)")
    parser.add_argument("--methods", nargs="+", help="the arms, in this order (default: every arm, the plain one first)")
    parser.add_argument("--seeds", nargs="+", type=int, help="only these seeds (default: every seed in the folder)")
    args = parser.parse_args(argv)
    print(markdown(table_rows(load_arms(args.folder, args.seeds), args.plain, args.methods), args.plain))


if __name__ == "__main__":
    main()
