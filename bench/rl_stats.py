"""Statistics shared by the bench scripts: rliable's metrics (IQM, probability of improvement) with bootstrap
confidence intervals, a percentile and a Student-t CI of a mean, a ratio of means with a paired bootstrap or a
Student-t CI over runs, and Welch's two-sample t interval of a difference of means.

rliable (Agarwal et al., 2021, "Deep RL at the Edge of the Statistical Precipice") is the field's standard for
aggregating RL runs; it is required (the ``bench`` and ``test`` extras install it). Its own interval routine
(``library.get_interval_estimates``) does not run with the installed arch/pandas (see :func:`stratified_bootstrap`),
so the resampling is done here, around rliable's metric functions, in one of two ways (``resample``):

* ``"tasks"``: as rliable's ``StratifiedBootstrap`` does it (every task column resampled over runs, independently);
  the intervals agree with rliable's own routine to Monte Carlo error (``tests/test_rl_stats.py`` runs that routine,
  arch's import mended for the test). Right where each column's runs are independent of the other columns' (one
  training run per task, as in rliable's Atari benchmarks).
* ``"runs"``: every resampled run keeps all its tasks. Right where one run spans all the tasks (a continual run: the
  same agent on tasks 0 .. n-1, its task sequence drawn per seed, so task index ``k`` is a different task in every
  seed and is no stratum): the independent unit is the run, and resampling the columns independently breaks the
  dependence between one agent's tasks (the CI can come out too narrow or too wide). ``bench/continual_report.py``
  uses it (thirtieth session; bench/README.md, "How the continual tables' intervals resample").

Imported by ``bench/stationary.py`` and ``bench/continual.py`` (``sys.path`` holds ``bench/``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import numpy as np

#: bootstrap resamples of :func:`bootstrap_mean_ci`
N_BOOT = 20_000

def bootstrap_mean_ci(values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` (resampling its entries)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def paired_run_sums(numerator: np.ndarray, denominator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each run's sums over its paired cells: the cells finite in both of two runs x cells arrays. A run (row) without
    such a cell is left out (it is no unit of a paired estimate). The shared input of :func:`ratio_of_means_ci` and
    :func:`ratio_of_means_t_ci`, whose ratio is ``sums_num.sum() / sums_den.sum()``; raises ``ValueError`` for arrays
    of two shapes or not 2-D, and where no cell is paired or the denominator's paired cells sum to 0."""
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.shape != den.shape or num.ndim != 2:
        raise ValueError(f"numerator and denominator must be runs x cells arrays of one shape, got {num.shape} "
                         f"and {den.shape}")
    cells = np.isfinite(num) & np.isfinite(den)
    paired = cells.any(axis=1)
    sums_num = np.where(cells, num, 0.0).sum(axis=1)[paired]
    sums_den = np.where(cells, den, 0.0).sum(axis=1)[paired]
    if not cells.any() or sums_den.sum() == 0:
        raise ValueError("no cell is finite in both arrays, or the denominator sums to 0: no ratio")
    return sums_num, sums_den


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}; allowed: a confidence level strictly between 0 and 1")


