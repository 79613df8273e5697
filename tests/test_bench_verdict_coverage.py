"""bench/verdict_coverage.py: the simulated error rates of the tables' verdicts (the percentile bootstrap's against
normal theory, the t interval near its nominal 5 %) and the listing of the committed folders' paired verdicts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def coverage():
    return load_bench("verdict_coverage")


def test_the_bootstrap_errs_as_normal_theory_says_and_the_t_interval_near_five_percent(coverage):
    """Normal run statistics, 5 runs: the percentile bootstrap's interval is mean +- z s sqrt(4/5) / sqrt(5), so it
    misses a true ratio of 1 with probability P(|T_4| > 1.96 sqrt(4/5)) = 15.4 %; 600 seeded experiments agree
    within their sampling error, and the t interval errs near 5 %."""
    import scipy.stats

    assert coverage.normal_theory_error(5) == pytest.approx(2 * scipy.stats.t.sf(1.959964 * np.sqrt(0.8), 4), rel=1e-5)
    assert coverage.normal_theory_error(5) == pytest.approx(0.154, abs=0.001)
    rates = coverage.paired_rates("normal", 5, trials=600, seed=1)
    assert rates["bootstrap"] == pytest.approx(coverage.normal_theory_error(5), abs=0.045)
    assert 0.02 <= rates["t"] <= 0.085
    power = coverage.paired_rates("normal", 5, trials=200, seed=1, loss=0.3)
    assert power["t"] > 0.9  # a 30 % loss is found


def test_the_committed_listing_gives_both_verdicts_and_marks_the_moved_ones(coverage, tmp_path):
    entry = dict(seeds=[0, 1, 2, 3, 4], vs_fresh="not resolved",
                 plasticity_ratio_last_half=dict(ratio=0.9, low=0.85, high=0.97, t_low=0.8, t_high=1.02))
    negative = dict(seeds=[0, 1, 2], vs_fresh="above fresh",
                    minus_fresh_last_half=dict(mean=5.0, low=2.0, high=8.0, t_low=1.0, t_high=9.0))
    old = dict(seeds=[0, 1, 2], plasticity_ratio_last_half=dict(ratio=0.9, low=0.85, high=0.97))  # no t: skipped
    two = dict(seeds=[0, 1], plasticity_ratio_last_half=dict(ratio=0.9, low=float("nan"), high=float("nan"),
                                                            t_low=float("nan"), t_high=float("nan")))  # no interval
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"methods": {"ppo": entry, "ppo_l2": negative,
                                                                         "ppo_old": old, "ppo_two": two}}))
    rows = coverage.committed_verdicts(str(tmp_path))
    assert [(r["method"], r["statistic"], r["bootstrap_verdict"], r["t_verdict"]) for r in rows] == [
        ("ppo", "ratio", "below", "not resolved"), ("ppo_l2", "c - f", "above", "above")]
    text = coverage.markdown([], rows, trials=1)
    assert "2 paired verdicts, 1 that the interval changes" in text and "Slippery Ant" not in text
    trend = [dict(seeds=5, slope_sd=60.0, cr1_coverage=0.95, bootstrap_coverage=0.84)]
    assert "| 5 | 60 | 95.0 % | 84.0 % |" in coverage.markdown([], rows, 1, trend, trend_trials=250)
    assert "| a | ppo | 5 | ratio | 0.9 | [0.85, 0.97] | [0.8, 1.02] | **below** | **not resolved** |" in text


def test_the_trend_rows_compare_the_cluster_robust_interval_with_the_seed_bootstrap(coverage, monkeypatch):
    """Seeded: with 5 seeds whose slopes differ, the table's interval holds the true slope more often than the seed
    bootstrap it replaced (40 experiments of 200 resamples; bench/README's table has 250 of 500 per row)."""
    monkeypatch.setattr(coverage, "TREND_REPS", 200)
    rates = coverage.trend_rates(5, 60.0, trials=40, seed=2)
    assert rates["cr1"] >= 0.85 and rates["cr1"] > rates["bootstrap"]


def test_a_bad_trial_count_is_refused(coverage, capsys):
    with pytest.raises(SystemExit):
        coverage.main(["--trials", "0", "--out", "unused"])
    assert "--trials 0: allowed: a positive number of experiments" in capsys.readouterr().err


def test_fiellers_interval_is_every_ratio_a_paired_t_test_does_not_reject(coverage):
    """Independent reference: at each of Fieller's bounds R, scipy's one-sample t test of the runs' N_i - R D_i
    against 0 sits exactly at p = 0.05 (two-sided), inside it p > 0.05, and the interval is not symmetric."""
    import scipy.stats

    rng = np.random.default_rng(3)
    cont = 15 + rng.normal(0, 2, size=(5, 4))
    fresh = 20 + rng.normal(0, 2, size=(5, 4))
    ratio, low, high = coverage.fieller_ci(cont, fresh)
    sums_c, sums_f = cont.sum(axis=1), fresh.sum(axis=1)
    assert ratio == pytest.approx(sums_c.sum() / sums_f.sum())
    for bound in (low, high):
        assert scipy.stats.ttest_1samp(sums_c - bound * sums_f, 0).pvalue == pytest.approx(0.05, rel=1e-6)
    assert scipy.stats.ttest_1samp(sums_c - ratio * sums_f, 0).pvalue > 0.5
    assert low < ratio < high and high - ratio != pytest.approx(ratio - low, rel=1e-6)


def test_fieller_is_unbounded_where_the_fresh_mean_is_not_resolved_and_log_t_stays_positive(coverage):
    """Fresh run sums straddling 0 (3 runs): Fieller's set is unbounded. Continual runs where one collapses (a
    PerturbedCartPole row in miniature): the symmetric t interval reaches below 0, its log-scale form does not and
    has the ratio as its geometric centre."""
    cont = np.array([[9.0, 9.0], [300.0, 280.0], [250.0, 310.0]])
    assert coverage.fieller_ci(cont, np.array([[-50.0, 10.0], [40.0, 30.0], [5.0, -20.0]]))[1:] == (-np.inf, np.inf)
    fresh = np.array([[400.0, 380.0], [300.0, 420.0], [350.0, 390.0]])
    _, t_low, _ = coverage.ratio_of_means_t_ci(cont, fresh)
    ratio, low, high = coverage.log_t_ci(cont, fresh)
    assert t_low < 0 < low < ratio < high
    assert low * high == pytest.approx(ratio ** 2)
    assert np.isnan(coverage.fieller_ci(cont[:1], fresh[:1])[1])


def test_the_paired_rates_measure_every_candidate_and_count_impossible_bounds(coverage):
    rates = coverage.paired_rates("run collapse", 3, trials=60, seed=4)
    assert set(coverage.PAIRED) <= set(rates) and "fieller_unbounded" in rates
    assert rates["t_below_0"] > 0.2  # whole collapsed runs: the symmetric interval often reaches below 0
    assert rates["log_t_below_0"] == 0.0
    assert all(0 <= v <= 1 for v in rates.values())


def test_welchs_vs_plain_keeps_its_error_rate_at_three_runs_where_the_iqm_rule_does_not(coverage):
    """Seeded, normal model, 3 runs each, 300 null experiments: two IQM intervals that do not overlap call a
    difference that is not there well above 5 % (1 000 experiments: 13 %), Welch's t near or below it; a true 50 %
    difference is found by Welch's t."""
    null = coverage.plain_rates("normal", 3, trials=300, seed=5)
    assert null["iqm"] > 0.08 and null["welch"] <= 0.07 and null["welch"] < null["iqm"]
    assert coverage.plain_rates("normal", 5, trials=60, seed=5, loss=0.5)["welch"] > 0.9


def test_the_committed_vs_plain_listing_gives_both_rules(coverage, tmp_path):
    def entry(seeds, iqm, low, high, welch=None):
        out = dict(seeds=list(range(seeds)), iqm_last_half=dict(iqm=iqm, low=low, high=high), vs_plain="x")
        if welch:
            out["welch_vs_plain"] = dict(zip(("difference", "low", "high", "p"), welch))
        return out

    methods = {"ppo": entry(5, 20.0, 19.0, 21.0), "ppo_snp": entry(3, 29.0, 28.0, 30.0, (9.0, 6.0, 12.0, 1e-4)),
               "ppo_nap": entry(5, 19.0, 17.0, 20.0, (-1.0, -3.0, 1.0, 0.2)),
               "ppo_two": entry(2, 25.0, 24.0, 26.0, (5.0, float("nan"), float("nan"), float("nan")))}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "summary.json").write_text(json.dumps({"plain": "ppo", "methods": methods}))
    rows = coverage.committed_plain_verdicts(str(tmp_path))
    assert [(r["method"], r["iqm_verdict"], r["welch_verdict"]) for r in rows] == [
        ("ppo_snp", "above", "above"), ("ppo_nap", "not resolved", "not resolved")]
    text = coverage.markdown([], [], trials=1, plain_committed=rows)
    assert "2 \"vs plain\" verdicts from 3 runs or more, 0 that the rule changes" in text
    assert rows[0]["p_holm"] == pytest.approx(2e-4) and rows[1]["p_holm"] == pytest.approx(0.2)
    assert ("| m | ppo_snp | 3 (5) | 29 [28, 30] | 20 [19, 21] | +9 | [6, 12] | 0.0001 | 0.0002 | - | above | "
            "above | above |") in text


