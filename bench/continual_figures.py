"""The figures of ``bench/continual.py``, built from the summary (``summary.json``'s per-method entries) and the run
JSONs alone, legible at README width (issue #29, part 4).

* ``end_of_task.png``: small multiples, one panel per method, each against the plain baseline and the fresh level:
  the method's end-of-task score per task (the IQM over seeds, the statistic the tables quote; band: its stratified
  bootstrap 95 % CI), the plain baseline's IQM (black) and the fresh agents' IQM (grey dashed: the plain baseline's
  fresh agents; dotted in the method's colour: the method's own, where they are not the plain baseline's).
* ``plasticity.png``: the same panels for plasticity per task, the ratio of means sum(continual) / sum(fresh) over
  seeds of each task (the estimator of the tables' "ratio of means" column; band: its paired bootstrap 95 % CI), the
  plain baseline's in black, the fresh level at 1.
* ``diagnostics.png``: one panel per network diagnostic, one line per method (the mean over seeds, the statistic the
  diagnostics table quotes), each method its own colour and line style (no two alike).

Every legend lies inside the figure; a log axis plots positive values only (a zero, e.g. MaxMin's DfI at step 0, is
left out instead of stretching the axis down to 1e-10).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from sb3_plastic.plot import seeds_label

#: the figures' width in inches at this dpi: ~1000 px, legible at README width
FIG_WIDTH, DPI = 9.0, 110
#: panels per row of the small multiples
COLUMNS = 4
#: the colours of the small multiples: the panel's method, the plain baseline, the fresh level
METHOD_COLOR, PLAIN_COLOR, FRESH_COLOR = "tab:blue", "black", "0.45"
#: fresh lines carry markers: with ``--fresh sample`` they have values on a few tasks only, between NaNs
FRESH_MARKER = "x"
#: colours of the diagnostics' methods (tab10 without its grey, kept for references), then line styles: 36 styles
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan")
LINESTYLES = ("-", "--", ":", "-.")


def figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: str) -> str:
    fig.savefig(path, dpi=DPI)
    return path


def positive(values: Any) -> np.ndarray:
    """``values`` as floats with every value that a log axis cannot show (<= 0, NaN, None) set to NaN."""
    array = np.array([np.nan if v is None else v for v in np.ravel(values)], dtype=float).reshape(np.shape(values))
    return np.where(np.isfinite(array) & (array > 0), array, np.nan)


def as_floats(values: Optional[list]) -> np.ndarray:
    """A summary list (``None`` where a value is missing) as floats with NaN for the gaps."""
    return np.array([np.nan if v is None else v for v in values or []], dtype=float)


def line_styles(methods: list[str], plain: Optional[str]) -> dict[str, dict[str, Any]]:
    """One style per method: the plain baseline black and thick, the others :data:`PALETTE`'s colours in turn, then
    the same colours dashed, dotted, dash-dotted (36 distinct styles; a 37th method repeats the first)."""
    styles: dict[str, dict[str, Any]] = {}
    others = [m for m in methods if m != plain]
    for i, method in enumerate(others):
        styles[method] = dict(color=PALETTE[i % len(PALETTE)],
                              linestyle=LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)], linewidth=1.3)
    if plain in methods:
        styles[plain] = dict(color=PLAIN_COLOR, linestyle="-", linewidth=2.0)
    return styles


def _panel_methods(summary: dict[str, Any], plain: str) -> list[str]:
    """The methods that get a panel: every method but the plain baseline (drawn in each), or the plain one alone."""
    others = [m for m in summary if m != plain]
    return others or [m for m in summary if m == plain]


def _panels(fig: Any, count: int, top: float) -> list[Any]:
    """``count`` axes in rows of :data:`COLUMNS` (fewer when there are fewer panels), sharing both axes."""
    columns = min(COLUMNS, count)
    rows = math.ceil(count / columns)
    grid = fig.add_gridspec(rows, columns, top=top, bottom=0.5 / fig.get_figheight(), left=0.07, right=0.99,
                            hspace=0.45, wspace=0.12)
    axes = []
    for i in range(count):
        shared = axes[0] if axes else None
        axes.append(fig.add_subplot(grid[i // columns, i % columns], sharex=shared, sharey=shared))
    for i, ax in enumerate(axes):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i % columns:
            ax.tick_params(labelleft=False)
        if i < count - columns:
            ax.tick_params(labelbottom=False)
    return axes


#: legend columns of the figures
LEGEND_COLUMNS = 3


def header_inches(entries: int, columns: int = LEGEND_COLUMNS) -> float:
    """Height of a figure's header: a two-line title, a legend of ``entries`` in ``columns`` and the first row's
    panel titles."""
    return 0.5 + 0.19 * math.ceil(entries / columns) + 0.35


def _header(fig: Any, title: str, handles: list[Any], labels: list[str], columns: int = LEGEND_COLUMNS) -> None:
    """The title and the one legend of the figure, at its top (inside the figure, above the panels)."""
    fig.suptitle(title, fontsize=9, y=1 - 0.06 / fig.get_figheight())
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.5 / fig.get_figheight()),
               ncol=columns, fontsize=8, frameon=False)


#: a log axis spans at most this many decades below its largest value: a value below (an exact isometry's DfI is
#: float noise, ~1e-10) is drawn off the bottom of the axis instead of stretching it
LOG_DECADES = 6


def limit_log_axis(ax: Any, values: list[np.ndarray]) -> None:
    """Fit the log y-axis ``ax`` to the positive values of ``values`` within :data:`LOG_DECADES` decades of the
    largest: from the smallest such value to the largest (a margin of x1.5 each side); smaller ones fall below."""
    finite = np.concatenate([positive(v).ravel() for v in values]) if values else np.array([])
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return
    top = float(finite.max())
    bottom = float(finite[finite >= top * 10.0**-LOG_DECADES].min())
    ax.set_ylim(bottom / 1.5, top * 1.5)


def _small_multiples(summary: dict[str, Any], plain: str, title: str, ylabel: str, series: Any,
                     labels: tuple[str, str], reference: Optional[float] = None) -> Any:
    """The small multiples of :func:`end_of_task_figure` and :func:`plasticity_figure`: ``series(entry)`` gives a
    method's ``(line, low, high, own fresh line or None)`` per task; the plain baseline's line is drawn in every
    panel and ``reference`` (a constant fresh level) or the plain baseline's fresh line as the fresh level."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    methods = _panel_methods(summary, plain)
    columns = min(COLUMNS, len(methods))
    rows = math.ceil(len(methods) / columns)
    header = header_inches(5)
    fig = figure(FIG_WIDTH, header + (1.75 if columns >= 3 else 3.0) * rows + 0.5)  # (one or two wide panels: taller)
    axes = _panels(fig, len(methods), top=1 - header / fig.get_figheight())
    base = series(summary[plain]) if plain in summary else None
    own_drawn = False
    for ax, method in zip(axes, methods):
        entry = summary[method]
        line, low, high, own = series(entry)
        x = np.arange(len(line))
        if base is not None and method != plain:
            ax.plot(np.arange(len(base[0])), base[0], color=PLAIN_COLOR, linewidth=1.1, gid="plain")
        if reference is not None:
            ax.axhline(reference, color=FRESH_COLOR, linestyle="--", linewidth=1.1, gid="fresh")
        elif base is not None and base[3] is not None:
            ax.plot(np.arange(len(base[3])), base[3], color=FRESH_COLOR, linestyle="--", linewidth=1.1,
                    marker=FRESH_MARKER, markersize=3, gid="fresh")
        if own is not None and method != plain and (base is None or base[3] is None or len(base[3]) != len(own)
                                                    or not np.allclose(own, base[3], equal_nan=True)):
            ax.plot(x, own, color=METHOD_COLOR, linestyle=":", linewidth=1.3, marker=FRESH_MARKER, markersize=3,
                    gid=f"fresh:{method}")
            own_drawn = True
        ax.fill_between(x, low, high, color=METHOD_COLOR, alpha=0.22, linewidth=0)
        ax.plot(x, line, color=METHOD_COLOR, linewidth=1.8, marker="o", markersize=2.5, gid=f"method:{method}")
        ax.set_title(f"{method} ({seeds_label(len(entry['seeds']))})", fontsize=8, pad=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[::min(COLUMNS, len(methods))]:
        ax.set_ylabel(ylabel, fontsize=7)
    for ax in axes[-min(COLUMNS, len(methods)):]:
        ax.set_xlabel("task", fontsize=7)
    handles = [Line2D([], [], color=METHOD_COLOR, linewidth=1.8, marker="o", markersize=2.5), Patch(
        color=METHOD_COLOR, alpha=0.22)]
    labels = list(labels)
    if base is not None and len(methods) and methods[0] != plain:
        handles.append(Line2D([], [], color=PLAIN_COLOR, linewidth=1.1))
        labels.append(f"{plain} (plain)")
    if reference is not None:
        handles.append(Line2D([], [], color=FRESH_COLOR, linestyle="--"))
        labels.append(f"fresh agent (= {reference:g})")
    elif base is not None and base[3] is not None:
        handles.append(Line2D([], [], color=FRESH_COLOR, linestyle="--", marker=FRESH_MARKER, markersize=3))
        labels.append(f"fresh agents of {plain} (IQM)")
    if own_drawn:
        handles.append(Line2D([], [], color=METHOD_COLOR, linestyle=":", marker=FRESH_MARKER, markersize=3))
        labels.append("the method's own fresh agents (IQM)")
    _header(fig, title, handles, labels)
    return fig


def end_of_task_figure(summary: dict[str, Any], setting: Any, plain: str, score: Optional[str] = None) -> Any:
    """The end-of-task score per task as small multiples (module docstring): from ``score_iqm``,
    ``score_iqm_ci_low`` / ``_high`` and ``fresh_iqm`` of the summary's entries; ``score`` names the setting's score
    on the axis (default: reward per env step or episode return)."""

    def series(entry: dict[str, Any]) -> tuple:
        fresh = as_floats(entry["fresh_iqm"]) if entry.get("fresh_iqm") else None
        return (as_floats(entry["score_iqm"]), as_floats(entry["score_iqm_ci_low"]),
                as_floats(entry["score_iqm_ci_high"]), fresh)

    score = score or ("reward per env step" if setting.score == "end_reward" else "episode return")
    return _small_multiples(summary, plain, f"{setting.description}\nend of each task: {score} over its last "
                            f"{setting.tail:.0%}", score, series, ("panel's method: IQM over seeds",
                                                                   "95 % CI (stratified bootstrap)"))


def plasticity_figure(summary: dict[str, Any], plain: str, title: str) -> Optional[Any]:
    """Plasticity per task as small multiples (module docstring), from ``plasticity_ratio_per_task``; ``None`` when no
    method has it (no fresh agents, or fresh scores that do not sum to a positive number)."""
    have = {m: s for m, s in summary.items() if s.get("plasticity_ratio_per_task")}
    if not have:
        return None

    def series(entry: dict[str, Any]) -> tuple:
        ratio = entry["plasticity_ratio_per_task"]
        return as_floats(ratio["ratio"]), as_floats(ratio["low"]), as_floats(ratio["high"]), None

    return _small_multiples(have, plain, f"{title}\nplasticity per task: ratio of means over seeds, "
                            "sum(continual) / sum(fresh agents of the method)", "continual / fresh", series,
                            ("panel's method: ratio of means", "95 % CI (paired bootstrap over seeds)"),
                            reference=1.0)


#: the panels of the diagnostics figure: (metric, title, axis scale)
DIAGNOSTIC_PANELS = (("dormant_fraction", "dormant fraction", "linear"), ("ntk_cond", "NTK condition number", "log"),
                     ("ntk_erank", "NTK effective rank", "linear"), ("dfi", "DfI, all layers (heads included)", "log"),
                     ("dfi_hidden", "DfI, hidden layers (AdamO's penalised layers)", "log"),
                     ("weight_norm", "weight norm", "log"))


def diagnostics_figure(records: list[dict], methods: list[str], setting: Any, network: str,
                       plain: Optional[str]) -> Optional[Any]:
    """The network diagnostics of the continual runs over training: one panel per metric, one line per method, the
    mean over seeds at each pass (the statistic of the diagnostics table); task switches dotted. ``None`` without
    diagnostics."""
    from matplotlib.lines import Line2D

    runs = [r for r in records if r.get("fresh_task") is None and r.get("diagnostics") and r["method"] in methods]
    if not runs:
        return None
    present = [m for m in methods if any(r["method"] == m for r in runs)]
    styles = line_styles(present, plain)
    header = header_inches(len(present), columns=5)
    fig = figure(FIG_WIDTH + 2, header + 5.6)
    grid = fig.add_gridspec(2, 3, top=1 - header / fig.get_figheight(), bottom=0.07, left=0.06, right=0.99,
                            hspace=0.32, wspace=0.22)
    for i, (metric, label, scale) in enumerate(DIAGNOSTIC_PANELS):
        ax = fig.add_subplot(grid[i // 3, i % 3])
        key = f"plasticity/{network}/{metric}"
        drawn = []
        for method in present:
            series = [np.array(r["diagnostics"][key], dtype=float) for r in runs
                      if r["method"] == method and key in r["diagnostics"]]
            if not series:
                continue
            n = min(len(x) for x in series)
            mean = np.array([x[:n, 1] for x in series]).mean(axis=0)
            drawn.append(positive(mean) if scale == "log" else mean)
            ax.plot(series[0][:n, 0], drawn[-1], gid=f"method:{method}", **styles[method])
        for k in range(1, setting.tasks):
            ax.axvline(k * setting.task_timesteps, color="0.7", linewidth=0.5, linestyle=":")
        ax.set_yscale(scale)
        if scale == "log":
            limit_log_axis(ax, drawn)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("env steps", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], **styles[m]) for m in present]
    _header(fig, f"{network} network diagnostics (PlasticityMonitor) of the continual runs: mean over seeds; dotted: "
            f"task switches; log axes: at most {LOG_DECADES} decades", handles, present, columns=5)
    return fig
