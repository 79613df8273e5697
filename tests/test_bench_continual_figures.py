"""bench/continual.py's figures and rebuilds (issue #29, parts 4 and 5): the small multiples plot the statistic the
tables quote (the IQM over seeds per task, the per-task ratio of means), log axes do not stretch to zeros, every method
has its own line style, the legends lie inside the figure; a rebuild is byte for byte the same, also after a last-bit
change of the inputs, the committed summary rebuilds from the committed JSONs, and --plot-only says which seeds it
summarises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from test_bench_continual import _load
from test_bench_continual_protocol import _synthetic_runs, _tiny_bandit

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "continual"


@pytest.fixture
def continual(monkeypatch):
    module = _load()
    monkeypatch.setattr(module.continual_report, "REPS", 200)  # where the statistics read it
    return module


def _scores(seed=0, seeds=5, tasks=4):
    """Continual and fresh scores (seeds x tasks) whose mean and IQM differ: one seed far above the others."""
    rng = np.random.default_rng(seed)
    plain, fresh, l2, l2_fresh = (rng.uniform(0.2, 0.9, size=(seeds, tasks)) for _ in range(4))
    plain[0] += 5.0  # an outlier seed moves the mean, not the IQM
    l2[1] += 3.0
    return plain, fresh, l2, l2_fresh


def _lines(ax):
    return {line.get_gid(): np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines() if line.get_gid()}


def _summary(continual, tmp_path, setting):
    plain, fresh, l2, l2_fresh = _scores()
    _synthetic_runs(tmp_path, setting, {"ppo": (plain, fresh), "ppo_l2": (l2, l2_fresh), "ppo_snp": (l2, fresh)})
    records = continual.load_records(str(tmp_path))
    return continual.rounded(continual.summarise(records, ["ppo", "ppo_l2", "ppo_snp"], setting)), records


def test_a_panel_of_one_seed_says_one_seed(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=4)
    plain, fresh, l2, l2_fresh = _scores()
    _synthetic_runs(tmp_path, setting, {"ppo": (plain, fresh), "ppo_l2": (l2[:1], l2_fresh[:1])})
    result = continual.summarise(continual.load_records(str(tmp_path)), ["ppo", "ppo_l2"], setting)
    fig = continual.continual_figures.end_of_task_figure(result["methods"], setting, "ppo")
    assert [ax.get_title() for ax in fig.axes] == ["ppo_l2 (1 seed)"]


def test_end_of_task_panels_plot_the_per_task_iqm_against_plain_and_the_fresh_level(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=4)
    result, _ = _summary(continual, tmp_path, setting)
    plain, fresh, l2, l2_fresh = _scores()
    fig = continual.continual_figures.end_of_task_figure(result["methods"], setting, "ppo")
    assert [ax.get_title() for ax in fig.axes] == ["ppo_l2 (5 seeds)", "ppo_snp (5 seeds)"]  # a panel per method

    def iqm(matrix):  # per task over seeds, scipy's 25 % trimmed mean (independent of rliable and the summary)
        return np.array([scipy.stats.trim_mean(matrix[:, k], 0.25) for k in range(matrix.shape[1])])

    l2_panel, snp_panel = (_lines(ax) for ax in fig.axes)
    np.testing.assert_allclose(l2_panel["method:ppo_l2"], iqm(l2), rtol=1e-9)
    assert not np.allclose(l2_panel["method:ppo_l2"], l2.mean(axis=0))  # the IQM, not the mean
    np.testing.assert_allclose(l2_panel["plain"], iqm(plain), rtol=1e-9)
    np.testing.assert_allclose(l2_panel["fresh"], iqm(fresh), rtol=1e-9)
    np.testing.assert_allclose(l2_panel["fresh:ppo_l2"], iqm(l2_fresh), rtol=1e-9)  # its own fresh agents
    assert "fresh:ppo_snp" not in snp_panel  # the plain fresh agents: drawn once, as the fresh level
    np.testing.assert_allclose(snp_panel["method:ppo_snp"], iqm(l2), rtol=1e-9)
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]  # the CI band brackets the line
    assert band.min() <= iqm(l2).min() and band.max() >= iqm(l2).max()
    _assert_legend_inside_and_clear_of_the_panels(fig)


def _assert_legend_inside_and_clear_of_the_panels(fig):
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    for ax in fig.axes:
        assert not box.overlaps(ax.get_tightbbox(renderer)), ax.get_title()


def test_plasticity_panels_plot_the_per_task_ratio_of_means(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=4)
    result, _ = _summary(continual, tmp_path, setting)
    plain, fresh, l2, l2_fresh = _scores()
    fig = continual.continual_figures.plasticity_figure(result["methods"], "ppo", "title")
    lines = _lines(fig.axes[0])
    np.testing.assert_allclose(lines["method:ppo_l2"], l2.sum(axis=0) / l2_fresh.sum(axis=0), rtol=1e-9)
    np.testing.assert_allclose(lines["plain"], plain.sum(axis=0) / fresh.sum(axis=0), rtol=1e-9)
    _assert_legend_inside_and_clear_of_the_panels(fig)


def test_log_axes_leave_out_zeros_and_float_noise_and_every_method_has_its_own_style(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=4)
    _, records = _summary(continual, tmp_path, setting)
    for r in records:  # MaxMin-like: an exact isometry at step 0 (DfI 0, or float noise), thousands later
        r["diagnostics"]["plasticity/policy/dfi"] = [[0, 0.0], [100, 2e3], [200, 4e3], [300, 8e4]]
        r["diagnostics"]["plasticity/policy/dfi_hidden"] = [[0, 1e-10], [100, 2e3], [200, 4e3], [300, 8e4]]
    fig = continual.continual_figures.diagnostics_figure(records, ["ppo", "ppo_l2", "ppo_snp"], setting, "policy",
                                                         "ppo")
    logs = [ax for ax in fig.axes if ax.get_yscale() == "log"]
    assert {ax.get_title() for ax in logs} >= {"DfI, all layers (heads included)",
                                              "DfI, hidden layers (AdamO's penalised layers)"}
    for ax in logs:
        for line in (line for line in ax.get_lines() if line.get_gid()):  # (not the task switches' markers)
            y = np.asarray(line.get_ydata(), dtype=float)
            assert not np.any(y <= 0), ax.get_title()  # a zero is left out, not drawn at 1e-300
        if "DfI" in ax.get_title():
            bottom, top = ax.get_ylim()
            assert bottom == pytest.approx(2e3 / 1.5) and top >= 8e4  # not stretched down to the 1e-10 of step 0
    styles = [(line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines() if line.get_gid()]
    assert len(styles) == 3 == len(set(styles))
    many = continual.continual_figures.line_styles([f"m{i}" for i in range(36)] + ["ppo"], "ppo")
    assert len({(s["color"], s["linestyle"]) for s in many.values()}) == 37 and many["ppo"]["color"] == "black"
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    light = {colormaps["tab20"](i) for i in range(1, 20, 2)}  # tab20's pale halves
    assert not light & {to_rgba(s["color"]) for s in many.values()}
    _assert_legend_inside_and_clear_of_the_panels(fig)


def _rebuilt(continual, out, *extra):
    assert continual.main(["--plot-only", "--out", str(out), "--tasks", "6", *extra]) == 0
    return {name: (out / name).read_bytes() for name in ("summary.json", "summary.md", "end_of_task.png",
                                                          "plasticity.png", "diagnostics.png")}


def test_rebuilds_are_byte_identical_also_after_a_last_bit_change_of_the_inputs(continual, tmp_path):
    setting = _tiny_bandit(continual, tasks=6)
    rng = np.random.default_rng(4)
    fresh, lost = 0.8 + 0.05 * rng.standard_normal((5, 6)), 0.4 + 0.05 * rng.standard_normal((5, 6))
    _synthetic_runs(tmp_path / "a", setting, {"ppo": (lost, fresh), "ppo_l2": (fresh * 0.9, fresh)})
    first = _rebuilt(continual, tmp_path / "a")
    assert _rebuilt(continual, tmp_path / "a") == first
    # the same runs, every score one float step away (what another CPU's summation order does to a result)
    _synthetic_runs(tmp_path / "b", setting, {"ppo": (np.nextafter(lost, 1), np.nextafter(fresh, 0)),
                                              "ppo_l2": (np.nextafter(fresh * 0.9, 0), np.nextafter(fresh, 1))})
    moved = _rebuilt(continual, tmp_path / "b")
    assert moved["summary.json"] == first["summary.json"] and moved["summary.md"] == first["summary.md"]
    floats = []

    def collect(value):
        if isinstance(value, float):
            floats.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)

    collect(json.loads(first["summary.json"]))
    assert len(floats) > 100 and all(v == float(f"{v:.10g}") for v in floats if np.isfinite(v))  # 10 digits written


def test_plot_only_says_which_seeds_it_summarises(continual, tmp_path, capsys):
    setting = _tiny_bandit(continual, tasks=6)
    scores = 0.5 + 0.01 * np.arange(36).reshape(6, 6)
    _synthetic_runs(tmp_path, setting, {"ppo": (scores, scores)})
    assert continual.main(["--plot-only", "--out", str(tmp_path), "--tasks", "6", "--no-diagnostics-plots"]) == 0
    out = capsys.readouterr()
    assert "seeds=0 1 2 3 4 5 (every seed found)" in out.out and "seeds=0 1 2," not in out.out
    assert continual.main(["--plot-only", "--out", str(tmp_path), "--tasks", "6", "--no-diagnostics-plots",
                           "--seeds", "0", "1"]) == 0
    out = capsys.readouterr()
    assert "--seeds 0 1 has no effect with --plot-only: every run found is summarised" in out.err
    assert "| ppo | 6 |" in out.out  # all six seeds, as the banner says


def test_a_committed_summary_rebuilds_byte_for_byte_from_its_committed_runs(tmp_path):
    """The README's rebuild of ``cartpole_obs_ent0.01`` (plain PPO with ``ent_coef=0.01``, 5 seeds, fresh agents) in a
    fresh clone: the same summary.json and summary.md, byte for byte (the module's own bootstrap size)."""
    continual = _load()
    committed = RESULTS / "cartpole_obs_ent0.01"
    shutil.copytree(committed / "runs", tmp_path / "runs")
    assert continual.main(["--setting", "cartpole_obs", "--ppo-kwarg", "ent_coef=0.01", "--out", str(tmp_path),
                           "--plot-only", "--no-diagnostics-plots"]) == 0
    for name in ("summary.json", "summary.md"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name


def test_fresh_agents_on_a_sample_of_tasks_are_visible(continual, tmp_path):
    """With --fresh sample a fresh line has values on a few tasks only, between NaNs: a line alone draws nothing
    there, so the fresh lines carry markers (the method's own and the plain baseline's)."""
    setting = _tiny_bandit(continual, tasks=4)
    result, _ = _summary(continual, tmp_path, setting)
    for method in ("ppo", "ppo_l2"):
        fresh = result["methods"][method]["fresh_iqm"]
        result["methods"][method]["fresh_iqm"] = [None if k % 2 == 0 else v for k, v in enumerate(fresh)]
    fig = continual.continual_figures.end_of_task_figure(result["methods"], setting, "ppo")
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines() if line.get_gid()}
    for gid in ("fresh", "fresh:ppo_l2"):
        y = np.asarray(lines[gid].get_ydata(), dtype=float)
        assert np.isnan(y[0]) and np.isfinite(y[1]) and np.isnan(y[2]), gid  # isolated values
        assert lines[gid].get_marker() not in (None, "None", "", " ") and lines[gid].get_markersize() > 0, gid