def ratio_of_means_ci(numerator: np.ndarray, denominator: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """The ratio of aggregates ``sum(numerator) / sum(denominator)`` over the finite cells of two runs x cells
    arrays (the same cells finite in both: paired), with a paired percentile bootstrap CI that resamples runs
    (rows) with replacement, each keeping its cells in both arrays; a run without a cell finite in both is left out
    (:func:`paired_run_sums`).

    A per-cell ratio divided by one noisy denominator (a single fresh agent) is biased upwards and explodes for
    small denominators; the ratio of sums is the usual estimator of a ratio of means and the run resampling keeps
    each run's continual and fresh scores together (issue #29, part 3). Returns ``(ratio, low, high)``; the CI is
    ``nan`` with fewer than two runs."""
    _check_level(level)
    num, den = paired_run_sums(numerator, denominator)
    point = float(num.sum() / den.sum())
    if len(num) < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(num), size=(n_boot, len(num)))
    sums_num, sums_den = num[rows].sum(axis=1), den[rows].sum(axis=1)
    ratios = sums_num[sums_den != 0] / sums_den[sums_den != 0]
    alpha = (1 - level) / 2
    return point, float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def ratio_of_means_t_ci(numerator: np.ndarray, denominator: np.ndarray,
                        level: float = 0.95) -> tuple[float, float, float]:
    """The ratio of aggregates ``R = sum(numerator) / sum(denominator)`` over the cells finite in both of two runs x
    cells arrays (as :func:`ratio_of_means_ci`), with a Student-t CI over runs of the linearised ratio: with run
    ``i``'s sums ``N_i`` and ``D_i``, ``e_i = (N_i - R D_i) / mean(D)``, the interval is ``R +- t(n - 1) sd(e) /
    sqrt(n)`` (the linearisation, or delta-method, variance of the ratio estimator; Cochran, 1977, *Sampling
    Techniques*, 3rd ed., section 6.4, with ``n - 1`` in the variance and Student's t for few runs). Where every run
    has the same denominator sum it is exactly the one-sample t interval of the runs' own ratios ``N_i / D_i``.

    Why beside the bootstrap: with 3-5 runs a percentile bootstrap over runs is too narrow (it has the spread of the
    runs with divisor ``n`` and normal quantiles instead of Student's): in ``bench/verdict_coverage.py``'s simulations
    (four data models) its 95 % interval of this ratio covers the true one in 81-86 % of 5-run experiments and
    68-75 % of 3-run ones, this interval in 92-96 % (less where whole runs collapse: bench/README.md, "The verdicts
    at 3-5 runs"). A run (row) without a cell finite in both arrays is left out (:func:`paired_run_sums`). Returns
    ``(ratio, low, high)``; the CI is ``nan`` with fewer than two runs."""
    import scipy.stats

    _check_level(level)
    num, den = paired_run_sums(numerator, denominator)
    ratio = float(num.sum() / den.sum())
    n = len(num)
    if n < 2:
        return ratio, float("nan"), float("nan")
    residuals = (num - ratio * den) / den.mean()
    half = scipy.stats.t.ppf(0.5 + level / 2, n - 1) * residuals.std(ddof=1) / np.sqrt(n)
    return ratio, float(ratio - half), float(ratio + half)


def t_mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Student-t CI of the mean of ``values``."""
    import scipy.stats

    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    half = scipy.stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


def welch_t_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Welch's two-sample t test and interval (Welch 1947, *Biometrika* 34, 28-35) of ``mean(a) - mean(b)`` for two
    independent samples of unequal variances: ``d +- t(nu) se`` with ``se^2 = s_a^2 / n_a + s_b^2 / n_b`` and the
    Welch-Satterthwaite degrees of freedom ``nu``: ``scipy.stats.ttest_ind(a, b, equal_var=False)`` and its
    ``confidence_interval`` (the tests hold it to the formula written out). The continual tables' "vs plain" reads
    it on the runs' last-half means: with 3-5 runs it errs at or below its nominal rate where two IQM intervals that
    must not overlap err 10-12 % at 3 runs (``bench/verdict_coverage.py``). Returns ``difference``, ``low``,
    ``high`` (the ``level`` interval), ``p`` (two-sided) and ``df``; every value but the difference is ``nan`` with
    fewer than two values in either sample or where both samples are constant (no spread to test against)."""
    import scipy.stats

    _check_level(level)
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or b.ndim != 1 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"a and b must be 1-D arrays of finite values, got shapes {a.shape} and {b.shape} "
                         f"with {int((~np.isfinite(a)).sum())} and {int((~np.isfinite(b)).sum())} non-finite values")
    out = {"difference": float(a.mean() - b.mean()) if len(a) and len(b) else float("nan"),
           "low": float("nan"), "high": float("nan"), "p": float("nan"), "df": float("nan")}
    if len(a) < 2 or len(b) < 2 or a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b) == 0:
        return out  # scipy would warn and give NaN (no spread to test against), or refuse a sample of one
    test = scipy.stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(level)
    out.update(low=float(ci.low), high=float(ci.high), p=float(test.pvalue), df=float(test.df))
    return out


def rliable_metrics() -> tuple[Callable[[np.ndarray], float], Callable[[np.ndarray, np.ndarray], float], str]:
    """rliable's IQM and probability of improvement, and the label the tables print for them.

    :raises ImportError: without rliable, naming the extra that installs it. (A scipy stand-in used to take its
        place silently, and a rebuilt table then differed from the committed one in its label: issue #29, part 5.)
    """
    try:
        from rliable import metrics
    except ImportError as exc:
        raise ImportError(
            "the bench's statistics are rliable's (IQM, probability of improvement) and rliable is not installed: "
            "pip install -e '.[bench]' (or '.[test]')"
        ) from exc
    return metrics.aggregate_iqm, metrics.probability_of_improvement, "rliable.metrics"


