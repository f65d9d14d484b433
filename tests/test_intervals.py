"""Intervals for what a sigma delivers on the population: coverage by simulation, width law, bounds.

The population is a large SYNTHETIC logits set (10,000 rows, K=10); its values at
sigma are exact (quadrature over every row). Small samples are drawn from it
without replacement (4% of the population: the finite-population correction
shrinks the true spread by 2%, a slightly conservative direction), and each sample's interval is checked against the
population value. A coverage rate over M samples has binomial standard error
sqrt(p (1 - p) / M); comparisons use 3 of them (a correct implementation fails
with probability ~0.3% per comparison). Seeds are fixed, so outcomes are
reproducible.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration import intervals as intervals_mod
from caliber_core.calibration.intervals import (
    BootstrapIntervals,
    half_width_rows,
    sample_size_advice,
)
from caliber_core.calibration.engine import CurveEngine, sample_estimates
from caliber_core.calibration.sweep import survival_intervals
from caliber_core.simulation.reference import argmax_monte_carlo
from caliber_core.simulation.synthetic import make_synthetic_logits

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
POP_N, K = 10_000, 10
SAMPLE_N = 400
N_SE = 3.0
LEVEL = 0.95


@pytest.fixture(scope="module")
def population():
    z, y = make_synthetic_logits(POP_N, K, clean_accuracy=0.75, seed=11)
    z = z.astype(np.float64)
    rows = CurveEngine(z, y, method="exact")
    grid = np.geomspace(0.6, 1.8, 30)
    est = sample_estimates(rows.at(grid))
    # sigma where the population retains 80% of its clean accuracy
    sigma0 = float(np.interp(-0.8, -est["retention"], grid))
    truth = {k: float(v[0]) for k, v in sample_estimates(rows.at(sigma0)).items()}
    return z, y, sigma0, truth, grid, est


def _samples(m, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.choice(POP_N, size=n, replace=False) for _ in range(m)]


def _binomial_band(p, m):
    return N_SE * math.sqrt(p * (1 - p) / m)


def _digits(name):
    with np.load(DATA_DIR / f"digits_{name}.npz", allow_pickle=False) as d:
        return d["logits"].astype(np.float64), d["labels"]


# --------------------------------------------------------------------------- coverage


def test_two_sided_coverage_is_nominal_with_exact_rows(population):
    z, y, sigma0, truth, *_ = population
    m = 300
    covered = {"accuracy": 0, "retention": 0, "agreement": 0}
    for i, idx in enumerate(_samples(m, SAMPLE_N, seed=1)):
        iv = BootstrapIntervals(CurveEngine(z[idx], y[idx], method="exact"), resamples=1000, seed=i).at(sigma0)
        for kind in covered:
            part = iv.get(kind)
            covered[kind] += part.low <= truth[kind] <= part.high
    for kind, hits in covered.items():
        assert abs(hits / m - LEVEL) <= _binomial_band(LEVEL, m), (kind, hits / m)


def test_coverage_carries_monte_carlo_row_error(population):
    """With 4 draws per row the rows are noisy; the row bootstrap must still cover."""
    z, y, sigma0, truth, *_ = population
    m = 200
    hits = 0
    widths_mc, widths_exact = [], []
    for i, idx in enumerate(_samples(m, SAMPLE_N, seed=2)):
        draws = survival_intervals(z[idx], y[idx], realizations=4, seed=100 + i)
        mc = BootstrapIntervals(CurveEngine(z[idx], y[idx], method="monte-carlo", draws=draws),
                                resamples=1000, seed=i).at(sigma0)
        hits += mc.retention.low <= truth["retention"] <= mc.retention.high
        widths_mc.append(mc.retention.half_width)
        exact = BootstrapIntervals(CurveEngine(z[idx], y[idx], method="exact"), resamples=1000, seed=i).at(sigma0)
        widths_exact.append(exact.retention.half_width)
    assert abs(hits / m - LEVEL) <= _binomial_band(LEVEL, m)
    # Noisy rows widen the interval: their Monte-Carlo variance adds to the rows' spread.
    assert np.mean(widths_mc) > 1.02 * np.mean(widths_exact)


def test_at_least_undershoots_and_at_most_overshoots_no_more_than_one_minus_confidence(population):
    z, y, sigma0, truth, grid, est = population
    m = 120
    target = 0.8
    under = over = 0
    # Population retention between grid points by linear interpolation; check its error first.
    mids = np.sqrt(grid[12:15] * grid[13:16])
    exact_mid = sample_estimates(CurveEngine(z, y, method="exact").at(mids))["retention"]
    assert np.max(np.abs(np.interp(mids, grid, est["retention"]) - exact_mid)) < 2e-4
    for i, idx in enumerate(_samples(m, SAMPLE_N, seed=3)):
        boot = BootstrapIntervals(CurveEngine(z[idx], y[idx], method="exact"), resamples=1000, seed=i)
        s_low = boot.sigma_for_bound(target, kind="retention", side="at-least", guess=sigma0)
        s_high = boot.sigma_for_bound(target, kind="retention", side="at-most", guess=sigma0)
        assert s_low < s_high
        under += np.interp(s_low, grid, est["retention"]) < target
        over += np.interp(s_high, grid, est["retention"]) > target
    limit = (1 - LEVEL) + _binomial_band(1 - LEVEL, m)
    assert under / m <= limit and over / m <= limit, (under / m, over / m)
    # ...and not by being vacuous: the sides are not wildly conservative either.
    assert under / m >= 0.005 or over / m >= 0.005


def test_width_shrinks_as_one_over_sqrt_n(population):
    z, y, sigma0, *_ = population
    widths = {}
    for n in (400, 1600):
        hw = [BootstrapIntervals(CurveEngine(z[idx], y[idx], method="exact"), resamples=1000, seed=i)
              .at(sigma0).retention.half_width for i, idx in enumerate(_samples(20, n, seed=n))]
        widths[n] = float(np.mean(hw))
    ratio = widths[400] / widths[1600]
    assert 1.8 <= ratio <= 2.2, ratio
    # The advice's prediction for 1,600 rows from the 400-row width.
    need = half_width_rows(widths[400], 400, widths[1600])
    assert 1600 * 0.8 <= need <= 1600 * 1.25


# --------------------------------------------------------------------------- method checks


@pytest.mark.parametrize("name", ["mlp-narrow", "logreg-pool", "cnn"])
def test_delta_method_agrees_with_bootstrap(name):
    z, y = _digits(name)
    boot = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=4000, seed=0)
    sigma = float(np.median(np.abs(np.diff(np.sort(z, axis=1)[:, -2:], axis=1))))
    b, d = boot.at(sigma), boot.delta_at(sigma)
    for kind in ("accuracy", "retention", "agreement"):
        bi, di = b.get(kind), d.get(kind)
        assert bi.estimate == di.estimate
        # Percentile endpoints of 4,000 replicates: ~3% relative noise on a half-width.
        assert abs(bi.half_width / di.half_width - 1) < 0.12, (kind, bi, di)
        assert abs((bi.low + bi.high) / 2 - di.estimate) < 0.3 * di.half_width


def test_estimates_match_a_brute_force_monte_carlo():
    z, y = _digits("mlp-brief")
    boot = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=500)
    sigma = 1.7
    iv = boot.at(sigma)
    acc, agr = argmax_monte_carlo(z, y, [sigma], realizations=400, seed=9)
    # Noise-only standard error of a 400-draw mean over 500 rows is below 0.0011.
    assert abs(iv.accuracy.estimate - acc[0]) < 4 * 0.0011
    assert abs(iv.agreement.estimate - agr[0]) < 4 * 0.0011
    assert iv.retention.estimate == pytest.approx(iv.accuracy.estimate / np.mean(z.argmax(1) == y))


def test_same_seed_same_intervals():
    z, y = _digits("mlp-wide")
    a = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=300, seed=5).at(2.0)
    b = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=300, seed=5).at(2.0)
    c = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=300, seed=6).at(2.0)
    assert a == b
    assert a.retention.low != c.retention.low


def test_row_groups_give_the_same_interval_as_rows(monkeypatch):
    """Beyond MAX_UNITS rows, random groups of rows are resampled; here 500 rows in 125 groups."""
    z, y = _digits("mlp-narrow")
    rows = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=4000, seed=1).at(2.8)
    monkeypatch.setattr(intervals_mod, "MAX_UNITS", 125)
    boot = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=4000, seed=1)
    assert "125 random groups" in boot.method
    groups = boot.at(2.8)
    for kind in ("accuracy", "retention", "agreement"):
        r, g = rows.get(kind), groups.get(kind)
        assert g.estimate == r.estimate
        # 125 units: the group sums' spread is estimated from 125 values (~6% relative error).
        assert abs(g.half_width / r.half_width - 1) < 0.2, (kind, r, g)


def test_row_group_coverage_is_nominal(population, monkeypatch):
    z, y, sigma0, truth, *_ = population
    monkeypatch.setattr(intervals_mod, "MAX_UNITS", 200)  # samples of 400 rows: groups of two
    m = 200
    hits = 0
    for i, idx in enumerate(_samples(m, SAMPLE_N, seed=7)):
        iv = BootstrapIntervals(CurveEngine(z[idx], y[idx], method="exact"), resamples=1000, seed=i).at(sigma0)
        hits += iv.retention.low <= truth["retention"] <= iv.retention.high
    assert abs(hits / m - LEVEL) <= _binomial_band(LEVEL, m), hits / m


def test_bands_order_and_interpolation():
    z, y = _digits("logreg-raw")
    boot = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=1000)
    grid = np.geomspace(0.2, 20, 30)
    bands = boot.bands(grid)
    for kind in ("accuracy", "retention", "agreement"):
        b = bands.bands[kind]
        assert np.all(b["low"] <= b["lower"] + 1e-12) and np.all(b["lower"] <= b["upper"] + 1e-12)
        assert np.all(b["upper"] <= b["high"] + 1e-12)
        assert np.all((b["low"] <= b["estimate"] + 1e-3) & (b["estimate"] <= b["high"] + 1e-3))
    at = bands.at(grid[7])
    direct = boot.at(grid[7])
    assert at.retention.low == pytest.approx(direct.retention.low, abs=1e-6)
    assert at.agreement.high == pytest.approx(direct.agreement.high, abs=1e-6)
    mid = np.sqrt(grid[7] * grid[8])
    assert bands.at(mid).retention.low == pytest.approx(boot.at(mid).retention.low, abs=2e-3)
    with pytest.raises(ValueError, match="outside the band grid"):
        bands.at(30.0)


def test_one_sided_solve_returns_the_safe_end():
    z, y = _digits("mlp-narrow")
    boot = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=1000)
    for kind, target in (("retention", 0.8), ("accuracy", 0.6), ("agreement", 0.7)):
        s_low = boot.sigma_for_bound(target, kind=kind, side="at-least", guess=2.0)
        s_high = boot.sigma_for_bound(target, kind=kind, side="at-most", guess=2.0)
        assert boot.bound(s_low, kind=kind, side="at-least")[0] >= target
        assert boot.bound(s_high, kind=kind, side="at-most")[0] <= target
        assert boot.bound(s_low * 1.001, kind=kind, side="at-least")[0] < target + 2e-3
        assert s_low < s_high


def test_to_config_record_and_no_labels():
    z, y = _digits("mlp-brief")
    rec = BootstrapIntervals(CurveEngine(z, y, method="exact"), resamples=200).at(1.0).to_config()
    assert list(rec) == ["level", "method", "accuracy", "retention", "agreement"]
    assert rec["level"] == 0.95 and "bootstrap" in rec["method"]
    assert all(len(rec[k]) == 2 and rec[k][0] <= rec[k][1] for k in ("accuracy", "retention", "agreement"))
    bare = BootstrapIntervals(CurveEngine(z, method="exact"), resamples=200).at(1.0)
    rec = bare.to_config()
    assert rec["accuracy"] is None and rec["retention"] is None and len(rec["agreement"]) == 2
    with pytest.raises(ValueError, match="needs labels"):
        BootstrapIntervals(CurveEngine(z, method="exact"), resamples=200).bound(1.0, kind="retention", side="at-least")


def test_the_engine_picks_monte_carlo_for_large_inputs():
    z, y = make_synthetic_logits(3000, 1000, seed=1)
    rows = CurveEngine(z, y)
    assert rows.method == "monte-carlo"
    assert CurveEngine(*_digits("cnn")).method == "exact"


# --------------------------------------------------------------------------- advice


def test_sample_size_advice():
    assert half_width_rows(0.029, 500, 0.015) == math.ceil(500 * (0.029 / 0.015) ** 2)
    assert sample_size_advice(0.029, 500) == "±2.9% at N=500; about 1,100 rows for ±2.0%, about 4,200 rows for ±1.0%"
    assert sample_size_advice(0.012, 2000) == "±1.2% at N=2,000; about 2,900 rows for ±1.0%"
    assert sample_size_advice(0.006, 20000) == "±0.60% at N=20,000; about 80,000 rows for ±0.30%"
    assert sample_size_advice(0.029, 500, goals=[0.015]).endswith("about 1,900 rows for ±1.5%")


# --------------------------------------------------------------------------- errors


def test_input_errors():
    z, y = _digits("cnn")
    rows = CurveEngine(z, y, method="exact")
    with pytest.raises(ValueError, match=r"confidence must be in \[0.5, 1\), got 1.0"):
        BootstrapIntervals(rows, confidence=1.0)
    with pytest.raises(ValueError, match="resamples must be an int >= 100, got 50"):
        BootstrapIntervals(rows, resamples=50)
    with pytest.raises(ValueError, match="resamples must be an int"):
        BootstrapIntervals(rows, resamples=True)
    with pytest.raises(ValueError, match="method must be one of .*'exact', 'monte-carlo'.*, got 'mc'"):
        CurveEngine(z, y, method="mc")
    with pytest.raises(ValueError, match="draws cover 10 rows, logits have 500"):
        CurveEngine(z, y, method="monte-carlo", draws=survival_intervals(z[:10], y[:10], realizations=2))
    with pytest.raises(ValueError, match="computed without labels"):
        CurveEngine(z, y, method="monte-carlo", draws=survival_intervals(z, realizations=2))
    with pytest.raises(ValueError, match=r"labels must be integers in \[0, 10\), got range \[0, 10\]"):
        CurveEngine(z, np.where(y == 9, 10, y), method="exact")
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        CurveEngine(z, y[:-1], method="exact")
    with pytest.raises(ValueError, match="sigma must be finite and >= 0"):
        rows.at(-1.0)
    boot = BootstrapIntervals(rows, resamples=200)
    with pytest.raises(ValueError, match="kind must be one of"):
        boot.bound(1.0, kind="precision", side="at-least")
    with pytest.raises(ValueError, match="side must be 'at-least' or 'at-most', got 'point'"):
        boot.sigma_for_bound(0.8, kind="retention", side="point", guess=1.0)
    a0 = float(np.mean(z.argmax(1) == y))
    with pytest.raises(ValueError, match="cannot be guaranteed at 95% confidence"):
        boot.sigma_for_bound(a0, kind="accuracy", side="at-least", guess=1.0)
