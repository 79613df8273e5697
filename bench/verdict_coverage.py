"""How often the continual tables' verdicts err with 3-5 runs, and which committed verdicts depend on the interval.

The continual tables (``bench/continual_report.py``) judge "continual vs fresh" by a paired interval of the ratio of
means sum(continual) / sum(fresh) over runs, and "vs plain" by a two-sample comparison with the plain baseline's runs.
Until the thirty-second session both were percentile bootstraps over runs (for "vs plain", two IQM intervals that do
not overlap); with 3-5 runs a percentile bootstrap is too narrow (it spreads like the runs with divisor n and normal
quantiles, where Student's t with n - 1 degrees of freedom applies). "Continual vs fresh" reads a Student-t interval
since the thirty-second session, "vs plain" Welch's t on the runs' last-half means since the thirty-fourth. This
script measures it:

1. **Simulations** (seeded; the true ratio 1, so every "above" / "below" is an error): for each data model and run
   count, the share of experiments whose paired 95 % interval misses 1 (the bootstrap the tables used until the
   thirty-second session, ``rl_stats.ratio_of_means_ci`` with the tables' 2 000 resamples, against the Student-t
   interval of the linearised ratio the verdict reads now, ``rl_stats.ratio_of_means_t_ci``, and two bounded-side
   alternatives an audit asked about, because the symmetric t interval reaches below 0 on three PerturbedCartPole
   rows whose returns cannot: Fieller's interval, :func:`fieller_ci`, and the t interval on the log scale,
   :func:`log_t_ci`), and the share of null experiments (two methods drawn alike, 10 tasks a run) that "vs plain"
   calls above or below, by the rule until the thirty-third session (two IQM intervals, ``rl_stats.iqm_ci`` with
   whole runs resampled, that do not overlap) and by Welch's t on the runs' last-half means
   (``rl_stats.welch_t_ci``), with each rule's power against a true 15 % difference; the normal-theory value of the
   bootstrap's error beside them (for normal
   run statistics its interval is ``mean +- z s sqrt((n - 1) / n) / sqrt(n)``, so it errs with probability
   ``P(|T_{n-1}| > z sqrt((n - 1) / n))``); and the power of both paired intervals against a true 15 % loss.
2. **The Slippery Ant trend** (``continual_report.parameter_adjusted_trend``: the OLS slope of the score on the task
   index with log10 friction and its square as covariates and an intercept per seed): how often its 95 % interval
   holds the true slope, for the cluster-robust (CR1) interval with t on seeds - 1 degrees of freedom the table gives
   since the thirty-second session and for the percentile bootstrap over seeds it replaced (here with
   :data:`TREND_REPS` resamples), on data drawn like that model (10 tasks per seed, frictions log-uniform on
   [0.01, 2], a true slope of -50 per task with or without seed-to-seed slope differences, SD 60, noise SD 350).
3. **The committed folders**: every method of every ``bench/results/continual/*/summary.json`` whose paired statistic
   has both intervals, with the verdict each gives; the rows where they differ are the verdicts that moved.

Models (per run ``i``, ``cells`` paired cells; continual and fresh cells drawn alike, so the ratio of means is 1):

* ``normal``: a run effect N(0, 2^2) shared by a run's cells, cell noise N(0, 3^2) around 20; 4 cells (the sample of
  fresh agents per seed of ``minatar_intensive``).
* ``collapse``: cells that collapse to 9 with probability 0.3, else N(300, 120^2) clipped to [9, 500] (a CartPole
  return); 10 cells (a fresh agent on every late task).
* ``skewed``: a log-normal run effect (sigma 0.5) times Gamma(4, 0.25) cells; 4 cells.
* ``run collapse``: ``collapse``'s cells, but a continual run collapses as a whole (every cell at 9, probability
  0.3: the committed collapsed runs look like that) while each fresh agent collapses on its own; 10 cells. The
  "vs plain" rows draw both methods' runs this way.

    OMP_NUM_THREADS=1 nice -n 10 python bench/verdict_coverage.py          # ~15 CPU-min; writes the results folder
    python bench/verdict_coverage.py --trials 200 --out /tmp/vc             # a quick look
    python bench/verdict_coverage.py --committed-only                       # the listings again, after new runs
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import continual_methods
from continual_report import parameter_adjusted_trend
from rl_stats import _check_level, iqm_ci, paired_run_sums, ratio_of_means_ci, ratio_of_means_t_ci, welch_t_ci

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "continual")
#: the tables' bootstrap resamples (``continual_report.REPS``)
TABLE_REPS = 2000
RUNS = (3, 4, 5, 10)
#: the "vs plain" rule's tasks per run (a last half of 10 tasks; ``minatar_intensive`` has 10, the others 5-6)
PLAIN_TASKS = 10
#: a true loss the power rows look for: continual = (1 - LOSS) x fresh in expectation
LOSS = 0.15
#: the trend rows: seeds per experiment, the true slope, the seed-to-seed slope SDs, the old bootstrap's resamples
TREND_SEEDS, TREND_SLOPE, TREND_SLOPE_SDS, TREND_REPS = (3, 5), -50.0, (0.0, 60.0), 500

Model = Callable[[np.random.Generator, int, int], np.ndarray]


def _normal(rng: np.random.Generator, runs: int, cells: int) -> np.ndarray:
    return 20 + rng.normal(0, 2, size=(runs, 1)) + rng.normal(0, 3, size=(runs, cells))


def _collapse(rng: np.random.Generator, runs: int, cells: int) -> np.ndarray:
    up = np.clip(rng.normal(300, 120, size=(runs, cells)), 9, 500)
    return np.where(rng.random((runs, cells)) < 0.3, 9.0, up)


def _skewed(rng: np.random.Generator, runs: int, cells: int) -> np.ndarray:
    return np.exp(rng.normal(3, 0.5, size=(runs, 1))) * rng.gamma(4, 0.25, size=(runs, cells))


def _run_collapse(rng: np.random.Generator, runs: int, cells: int) -> np.ndarray:
    up = np.clip(rng.normal(300, 120, size=(runs, cells)), 9, 500)
    return np.where(rng.random((runs, 1)) < 0.3, 9.0, up)


#: name -> (draw of a runs x cells matrix, paired cells per run)
MODELS: dict[str, tuple[Model, int]] = {"normal": (_normal, 4), "collapse": (_collapse, 10), "skewed": (_skewed, 4),
                                        "run collapse": (_run_collapse, 10)}


def draw_pair(model: str, rng: np.random.Generator, runs: int) -> tuple[np.ndarray, np.ndarray]:
    """Continual and fresh cells (runs x cells) of one experiment with the same expectation: both halves of one draw
    of the model (a run's continual and fresh cells share its run effect), except under ``run collapse``, where a
    continual run collapses as a whole (every cell at 9, probability 0.3, as the committed collapsed runs do) and
    each fresh agent on its own (``collapse``'s cells)."""
    draw, cells = MODELS[model]
    if model == "run collapse":
        return draw(rng, runs, cells), _collapse(rng, runs, cells)
    both = draw(rng, runs, 2 * cells)
    return both[:, :cells], both[:, cells:]


def normal_theory_error(runs: int, level: float = 0.95) -> float:
    """The percentile bootstrap's error rate for normal run statistics: ``P(|T_{n-1}| > z sqrt((n - 1) / n))``."""
    import scipy.stats

    z = scipy.stats.norm.ppf(0.5 + level / 2)
    return float(2 * scipy.stats.t.sf(z * math.sqrt((runs - 1) / runs), runs - 1))


def fieller_ci(numerator: np.ndarray, denominator: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Fieller's interval (Fieller 1954, *J. R. Stat. Soc. B* 16, 175-185) for the ratio of means of two paired
    runs x cells arrays, on the runs' sums (:func:`rl_stats.paired_run_sums`): every ``R`` whose one-sample Student-t
    test of the runs' ``N_i - R D_i`` against 0 does not reject at ``level``. It is exact for normal run sums and
    need not be symmetric; where the denominator's mean is not itself resolved from 0 the set is unbounded and the
    interval is ``(-inf, inf)`` here (its two-ray form is not used). Returns ``(ratio, low, high)``; ``nan`` bounds
    with fewer than two runs. A candidate measured by :func:`paired_rates`; the tables keep
    ``rl_stats.ratio_of_means_t_ci``."""
    import scipy.stats

    _check_level(level)
    num, den = paired_run_sums(numerator, denominator)
    n, ratio = len(num), float(num.sum() / den.sum())
    if n < 2:
        return ratio, float("nan"), float("nan")
    a, b = num.mean(), den.mean()
    cov = np.cov(num, den, ddof=1)
    q = scipy.stats.t.ppf(0.5 + level / 2, n - 1) ** 2 / n
    # (a - R b)^2 = q var(N - R D) is  A R^2 - 2 B R + C = 0
    big_a, big_b, big_c = b * b - q * cov[1, 1], a * b - q * cov[0, 1], a * a - q * cov[0, 0]
    disc = big_b * big_b - big_a * big_c
    if big_a <= 0 or disc < 0:
        return ratio, -math.inf, math.inf
    root = math.sqrt(disc)
    return ratio, float((big_b - root) / big_a), float((big_b + root) / big_a)


def log_t_ci(numerator: np.ndarray, denominator: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """The linearised t interval of ``rl_stats.ratio_of_means_t_ci`` moved to the log scale: ``R exp(+- h / R)`` with
    ``h`` its half-width (the delta method for ``log R``), positive for a positive ratio. Returns ``(ratio, low,
    high)``; ``nan`` bounds for fewer than two runs or a ratio <= 0. A candidate measured by :func:`paired_rates`."""
    ratio, low, high = ratio_of_means_t_ci(numerator, denominator, level)
    if not math.isfinite(low) or ratio <= 0:
        return ratio, float("nan"), float("nan")
    half = high - ratio
    return ratio, ratio * math.exp(-half / ratio), ratio * math.exp(half / ratio)


#: the paired intervals :func:`paired_rates` measures: the tables' two (bootstrap until the thirty-second session,
#: t since) and the two bounded-side candidates
PAIRED = ("bootstrap", "t", "fieller", "log_t")


def _misses(low: float, high: float, null: float) -> bool:
    return not low <= null <= high


def paired_rates(model: str, runs: int, trials: int, seed: int, loss: float = 0.0) -> dict[str, float]:
    """Share of ``trials`` experiments whose paired interval (each of :data:`PAIRED`) leaves out 1 when continual =
    (1 - loss) x fresh in expectation: error rates at ``loss = 0``, power otherwise; and, under ``<name>_below_0``,
    the share whose interval reaches below 0 (impossible ratios: every model's cells are positive), under
    ``fieller_unbounded`` the share where Fieller's set is unbounded. The continual cells of a run share its run
    effect with its fresh cells (drawn together, as one matrix of twice the cells)."""
    rng = np.random.default_rng([seed, runs, int(loss * 1000)])
    counts = dict.fromkeys([*PAIRED, *(f"{name}_below_0" for name in PAIRED), "fieller_unbounded"], 0)
    for trial in range(trials):
        cont, fresh = draw_pair(model, rng, runs)
        cont = (1 - loss) * cont
        intervals = {"bootstrap": ratio_of_means_ci(cont, fresh, n_boot=TABLE_REPS, seed=trial)[1:],
                     "t": ratio_of_means_t_ci(cont, fresh)[1:], "fieller": fieller_ci(cont, fresh)[1:],
                     "log_t": log_t_ci(cont, fresh)[1:]}
        for name, (low, high) in intervals.items():
            counts[name] += _misses(low, high, 1.0)
            counts[f"{name}_below_0"] += low < 0
        counts["fieller_unbounded"] += not math.isfinite(intervals["fieller"][1])
    return {name: count / trials for name, count in counts.items()}


def plain_rates(model: str, runs: int, trials: int, seed: int, loss: float = 0.0) -> dict[str, float]:
    """Share of experiments (two methods, ``runs`` x :data:`PLAIN_TASKS` each, the second scaled by ``1 - loss``)
    in which "vs plain" says above or below: error rates at ``loss = 0``, power otherwise; ``iqm``: the two IQM
    intervals do not overlap (the rule until the thirty-third session), ``welch``: Welch's 95 % t interval of the
    difference of the runs' mean scores leaves out 0 (the rule since)."""
    draw, _ = MODELS[model]
    rng = np.random.default_rng([seed, runs, 7] + ([int(loss * 1000)] if loss else []))
    iqm = welch = 0
    for trial in range(trials):
        arms = {"a": draw(rng, runs, PLAIN_TASKS), "b": (1 - loss) * draw(rng, runs, PLAIN_TASKS)}
        ci = iqm_ci(arms, reps=TABLE_REPS, seed=trial, resample="runs")
        iqm += ci["a"][2] < ci["b"][1] or ci["a"][1] > ci["b"][2]
        test = welch_t_ci(arms["a"].mean(axis=1), arms["b"].mean(axis=1))
        welch += _misses(test["low"], test["high"], 0.0) and math.isfinite(test["low"])
    return {"iqm": iqm / trials, "welch": welch / trials}


def trend_data(rng: np.random.Generator, seeds: int, slope_sd: float) -> tuple[dict, dict]:
    """One simulated Slippery Ant experiment: per seed 10 tasks, frictions log-uniform on [0.01, 2], score = level +
    (TREND_SLOPE + the seed's deviation, SD ``slope_sd``) x task + a quadratic in log10 friction + noise (SD 350)."""
    scores, parameters = {}, {}
    for s in range(seeds):
        friction = 10 ** rng.uniform(-2, 0.3, size=10)
        x = np.log10(friction)
        own = TREND_SLOPE + rng.normal(0, slope_sd)
        y = 2000 + rng.normal(0, 300) + own * np.arange(10) + 400 * x - 300 * x ** 2 + rng.normal(0, 350, 10)
        scores[str(s)] = [float(v) for v in y]
        parameters[str(s)] = [{"friction": float(f)} for f in friction]
    return scores, parameters


def trend_rates(seeds: int, slope_sd: float, trials: int, seed: int) -> dict[str, float]:
    """Share of ``trials`` experiments whose 95 % interval of the adjusted slope holds the true one: the table's
    cluster-robust interval, and a percentile bootstrap over seeds (whole seeds resampled, each copy its own
    intercept; :data:`TREND_REPS` resamples)."""
    rng = np.random.default_rng([seed, seeds, int(slope_sd)])
    cr1 = boot = 0
    for _ in range(trials):
        scores, parameters = trend_data(rng, seeds, slope_sd)
        out = parameter_adjusted_trend(scores, parameters)
        cr1 += out["low"] <= TREND_SLOPE <= out["high"]
        draws = rng.integers(0, seeds, size=(TREND_REPS, seeds))
        slopes = [parameter_adjusted_trend({str(i): scores[str(d)] for i, d in enumerate(draw)},
                                           {str(i): parameters[str(d)] for i, d in enumerate(draw)})["slope"]
                  for draw in draws]
        boot += np.percentile(slopes, 2.5) <= TREND_SLOPE <= np.percentile(slopes, 97.5)
    return {"cr1": float(cr1 / trials), "bootstrap": float(boot / trials)}


def simulate_trend(trials: int, seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    for seeds in TREND_SEEDS:
        for slope_sd in TREND_SLOPE_SDS:
            rates = trend_rates(seeds, slope_sd, trials, seed)
            rows.append({"seeds": seeds, "slope_sd": slope_sd, "cr1_coverage": rates["cr1"],
                         "bootstrap_coverage": rates["bootstrap"]})
            print(rows[-1], flush=True)
    return rows


def simulate(trials: int, seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    for model in MODELS:
        for runs in RUNS:
            null = paired_rates(model, runs, trials, seed)
            power = paired_rates(model, runs, trials, seed, loss=LOSS)
            plain_null = plain_rates(model, runs, max(trials // 2, 1), seed)
            plain_power = plain_rates(model, runs, max(trials // 2, 1), seed, loss=LOSS)
            rows.append({"model": model, "runs": runs, "paired_bootstrap_error": null["bootstrap"],
                         "paired_t_error": null["t"], "normal_theory_bootstrap_error": normal_theory_error(runs),
                         "plain_rule_error": plain_null["iqm"], "plain_welch_error": plain_null["welch"],
                         "plain_rule_power": plain_power["iqm"], "plain_welch_power": plain_power["welch"],
                         "power_bootstrap": power["bootstrap"], "power_t": power["t"],
                         "paired_fieller_error": null["fieller"], "paired_log_t_error": null["log_t"],
                         "power_fieller": power["fieller"], "power_log_t": power["log_t"],
                         "t_below_0": null["t_below_0"], "fieller_below_0": null["fieller_below_0"],
                         "fieller_unbounded": null["fieller_unbounded"]})
            print(rows[-1], flush=True)
    return rows


def _verdict(low: float, high: float, null: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "-"
    return "below" if high < null else "above" if low > null else "not resolved"


def committed_verdicts(results: str = RESULTS) -> list[dict[str, Any]]:
    """Every method of every results folder whose paired statistic (ratio of means, else continual - fresh) carries
    both intervals (3 runs or more), with the verdict of each."""
    rows = []
    for path in sorted(glob.glob(os.path.join(results, "*", "summary.json"))):
        with open(path) as f:
            methods = json.load(f).get("methods", {})
        for method, entry in methods.items():
            stat, null, key = entry.get("plasticity_ratio_last_half"), 1.0, "ratio"
            if not stat:
                stat, null, key = entry.get("minus_fresh_last_half"), 0.0, "mean"
            if not stat or "t_low" not in stat or not math.isfinite(stat["t_low"]):
                continue  # written before the t interval, or fewer than 3 runs (no interval)
            rows.append({"folder": os.path.basename(os.path.dirname(path)), "method": method,
                         "runs": len(entry["seeds"]), "statistic": "ratio" if key == "ratio" else "c - f",
                         "point": stat[key], "bootstrap": [stat["low"], stat["high"]],
                         "t": [stat["t_low"], stat["t_high"]],
                         "bootstrap_verdict": _verdict(stat["low"], stat["high"], null),
                         "t_verdict": _verdict(stat["t_low"], stat["t_high"], null),
                         "table_verdict": entry.get("vs_fresh", "-")})
    return rows

def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, *Scand. J. Statist.* 6, 65-70), in the order given: with the
    m values sorted ascending, the k-th (from 1) becomes ``max over j <= k of min(1, (m - j + 1) p_(j))``; a test
    holds at family-wise level alpha where its adjusted value is below alpha."""
    order = np.argsort(p_values, kind="stable")
    m = len(p_values)
    adjusted, running = [0.0] * m, 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def committed_plain_verdicts(results: str = RESULTS) -> list[dict[str, Any]]:
    """Every method of every results folder with Welch's "vs plain" (``welch_vs_plain``) from 3 runs or more of it
    and of the plain baseline, with the verdict of the IQM rule (the two IQM intervals do not overlap; until the
    thirty-third session, and from 4 runs each since the thirty-second), of Welch's interval, and of Welch's test
    with Holm's correction over the folder's listed tests (``p_holm``, ``holm_verdict``: the tables apply none) and,
    where ``continual_methods.PREREGISTERED`` names the folder's pre-registered methods, over those alone
    (``p_holm_preregistered``; ``None`` for a post hoc method and in a folder without such a family)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(results, "*", "summary.json"))):
        with open(path) as f:
            summary = json.load(f)
        methods = summary.get("methods", {})
        base = methods.get(summary.get("plain"))
        for method, entry in methods.items():
            welch = entry.get("welch_vs_plain")
            if not base or not welch or not math.isfinite(welch["low"]) or min(len(entry["seeds"]),
                                                                               len(base["seeds"])) < 3:
                continue
            a, b = entry["iqm_last_half"], base["iqm_last_half"]
            iqm_rule = ("below" if a["high"] < b["low"] else "above" if a["low"] > b["high"] else "not resolved")
            rows.append({"folder": os.path.basename(os.path.dirname(path)), "method": method,
                         "runs": len(entry["seeds"]), "plain_runs": len(base["seeds"]),
                         "iqm": [a["iqm"], a["low"], a["high"]], "plain_iqm": [b["iqm"], b["low"], b["high"]],
                         "difference": welch["difference"], "welch": [welch["low"], welch["high"]], "p": welch["p"],
                         "iqm_verdict": iqm_rule, "welch_verdict": _verdict(welch["low"], welch["high"], 0.0),
                         "table_verdict": entry.get("vs_plain", "-")})
    for folder in dict.fromkeys(r["folder"] for r in rows):
        family = [r for r in rows if r["folder"] == folder]
        for r, adjusted in zip(family, holm([r["p"] for r in family])):
            r["p_holm"] = adjusted
            r["holm_verdict"] = r["welch_verdict"] if adjusted < 0.05 else "not resolved"
        named = continual_methods.PREREGISTERED.get(folder, ())
        preregistered = [r for r in family if r["method"] in named]
        for r in family:
            r["p_holm_preregistered"] = None
        for r, adjusted in zip(preregistered, holm([r["p"] for r in preregistered])):
            r["p_holm_preregistered"] = adjusted
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def markdown(sim: list[dict[str, Any]], committed: list[dict[str, Any]], trials: int,
             trend: Optional[list[dict[str, Any]]] = None, trend_trials: int = 0,
             plain_committed: Optional[list[dict[str, Any]]] = None) -> str:
    lines = [f"# The verdicts at 3-10 runs (`bench/verdict_coverage.py`, {trials} simulated experiments per row)", "",
             "Error rates with the true ratio 1 (nominal 5 %): the paired 95 % interval of the ratio of means leaves "
             "out 1 (\"continual vs fresh\" says above or below); two methods drawn alike get non-overlapping IQM "
             f"intervals ({PLAIN_TASKS} tasks a run; \"vs plain\" says above or below). Power: the share of experiments "
             f"with a true {LOSS:.0%} loss that the paired interval calls (below 1).", "",
             "| model | runs | paired bootstrap: error | (normal theory) | paired t: error | \"vs plain\", IQM rule: error "
             "| power, bootstrap | power, t |", "|---|---|---|---|---|---|---|---|"]
    for r in sim:
        lines.append(f"| {r['model']} | {r['runs']} | {_pct(r['paired_bootstrap_error'])} | "
                     f"{_pct(r['normal_theory_bootstrap_error'])} | {_pct(r['paired_t_error'])} | "
                     f"{_pct(r['plain_rule_error'])} | {_pct(r['power_bootstrap'])} | {_pct(r['power_t'])} |")
    if sim and "paired_fieller_error" in sim[0]:
        lines += ["", "## Bounded-side alternatives to the t interval", "",
                  "The t interval is symmetric, so it can reach below 0 where no ratio can (three PerturbedCartPole "
                  "rows). Fieller's interval (exact for normal run sums, unbounded where the fresh mean is not "
                  "resolved from 0) and the t interval on the log scale, beside it; error rates with the true ratio "
                  f"1 (nominal 5 %), power against a true {LOSS:.0%} loss, and the share of null experiments whose "
                  "interval reaches below 0.", "",
                  "| model | runs | t: error | Fieller: error | log t: error | power, t | power, Fieller | power, log t "
                  "| t below 0 | Fieller below 0 | Fieller unbounded |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sim:
            lines.append(f"| {r['model']} | {r['runs']} | {_pct(r['paired_t_error'])} | "
                         f"{_pct(r['paired_fieller_error'])} | {_pct(r['paired_log_t_error'])} | "
                         f"{_pct(r['power_t'])} | {_pct(r['power_fieller'])} | {_pct(r['power_log_t'])} | "
                         f"{_pct(r['t_below_0'])} | {_pct(r['fieller_below_0'])} | {_pct(r['fieller_unbounded'])} |")
    if sim and "plain_welch_error" in sim[0]:
        lines += ["", f"## \"vs plain\": two IQM intervals against Welch's t ({max(trials // 2, 1)} simulated "
                  "experiments per row)", "",
                  f"Two methods, {PLAIN_TASKS} tasks a run: the share of experiments in which \"vs plain\" says above "
                  "or below when both are drawn alike (error, nominal 5 %) and when the second scores a true "
                  f"{LOSS:.0%} less (power); the IQM rule (the two IQM intervals do not overlap) until the thirty-third "
                  "session, Welch's 95 % t interval of the difference of the runs' mean scores since.", "",
                  "| model | runs | IQM rule: error | Welch: error | IQM rule: power | Welch: power |",
                  "|---|---|---|---|---|---|"]
        for r in sim:
            lines.append(f"| {r['model']} | {r['runs']} | {_pct(r['plain_rule_error'])} | "
                         f"{_pct(r['plain_welch_error'])} | {_pct(r['plain_rule_power'])} | "
                         f"{_pct(r['plain_welch_power'])} |")
    if trend:
        lines += ["", f"## The Slippery Ant trend's interval ({trend_trials} simulated experiments per row)", "",
                  f"How often the 95 % interval of the friction-adjusted slope holds the true slope ({TREND_SLOPE:g} per "
                  "task); nominal 95 %.", "",
                  "| seeds | seed-to-seed slope SD | cluster-robust (CR1), t(seeds - 1): the table's | percentile "
                  f"bootstrap over seeds ({TREND_REPS} resamples): until the thirty-second session |", "|---|---|---|---|"]
        for r in trend:
            lines.append(f"| {r['seeds']} | {r['slope_sd']:g} | {_pct(r['cr1_coverage'])} | "
                         f"{_pct(r['bootstrap_coverage'])} |")
    moved = [r for r in committed if r["bootstrap_verdict"] != r["t_verdict"]]
    lines += ["", f"## The committed folders: {len(committed)} paired verdicts, {len(moved)} that the interval "
              "changes", "", "The table's verdict is the t interval's (since the thirty-second session).", "",
              "| folder | method | runs | statistic | point | bootstrap 95 % | t 95 % | bootstrap verdict | t verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in committed:
        mark = "**" if r["bootstrap_verdict"] != r["t_verdict"] else ""
        lines.append(f"| {r['folder']} | {r['method']} | {r['runs']} | {r['statistic']} | {r['point']:.3g} | "
                     f"[{r['bootstrap'][0]:.3g}, {r['bootstrap'][1]:.3g}] | [{r['t'][0]:.3g}, {r['t'][1]:.3g}] | "
                     f"{mark}{r['bootstrap_verdict']}{mark} | {mark}{r['t_verdict']}{mark} |")
    if plain_committed is not None:
        moved = [r for r in plain_committed if r["iqm_verdict"] != r["welch_verdict"]]
        lines += ["", f"## The committed folders: {len(plain_committed)} \"vs plain\" verdicts from 3 runs or more, "
                  f"{len(moved)} that the rule changes", "",
                  "The table's verdict is Welch's (since the thirty-fourth session; from the thirty-second to the "
                  "thirty-third the IQM rule's from 4 runs each). Holm: Welch's p adjusted over the folder's tests "
                  "listed here (family-wise 5 %; the tables apply no correction); pre-registered: over the methods "
                  "the folder's grid named before its first run (`continual_methods.PREREGISTERED`; \"post hoc\" "
                  "for a method added later, \"-\" for a folder without such a family).", "",
                  "| folder | method | runs (plain) | IQM [95 %] | plain IQM [95 %] | difference of means | Welch 95 % | p "
                  "| p, Holm | p, Holm (pre-registered) | IQM rule | Welch | Welch, Holm |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in plain_committed:
            mark = "**" if r["iqm_verdict"] != r["welch_verdict"] else ""
            (a, al, ah), (b, bl, bh) = r["iqm"], r["plain_iqm"]
            pre = r.get("p_holm_preregistered")
            pre = f"{pre:.2g}" if pre is not None else "post hoc" if r["folder"] in continual_methods.PREREGISTERED else "-"
            lines.append(f"| {r['folder']} | {r['method']} | {r['runs']} ({r['plain_runs']}) | {a:.3g} [{al:.3g}, "
                         f"{ah:.3g}] | {b:.3g} [{bl:.3g}, {bh:.3g}] | {r['difference']:+.3g} | [{r['welch'][0]:.3g}, "
                         f"{r['welch'][1]:.3g}] | {r['p']:.2g} | {r['p_holm']:.2g} | {pre} | {mark}{r['iqm_verdict']}{mark} | "
                         f"{mark}{r['welch_verdict']}{mark} | {r['holm_verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="simulated experiments per (model, runs) row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "verdict_coverage"))
    parser.add_argument("--results", default=RESULTS, help="the folders of bench/continual.py to read")
    parser.add_argument("--committed-only", action="store_true",
                        help="keep the simulations of --out's coverage.json (seconds, not ~20 CPU-min) and list the "
                             "committed folders' verdicts again, e.g. after new runs")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: allowed: a positive number of experiments")
    if args.committed_only:
        saved = os.path.join(args.out, "coverage.json")
        if not os.path.exists(saved):
            parser.error(f"--committed-only: {saved} does not exist; allowed only where a full run wrote it")
        with open(saved) as f:
            old = json.load(f)
        args.trials, args.seed = old["trials"], old["seed"]
        sim, trend_trials, trend = old["simulations"], old["trend_trials"], old["trend"]
    else:
        sim = simulate(args.trials, args.seed)
        trend_trials = max(args.trials // 4, 1)
        trend = simulate_trend(trend_trials, args.seed)
    committed = committed_verdicts(args.results)
    plain_committed = committed_plain_verdicts(args.results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "coverage.json"), "w") as f:
        json.dump({"trials": args.trials, "seed": args.seed, "simulations": sim, "trend_trials": trend_trials,
                   "trend": trend, "committed": committed, "plain_committed": plain_committed}, f, indent=1)
    text = markdown(sim, committed, args.trials, trend, trend_trials, plain_committed)
    with open(os.path.join(args.out, "coverage.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
