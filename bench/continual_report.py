"""The report of bench/continual.py: the run JSONs read back (:func:`load_records`), their statistics
(:func:`summarise`: IQMs, plasticity, ratios of means, probability of improvement, verdicts), the tables
(:func:`markdown_table`), summary.json's rounding, and :func:`report` (tables, summary files and figures)."""

from __future__ import annotations

import itertools
import json
import math
import os
from typing import Any, Optional

import continual_figures
import numpy as np
from continual_methods import ALL_METHOD_NAMES, ARM_OF, canonical_method, method_name, task_parameters
from continual_recorder import DIAGNOSTICS, TRAIN_SCALARS, add_hidden_dfi, add_train_scalars
from continual_runs import fresh_sample
from continual_settings import SCORE_LABELS, Setting, setting_config
from rl_stats import (
    bootstrap_mean_ci,
    iqm_ci,
    paired_run_sums,
    ratio_of_means_ci,
    ratio_of_means_t_ci,
    rliable_metrics,
    stratified_bootstrap,
    welch_t_ci,
)

#: bootstrap resamples of the tables (over runs for IQM / probability of improvement, per task for the bands)
REPS = 2000
#: how the last-half IQM and probability-of-improvement intervals resample a runs x tasks matrix: whole runs, each
#: with all its tasks (:mod:`rl_stats`). A continual run is one agent over all tasks and its task sequence is drawn
#: per seed, so the run is the independent unit; until the thirtieth session these intervals used rliable's
#: stratified bootstrap (task columns resampled independently), which ignores the dependence between one run's tasks
#: (bench/README.md, "How the continual tables' intervals resample", compares the two).
RESAMPLE = "runs"


class NoRunsError(RuntimeError):
    """No finished run under ``--out``: nothing to build a table from (and nothing is written)."""


class SettingMismatchError(ValueError):
    """Runs under ``--out`` made with another setting than the command's (:func:`check_records_setting`)."""


def load_records(out: str) -> list[dict]:
    """Every finished run under ``out/runs`` (continual and fresh; a fresh record has ``fresh_task`` set)."""
    records = []
    root = os.path.join(out, "runs")
    for method in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for folder in (os.path.join(root, method), os.path.join(root, method, "fresh")):
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                if name.endswith(".json"):
                    with open(os.path.join(folder, name)) as f:
                        records.append(json.load(f))
    return records


def _score(record: dict, setting: Setting) -> list[float]:
    # records written before the end_return field (the bandit's runs) score by reward per env step
    return record.get(setting.score, record["end_reward"])


