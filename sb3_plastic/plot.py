"""Plots of continual-RL runs from their TensorBoard event files (``sb3-plastic plot``).

Runs are the directories holding TensorBoard event files (``events.out.tfevents.*``; SB3 writes one
directory per ``learn`` call, e.g. ``runs/CartPole-v1/PPO_1``). They are read with TensorBoard's own
reader (:class:`~tensorboard.backend.event_processing.event_accumulator.EventAccumulator`) and grouped
by method (:func:`assign_groups`):

* runs with the metadata of :mod:`sb3_plastic.run_info` (every plastic algorithm writes it; plain SB3 models
  with :class:`~sb3_plastic.run_info.RunInfoCallback`): the algorithm, plus the environment when the runs
  cover several, plus the hyperparameters whose values differ between the runs of that algorithm
  (seed-like keys excluded), e.g. ``PlasticPPO isometry_coef=0.1`` and ``PlasticPPO isometry_coef=1``;
* runs without it: ``<parent directory>/<run directory>`` with SB3's ``_<n>`` suffix and ``seed<k>`` parts
  removed (``CartPole-v1/PPO``, ``CartPole-v1/DQN``), so two algorithms are never one curve;
* ``group_by``: a regular expression searched in the run's path (its first group, if it has one, else the
  whole match); an expression that matches no run is an error, runs it does not match keep their default
  group (with a warning).

Every curve is the mean over the group's runs with a ± one standard deviation band, on the steps that all of
them cover (each run linearly interpolated inside its own range): a run that ends (or starts) at another step
than the others does not leave a tail averaged over fewer runs than the legend's "<n> seeds"; the steps cut are
named in a ``UserWarning``, once per group (runs whose ranges do not overlap at all, e.g. the two directories of
a resumed run, keep the union of their steps, with a warning). Requests that match nothing (a
``metrics`` pattern matching no tag, a ``return_tag`` no run logs, a ``group_by`` matching no run) raise
:class:`PlotError`.

Runs of several environments (their metadata's ``env_id``) get one set of figures each, in ``<out>/<env id>/``,
with the environment in the titles and the methods grouped among that environment's runs (``split_envs=False``,
``sb3-plastic plot --together``: one set of figures, the environment in the legend). Legends sit inside the axes,
long entries wrapped (:func:`legend_label`).

Figures (PNG, written with matplotlib's Agg canvas, without touching pyplot's global backend):

* ``return_curve.png``: episode return (``rollout/ep_rew_mean``) vs timesteps, task switches
  marked by vertical lines (from ``switch_every`` or from the logged ``plasticity/task_id``): the
  "alligator" plot of continual RL (e.g. Dohare et al., 2024, "Loss of plasticity in deep continual
  learning", Nature);
* ``return_per_task.png``: mean return per task (from :class:`~sb3_plastic.callbacks.monitor.PlasticityMonitor`'s
  ``plasticity/return/task_<id>``) or, without those, per task phase of ``switch_every`` steps;
* ``metric_<tag>.png``: one per diagnostic tag matching ``metrics`` (tags or glob patterns, where ``*``
  stays inside one ``/``-separated level and ``**`` crosses levels). Without ``metrics``, the network-level
  :data:`DEFAULT_METRICS` of every monitor the runs log (:func:`monitor_prefixes`: ``plasticity/<net>/<metric>``,
  and ``plasticity/<name>/<net>/<metric>`` for a monitor with a ``name``); a ``UserWarning`` says so when they
  match no tag. Condition numbers (metrics ending in
  ``cond``: ``ntk_cond``, a layer's ``cond`` = σmax/σmin) are drawn on a log y-axis; their ``log10`` tags
  (``ntk_log10_cond``) on a linear axis labelled as log10; other metrics on a log axis when their positive
  values span more than two decades.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sb3_plastic.run_info import read_run_info

RETURN_TAG = "rollout/ep_rew_mean"
#: The x-axis of every figure: TensorBoard's step, SB3's ``num_timesteps`` (env steps summed over the vector env's
#: copies; a task of ``change_every`` steps per copy lasts ``change_every x n_envs`` timesteps)
STEP_AXIS = "timesteps (num_timesteps: env steps of all copies)"

#: Diagnostics plotted when no ``metrics`` are given: network-level headline diagnostics, written for the unnamed
#: monitor; for a named one ``plasticity/`` stands for ``plasticity/<name>/`` (:func:`default_metric_patterns`).
DEFAULT_METRICS = (
    "plasticity/*/dormant_fraction",
    "plasticity/*/ntk_cond",
    "plasticity/*/ntk_erank",
    "plasticity/*/weight_norm",
    "plasticity/*/grad_norm",
)

#: Readable names of the diagnostics of :mod:`sb3_plastic.diagnostics` (the last part of a tag).
METRIC_LABELS = {
    "dormant_fraction": "fraction of dormant units (ReDo score ≤ τ)",
    "zero_fraction": "fraction of dead units (output always 0)",
    "srank": "srank of the features (singular values covering 99%)",
    "effective_rank": "effective rank of the features",
    "feature_norm": "mean feature norm",
    "feature_variance": "mean per-sample feature variance",
    "weight_norm": "weight norm",
    "dist_from_init": "distance from the initial weights",
    "dfi": "deviation from isometry ‖WᵀW − sI‖² (WWᵀ if wide; s: isometry_scale)",
    "dfi_hidden": "deviation from isometry of the hidden layers (heads excluded)",
    "dfi_free": "scale-free deviation from isometry Σ(σᵢ² − mean σ²)²",
    "dfi_free_hidden": "scale-free deviation from isometry of the hidden layers",
    "dfi_floor": "deviation from isometry below the target Σ_{σᵢ² < s}(σᵢ² − s)²",
    "dfi_ceiling": "deviation from isometry above the target Σ_{σᵢ² > s}(σᵢ² − s)²",
    "dfi_floor_hidden": "deviation from isometry below the target, hidden layers",
    "dfi_ceiling_hidden": "deviation from isometry above the target, hidden layers",
    "sigma_max": "largest singular value of the weight",
    "sigma_min": "smallest singular value of the weight",
    "cond": "condition number of the weight (σmax / σmin)",
    "grad_norm": "output gradient norm",
    "ntk_cond": "NTK condition number (λmax / λmin)",
    "ntk_erank": "NTK effective rank",
    "ntk_trace": "NTK mean diagonal (squared Jacobian norm)",
    "ntk_size": "probe samples of the NTK",
    "monitor_seconds": "time spent in the monitor (s)",
    "task_id": "task id",
}

#: Metrics (last part of a tag) drawn on a log y-axis whatever their range: condition numbers.
LOG_AXIS_SUFFIXES = ("cond",)
#: Hyperparameters that never define a method: seeds (any key containing "seed", any case).
SEED_LIKE = re.compile(r"seed", re.IGNORECASE)
_SB3_RUN_SUFFIX = re.compile(r"_\d+$")
_SEED_PART = re.compile(r"(?:^|[_\-.])seed[_\-=]?\d+", re.IGNORECASE)
_MAX_LISTED = 40
#: Characters per line of a legend entry (:func:`legend_label`): long labels wrap inside the axes
LEGEND_WIDTH = 60
#: Name of the output folder of the runs without metadata when :func:`plot_runs` splits by environment
NO_ENV_FOLDER = "no_run_metadata"

_TASK_RETURN = re.compile(r"^plasticity/(?:.+/)?return/task_(.+)$")
_MAX_POINTS = 1000

Series = tuple[np.ndarray, np.ndarray]


class PlotError(ValueError):
    """A plot request that cannot act: a filter (``metrics``, ``return_tag``, ``group_by``) matching nothing,
    or a bad value. The message names the value and what exists."""


@dataclass
class Run:
    """One run: a directory of TensorBoard event files, the method (group) it belongs to and its metadata
    (:func:`sb3_plastic.run_info.read_run_info`, ``None`` without)."""

    path: str
    group: str
    scalars: dict[str, Series] = field(default_factory=dict)
    info: Optional[dict] = None

    def series(self, tag: str) -> Optional[Series]:
        return self.scalars.get(tag)


# ---------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------
def _is_event_file(name: str) -> bool:
    return "tfevents" in name


def find_run_dirs(paths: Iterable[str]) -> list[str]:
    """Directories holding TensorBoard event files under ``paths`` (files or directories), sorted."""
    found: set[str] = set()
    for path in paths:
        if os.path.isfile(path) and _is_event_file(os.path.basename(path)):
            found.add(os.path.dirname(os.path.abspath(path)))
        for root, _, files in os.walk(path):
            if any(_is_event_file(f) for f in files):
                found.add(os.path.abspath(root))
    return sorted(found)


def fallback_group(run_dir: str) -> str:
    """Group of a run without metadata: ``<parent>/<run directory>`` with SB3's ``_<n>`` suffix and
    ``seed<k>`` parts removed (``runs/CartPole-v1/PPO_1`` -> ``CartPole-v1/PPO``, ``logs/ppo_relu/seed0_1``
    -> ``ppo_relu``)."""
    run_dir = run_dir.rstrip(os.sep)
    name = _SEED_PART.sub("", _SB3_RUN_SUFFIX.sub("", os.path.basename(run_dir))).strip("_-.")
    parent = os.path.basename(os.path.dirname(run_dir))
    return "/".join(p for p in (parent, name) if p) or run_dir


def _compile_group_by(group_by: str) -> re.Pattern[str]:
    try:
        return re.compile(group_by)
    except re.error as error:
        raise PlotError(f"group_by {group_by!r} is not a regular expression: {error}") from None


def group_of(run_dir: str, group_by: Optional[str] = None) -> str:
    """The method of one run from its path alone: the match of ``group_by`` in its path (its first group, if
    any), else :func:`fallback_group`. (:func:`assign_groups` uses the runs' metadata too.)"""
    if group_by:
        match = _compile_group_by(group_by).search(run_dir.replace(os.sep, "/"))
        if match:
            return match.group(1) if match.groups() else match.group(0)
    return fallback_group(run_dir)


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


_MISSING = object()


def metadata_groups(infos: Sequence[dict]) -> list[str]:
    """Group labels of runs from their metadata: the algorithm, the environment when the runs cover several,
    and the hyperparameters whose values differ between the runs of the same algorithm (keys matching
    :data:`SEED_LIKE` excluded), as ``key=value`` sorted by key."""
    envs = {info.get("env_id") for info in infos}
    by_algo: dict[str, list[dict]] = {}
    for info in infos:
        by_algo.setdefault(info["algo"], []).append(info.get("hyperparameters") or {})
    differing: dict[str, list[str]] = {}
    for algo, hypers in by_algo.items():
        keys = sorted({k for h in hypers for k in h if not SEED_LIKE.search(k)})
        differing[algo] = [k for k in keys if len({json.dumps(h.get(k, "<unset>"), sort_keys=True) for h in hypers}) > 1]
    labels = []
    for info in infos:
        hyper = info.get("hyperparameters") or {}
        parts = [info["algo"]]
        if len(envs) > 1:
            parts.append(str(info.get("env_id")))
        parts += [f"{k}={_format_value(hyper.get(k, '<unset>'))}" for k in differing[info["algo"]]]
        labels.append(" ".join(parts))
    return labels


def _listing(items: Sequence[str]) -> str:
    items = list(items)
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


def assign_groups(runs: Sequence[Run], group_by: Optional[str] = None) -> None:
    """Set ``run.group`` of every run (see the module docstring): from the metadata when a run has it, else
    :func:`fallback_group`; ``group_by`` (a regular expression searched in the run's path) overrides both
    for the runs it matches.

    :raises PlotError: when ``group_by`` is not a regular expression or matches no run.
    """
    with_info = [r for r in runs if r.info is not None]
    for run, label in zip(with_info, metadata_groups([r.info for r in with_info])):  # type: ignore[misc]
        run.group = label
    for run in runs:
        if run.info is None:
            run.group = fallback_group(run.path)
    if not group_by:
        return
    regex = _compile_group_by(group_by)
    unmatched = []
    for run in runs:
        match = regex.search(run.path.replace(os.sep, "/"))
        if match:
            run.group = match.group(1) if match.groups() else match.group(0)
        else:
            unmatched.append(run.path)
    if len(unmatched) == len(runs):
        raise PlotError(f"group_by {group_by!r} matches none of the {len(runs)} run paths: {_listing(unmatched)}")
    if unmatched:
        warnings.warn(
            f"group_by {group_by!r} does not match {len(unmatched)} of {len(runs)} runs; they keep their default "
            f"group: {_listing(unmatched)}",
            stacklevel=2,
        )


def load_scalars(run_dir: str) -> dict[str, Series]:
    """All scalar series of a run directory, ``tag -> (steps, values)`` sorted by step (last value kept
    for a repeated step), read with TensorBoard's ``EventAccumulator``."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    out: dict[str, Series] = {}
    for tag in acc.Tags().get("scalars", []):
        points = {e.step: e.value for e in acc.Scalars(tag)}
        steps = np.array(sorted(points), dtype=np.float64)
        out[tag] = (steps, np.array([points[s] for s in sorted(points)], dtype=np.float64))
    return out


def load_runs(paths: Sequence[str], group_by: Optional[str] = None) -> list[Run]:
    """Find and read every run under ``paths`` (scalars and metadata) and group them (:func:`assign_groups`).

    :raises FileNotFoundError: when no TensorBoard event file is found.
    :raises PlotError: for a ``group_by`` that is not a regular expression or matches no run, or an
        unreadable metadata file.
    """
    dirs = find_run_dirs(paths)
    if not dirs:
        raise FileNotFoundError(
            "no TensorBoard event files (events.out.tfevents.*) found under: " + ", ".join(map(str, paths))
        )
    runs = []
    for d in dirs:
        try:
            info = read_run_info(d)
        except ValueError as error:
            raise PlotError(str(error)) from None
        runs.append(Run(d, "", load_scalars(d), info))
    assign_groups(runs, group_by)
    return runs


def env_of(run: Run) -> Optional[str]:
    """The environment id of a run, from its metadata (``None`` without)."""
    env = (run.info or {}).get("env_id")
    return None if env is None else str(env)


def runs_env(runs: Sequence[Run]) -> Optional[str]:
    """The environment id all ``runs`` share (``None`` when they cover several, or one has no metadata)."""
    envs = {env_of(r) for r in runs}
    return envs.pop() if len(envs) == 1 else None


def split_by_env(runs: Sequence[Run]) -> dict[Optional[str], list[Run]]:
    """The runs per environment id (:func:`env_of`), environments sorted; runs without metadata (``None``) get a
    group of their own only when the others cover two environments or more (their environment is unknown: with one
    known environment they stay with it, as they would without the split)."""
    known = {env_of(r) for r in runs} - {None}
    if len(known) < 2:
        return {None if len(known) == 0 else next(iter(known)): list(runs)}
    out: dict[Optional[str], list[Run]] = {}
    for run in sorted(runs, key=lambda r: (env_of(r) is None, env_of(r) or "", r.path)):
        out.setdefault(env_of(run), []).append(run)
    return out


def groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by group, groups in sorted order."""
    out: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.group, r.path)):
        out.setdefault(run.group, []).append(run)
    return out