def test_holm_is_also_read_over_the_folders_preregistered_family_alone(coverage, tmp_path, monkeypatch):
    """A folder with a pre-registered family (``continual_methods.PREREGISTERED``): Holm over every listed test and,
    beside it, over the family alone; a post hoc method has no value in the second column. p = 0.01 and 0.02 in the
    family, 0.001 post hoc: over all three 0.003, 0.02, 0.02; over the family 0.02, 0.02."""
    def entry(p=None):
        out = dict(seeds=[0, 1, 2], iqm_last_half=dict(iqm=1.0, low=0.0, high=2.0))
        return out if p is None else dict(out, welch_vs_plain=dict(difference=1.0, low=0.5, high=1.5, p=p))

    methods = {"ppo": entry(), "ppo_snp": entry(0.01), "ppo_nap": entry(0.02), "plastic_maxmin_off": entry(0.001)}
    for folder in ("m", "other"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "summary.json").write_text(json.dumps({"plain": "ppo", "methods": methods}))
    monkeypatch.setattr(coverage.continual_methods, "PREREGISTERED", {"m": ("ppo_snp", "ppo_nap")})
    rows = {(r["folder"], r["method"]): r for r in coverage.committed_plain_verdicts(str(tmp_path))}
    assert rows["m", "plastic_maxmin_off"]["p_holm"] == pytest.approx(0.003)
    assert rows["m", "ppo_snp"]["p_holm"] == pytest.approx(0.02) == rows["m", "ppo_nap"]["p_holm"]
    assert rows["m", "ppo_snp"]["p_holm_preregistered"] == pytest.approx(0.02)
    assert rows["m", "plastic_maxmin_off"]["p_holm_preregistered"] is None
    assert all(r["p_holm_preregistered"] is None for key, r in rows.items() if key[0] == "other")
    text = coverage.markdown([], [], trials=1, plain_committed=list(rows.values()))
    assert "| m | ppo_snp | 3 (3) |" in text and "| 0.01 | 0.02 | 0.02 | **not resolved** | **above** | above |" in text
    assert "| 0.001 | 0.003 | post hoc | **not resolved** | **above** | above |" in text
    assert "| 0.001 | 0.003 | - | **not resolved** | **above** | above |" in text  # the folder without a family