def _entropy_last_half(runs: list[dict], records: list[dict], method: str, n: int) -> dict[str, float]:
    """PPO's policy entropy (``-train/entropy_loss``, :data:`TRAIN_SCALARS`) averaged over runs x last-half tasks of
    the continual runs and over the matching fresh agents, where the run JSONs carry it; else ``{}``."""
    tag = "train/entropy_loss"

    def mean(lists: list[list[Optional[float]]]) -> Optional[float]:
        values = [-v for values in lists for v in values if v is not None]
        return float(np.mean(values)) if values else None

    cont = [r["train_scalars"][tag][n // 2: n] for r in runs if tag in r.get("train_scalars", {})]
    seeds = {r["seed"] for r in runs}
    fresh = [r["train_scalars"][tag] for r in records if r["method"] == method and r.get("fresh_task") is not None
             and n // 2 <= r["fresh_task"] < n and r["seed"] in seeds and tag in r.get("train_scalars", {})]
    out = {}
    if cont and mean(cont) is not None:
        out["entropy_last_half"] = mean(cont)
    if fresh and mean(fresh) is not None:
        out["fresh_entropy_last_half"] = mean(fresh)
    return out


#: the output head's statistics the run JSONs record per task (``continual_recorder.head_statistics``), in the order
#: of the head table, with their column names: at a task's end (``head_*``: its tail's last observations) and as the
#: task found the network (``switch_head_*``: its first observations, before any update on it)
HEAD_STATISTICS = {
    "head_entropy": "entropy", "head_max_prob": "max prob", "head_logit_std": "logit std",
    "head_q_std": "Q std", "head_q_max": "max Q", "head_action_std": "action std", "head_mean_abs": "abs(mean action)",
}
HEAD_STATISTICS.update({f"switch_{key}": f"{name}, as found" for key, name in list(HEAD_STATISTICS.items())})


def head_last_half(runs: list[dict], records: list[dict], method: str, n: int) -> dict[str, dict[str, Optional[float]]]:
    """The output head over the last half of the tasks (issue #28: "the policy entropy and the output head's logit
    scale per task, so the mechanism can be read"): per :data:`HEAD_STATISTICS` key any run records, its mean over the
    continual runs x last-half tasks (``continual``) and over the fresh agents of those tasks (``fresh``; a fresh
    agent's ``switch_head_*`` is an untrained network's head), each over the runs that recorded it (``None`` where
    none did); ``{}`` when no run records one."""
    seeds = {r["seed"] for r in runs}
    fresh = [r for r in records if r["method"] == method and r.get("fresh_task") is not None
             and n // 2 <= r["fresh_task"] < n and r["seed"] in seeds]

    def mean(lists: list[list[Any]]) -> Optional[float]:
        values = [float(v) for values in lists for v in values if v is not None and math.isfinite(float(v))]
        return float(np.mean(values)) if values else None

    out = {}
    for key in HEAD_STATISTICS:
        if any(key in r for r in runs + fresh):
            out[key] = {"continual": mean([r[key][n // 2: n] for r in runs if key in r]),
                        "fresh": mean([r[key][:1] for r in fresh if key in r])}
    return out


#: the diagnostics of the summary table (:func:`diagnostics_last_half`); the condition number as its log10
TABLE_DIAGNOSTICS = ("dormant_fraction", "ntk_erank", "ntk_cond", "dfi", "dfi_hidden")


def _network(records: list[dict]) -> str:
    """The network whose diagnostics are summarised and plotted: ``policy`` where the runs have it, else the first."""
    keys = [k for r in records for k in (r.get("diagnostics") or {})]
    if not keys:
        return "policy"
    return "policy" if any(k.startswith("plasticity/policy/") for k in keys) else keys[0].split("/")[1]


def diagnostics_last_half(runs: list[dict], records: list[dict], method: str, n: int,
                          setting: Setting) -> dict[str, dict[str, float]]:
    """Per metric of :data:`TABLE_DIAGNOSTICS` (``ntk_cond`` as ``log10``): the continual runs' mean over the
    passes in the last half of the tasks (steps after ``n // 2`` tasks), then the mean, min and max over seeds; and
    ``fresh``: the fresh agents' last pass on their task, averaged over the last-half tasks and seeds. Metrics no
    run recorded are left out."""
    network = _network(runs)
    start = (n // 2) * setting.task_timesteps
    fresh_runs = [r for r in records if r["method"] == method and r.get("fresh_task") is not None
                  and n // 2 <= r["fresh_task"] < n and r["seed"] in {x["seed"] for x in runs}]
    out: dict[str, dict[str, float]] = {}
    for metric in TABLE_DIAGNOSTICS:
        key = f"plasticity/{network}/{metric}"
        transform = np.log10 if metric == "ntk_cond" else (lambda x: x)
        per_seed = []
        for r in runs:
            values = [v for step, v in (r.get("diagnostics") or {}).get(key, []) if step > start]
            if values:
                per_seed.append(float(np.mean(transform(np.asarray(values, dtype=float)))))
        if not per_seed:
            continue
        entry = {"mean": float(np.mean(per_seed)), "min": float(np.min(per_seed)), "max": float(np.max(per_seed)),
                 "seeds": len(per_seed)}
        ends = [float(transform(float(r["diagnostics"][key][-1][1]))) for r in fresh_runs
                if (r.get("diagnostics") or {}).get(key)]
        if ends:
            entry["fresh"] = float(np.mean(ends))
        out["log10_ntk_cond" if metric == "ntk_cond" else metric] = entry
    return out


def _ci_text(v: Optional[dict], digits: int = 3) -> str:
    if not v:
        return "-"
    part = f" ({v['runs']} of {v['of']} runs)" if "runs" in v else ""
    if not math.isfinite(v["low"]):  # fewer than MIN_CI_RUNS runs: no interval
        return f"{v['iqm']:.{digits}g} ({NO_CI}){part}"
    return f"{v['iqm']:.{digits}g} [{v['low']:.{digits}g}, {v['high']:.{digits}g}]{part}"


def _ratio_text(v: Optional[dict], minus: Optional[dict] = None) -> str:
    """The table's paired cell: the ratio of means ``v`` with its bootstrap and t intervals; where there is no ratio
    (fresh scores that do not sum above 0), the mean of continual - fresh ``minus`` the same way ("c - f")."""
    prefix = ""
    if not v and minus:
        v, prefix = dict(minus, ratio=minus["mean"]), "c - f: "
    if not v:
        return "-"
    sample = "" if v.get("complete", True) else " (sample)"
    signs = _signs_text(v)
    if not math.isfinite(v["low"]):
        return f"{prefix}{v['ratio']:.3g} ({NO_CI}){sample}{signs}"
    t = f", t [{v['t_low']:.3g}, {v['t_high']:.3g}]" if "t_low" in v else ""
    return f"{prefix}{v['ratio']:.3g} [{v['low']:.3g}, {v['high']:.3g}]{t}{sample}{signs}"


def _signs_text(v: dict) -> str:
    """"; 5 of 5 runs below" / "; 3 below, 2 above (of 5)": the paired runs on each side of their fresh agents."""
    if "paired_runs" not in v:
        return ""
    below, above, runs = v["runs_below"], v["runs_above"], v["paired_runs"]
    if (below and above) or below + above < runs:
        return f"; {below} below, {above} above (of {runs} runs)"
    return f"; {below or above} of {runs} runs {'below' if below else 'above'}"


def _iqm_entry(matrix: np.ndarray) -> Optional[dict]:
    if matrix.size == 0 or not np.all(np.isfinite(matrix)):
        return None
    point, low, high = iqm_ci({"x": matrix}, reps=REPS, resample=RESAMPLE)["x"]
    if len(matrix) < MIN_CI_RUNS:
        low = high = float("nan")
    return {"iqm": point, "low": low, "high": high}


def _iqm_of_complete_runs(matrix: np.ndarray) -> Optional[dict]:
    """The IQM entry over the runs (rows) with every cell finite, with ``runs`` and ``of`` (how many runs of how
    many): the fresh level of a ``--fresh all`` grid in progress. ``None`` when no run is complete."""
    rows = np.isfinite(matrix).all(axis=1)
    entry = _iqm_entry(matrix[rows]) if rows.any() else None
    return entry and {**entry, "runs": int(rows.sum()), "of": len(matrix)}


#: fewest runs per method for a verdict: a bootstrap over one or two runs gives an interval that says nothing
MIN_VERDICT_SEEDS = 3
#: fewest runs of a method and of the plain baseline for "vs plain" (Welch's t on the runs' last-half means, which
#: errs at or below its nominal 5 % from 3 runs each in ``bench/verdict_coverage.py``'s simulations). From the
#: thirty-second to the thirty-third session it was 4: the rule then, two IQM intervals that do not overlap, errs
#: 10-12 % at 3 runs each.
MIN_PLAIN_VERDICT_SEEDS = MIN_VERDICT_SEEDS
#: fewest runs for a last-half interval (IQM, ratio of means, continual - fresh, P(> plain)): a bootstrap over two
#: runs has three distinct resamples, so its "95 % interval" is the range of the two runs' statistics; below this the
#: summary gives the point and NaN bounds, the table "no CI" (until the thirtieth session such intervals were printed)
MIN_CI_RUNS = MIN_VERDICT_SEEDS
#: what the table prints in place of an interval from fewer than :data:`MIN_CI_RUNS` runs
NO_CI = f"< {MIN_CI_RUNS} runs: no CI"


def _too_few(seeds: int, minimum: int = MIN_VERDICT_SEEDS) -> str:
    """The verdict text when ``seeds`` runs are fewer than the verdict's ``minimum`` (else ``""``)."""
    return f"too few seeds ({seeds} < {minimum})" if seeds < minimum else ""


def compare(a: Optional[dict], b: Optional[dict], lower: str, higher: str) -> str:
    """``lower`` when the CI of ``a`` lies wholly below that of ``b``, ``higher`` when above, else "not resolved"."""
    if not a or not b:
        return "-"
    if a["high"] < b["low"]:
        return lower
    if a["low"] > b["high"]:
        return higher
    return "not resolved"


def _vs_plain_text(entry: dict) -> str:
    """The "vs plain" cell: the verdict, with Welch's difference of means and its interval where there is one and
    the runs are enough for a verdict (below that the other cells print no interval either)."""
    welch, verdict = entry.get("welch_vs_plain"), entry.get("vs_plain", "-")
    if not welch or not math.isfinite(welch["low"]) or verdict.startswith("too few"):
        return verdict
    return f"{verdict} ({welch['difference']:+.3g} [{welch['low']:.3g}, {welch['high']:.3g}])"


def _paired_verdict(entry: dict) -> str:
    """Continual against fresh, paired over the last-half cells that have a fresh agent (every task's, or a sample's):
    the ratio of means sum(continual) / sum(fresh) against 1 where the fresh scores sum above 0, else the mean of
    continual - fresh against 0 (negative returns), each judged by its Student-t interval over runs
    (:func:`rl_stats.ratio_of_means_t_ci`: ``t_low`` / ``t_high``). (Until the thirtieth session a setting with a
    fresh agent on every task compared the two IQM intervals instead: unpaired, and so blind to differences the
    pairing shows; until the thirty-second the paired bootstrap's interval decided, which with 3-5 runs covers 68-86 %
    instead of 95 %: bench/README.md, "The verdicts at 3-5 runs".)"""
    stat, null = entry.get("plasticity_ratio_last_half"), 1.0
    if not stat:
        stat, null = entry.get("minus_fresh_last_half"), 0.0
    if not stat:
        return "-"
    return compare({"low": stat["t_low"], "high": stat["t_high"]}, {"low": null, "high": null},
                   "below fresh (plasticity lost)", "above fresh")


def evaluation_summary(runs: list[dict], tasks: int) -> dict[str, Any]:
    """The greedy evaluations of the continual runs (settings with ``eval_every``): per run the mean return over all
    its evaluations (C-CHAIN's Table 4 statistic as read from their code: the evaluation curve averaged over the
    whole run), then its mean and standard error over runs (``mean``, ``se``, ``per_seed``); and per task the mean
    over runs of each run's mean over the evaluations of that task (``per_task``). Empty without evaluations."""
    with_evals = [r for r in runs if r.get("evaluations")]
    if not with_evals:
        return {}
    per_seed = [float(np.mean([e[2] for e in r["evaluations"]])) for r in with_evals]
    per_task = []
    for k in range(tasks):
        means = [float(np.mean(v)) for r in with_evals if (v := [e[2] for e in r["evaluations"] if e[1] == k])]
        per_task.append(float(np.mean(means)) if means else None)
    kept = [one_per_logged_step(r["evaluations"]) for r in with_evals]
    whole, logged = _mean_se(np.asarray(per_seed)), _mean_se(np.asarray([np.mean([e[2] for e in k]) for k in kept]))
    return {"mean": whole["mean"], "se": whole["se"], "per_seed": per_seed, "per_task": per_task,
            "seeds": len(per_seed), "logged_mean": logged["mean"], "logged_se": logged["se"],
            "logged_points": len(kept[0])}


def one_per_logged_step(evaluations: list[list[Any]]) -> list[list[Any]]:
    """The evaluations a history keyed by the global step keeps when two share a step (C-CHAIN's runs log to wandb
    at the step: at a game switch the new game's first evaluation is logged at the step of the old game's last one,
    and the later value replaces the earlier, as inferred from ``crl_run_double_dqn.py``; their saved files hold only
    the final evaluation). Here the old game's last evaluation is one step before the new game's first: an
    evaluation followed within one step by the next task's is dropped."""
    return [e for i, e in enumerate(evaluations)
            if not (i + 1 < len(evaluations) and evaluations[i + 1][1] == e[1] + 1 and evaluations[i + 1][0] - e[0] <= 1)]


def _mean_se(values: np.ndarray) -> dict[str, Any]:
    se = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"mean": float(np.mean(values)), "se": se, "per_seed": [float(v) for v in values], "seeds": len(values)}


def run_average_summary(ends: np.ndarray, fresh: np.ndarray, floor_below: Optional[float] = None) -> dict[str, Any]:
    """TRAC / C-CHAIN's Table 1 statistic for a setting scored by ``iteration_return`` (runs x tasks in ``ends``,
    the fresh agents' scores or NaN in ``fresh``): ``run_average``, per run the mean over all its tasks (every task has
    the same number of iterations: the mean over all the run's iterations, their "average performance"), then the
    mean and standard error over runs; ``fresh_run_average``, the same over each run's fresh agents (a new network and
    optimizer at every task: their "Oracle"), over the tasks that have one (``fresh_tasks`` of them, all tasks with
    ``--fresh all``; a sample of the late tasks with ``--fresh sample``). With a ``floor_below``, ``later_at_floor``
    counts the cells of every task after the first (the tasks the statistic averages over besides task 0) that sit
    at the floor: a run's average moves by whole cells that leave it (C-CHAIN's vanilla CartPole: ~3 of 54)."""
    out: dict[str, Any] = {"run_average": _mean_se(ends.mean(axis=1))}
    if floor_below is not None:
        out["later_at_floor"] = _at_floor(ends[:, 1:], floor_below)
    seen = np.isfinite(fresh)
    rows = seen.any(axis=1)
    if rows.any():
        per_run = np.array([fresh[i, seen[i]].mean() for i in np.flatnonzero(rows)])
        out["fresh_run_average"] = dict(_mean_se(per_run), fresh_tasks=int(seen[rows].sum(axis=1).min()),
                                        complete=bool(seen.all()))
    return out


def _paired_fresh_last_half(cont: np.ndarray, fresh: np.ndarray) -> dict[str, Any]:
    """The paired statistics over the last-half cells (runs x tasks) that have a fresh agent (all of them, or
    :func:`fresh_sample`'s): ``plasticity_ratio_last_half``, the ratio of aggregates sum(continual) / sum(fresh) with a
    paired bootstrap over runs (:func:`rl_stats.ratio_of_means_ci`; ``low`` / ``high`` are its 95 % CI) and a
    Student-t interval over runs (:func:`rl_stats.ratio_of_means_t_ci`; ``t_low`` / ``t_high``, which the verdict
    reads), and ``minus_fresh_last_half``, the mean of continual - fresh over those cells with the same two intervals;
    with a sample of equal size per run also the IQMs of both over the sampled cells (``iqm_fresh_last_half``,
    ``iqm_sampled_last_half``). Both dicts count the paired runs whose continual scores sum below / above their fresh
    agents' over their paired cells (``runs_below`` / ``runs_above`` of ``paired_runs``: the runs' signs, free of the
    t interval's normal theory). Empty when no last-half cell has a fresh agent. A run without a paired cell (its
    fresh agents not run yet) is no unit of the intervals; below :data:`MIN_CI_RUNS` runs with one every interval is
    NaN."""
    cells = np.isfinite(fresh) & np.isfinite(cont)
    if not cells.any():
        return {}
    out: dict[str, Any] = {}
    count = int(cells.sum())
    runs = int(cells.any(axis=1).sum())  # the runs with a paired cell: the units of every interval
    paired_cont, paired_fresh = np.where(cells, cont, np.nan), np.where(cells, fresh, np.nan)
    # the mean difference per cell is the ratio of the runs' difference sums to their cell counts
    difference, ones = np.where(cells, cont - fresh, np.nan), np.where(cells, 1.0, np.nan)
    per_run, _ = paired_run_sums(difference, ones)
    # the runs' signs: distribution-free, beside the t interval's normal theory (a sign test cannot resolve a
    # difference at 5 % below 6 runs: all of 5 runs on one side has p = 0.0625)
    signs = {"runs_below": int((per_run < 0).sum()), "runs_above": int((per_run > 0).sum()), "paired_runs": runs}
    if np.nansum(paired_fresh) > 0:
        point, low, high = ratio_of_means_ci(paired_cont, paired_fresh, n_boot=REPS)
        _, t_low, t_high = ratio_of_means_t_ci(paired_cont, paired_fresh)
        if runs < MIN_CI_RUNS:
            low = high = t_low = t_high = float("nan")
        out["plasticity_ratio_last_half"] = {"ratio": point, "low": low, "high": high, "t_low": t_low,
                                             "t_high": t_high, "cells": count, "complete": bool(cells.all()), **signs}
    mean, low, high = ratio_of_means_ci(difference, ones, n_boot=REPS)
    _, t_low, t_high = ratio_of_means_t_ci(difference, ones)
    if runs < MIN_CI_RUNS:
        low = high = t_low = t_high = float("nan")
    out["minus_fresh_last_half"] = {"mean": mean, "low": low, "high": high, "t_low": t_low, "t_high": t_high,
                                    "cells": count, "complete": bool(cells.all()), **signs}
    per = cells.sum(axis=1)
    if not cells.all() and per.min() == per.max() > 0:
        out["iqm_fresh_last_half"] = _iqm_entry(fresh[cells].reshape(len(fresh), -1))
        out["iqm_sampled_last_half"] = _iqm_entry(cont[cells].reshape(len(cont), -1))
    return out


def fresh_sample_cells(cont: np.ndarray, fresh: np.ndarray, seeds: list[int],
                       setting: Setting) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The fresh scores (runs x tasks) the paired estimator reads when a grid mixes ``--fresh sample`` and ``--fresh
    all`` (issue #28: every seed on its sample of the late tasks, one seed also on every task to check the sample):
    when some run has fresh agents on exactly its :func:`fresh_sample` (a part of the last half), a run with more
    enters with its own sample only (every seed weighs alike), and when it has every late task its other fresh agents
    go into the check: the fresh level over its sample against the level over every late task (mean, standard
    deviation over the tasks) and the ratio of means over both. Otherwise (every run on every task, or a ``--fresh
    all`` grid still in progress) the scores come back unchanged and there is no check."""
    n = fresh.shape[1]
    late = list(range(n // 2, n))
    if n != setting.tasks:
        return fresh, []
    samples = [fresh_sample(setting, seed) for seed in seeds]
    present = [[k for k in late if np.isfinite(fresh[i, k])] for i in range(len(fresh))]
    # the sample design is in use when some run holds exactly its sample, a part of the last half (a --fresh all grid
    # still in progress does not: its runs enter with every fresh agent they have)
    if not any(p == sample and len(sample) < len(late) for p, sample in zip(present, samples)):
        return fresh, []
    out, checks = fresh.copy(), []
    for i, sample in enumerate(samples):
        counts = len(present[i])
        if counts <= len(sample) or not set(sample) <= set(present[i]):
            continue  # a run on its sample (or short of it) enters as it is
        out[i, [k for k in late if k not in sample]] = np.nan
        if counts < len(late):  # the check waits for every late fresh agent of the run
            continue
        checks.append({"seed": seeds[i], "sample": sample, "late_tasks": late,
                       "fresh_sample_mean": float(fresh[i, sample].mean()),
                       "fresh_late_mean": float(fresh[i, late].mean()),
                       "fresh_late_sd": float(fresh[i, late].std(ddof=1)),
                       "fresh_late": fresh[i, late].tolist(),
                       "ratio_sample": float(cont[i, sample].sum() / fresh[i, sample].sum()),
                       "ratio_late": float(cont[i, late].sum() / fresh[i, late].sum())})
    return out, checks


def _ratio_per_task(cont: np.ndarray, fresh: np.ndarray) -> Optional[dict[str, list[Optional[float]]]]:
    """Plasticity per task as the ratio of means over the seeds with a fresh agent on that task, sum(continual) /
    sum(fresh), with its paired bootstrap 95 % CI over seeds (:func:`ratio_of_means_ci`; NaN with one seed):
    ``{"ratio": [...], "low": [...], "high": [...]}`` over tasks, ``None`` for a task without fresh agents or whose
    fresh scores do not sum to a positive number; ``None`` when no task has one."""
    out: dict[str, list[Optional[float]]] = {"ratio": [], "low": [], "high": []}
    for k in range(cont.shape[1]):
        cells = np.isfinite(cont[:, k]) & np.isfinite(fresh[:, k])
        if cells.any() and fresh[cells, k].sum() > 0:
            values = ratio_of_means_ci(cont[cells][:, [k]], fresh[cells][:, [k]], n_boot=REPS)
        else:
            values = (None, None, None)
        for key, value in zip(("ratio", "low", "high"), values):
            out[key].append(value)
    return out if any(v is not None for v in out["ratio"]) else None


def summarise(records: list[dict], methods: list[str], setting: Setting) -> dict[str, Any]:
    """Per method: per-task continual and fresh scores (mean and 95 % bootstrap CI over seeds), plasticity per task
    (continual / fresh of the same method), and over the last half of the tasks the IQM with a bootstrap 95 % CI
    over runs (:data:`RESAMPLE`) of the continual score, the fresh score and plasticity, the probability of
    improvement over the plain baseline, and verdicts ("not resolved" where the interval holds the null; continual
    against fresh paired over the same cells, :func:`_paired_verdict`; against the plain baseline Welch's t interval
    of the difference of the runs' last-half means, ``welch_vs_plain``, :func:`rl_stats.welch_t_ci`)."""
    iqm, poi, metrics_source = rliable_metrics()
    plain = method_name("ppo", setting.algo)
    summary: dict[str, Any] = {}
    for method in methods:
        runs = sorted((r for r in records if r["method"] == method and r.get("fresh_task") is None),
                      key=lambda r: r["seed"])
        if not runs:
            continue
        n = min(len(r["end_reward"]) for r in runs)
        ends = np.array([_score(r, setting)[:n] for r in runs], dtype=float)  # seeds x tasks
        fresh_by = {(r["seed"], r["fresh_task"]): _score(r, setting)[0]
                    for r in records if r["method"] == method and r.get("fresh_task") is not None and r["task"]}
        fresh = np.array([[fresh_by.get((r["seed"], k), np.nan) for k in range(n)] for r in runs], dtype=float)
        half = slice(n // 2, n)
        first, last_half = ends[:, 0], ends[:, half].mean(axis=1)
        bands = [bootstrap_mean_ci(ends[:, k], n_boot=REPS) for k in range(n)]
        iqm_bands = [iqm_ci({"x": ends[:, [k]]}, reps=REPS)["x"] for k in range(n)]  # per task, over seeds
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in runs],
            "tasks": n,
            "score": setting.score,
            "end_reward_mean": ends.mean(axis=0).tolist(),
            "end_reward_min": ends.min(axis=0).tolist(),
            "end_reward_max": ends.max(axis=0).tolist(),
            "score_ci_low": [b[0] for b in bands],
            "score_ci_high": [b[1] for b in bands],
            "score_iqm": [b[0] for b in iqm_bands],
            "score_iqm_ci_low": [b[1] for b in iqm_bands],
            "score_iqm_ci_high": [b[2] for b in iqm_bands],
            "task0": float(first.mean()),
            "last_half": float(last_half.mean()),
            "last_half_per_seed": last_half.tolist(),
            "retained": float(last_half.mean() / first.mean()) if first.mean() > 0 else float("nan"),
            "iqm_last_half": _iqm_entry(ends[:, half]),
            "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in runs])),
            "cpu_seconds_mean": float(np.mean([r["cpu_seconds"] for r in runs])),
            "device": runs[0]["device"],
        }
        if setting.floor_below is not None:
            entry["at_floor_last_half"] = _at_floor(ends[:, half], setting.floor_below)
        evaluations = evaluation_summary(runs, n)
        if evaluations:
            entry["evaluations"] = evaluations
        if setting.score == "iteration_return":
            entry.update(run_average_summary(ends, fresh, setting.floor_below))
        entropy = _entropy_last_half(runs, records, method, n)
        if entropy:
            entry.update(entropy)
        head = head_last_half(runs, records, method, n)
        if head:
            entry["head_last_half"] = head
        diagnostics = diagnostics_last_half(runs, records, method, n, setting)
        if diagnostics:
            entry["diagnostics_last_half"] = diagnostics
            entry["diagnostics_network"] = _network(runs)
        seen = np.isfinite(fresh)
        if seen.any():
            entry["fresh_mean"] = [float(np.nanmean(fresh[:, k])) if seen[:, k].any() else None for k in range(n)]
            entry["fresh_iqm"] = [float(iqm(fresh[seen[:, k], k][:, None])) if seen[:, k].any() else None
                                  for k in range(n)]
            per_task = _ratio_per_task(ends, fresh)
            if per_task:
                entry["plasticity_ratio_per_task"] = per_task
            entry["fresh_complete"] = bool(seen.all())
            entry["iqm_fresh_last_half"] = _iqm_entry(fresh[:, half]) or _iqm_of_complete_runs(fresh[:, half])
            if seen.all() and np.all(fresh > 0):
                ratio = ends / fresh
                entry["plasticity_mean"] = ratio.mean(axis=0).tolist()
                ratio_bands = [bootstrap_mean_ci(ratio[:, k], n_boot=REPS) for k in range(n)]
                entry["plasticity_ci_low"] = [b[0] for b in ratio_bands]
                entry["plasticity_ci_high"] = [b[1] for b in ratio_bands]
                entry["iqm_plasticity_last_half"] = _iqm_entry(ratio[:, half])
            else:  # a ratio needs positive fresh scores (rewards can be negative): the difference is reported
                entry["plasticity_mean"] = None
            entry["iqm_minus_fresh_last_half"] = _iqm_entry(ends[:, half] - fresh[:, half]) if seen.all() else None
            paired, checks = fresh_sample_cells(ends, fresh, entry["seeds"], setting)
            if checks:
                entry["fresh_sample_check"] = checks
            entry.update(_paired_fresh_last_half(ends[:, half], paired[:, half]))
            paired_runs = entry.get("minus_fresh_last_half", {}).get("paired_runs", 0)  # runs with a paired cell
            if setting.floor_below is not None:
                entry["fresh_at_floor_last_half"] = _at_floor(fresh[:, half], setting.floor_below)
            entry["vs_fresh"] = _too_few(paired_runs) or _paired_verdict(entry)
        summary[method] = entry
    if plain in summary:
        base = summary[plain]
        base_ends = np.array([_score(r, setting)[: base["tasks"]] for r in records
                              if r["method"] == plain and r.get("fresh_task") is None], dtype=float)
        for method, entry in summary.items():
            if method == plain:
                entry["vs_plain"] = "-"
                continue
            ends = np.array([_score(r, setting)[: entry["tasks"]] for r in records
                             if r["method"] == method and r.get("fresh_task") is None], dtype=float)
            n = min(ends.shape[1], base_ends.shape[1])
            half = slice(n // 2, n)
            means, base_means = (np.array(list(_last_half_means(records, setting, m, n).values()))
                                 for m in (method, plain))
            unscored = int((~np.isfinite(means)).sum() + (~np.isfinite(base_means)).sum())
            means, base_means = means[np.isfinite(means)], base_means[np.isfinite(base_means)]
            welch = welch_t_ci(means, base_means)  # a run with a task left unscored is no unit of the test
            entry["welch_vs_plain"] = {**welch, "tasks": n - n // 2, **({"unscored_runs": unscored} if unscored else {})}
            entry["vs_plain"] = _too_few(min(len(means), len(base_means)), MIN_PLAIN_VERDICT_SEEDS) or compare(
                welch, {"low": 0.0, "high": 0.0}, f"below {plain}", f"above {plain}")
            point, low, high = stratified_bootstrap(poi, ends[:, half], base_ends[:, half], reps=REPS,
                                                    resample=RESAMPLE)
            if min(len(ends), len(base_ends)) < MIN_CI_RUNS:
                low = high = float("nan")
            entry["poi_vs_plain"] = {"iqm": point, "low": low, "high": high}  # (the point is P, not an IQM)
    for method, entry in summary.items():
        arm = ARM_OF.get(canonical_method(method))
        arm = arm and method_name(arm, setting.algo)
        if arm in summary:
            entry.update(against_arm(records, setting, method, arm, min(entry["tasks"], summary[arm]["tasks"])))
    result = {"metrics": metrics_source, "plain": plain, "methods": summary}
    result.update(per_run_task_parameters(records, methods, setting))
    return result


def _last_half_means(records: list[dict], setting: Setting, method: str, n: int) -> dict[int, float]:
    """Each continual run of ``method``: its mean score over the last half of its first ``n`` tasks, by seed (NaN
    where a task is left unscored)."""
    return {r["seed"]: float(np.asarray(_score(r, setting)[:n], dtype=float)[n // 2:].mean()) for r in records
            if r["method"] == method and r.get("fresh_task") is None}


def against_arm(records: list[dict], setting: Setting, method: str, arm: str, n: int) -> dict[str, Any]:
    """A control or ablation against the arm it changes one ingredient of (:data:`continual_methods.ARM_OF`), read as
    a method against plain PPO: ``welch_vs_arm``, Welch's t on the runs' last-half means over the first ``n`` tasks
    (``method - arm``; :func:`rl_stats.welch_t_ci`, each run one number, a run with an unscored task left out) with
    the two means and ``paired``, the difference of the seeds both ran (they share a task sequence and, for the
    controls built on the arm's network, the starting weights), by seed; ``vs_arm``, the verdict from 3 runs of each
    ("not resolved" where the interval holds 0)."""
    mine, theirs = _last_half_means(records, setting, method, n), _last_half_means(records, setting, arm, n)
    a = np.array([v for v in mine.values() if math.isfinite(v)])
    b = np.array([v for v in theirs.values() if math.isfinite(v)])
    welch = welch_t_ci(a, b)
    paired = {str(seed): mine[seed] - theirs[seed] for seed in sorted(mine.keys() & theirs.keys())
              if math.isfinite(mine[seed] - theirs[seed])}
    verdict = _too_few(min(len(a), len(b)), MIN_PLAIN_VERDICT_SEEDS) or compare(
        welch, {"low": 0.0, "high": 0.0}, f"below {arm}", f"above {arm}")
    return {"welch_vs_arm": {**welch, "arm": arm, "tasks": n - n // 2, "runs": [len(a), len(b)],
                             "mean": float(a.mean()) if len(a) else float("nan"),
                             "arm_mean": float(b.mean()) if len(b) else float("nan"), "paired": paired},
            "vs_arm": verdict}


def per_run_task_parameters(records: list[dict], methods: list[str], setting: Setting) -> dict[str, Any]:
    """For a setting whose tasks draw simulator parameters (Slippery Ant's friction): ``task_parameters`` (per run
    seed, each task's parameters) and ``per_run_scores`` (per method and seed, the continual run's score per task),
    so that a run's return on a task can be read beside that task's friction (one seed's methods share its tasks);
    ``{}`` for every other setting."""
    runs = [r for r in records if r.get("fresh_task") is None and r["method"] in methods]
    seeds = sorted({int(r["seed"]) for r in runs})
    if not seeds or task_parameters(setting, seeds[0]) is None:
        return {}
    parameters = {str(seed): task_parameters(setting, seed) for seed in seeds}
    scores = {m: {str(r["seed"]): _score(r, setting) for r in sorted(runs, key=lambda r: r["seed"]) if r["method"] == m}
              for m in methods if any(r["method"] == m for r in runs)}
    trends = {m: t for m, per_seed in scores.items() if (t := parameter_adjusted_trend(per_seed, parameters)) is not None}
    return {"task_parameters": parameters, "per_run_scores": scores, **({"adjusted_trend": trends} if trends else {})}


def parameter_adjusted_trend(scores: dict[str, list[float]], parameters: dict[str, list[dict[str, float]]],
                             first_task: int = 1) -> Optional[dict[str, Any]]:
    """The trend of a method's continual score over the tasks with each task's drawn parameters held fixed (Slippery
    Ant: friction moves the return more than time does, and every seed draws its own frictions, so a decline over
    tasks is read with them as covariates). Fixed before any run at Dohare et al.'s design finished (twenty-ninth
    session).

    ``slope``: the OLS coefficient ``c`` of ``score[s, k] = a_s + c k + sum_p (b_p x_p + b'_p x_p^2)`` over the
    seeds' tasks ``k >= first_task`` (task 0, learnt from scratch, left out), ``x_p`` the log10 of parameter ``p``
    (the value itself where it is not positive), one intercept per seed; ``low`` / ``high``: its 95 % interval from the
    cluster-robust (CR1) standard error with the seeds as clusters and Student's t on seeds - 1 degrees of freedom
    (Cameron & Miller, 2015, "A practitioner's guide to cluster-robust inference", J. Human Resources 50(2); ``None``
    below 3 seeds); ``per_seed``: each seed's own fit of the same model; ``tasks``: the tasks used per seed. A seed
    with no more tasks than coefficients is left out; ``None`` when every seed is. (Until the thirty-second session,
    before a second seed had run, the interval was a percentile bootstrap over seeds, which in simulated 5-seed
    experiments held the true slope in ~84 % of them, the CR1 interval in ~95 %: bench/README.md, "The verdicts at
    3-5 runs".)

    :param scores: per seed (as a string), the continual run's score per task.
    :param parameters: per seed, each task's parameters (``task_parameters`` of the summary).
    """
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for seed, values in scores.items():
        params = parameters.get(seed)
        if not params:
            continue
        ks = [k for k in range(first_task, min(len(values), len(params))) if np.isfinite(values[k])]
        names = sorted(params[0])
        cov = []
        for k in ks:
            x = []
            for name in names:
                v = float(params[k][name])
                v = float(np.log10(v)) if all(float(t[name]) > 0 for t in params) else v
                x += [v, v * v]
            cov.append([float(k), *x])
        if len(ks) > len(names) * 2 + 2:
            rows[seed] = (np.asarray(cov), np.asarray([values[k] for k in ks], dtype=float))
    if not rows:
        return None

    def fit(seeds: list[str]) -> tuple[float, Optional[float]]:
        """The slope and, over 3 seeds or more, the half-width of its 95 % CR1 / t(G - 1) interval."""
        import scipy.stats

        blocks = [rows[s] for s in seeds]
        x = np.concatenate([b[0] for b in blocks])
        y = np.concatenate([b[1] for b in blocks])
        fixed = np.zeros((len(x), len(seeds)))
        bounds = np.cumsum([0, *(len(b[1]) for b in blocks)])
        for i in range(len(seeds)):
            fixed[bounds[i]:bounds[i + 1], i] = 1.0
        design = np.hstack([fixed, x])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        clusters, (n, k) = len(seeds), design.shape
        if clusters < 3:
            return float(coef[clusters]), None
        bread = np.linalg.pinv(design.T @ design)
        per_seed = [design[a:b].T @ (y[a:b] - design[a:b] @ coef) for a, b in itertools.pairwise(bounds)]
        meat = sum(np.outer(g, g) for g in per_seed)
        factor = clusters / (clusters - 1) * (n - 1) / (n - k)
        se = float(np.sqrt(factor * (bread @ meat @ bread)[clusters, clusters]))
        return float(coef[clusters]), float(scipy.stats.t.ppf(0.975, clusters - 1) * se)

    seeds = sorted(rows, key=int)
    slope, half = fit(seeds)
    low, high = (None, None) if half is None else (slope - half, slope + half)
    return {"slope": slope, "low": low, "high": high, "seeds": len(seeds),
            "per_seed": {s: fit([s])[0] for s in seeds}, "tasks": {s: len(rows[s][1]) for s in seeds}}


def _at_floor(cells: np.ndarray, floor_below: float) -> dict[str, int]:
    """How many of the scored ``cells`` (NaN: no run) are below the setting's ``floor_below``."""
    scored = cells[np.isfinite(cells)]
    return {"cells": int((scored < floor_below).sum()), "of": int(scored.size)}


def _arm_lines(summary: dict[str, Any]) -> list[str]:
    """The table of the controls and ablations against their arms (:func:`against_arm`), empty where none ran with
    its arm."""
    rows = [(method, s["welch_vs_arm"], s["vs_arm"]) for method, s in summary.items() if "welch_vs_arm" in s]
    if not rows:
        return []
    lines = ["", "Controls and ablations against their arms (`continual_methods.ARM_OF`: the arm a method changes "
             "one ingredient of), read as a method against plain PPO: Welch's t on the runs' last-half means, method "
             "- arm [95 % interval], a verdict from 3 runs of each; paired: the difference of each seed both ran "
             "(the same task sequence), by seed.", "",
             "| method | arm | runs: method / arm | last-half mean: method / arm | vs arm | paired differences by seed |",
             "|---|---|---|---|---|---|"]
    for method, vs, verdict in rows:
        cell = verdict
        if math.isfinite(vs["low"]) and not verdict.startswith("too few"):
            cell = f"{verdict} ({vs['difference']:+.3g} [{vs['low']:.3g}, {vs['high']:.3g}], p {vs['p']:.2g})"
        paired = ", ".join(f"{seed}: {d:+.3g}" for seed, d in vs["paired"].items()) or "-"
        lines.append(f"| {method} | {vs['arm']} | {vs['runs'][0]} / {vs['runs'][1]} "
                     f"| {vs['mean']:.3g} / {vs['arm_mean']:.3g} | {cell} | {paired} |")
    return lines


def markdown_table(result: dict[str, Any], setting_name: str, setting: Setting) -> str:
    summary = result["methods"]
    score = SCORE_LABELS[setting.score]
    lines = [
        f"setting={setting_name}: {setting.description}. Score: {score} over the last {setting.tail:.0%} of each task. "
        f"Last half of the tasks: IQM over runs x tasks [95 % CI, bootstrap over runs: each keeps its tasks] "
        f"({result['metrics']}); "
        "plasticity = IQM of continual / fresh agent of the same method on the same task, per cell; ratio of means = "
        "sum(continual) / sum(fresh) over the last-half cells with a fresh agent [paired bootstrap over runs], t [Student-t "
        "interval over runs of the linearised ratio: what 'continual vs fresh' reads] (where the fresh scores do not sum "
        "above 0, 'c - f': the mean of continual - fresh over those cells, the same intervals); 'k of n runs below': "
        "the runs whose continual scores sum below their fresh agents' over those cells "
        f"('sample': fresh agents on a sample of the late tasks); P(> {result['plain']}): "
        "probability of improvement over the plain baseline [95 % CI]; vs plain: Welch's t test of the runs' "
        "last-half means against the plain baseline's, the difference of means [its 95 % interval]; 'not "
        "resolved': the interval holds the null (1 for a ratio, 0 for a difference).",
        "",
        "| method | seeds | fresh agent | continual | plasticity | plasticity, ratio of means | continual vs fresh "
        "| P(> plain) | vs plain | CPU min / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with_entropy = any("entropy_last_half" in s for s in summary.values())
    if with_entropy:
        lines[2] = lines[2].replace(" CPU min / run |", " policy entropy: continual / fresh | CPU min / run |")
        lines[3] += "---|"
    with_floor = setting.floor_below is not None and any("at_floor_last_half" in s for s in summary.values())
    if with_floor:
        lines[0] += (f" At the floor: the last-half cells scoring below {setting.floor_below:g} (a collapsed policy's "
                     "score; the IQM drops the lowest quarter of the cells), continual / fresh agents.")
        lines[2] = lines[2].replace(" | continual | ", " | continual | at the floor: continual / fresh | ")
        lines[3] += "---|"
    for method, s in summary.items():
        poi = s.get("poi_vs_plain")
        entropy = ""
        if with_entropy:
            cells = [s.get("entropy_last_half"), s.get("fresh_entropy_last_half")]
            entropy = " / ".join("-" if c is None else f"{c:.3f}" for c in cells) + " | "
        floor = ""
        if with_floor:
            counts = [s.get("at_floor_last_half"), s.get("fresh_at_floor_last_half")]
            floor = " / ".join("-" if c is None else f"{c['cells']} of {c['of']}" for c in counts) + " | "
        paired = _ratio_text(s.get("plasticity_ratio_last_half"), s.get("minus_fresh_last_half"))
        lines.append(
            f"| {method} | {len(s['seeds'])} | {_ci_text(s.get('iqm_fresh_last_half'))} | {_ci_text(s['iqm_last_half'])} "
            f"| {floor}{_ci_text(s.get('iqm_plasticity_last_half'))} | {paired} "
            f"| {s.get('vs_fresh', '-')} "
            f"| {_ci_text(poi, 2)} | {_vs_plain_text(s)} | {entropy}{s['cpu_seconds_mean'] / 60:.1f} |"
        )
    lines += _arm_lines(summary)
    n_tasks = max(s["tasks"] for s in summary.values())
    shown = sorted({0, 1, n_tasks // 2, n_tasks - 1} & set(range(n_tasks)))
    lines += ["", "Per task (mean over seeds): continual score / plasticity (continual / fresh)", "",
              "| method | " + " | ".join(f"task {k}" for k in shown) + " |", "|---|" + "---|" * len(shown)]
    for method, s in summary.items():
        ratio = s.get("plasticity_mean")
        cells = [f"{s['end_reward_mean'][k]:.3g}" + (f" / {ratio[k]:.2f}" if ratio else "") if k < s["tasks"] else "-"
                 for k in shown]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    heads = [key for key in HEAD_STATISTICS if any(key in s.get("head_last_half", {}) for s in summary.values())]
    if heads:
        lines += ["", "Output head over the last half of the tasks (`continual_recorder.head_statistics`): continual / "
                  "fresh agents of those tasks, mean over runs x tasks where the run JSONs record it; at a task's end, "
                  "and 'as found': on the task's first observations, before any update on it (a fresh agent's: an "
                  "untrained head)", "",
                  "| method | " + " | ".join(HEAD_STATISTICS[k] for k in heads) + " |", "|---|" + "---|" * len(heads)]
        for method, s in summary.items():
            stats = s.get("head_last_half", {})
            cells = [" / ".join("-" if v is None else f"{v:.3g}" for v in (stats[k]["continual"], stats[k]["fresh"]))
                     if k in stats else "-" for k in heads]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if result.get("task_parameters"):
        names = sorted({k for tasks in result["task_parameters"].values() for t in tasks for k in t})
        lines += ["", "Per run: each task's parameters (drawn from the run seed's task sequence: a seed's methods share "
                  "them) and the continual run's score on each task", "",
                  "| seed | | " + " | ".join(f"task {k}" for k in range(n_tasks)) + " |", "|---|---|" + "---|" * n_tasks]
        for seed, tasks in result["task_parameters"].items():
            for name in names:
                lines.append(f"| {seed} | {name} | " + " | ".join(f"{t[name]:.3g}" for t in tasks[:n_tasks]) + " |")
            for method, per_seed in result["per_run_scores"].items():
                if seed in per_seed:
                    ends = per_seed[seed]
                    lines.append(f"| {seed} | {method} | " + " | ".join(
                        f"{ends[k]:.4g}" if k < len(ends) else "-" for k in range(n_tasks)) + " |")
    if result.get("adjusted_trend"):
        lines += ["", "Trend over the tasks after task 0 with each task's parameters held fixed: the OLS slope of the "
                  "score on the task index with log10 of each parameter and its square as covariates and an intercept "
                  "per seed [95 % CI: cluster-robust (CR1) standard error over seeds, Student's t on seeds - 1 degrees of "
                  "freedom, from 3 seeds]; per seed: its own fit", "",
                  "| method | seeds | slope per task | per seed |", "|---|---|---|---|"]
        for method, t in result["adjusted_trend"].items():
            ci = f" [{t['low']:.3g}, {t['high']:.3g}]" if t["low"] is not None else ""
            per = ", ".join(f"{s}: {v:.3g}" for s, v in t["per_seed"].items())
            lines.append(f"| {method} | {t['seeds']} | {t['slope']:.3g}{ci} | {per} |")
    checked = {m: s["fresh_sample_check"] for m, s in summary.items() if s.get("fresh_sample_check")}
    if checked:
        lines += ["", "Fresh-sample check (runs with a fresh agent on every late task; the ratio of means above uses "
                  "their sample only): the fresh level over the run's sample against every late task (mean, SD over "
                  "the tasks), and the ratio of means over both", "",
                  "| method | seed | sample | fresh, sample | fresh, every late task | ratio of means, sample / every "
                  "late task |", "|---|---|---|---|---|---|"]
        for method, runs in checked.items():
            for c in runs:
                lines.append(f"| {method} | {c['seed']} | {' '.join(map(str, c['sample']))} | "
                             f"{c['fresh_sample_mean']:.3g} | {c['fresh_late_mean']:.3g} ± {c['fresh_late_sd']:.2g} | "
                             f"{c['ratio_sample']:.3g} / {c['ratio_late']:.3g} |")
    evaluated = {m: s["evaluations"] for m, s in summary.items() if s.get("evaluations")}
    if evaluated:
        lines += ["", f"Greedy evaluations ({setting.eval_episodes} episodes every {setting.eval_every} timesteps, the "
                  "task just trained): mean over all evaluations of a run, mean ± standard error over runs; per task: "
                  "mean over runs", "", "| method | runs | whole run | " + " | ".join(
                      f"task {k}" for k in range(n_tasks)) + " |", "|---|---|---|" + "---|" * n_tasks]
        for method, e in evaluated.items():
            cells = ["-" if v is None else f"{v:.3g}" for v in e["per_task"]]
            lines.append(f"| {method} | {e['seeds']} | {e['mean']:.3g} ± {e['se']:.2g} | " + " | ".join(cells) + " |")
        lines += ["", "The same without each task's last evaluation where the next task's first follows it by one step "
                  "(a history keyed by the global step, as C-CHAIN's wandb logging, keeps the later of the two): "
                  + "; ".join(f"{m} {e['logged_mean']:.3g} ± {e['logged_se']:.2g} ({e['logged_points']} points a run)"
                              for m, e in evaluated.items() if "logged_mean" in e)]
    averaged = {m: s for m, s in summary.items() if s.get("run_average")}
    if averaged:
        lines += ["", "TRAC / C-CHAIN's statistic (their Table 1): per run the mean over all its PPO iterations of the "
                  "iteration's mean episode return, mean ± standard error over runs; fresh agents (their 'Oracle': a new "
                  "network and optimizer at every task): the same over the tasks with a fresh agent", "",
                  "| method | runs | continual, whole run | fresh agents (tasks) |", "|---|---|---|---|"]
        floors = any("later_at_floor" in s for s in averaged.values())
        if floors:
            lines[-4] += (f"; later tasks at the floor: the cells of tasks 1-{n_tasks - 1} scoring below "
                          f"{setting.floor_below:g}")
            lines[-2] = lines[-2].replace(" fresh agents (tasks) |", " fresh agents (tasks) | later tasks at the floor |")
            lines[-1] += "---|"
        for method, s in averaged.items():
            a, f = s["run_average"], s.get("fresh_run_average")
            fresh_text = "-" if not f else (f"{f['mean']:.4g} ± {f['se']:.2g} ({'all' if f['complete'] else f['fresh_tasks']}"
                                            f"{'' if f['complete'] else ' per run'})")
            floor = ""
            if floors:
                c = s.get("later_at_floor")
                floor = " " + ("-" if c is None else f"{c['cells']} of {c['of']}") + " |"
            lines.append(f"| {method} | {a['seeds']} | {a['mean']:.4g} ± {a['se']:.2g} | {fresh_text} |{floor}")
    diagnosed = {m: s["diagnostics_last_half"] for m, s in summary.items() if s.get("diagnostics_last_half")}
    if diagnosed:
        names = {"dormant_fraction": "dormant fraction", "ntk_erank": "NTK effective rank",
                 "log10_ntk_cond": "log10 NTK cond", "dfi": "DfI, all layers", "dfi_hidden": "DfI, hidden layers"}
        shown_metrics = [m for m in names if any(m in d for d in diagnosed.values())]
        network = next(s.get("diagnostics_network", "policy") for s in summary.values() if s.get("diagnostics_last_half"))
        lines += ["", f"{network} network diagnostics (PlasticityMonitor) over the last half of the tasks: continual runs, "
                  "mean over seeds [min, max over seeds]; fresh: the fresh agents' last pass on the same tasks", "",
                  "| method | " + " | ".join(names[m] for m in shown_metrics) + " |", "|---|" + "---|" * len(shown_metrics)]
        for method, d in diagnosed.items():
            cells = []
            for m in shown_metrics:
                e = d.get(m)
                fewer = e is not None and e.get("seeds", len(summary[method]["seeds"])) < len(summary[method]["seeds"])
                cells.append("-" if e is None else f"{e['mean']:.3g} [{e['min']:.3g}, {e['max']:.3g}]"
                             + (f" ({e['seeds']} seeds)" if fewer else "")
                             + (f"; fresh {e['fresh']:.3g}" if "fresh" in e else ""))
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: significant digits of the floats of summary.json (and of the tables and figures built from them): a rebuild on
#: another machine differs in a float's last bits (numpy's sums follow the CPU's SIMD width), and a committed summary
#: must rebuild byte for byte in a fresh clone (issue #29, part 5); 10 digits are far below every CI's resolution
SUMMARY_DIGITS = 10


def rounded(value: Any, digits: int = SUMMARY_DIGITS) -> Any:
    """``value`` with every finite float (in dicts, lists and tuples, recursively; tuples become lists, as in JSON)
    rounded to ``digits`` significant digits; NaN, infinities and everything else unchanged."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


#: The fields of a run's recorded setting that its summary depends on (the task index, the score and its window), with
#: the command-line flag that sets each where one does.
SUMMARY_FIELDS = {"env_id": "--setting", "tasks": "--tasks", "change_every": "--change-every", "n_envs": "--setting",
                  "score": "--setting", "tail": "--setting"}


def check_records_setting(records: list[dict], setting: Setting, setting_name: str) -> None:
    """Refuse to summarise runs with a setting other than the command's: a folder of runs made with
    ``--change-every 125000`` summarised at the setting's default would cut its tasks elsewhere, silently.

    :raises SettingMismatchError: naming the field, the command's value, the runs' value and the flag that sets
        it.
    """
    for record in records:
        recorded = record.get("setting")
        if not isinstance(recorded, dict):
            continue  # runs written before settings were recorded
        for name, flag in SUMMARY_FIELDS.items():
            if name in recorded and recorded[name] != getattr(setting, name):
                what = "fresh agent" if record.get("fresh_task") is not None else "run"
                raise SettingMismatchError(
                    f"the {what} {record['method']} seed {record['seed']} was made with {name}={recorded[name]!r}, "
                    f"the command's setting {setting_name!r} has {name}={getattr(setting, name)!r}: pass the runs' "
                    f"value ({flag}) to summarise them, or another --out for runs of this setting"
                )


def report(out: str, setting_name: str, setting: Setting, methods: Optional[list[str]], diagnostics: bool = True,
           tb_plots: bool = False) -> dict[str, Any]:
    """Tables on stdout, ``summary.json``, ``summary.md`` and the figures, from the run JSONs under ``out`` alone
    (``methods=None``: every method found). ``tb_plots`` adds :func:`sb3_plastic.plot.plot_runs`'s figures of the
    TensorBoard events under ``plots/`` (the events are not committed).

    :raises NoRunsError: when ``out`` holds no finished run of ``methods``; nothing is written then.
    :raises SettingMismatchError: when the runs were made with another setting (:func:`check_records_setting`).
    """
    check_records_setting(load_records(out), setting, setting_name)
    rebuilt = add_hidden_dfi(out)
    if rebuilt:
        print(f"rebuilt the hidden-layer DfI (dfi_hidden) from the TensorBoard events of {rebuilt} run JSONs", flush=True)
    copied = add_train_scalars(out, setting)
    if copied:
        print(f"copied SB3's training scalars ({', '.join(TRAIN_SCALARS)}) from the TensorBoard events into {copied} "
              "run JSONs", flush=True)
    records = load_records(out)
    found = list(dict.fromkeys(r["method"] for r in records))
    if methods is None:
        order = {m: i for i, m in enumerate(ALL_METHOD_NAMES)}
        methods = sorted(found, key=lambda m: order.get(m, len(order)))
    result = rounded(summarise(records, methods, setting))
    if not result["methods"]:
        raise NoRunsError(
            f"no finished runs of {', '.join(methods) or 'any method'} under {os.path.join(out, 'runs')} "
            f"(found: {', '.join(found) or 'none'}): nothing written"
        )
    table = markdown_table(result, setting_name, setting)
    print(table)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(rounded({"setting": setting_name, "tail": setting.tail, "description": setting.description,
                           "setting_config": setting_config(setting), **result}), f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    summary = result["methods"]
    figures = {"end_of_task.png": continual_figures.end_of_task_figure(summary, setting, result["plain"],
                                                                         SCORE_LABELS[setting.score]),
               "plasticity.png": continual_figures.plasticity_figure(summary, result["plain"], setting.description)}
    if diagnostics:
        runs = [r for r in records if r["method"] in summary]
        figures["diagnostics.png"] = continual_figures.diagnostics_figure(runs, list(summary), setting, _network(runs),
                                                                          result["plain"])
    for name, fig in figures.items():
        if fig is not None:
            print("wrote", continual_figures.save(fig, os.path.join(out, name)))
    if tb_plots:
        from sb3_plastic.plot import plot_runs

        metrics = [f"plasticity/policy/{m}" for m in DIAGNOSTICS] + ["continual/end_of_task_reward"]
        tb = os.path.join(out, "tb")
        paths = [os.path.join(tb, m, d) for m in summary if os.path.isdir(os.path.join(tb, m))
                 for d in sorted(os.listdir(os.path.join(tb, m))) if d != "fresh"]  # the continual runs only
        # one curve per method folder tb/<method>/ (the plain methods differ only in their callbacks)
        for path in plot_runs(paths, os.path.join(out, "plots"), metrics=metrics, switch_every=setting.task_timesteps,
                              group_by=r"/tb/([^/]+)/[^/]+$"):
            print("wrote", path)
    return summary