# ---------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------
def aggregate(series: Sequence[Series], max_points: int = _MAX_POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and standard deviation over runs on the union of their steps.

    Each run is linearly interpolated inside its own step range (NaN outside; non-finite values are
    dropped); at most ``max_points`` evenly spaced steps are kept.

    :return: ``(steps, mean, std)``; mean / std are NaN where no run covers a step.
    """
    clean = []
    for steps, values in series:
        ok = np.isfinite(values)
        if ok.any():
            clean.append((steps[ok], values[ok]))
    if not clean:
        return np.array([]), np.array([]), np.array([])
    grid = np.unique(np.concatenate([s for s, _ in clean]))
    if grid.size > max_points:
        grid = np.linspace(grid[0], grid[-1], max_points)
    stack = np.full((len(clean), grid.size), np.nan)
    for i, (steps, values) in enumerate(clean):
        inside = (grid >= steps[0]) & (grid <= steps[-1])
        stack[i, inside] = np.interp(grid[inside], steps, values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)  # all-NaN columns: "Mean of empty slice"
        mean = np.nanmean(stack, axis=0)
        std = np.nanstd(stack, axis=0)
    return grid, mean, std


def switch_steps(runs: Sequence[Run], switch_every: Optional[int] = None) -> list[float]:
    """Timesteps (:data:`STEP_AXIS`) of the task switches: multiples of ``switch_every`` before the last logged step,
    or the steps where a logged ``plasticity/.../task_id`` changes (union over runs)."""
    last = max((s[0][-1] for r in runs for s in r.scalars.values() if s[0].size), default=0.0)
    if switch_every:
        return [float(k * switch_every) for k in range(1, math.ceil(last / switch_every))]
    found: set[float] = set()
    for run in runs:
        for tag, (steps, values) in run.scalars.items():
            if tag.startswith("plasticity/") and tag.endswith("/task_id") and steps.size > 1:
                changed = np.nonzero(np.diff(values) != 0)[0] + 1
                found.update(float(s) for s in steps[changed])
    return sorted(found)


#: Tags every :class:`~sb3_plastic.callbacks.monitor.PlasticityMonitor` pass writes under its prefix.
_MONITOR_TAGS = ("monitor_seconds", "skipped_passes")


def monitor_prefixes(tags: Iterable[str]) -> list[str]:
    """Log prefixes of the monitors whose tags are in ``tags``: ``plasticity`` (unnamed) and ``plasticity/<name>``,
    found from their ``<prefix>/monitor_seconds`` and ``<prefix>/skipped_passes`` tags, sorted; ``["plasticity"]``
    when there are none (runs logged without those tags)."""
    found = set()
    for tag in tags:
        head, _, last = tag.rpartition("/")
        if last in _MONITOR_TAGS and head.split("/")[0] == "plasticity" and len(head.split("/")) <= 2:
            found.add(head)
    return sorted(found) or ["plasticity"]


def default_metric_patterns(tags: Iterable[str]) -> list[str]:
    """:data:`DEFAULT_METRICS` for every monitor of :func:`monitor_prefixes` (``plasticity/`` replaced by the
    monitor's prefix)."""
    return [prefix + pattern[len("plasticity") :] for prefix in monitor_prefixes(tags) for pattern in DEFAULT_METRICS]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    conv = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("^" + "".join(conv.get(p, re.escape(p)) for p in parts) + "$")


def match_tags(tags: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Tags matching any of ``patterns`` (exact tags or globs: ``*`` within one level, ``**`` across), in
    pattern order, then sorted."""
    tags = sorted(set(tags))
    out: list[str] = []
    for pattern in patterns:
        regex = _glob_regex(pattern)
        out += [t for t in tags if regex.match(t) and t not in out]
    return out


def check_metrics(tags: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """:func:`match_tags`, where every pattern must match a tag.

    :raises PlotError: naming the patterns that match nothing and listing the scalar tags there are.
    """
    tags = sorted(set(tags))
    missing = [p for p in patterns if not match_tags(tags, [p])]
    if missing:
        which = "pattern " + repr(missing[0]) + " matches" if len(missing) == 1 else f"patterns {missing} match"
        raise PlotError(
            f"metrics {which} no scalar tag of the runs ('*' stays within one '/' level, '**' crosses levels); "
            f"the {len(tags)} tags are: {_listing(tags)}"
        )
    return match_tags(tags, patterns)


def return_like_tags(tags: Iterable[str]) -> list[str]:
    """Scalar tags that look like episode returns (containing ``rew`` or ``return``), sorted."""
    return sorted({t for t in tags if re.search(r"rew|return", t, re.IGNORECASE)})


# ---------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------
def _figure(width: float = 9.0, height: float = 5.0) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def seeds_label(n: int) -> str:
    """``"1 seed"`` or ``"<n> seeds"``: the run count of a legend or a panel title."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _mark_switches(ax: Axes, switches: Sequence[float]) -> None:
    for i, step in enumerate(switches):
        ax.axvline(step, color="0.35", linestyle="--", linewidth=0.9, alpha=0.8, label="task switch" if i == 0 else None)


def _finite_ranges(series: Sequence[Series]) -> list[tuple[float, float]]:
    out = []
    for steps, values in series:
        ok = np.isfinite(values)
        if ok.any():
            out.append((float(steps[ok][0]), float(steps[ok][-1])))
    return out


def _cut_to_common(series: Sequence[Series], group: str, tag: str, cuts: dict) -> list[Series]:
    """The series restricted to the steps all of them cover; a note for the warning goes into ``cuts[group]``."""
    ranges = _finite_ranges(series)
    if len(ranges) < 2:
        return list(series)
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if lo == min(r[0] for r in ranges) and hi == max(r[1] for r in ranges):
        return list(series)
    union = np.unique(np.concatenate([s[np.isfinite(v)] for s, v in series]))
    note = dict(tag=tag, runs=len(ranges), starts=[r[0] for r in ranges], ends=[r[1] for r in ranges], total=union.size)
    if lo > hi:
        cuts.setdefault(group, []).append(dict(note, overlap=False))
        return list(series)
    cut = int(((union < lo) | (union > hi)).sum())
    cuts.setdefault(group, []).append(dict(note, overlap=True, lo=lo, hi=hi, cut=cut))
    out = []
    for steps, values in series:
        keep = (steps >= lo) & (steps <= hi)
        out.append((steps[keep], values[keep]))
    return out


def _warn_cuts(cuts: dict) -> None:
    """One ``UserWarning`` per group whose curves :func:`_cut_to_common` cut (or could not cut)."""
    for group, notes in cuts.items():
        first = notes[0]
        figures = f" ({len(notes)} curves, e.g. {first['tag']})" if len(notes) > 1 else f" ({first['tag']})"
        ranges = ", ".join(f"{a:g}-{b:g}" for a, b in zip(first["starts"], first["ends"]))
        if first["overlap"]:
            message = (
                f"group {group!r}: its {first['runs']} runs log different step ranges ({ranges}); its curves are cut "
                f"to the steps all of them cover, {first['lo']:g}-{first['hi']:g}: {first['cut']} of {first['total']} "
                f"logged steps dropped{figures}"
            )
        else:
            message = (
                f"group {group!r}: the step ranges of its {first['runs']} runs do not overlap ({ranges}): each step "
                f"of its curves averages only the runs that cover it, fewer than the legend's seeds{figures}"
            )
        warnings.warn(message, stacklevel=3)
    cuts.clear()


def _curves(ax: Axes, by_group: dict[str, list[Run]], tag: str, cuts: Optional[dict] = None) -> int:
    drawn = 0
    notes: dict = {} if cuts is None else cuts
    for group, members in by_group.items():
        series = [s for s in (r.series(tag) for r in members) if s is not None]
        steps, mean, std = aggregate(_cut_to_common(series, group, tag, notes))
        if steps.size == 0:
            continue
        (line,) = ax.plot(steps, mean, linewidth=1.6, label=f"{group} ({seeds_label(len(series))})")
        if len(series) > 1:
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn += 1
    if cuts is None:
        _warn_cuts(notes)
    return drawn


def y_scale(tag: str, values: np.ndarray) -> str:
    """``"log"`` or ``"linear"``: the y-axis of a diagnostic. Condition numbers (a metric, the last part of the
    tag, ending in one of :data:`LOG_AXIS_SUFFIXES`) get a log axis whenever they have a positive finite
    value; a ``log10`` metric (``ntk_log10_cond``) is already logarithmic (linear axis); any other metric gets
    a log axis when its values are all positive and span more than two decades."""
    metric = tag.rsplit("/", 1)[-1]
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if "log10" in metric or values.size == 0:
        return "linear"
    if metric.endswith(LOG_AXIS_SUFFIXES):
        return "log" if (values > 0).any() else "linear"
    return "log" if values.min() > 0 and values.max() / values.min() > 100 else "linear"


def legend_label(text: str, width: int = LEGEND_WIDTH) -> str:
    """A legend entry wrapped to lines of at most ``width`` characters (breaking at spaces, and inside a long
    ``key=value`` only when it has to), so the legend fits inside the axes."""
    return textwrap.fill(text, width=width, break_long_words=True, break_on_hyphens=False)


def _finish(fig: Figure, ax: Axes, path: str, legend: bool = True) -> str:
    """Grid, the legend inside the axes (labels wrapped, :func:`legend_label`), saved to ``path``."""
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if legend and handles:
        ax.legend(handles, [legend_label(label) for label in labels], loc="best", fontsize=8, framealpha=0.85)
    fig.savefig(path)
    return path


def _on_env(title: str, env: Optional[str]) -> str:
    """``title`` with the environment of the figure's runs (``None``: several or unknown)."""
    return title if env is None else f"{title} on {env}"


def returns_figure(
    runs: Sequence[Run], switches: Sequence[float] = (), tag: str = RETURN_TAG, cuts: Optional[dict] = None
) -> Optional[tuple[Figure, Axes]]:
    """The figure of the episode return vs timesteps per method (legend: ``<group> (<n> seeds)``),
    task switches marked, not yet saved; ``None`` when no run logs ``tag``. The title names the runs' environment
    when they share one (:func:`runs_env`).

    :param cuts: collects the curves cut to the steps all of a group's runs cover, for one warning per group
        (:func:`plot_runs`); ``None`` warns here."""
    by_group = groups(runs)
    fig, ax = _figure()
    if not _curves(ax, by_group, tag, cuts):
        return None
    _mark_switches(ax, switches)
    ax.set_title(_on_env("Episode return during training", runs_env(runs)) + "\n(mean ± std over seeds)")
    ax.set_xlabel(STEP_AXIS)
    what = "mean return of the last 100 episodes" if tag == RETURN_TAG else tag
    ax.set_ylabel(f"episode return\n({what})")
    return fig, ax


def plot_returns(
    runs: Sequence[Run], out_dir: str, switches: Sequence[float], tag: str = RETURN_TAG, cuts: Optional[dict] = None
) -> Optional[str]:
    """``return_curve.png``: episode return vs timesteps per method (:func:`returns_figure`)."""
    made = returns_figure(runs, switches, tag, cuts)
    if made is None:
        return None
    return _finish(*made, os.path.join(out_dir, "return_curve.png"))


def _task_sort_key(task: str) -> tuple[int, float, str]:
    try:
        return (0, float(task), task)
    except ValueError:
        return (1, 0.0, task)


def task_returns(
    runs: Sequence[Run], switch_every: Optional[int] = None, tag: str = RETURN_TAG
) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Per group, per task: the mean return of each run (one value per seed), and what "task" means.

    From ``plasticity/return/task_<id>`` (each run's mean over its logged values: an unweighted mean of the
    per-write means, each the mean return of the episodes finished since the previous write, so the episodes of a
    write with few of them weigh more than those of a write with many) when logged, else from
    ``tag`` averaged over each phase of ``switch_every`` steps (``"phase k"``); empty without either.
    """
    out: dict[str, dict[str, list[float]]] = {}
    have_tasks = any(_TASK_RETURN.match(t) for r in runs for t in r.scalars)
    for group, members in groups(runs).items():
        per_task: dict[str, list[float]] = {}
        for run in members:
            if have_tasks:
                for t, (_, values) in run.scalars.items():
                    m = _TASK_RETURN.match(t)
                    finite = values[np.isfinite(values)]
                    if m and finite.size:
                        per_task.setdefault(m.group(1), []).append(float(finite.mean()))
            elif switch_every and (s := run.series(tag)) is not None:
                steps, values = s
                phase = (steps // switch_every).astype(int)
                for k in np.unique(phase):
                    finite = values[(phase == k) & np.isfinite(values)]
                    if finite.size:
                        per_task.setdefault(f"phase {k + 1}", []).append(float(finite.mean()))
        out[group] = per_task
    return out, ("task" if have_tasks else "task phase")


def plot_task_returns(
    runs: Sequence[Run], out_dir: str, switch_every: Optional[int] = None, tag: str = RETURN_TAG
) -> Optional[str]:
    """``return_per_task.png``: bar chart of the mean return per task and method (error bars: std over seeds)."""
    data, kind = task_returns(runs, switch_every, tag)
    tasks = sorted({t for per_task in data.values() for t in per_task}, key=_task_sort_key)
    if not tasks:
        return None
    fig, ax = _figure(max(8.0, 1.2 + 0.9 * len(tasks) * max(1, len(data)) ** 0.5), 5.0)
    width = 0.8 / max(len(data), 1)
    x = np.arange(len(tasks))
    for i, (group, per_task) in enumerate(data.items()):
        means = [np.mean(per_task[t]) if t in per_task else math.nan for t in tasks]
        stds = [np.std(per_task[t]) if t in per_task else 0.0 for t in tasks]
        n = max((len(v) for v in per_task.values()), default=0)
        ax.bar(x + (i - (len(data) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=f"{group} ({seeds_label(n)})")
    labels = [f"task {t}" if kind == "task" else t for t in tasks]
    ax.set_xticks(x, labels, rotation=30 if len(tasks) > 8 else 0)
    ax.axhline(0, color="0.2", linewidth=0.6)
    env = runs_env(runs)
    if kind == "task":
        ax.set_title(_on_env("Mean episode return per task", env) + "\n(mean ± std over seeds)")
        ax.set_ylabel("mean episode return on the task")
    else:
        ax.set_title(
            _on_env("Mean episode return per task phase", env)
            + f"\n(phases of {switch_every:,} timesteps; mean ± std over seeds)"
        )
        ax.set_ylabel("mean of the return curve over the phase")
    ax.set_xlabel(kind)
    return _finish(fig, ax, os.path.join(out_dir, "return_per_task.png"))


def _metric_label(metric: str) -> str:
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    if "log10_" in metric:  # ntk_log10_cond: log10 of ntk_cond
        return "log10 of the " + _metric_label(metric.replace("log10_", "", 1))
    return metric.replace("_", " ")


def describe_tag(tag: str, prefixes: Optional[Sequence[str]] = None) -> tuple[str, str]:
    """``(metric label, where)`` of a diagnostic tag ``plasticity[/<name>]/<net>[/<layer>]/<metric>``.

    :param prefixes: the monitors' log prefixes (:func:`monitor_prefixes`); the longest one the tag starts with is
        its monitor. ``None``: a tag of five levels is a named monitor's layer, one of four the unnamed monitor's
        layer (``plasticity/<name>/<net>/<metric>`` can only be told apart with ``prefixes``).
    """
    parts = tag.split("/")
    label = _metric_label(parts[-1])
    if parts[0] != "plasticity":
        return label, tag
    monitor: Optional[str] = None
    rest = parts[1:-1]
    if prefixes is not None:
        owner = max((p for p in prefixes if tag.startswith(p + "/")), key=len, default="plasticity")
        pre = owner.split("/")
        monitor = pre[1] if len(pre) == 2 else None
        rest = parts[len(pre) : -1]
    elif len(rest) == 3:
        monitor, rest = rest[0], rest[1:]
    where = [f"monitor '{monitor}'"] if monitor is not None else []
    if len(rest) in (1, 2):
        where += [f"network '{rest[0]}'"] + ([f"layer '{rest[1]}'"] if len(rest) == 2 else [])
    elif rest:
        return label, tag
    return label, ", ".join(where) if where else tag


def _safe_name(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", tag.replace("/", "__")).strip("_")


def metric_figure(
    runs: Sequence[Run], tag: str, switches: Sequence[float] = (), cuts: Optional[dict] = None
) -> Optional[tuple[Figure, Axes]]:
    """The figure of one diagnostic vs timesteps per method (y-axis scale from :func:`y_scale`), not
    yet saved; ``None`` when no run logs ``tag``. ``cuts``: as :func:`returns_figure`."""
    by_group = groups(runs)
    fig, ax = _figure()
    if not _curves(ax, by_group, tag, cuts):
        return None
    _mark_switches(ax, switches)
    found = [s[1] for members in by_group.values() for r in members if (s := r.series(tag)) is not None]
    scale = y_scale(tag, np.concatenate(found) if found else np.array([]))
    ax.set_yscale(scale)
    label, where = describe_tag(tag, monitor_prefixes({t for r in runs for t in r.scalars}))
    title = _on_env(f"{label[0].upper()}{label[1:]}: {where}", runs_env(runs))
    ax.set_title(f"{title}\n(mean ± std over seeds; TensorBoard tag {tag})", fontsize=11)
    ax.set_xlabel(STEP_AXIS)
    ax.set_ylabel(f"{label} (log scale)" if scale == "log" else label)
    return fig, ax


def plot_metric(
    runs: Sequence[Run], tag: str, out_dir: str, switches: Sequence[float], cuts: Optional[dict] = None
) -> Optional[str]:
    """``metric_<tag>.png``: one diagnostic vs timesteps per method (:func:`metric_figure`)."""
    made = metric_figure(runs, tag, switches, cuts)
    if made is None:
        return None
    return _finish(*made, os.path.join(out_dir, f"metric_{_safe_name(tag)}.png"))


def plot_runs(
    paths: Sequence[str],
    out_dir: str,
    metrics: Optional[Sequence[str]] = None,
    switch_every: Optional[int] = None,
    group_by: Optional[str] = None,
    return_tag: Optional[str] = None,
    split_envs: bool = True,
) -> list[str]:
    """Read the runs under ``paths`` and write every figure into ``out_dir`` (created if needed).

    :param paths: run directories, or directories above them, or event files.
    :param metrics: diagnostic tags or glob patterns, each of which must match a tag of some run (default
        :data:`DEFAULT_METRICS` of every monitor the runs log, :func:`default_metric_patterns`; a warning when they
        match nothing).
    :param switch_every: timesteps per task (:data:`STEP_AXIS`: ``change_every x n_envs``); ``None`` takes the switches
        from ``plasticity/task_id``.
    :param group_by: regular expression giving a run's method from its path (default: the run metadata, see
        :func:`assign_groups`).
    :param return_tag: scalar tag of the episode return, which some run must log (default :data:`RETURN_TAG`;
        without it the return curve is left out with a warning).
    :param split_envs: when the runs cover several environments (their metadata's ``env_id``), one set of figures
        per environment, in ``out_dir/<env id>/`` (runs without metadata in ``out_dir/no_run_metadata/``;
        :func:`split_by_env`), each with
        the environment in its titles and its methods grouped among its own runs (default). ``False``: every run on
        the same axes, the environment in the legend labels.
    :return: paths of the PNG files written.
    :raises FileNotFoundError: when no event file is found.
    :raises PlotError: for a bad ``switch_every``, a ``metrics`` pattern matching no tag, a ``return_tag`` no run
        logs, a ``group_by`` matching no run.
    """
    if switch_every is not None and (
        isinstance(switch_every, bool) or not isinstance(switch_every, (int, np.integer)) or switch_every <= 0
    ):
        raise PlotError(
            f"switch_every must be a positive integer (timesteps per task (change_every x n_envs)), got {switch_every!r}"
        )
    runs = load_runs(paths, group_by)
    all_tags = sorted({t for r in runs for t in r.scalars})
    if metrics is not None and isinstance(metrics, str):
        metrics = [metrics]
    if metrics:
        check_metrics(all_tags, list(metrics))
    else:
        defaults = default_metric_patterns(all_tags)
        if not match_tags(all_tags, defaults):
            warnings.warn(
                f"no scalar tag of the {len(runs)} runs matches the default diagnostics ({_listing(defaults)}): no "
                "metric figures (log them with PlasticityMonitor, or pass metrics / --metrics patterns of the tags "
                f"there are: {_listing(all_tags)})",
                stacklevel=2,
            )
    if return_tag is None:
        return_tag = RETURN_TAG
        if return_tag not in all_tags:
            warnings.warn(f"no run logs the return tag {return_tag!r}: no return curve", stacklevel=2)
    elif return_tag not in all_tags:
        like = return_like_tags(all_tags)
        raise PlotError(
            f"return_tag {return_tag!r} is logged by none of the {len(runs)} runs; "
            + (f"tags that look like returns: {_listing(like)}" if like else "no tag looks like a return (rew/return)")
        )
    by_env = split_by_env(runs) if split_envs else {None: list(runs)}
    written: list[str] = []
    cuts: dict = {}
    for env, members in by_env.items():
        folder = out_dir if len(by_env) == 1 else os.path.join(out_dir, _safe_name(env) if env else NO_ENV_FOLDER)
        if len(by_env) > 1 and not group_by:
            assign_groups(members)  # the methods as they differ among this environment's runs
        tags = sorted({t for r in members for t in r.scalars})
        chosen = match_tags(tags, list(metrics) if metrics else default_metric_patterns(tags))
        if return_tag in all_tags and return_tag not in tags:
            warnings.warn(f"no run on {env or 'the runs without metadata'} logs {return_tag!r}: no return curve for it")
        os.makedirs(folder, exist_ok=True)
        switches = switch_steps(members, switch_every)
        written += [
            plot_returns(members, folder, switches, return_tag, cuts),
            plot_task_returns(members, folder, switch_every, return_tag),
        ]
        written += [plot_metric(members, tag, folder, switches, cuts) for tag in chosen]
    _warn_cuts(cuts)
    return [w for w in written if w is not None]