def test_holm_adjusts_step_down_as_written_out_by_hand(coverage):
    """m = 4, p = (0.01, 0.04, 0.03, 0.005): sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06,
    0.04, made monotone: 0.02, 0.03, 0.06, 0.06; returned in the given order. statsmodels' multipletests agrees
    where it is installed."""
    p = [0.01, 0.04, 0.03, 0.005]
    assert coverage.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert coverage.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    assert coverage.holm(p) == pytest.approx(list(multitest.multipletests(p, method="holm")[1]))


def test_committed_only_keeps_the_saved_simulations_and_lists_the_folders_again(coverage, tmp_path):
    sim = [dict(model="normal", runs=3, paired_bootstrap_error=0.25, normal_theory_bootstrap_error=0.25,
                paired_t_error=0.05, plain_rule_error=0.12, power_bootstrap=0.8, power_t=0.4)]
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        coverage.main(["--committed-only", "--out", str(out)])
    out.mkdir()
    (out / "coverage.json").write_text(json.dumps(dict(trials=7, seed=3, simulations=sim, trend_trials=1, trend=[],
                                                       committed=[], plain_committed=[])))
    results = tmp_path / "results" / "a"
    results.mkdir(parents=True)
    entry = dict(seeds=[0, 1, 2], vs_fresh="below fresh (plasticity lost)",
                 plasticity_ratio_last_half=dict(ratio=0.8, low=0.7, high=0.9, t_low=0.6, t_high=0.95))
    (results / "summary.json").write_text(json.dumps({"methods": {"ppo": entry}}))
    assert coverage.main(["--committed-only", "--out", str(out), "--results", str(tmp_path / "results")]) == 0
    saved = json.loads((out / "coverage.json").read_text())
    assert saved["simulations"] == sim and saved["trials"] == 7 and len(saved["committed"]) == 1
    assert "| normal | 3 | 25.0 % |" in (out / "coverage.md").read_text()
