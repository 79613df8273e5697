"""Statistics shared by the bench scripts: rliable's metrics (IQM, probability of improvement) with rliable's
stratified bootstrap confidence intervals, a percentile and a Student-t CI of a mean.

rliable (Agarwal et al., 2021, "Deep RL at the Edge of the Statistical Precipice") is the field's standard for
aggregating RL runs; it is required (the ``bench`` and ``test`` extras install it). Its own interval routine
(``library.get_interval_estimates``) does not run with the installed arch/pandas (see :func:`stratified_bootstrap`),
so the resampling is done here, as rliable's ``StratifiedBootstrap`` does it (every task column resampled over runs,
independently), around rliable's metric functions; the intervals agree with rliable's own routine to Monte Carlo
error (``tests/test_rl_stats.py`` runs that routine, arch's import mended for the test). Imported by
``bench/stationary.py`` and ``bench/continual.py`` (``sys.path`` holds ``bench/``).
"""

from __future__ import annotations

from collections.abc import Callable

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


def ratio_of_means_ci(numerator: np.ndarray, denominator: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """The ratio of aggregates ``sum(numerator) / sum(denominator)`` over the finite cells of two runs x cells
    arrays (the same cells finite in both: paired), with a paired percentile bootstrap CI that resamples runs
    (rows) with replacement, each keeping its cells in both arrays.

    A per-cell ratio divided by one noisy denominator (a single fresh agent) is biased upwards and explodes for
    small denominators; the ratio of sums is the usual estimator of a ratio of means and the run resampling keeps
    each run's continual and fresh scores together (issue #29, part 3). Returns ``(ratio, low, high)``; the CI is
    ``nan`` with fewer than two runs."""
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.shape != den.shape or num.ndim != 2:
        raise ValueError(f"numerator and denominator must be runs x cells arrays of one shape, got {num.shape} "
                         f"and {den.shape}")
    cells = np.isfinite(num) & np.isfinite(den)
    num, den = np.where(cells, num, 0.0), np.where(cells, den, 0.0)
    if not cells.any() or den.sum() == 0:
        raise ValueError("no cell is finite in both arrays, or the denominator sums to 0: no ratio")
    point = float(num.sum() / den.sum())
    if len(num) < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(num), size=(n_boot, len(num)))
    sums_num, sums_den = num.sum(axis=1)[rows].sum(axis=1), den.sum(axis=1)[rows].sum(axis=1)
    ratios = sums_num[sums_den != 0] / sums_den[sums_den != 0]
    alpha = (1 - level) / 2
    return point, float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def t_mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Student-t CI of the mean of ``values``."""
    import scipy.stats

    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    half = scipy.stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


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


def stratified_bootstrap(fn: Callable[..., float], *scores: np.ndarray, reps: int = 5000, seed: int = 0,
                         level: float = 0.95) -> tuple[float, float, float]:
    """Point estimate and percentile CI of ``fn(*scores)`` under rliable's stratified bootstrap: the runs of every
    task (column) of every score matrix (runs x tasks) are resampled with replacement, independently.

    (rliable 1.2's own ``library.get_interval_estimates`` does not run with pandas 3: rliable 1.2 requires
    ``arch < 8``, and arch 7.2 does not import with pandas 3.x (``deprecate_kwarg() missing 1 required positional
    argument``, pandas 3.1.1); arch 8.0, which imports, rejects the ``random_state`` rliable passes. rliable's
    resampling draws from numpy's global generator (``np.random.choice``), this one from its own seeded generator:
    the same distribution, other draws.)
    """
    rng = np.random.default_rng(seed)
    point = float(fn(*scores))
    stats = np.empty(reps)
    for r in range(reps):
        resampled = []
        for m in scores:
            idx = rng.integers(0, m.shape[0], size=m.shape)
            resampled.append(np.take_along_axis(m, idx, axis=0))
        stats[r] = fn(*resampled)
    alpha = (1 - level) / 2
    return point, float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def iqm_rows(x: np.ndarray) -> np.ndarray:
    """IQM of every row of ``x`` (reps, n): the 25 % trimmed mean exactly as ``scipy.stats.trim_mean`` (and so
    rliable's ``aggregate_iqm``) computes it, vectorised over the bootstrap samples."""
    n = x.shape[1]
    cut = int(0.25 * n)
    return np.sort(x, axis=1)[:, cut:n - cut].mean(axis=1)


def iqm_ci(scores: dict[str, np.ndarray], reps: int = 5000, seed: int = 0,
            level: float = 0.95) -> dict[str, tuple[float, float, float]]:
    """IQM (rliable's ``aggregate_iqm``) with a stratified bootstrap 95 % CI per arm; ``scores[arm]`` has shape
    (runs, tasks). Same resampling as :func:`stratified_bootstrap`, vectorised."""
    iqm, _, _ = rliable_metrics()
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    out = {}
    for arm, m in scores.items():
        runs, tasks = m.shape
        idx = rng.integers(0, runs, size=(reps, runs, tasks))
        samples = m[idx, np.arange(tasks)[None, None, :]].reshape(reps, runs * tasks)
        stats = iqm_rows(samples)
        out[arm] = (float(iqm(m)), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))
    return out