#: how a bootstrap resamples a runs x tasks score matrix (module docstring)
RESAMPLE = ("tasks", "runs")


def _resample_rows(rng: np.random.Generator, shape: tuple[int, int], resample: str,
                   reps: Optional[int] = None) -> np.ndarray:
    """Row indices of a resample (``reps`` of them with ``reps``) of a runs x tasks matrix of ``shape``: one per cell,
    drawn per column (``"tasks"``) or one per resampled run, repeated across its columns (``"runs"``)."""
    if resample not in RESAMPLE:
        raise ValueError(f"resample={resample!r}; allowed: {', '.join(map(repr, RESAMPLE))}")
    runs, tasks = shape
    lead = () if reps is None else (reps,)
    if resample == "tasks":
        return rng.integers(0, runs, size=(*lead, runs, tasks))
    return np.repeat(rng.integers(0, runs, size=(*lead, runs))[..., None], tasks, axis=-1)


def stratified_bootstrap(fn: Callable[..., float], *scores: np.ndarray, reps: int = 5000, seed: int = 0,
                         level: float = 0.95, resample: str = "tasks") -> tuple[float, float, float]:
    """Point estimate and percentile CI of ``fn(*scores)`` under a bootstrap of every score matrix (runs x tasks),
    each resampled independently of the others: by default rliable's stratified bootstrap (the runs of every task
    column resampled with replacement, independently); ``resample="runs"`` resamples whole runs (module docstring).
    The CI is NaN when a matrix has fewer than two runs (a resample of one run is that run: no interval).

    (rliable 1.2's own ``library.get_interval_estimates`` does not run with pandas 3: rliable 1.2 requires
    ``arch < 8``, and arch 7.2 does not import with pandas 3.x (``deprecate_kwarg() missing 1 required positional
    argument``, pandas 3.1.1); arch 8.0, which imports, rejects the ``random_state`` rliable passes. rliable's
    resampling draws from numpy's global generator (``np.random.choice``), this one from its own seeded generator:
    the same distribution, other draws.)
    """
    rng = np.random.default_rng(seed)
    point = float(fn(*scores))
    if min(m.shape[0] for m in scores) < 2:
        _resample_rows(rng, scores[0].shape, resample)  # (checks ``resample``)
        return point, float("nan"), float("nan")
    stats = np.empty(reps)
    for r in range(reps):
        resampled = [np.take_along_axis(m, _resample_rows(rng, m.shape, resample), axis=0) for m in scores]
        stats[r] = fn(*resampled)
    alpha = (1 - level) / 2
    return point, float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def iqm_rows(x: np.ndarray) -> np.ndarray:
    """IQM of every row of ``x`` (reps, n): the 25 % trimmed mean exactly as ``scipy.stats.trim_mean`` (and so
    rliable's ``aggregate_iqm``) computes it, vectorised over the bootstrap samples."""
    n = x.shape[1]
    cut = int(0.25 * n)
    return np.sort(x, axis=1)[:, cut:n - cut].mean(axis=1)


def iqm_ci(scores: dict[str, np.ndarray], reps: int = 5000, seed: int = 0, level: float = 0.95,
           resample: str = "tasks") -> dict[str, tuple[float, float, float]]:
    """IQM (rliable's ``aggregate_iqm``) with a bootstrap 95 % CI per arm; ``scores[arm]`` has shape (runs, tasks).
    The same resampling as :func:`stratified_bootstrap` (``resample``: ``"tasks"``, rliable's stratified bootstrap,
    or ``"runs"``), vectorised; the CI is NaN for an arm of one run."""
    iqm, _, _ = rliable_metrics()
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    out = {}
    for arm, m in scores.items():
        runs, tasks = m.shape
        idx = _resample_rows(rng, m.shape, resample, reps)
        if runs < 2:
            out[arm] = (float(iqm(m)), float("nan"), float("nan"))
            continue
        samples = m[idx, np.arange(tasks)[None, None, :]].reshape(reps, runs * tasks)
        stats = iqm_rows(samples)
        out[arm] = (float(iqm(m)), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))
    return out
