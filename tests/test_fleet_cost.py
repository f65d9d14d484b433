"""Shared per-task fits, leave-one-out, the margin ablation, and Proposition 2 (cost).

Statistical comparisons use 4 standard errors computed from the exact per-input
probabilities (quadrature); seeds are fixed, so outcomes are reproducible.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caliber_core.calibration import fleet
from caliber_core.calibration.calibrate import calibrate_model, measured_accuracy
from caliber_core.calibration.cost import effective_intensity, queries_needed, recovered_utility, sigma_after_averaging
from caliber_core.calibration.fit import LogisticFit, invert_logistic
from caliber_core.calibration.margins import margin_scale
from caliber_core.serving.runtime import Perturber
from caliber_core.calibration.engine import CurveEngine
from caliber_core.calibration.survival import sorted_gaps, survival_probability
from caliber_core.simulation.reference import argmax_monte_carlo

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DIGITS_FILES = sorted(DATA_DIR.glob("digits_*.npz"))
N_SE = 4.0


def _digits(path):
    with np.load(path, allow_pickle=False) as d:
        return d["logits"].astype(np.float64), d["labels"]


@pytest.fixture(scope="module")
def calibrations():
    return [calibrate_model(*_digits(p), name=p.stem) for p in DIGITS_FILES]


# --------------------------------------------------------------------------- shared fit


def test_shared_fit_pools_every_model_and_fits_well(calibrations):
    fit = fleet.shared_fit(calibrations)
    assert fit.n_points == sum(c.sweep.v.size for c in calibrations)
    assert 0.9 < fit.r2 <= 1.0
    assert fit.v50 > 0 and fit.p > 0 and 0 <= fit.c < 1
    # The pooled points are each model's (v, A~) on its own sweep.
    v, u = fleet.normalized_points(calibrations[0], "median")
    np.testing.assert_allclose(v, calibrations[0].sweep.v, rtol=1e-12)
    np.testing.assert_array_equal(u, calibrations[0].sweep.utility)


def test_shared_fit_under_another_statistic_moves_only_v(calibrations):
    cal = calibrations[2]
    v_mean, u_mean = fleet.normalized_points(cal, "mean")
    np.testing.assert_allclose(v_mean, (cal.sweep.sigma / cal.scales["mean"]) ** 2, rtol=1e-12)
    np.testing.assert_array_equal(u_mean, cal.sweep.utility)


@pytest.mark.parametrize("retention", [0.95, 0.9, 0.8, 0.7, 0.6])
def test_calibrate_from_scale_is_the_inverse_of_the_shared_fit(calibrations, retention):
    fit = fleet.shared_fit(calibrations)
    for cal in calibrations:
        t = fleet.calibrate_from_scale(fit, scale=cal.scale, clean_accuracy=cal.clean_accuracy,
                                       n_classes=cal.n_classes, value=retention)
        accuracy = retention * cal.clean_accuracy
        u = (accuracy - 0.1) / (cal.clean_accuracy - 0.1)
        v = invert_logistic(u, v50=fit.v50, p=fit.p, c=fit.c)
        assert t.v == v
        assert t.sigma == pytest.approx(cal.scale * math.sqrt(v), rel=1e-15)
        assert t.accuracy == pytest.approx(accuracy, rel=1e-15) and t.retention == pytest.approx(retention)
        assert t.method == "shared-logistic" and not t.saturated
        # The law predicts the target utility back at v*.
        assert fit.predict(t.v) == pytest.approx(u, rel=1e-9)


def test_calibrate_from_scale_edges_and_errors(calibrations):
    fit = fleet.shared_fit(calibrations)
    kw = dict(scale=2.0, clean_accuracy=0.9, n_classes=10)
    assert fleet.calibrate_from_scale(fit, value=1.0, **kw).sigma == 0.0
    assert fleet.calibrate_from_scale(fit, value=1.2, **kw).sigma == 0.0
    with pytest.raises(ValueError, match=r"floor"):
        fleet.calibrate_from_scale(fit, value=0.05, kind="accuracy", **kw)
    sat = fleet.calibrate_from_scale(fit, value=0.05, kind="accuracy", saturate=True, **kw)
    assert sat.saturated and sat.sigma == math.inf
    with pytest.raises(ValueError, match=r"kind must be 'accuracy' or 'retention', got 'agreement'"):
        fleet.calibrate_from_scale(fit, value=0.8, kind="agreement", **kw)
    with pytest.raises(ValueError, match=r"scale S must be positive, got 0"):
        fleet.calibrate_from_scale(fit, value=0.8, scale=0.0, clean_accuracy=0.9, n_classes=10)
    with pytest.raises(ValueError, match=r"clean accuracy 0.1 is not above chance 1/K=0.1"):
        fleet.calibrate_from_scale(fit, value=0.8, scale=1.0, clean_accuracy=0.1, n_classes=10)


def test_shared_fit_errors(calibrations):
    with pytest.raises(ValueError, match=r"at least one model"):
        fleet.shared_fit([])
    z, _ = _digits(DIGITS_FILES[0])
    unlabeled = calibrate_model(z, name="no-labels")
    with pytest.raises(ValueError, match=r"model 'no-labels' has no labels"):
        fleet.shared_fit([calibrations[0], unlabeled])


# --------------------------------------------------------------------------- leave-one-out and ablation


def test_transfer_error_is_the_relative_accuracy_miss(calibrations):
    fit = fleet.shared_fit(calibrations)
    cal = calibrations[1]
    errs = []
    for r in fleet.DEFAULT_RETENTIONS:
        t = fleet.calibrate_from_scale(fit, scale=cal.scale, clean_accuracy=cal.clean_accuracy,
                                       n_classes=10, value=r, saturate=True)
        got = cal.engine.accuracy(t.sigma)[0]  # digits: the exact curve is the measured one
        errs.append(abs(got - t.accuracy) / t.accuracy * 100)
    assert cal.curve_method == "exact"
    assert fleet.transfer_error(cal, fit, statistic="median") == pytest.approx(np.mean(errs), rel=1e-9)


def test_leave_one_out_has_a_row_per_model(calibrations):
    rows = fleet.leave_one_out(calibrations)
    assert [r["model"] for r in rows] == [c.name for c in calibrations]
    for row, cal in zip(rows, calibrations):
        assert row["scale"] == cal.scale
        assert np.isfinite(row["in_sample_error"]) and row["in_sample_error"] >= 0
        assert np.isfinite(row["held_out_error"]) and row["held_out_error"] >= 0
    # The held-out law never saw the model: on average it does no better than the
    # in-sample law (a small slack for the odd model a held-out fit happens to suit).
    in_sample = np.mean([r["in_sample_error"] for r in rows])
    held_out = np.mean([r["held_out_error"] for r in rows])
    assert held_out >= 0.95 * in_sample
    # The held-out error of a model is that of the law fit without it.
    others = calibrations[1:]
    held = fleet.shared_fit(others)
    assert rows[0]["held_out_error"] == pytest.approx(
        fleet.transfer_error(calibrations[0], held, statistic="median"), rel=1e-12)


def test_leave_one_out_needs_two_models(calibrations):
    with pytest.raises(ValueError, match=r"at least 2 models, got 1"):
        fleet.leave_one_out(calibrations[:1])


def test_margin_ablation_has_the_three_statistics(calibrations):
    rows = fleet.margin_ablation(calibrations[:4])
    assert [r["statistic"] for r in rows] == ["median", "mean", "trimmed"]
    for r in rows:
        assert 0.0 < r["r2"] <= 1.0
        assert np.isfinite(r["in_sample_error"]) and np.isfinite(r["held_out_error"])
        assert r["in_sample_error"] >= 0 and r["held_out_error"] >= 0
    # Each row is the leave-one-out table under that statistic.
    mean_rows = fleet.leave_one_out(calibrations[:4], statistic="mean")
    assert rows[1]["held_out_error"] == pytest.approx(np.mean([r["held_out_error"] for r in mean_rows]))
    assert rows[1]["r2"] == fleet.shared_fit(calibrations[:4], statistic="mean").r2


# --------------------------------------------------------------------------- cost: Proposition 2


@pytest.mark.parametrize(
    "v, v_use, expected",
    [(0.3, 0.1, 3), (0.6, 0.2, 3), (0.9, 0.3, 3), (0.7, 0.1, 7), (1.0, 0.1, 10), (1.0, 0.3, 4),
     (0.31, 0.1, 4), (0.05, 0.1, 1), (0.1, 0.1, 1), (0.0, 0.1, 1), (50.0, 0.01, 5000)],
)
def test_queries_needed_by_hand(v, v_use, expected):
    assert queries_needed(v, v_use) == expected
    assert isinstance(queries_needed(v, v_use), int)


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 2_000), v_use=st.floats(1e-4, 10.0))
def test_queries_needed_exact_multiples(m, v_use):
    # v = m * v_use rounded: M = m, not m + 1. The round-off of v / v_use is a few
    # ulps, inside the function's relative 1e-12 guard (large m below as well).
    v = m * v_use
    assert queries_needed(v, v_use) == m
    # A hair more intensity needs one more query.
    assert queries_needed(v * (1 + 1e-9), v_use) == m + 1


@settings(max_examples=200, deadline=None)
@given(v=st.floats(1e-6, 1e3), v_use=st.floats(1e-4, 10.0))
def test_queries_needed_is_the_smallest_sufficient_m(v, v_use):
    m = queries_needed(v, v_use)
    assert m >= 1
    # v / m <= v_use (up to the documented round-off guard), and m - 1 would not do.
    assert v / m <= v_use * (1 + 1e-9)
    if m > 1:
        assert v / (m - 1) > v_use * (1 - 1e-9)


def test_queries_needed_exact_multiples_at_large_m():
    assert queries_needed(256.16, 0.01) == 25616
    assert queries_needed(32.005, 0.001) == 32005


@pytest.mark.parametrize("v, v_use, match", [(1.0, 0.0, r"v_use must be positive, got 0.0"),
                                             (1.0, -1.0, r"v_use must be positive"),
                                             (-1.0, 0.1, r"v must be >= 0, got -1.0")])
def test_queries_needed_errors(v, v_use, match):
    with pytest.raises(ValueError, match=match):
        queries_needed(v, v_use)


def test_effective_intensity():
    m = np.array([1, 2, 4, 10])
    np.testing.assert_allclose(effective_intensity(2.0, m), [2.0, 1.0, 0.5, 0.2], rtol=1e-15)
    # Per-input seeding: the M answers coincide, the intensity stays at v.
    np.testing.assert_array_equal(effective_intensity(2.0, m, seeding="per-input"), [2.0] * 4)
    assert effective_intensity(3.0, 3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"m must be >= 1, got 0"):
        effective_intensity(1.0, [1, 0])
    with pytest.raises(ValueError, match=r"seeding must be 'fresh' or 'per-input', got 'hmac'"):
        effective_intensity(1.0, 2, seeding="hmac")


def test_sigma_after_averaging():
    np.testing.assert_allclose(sigma_after_averaging(3.0, [1, 4, 9]), [3.0, 1.5, 1.0], rtol=1e-15)
    np.testing.assert_array_equal(sigma_after_averaging(3.0, [1, 4, 9], seeding="per-input"), [3.0] * 3)


def test_recovered_utility_is_the_law_at_v_over_m():
    fit = LogisticFit(v50=1.2, p=1.5, c=0.05, r2=1.0, rmse=0.0, n_points=40)
    m = np.array([1, 2, 5, 20])
    np.testing.assert_allclose(recovered_utility(fit, 3.0, m), fit.predict(3.0 / m), rtol=1e-15)
    np.testing.assert_array_equal(recovered_utility(fit, 3.0, m, seeding="per-input"), fit.predict([3.0] * 4))
    # More queries, more utility back, up to the clean model.
    u = recovered_utility(fit, 3.0, np.arange(1, 200))
    assert np.all(np.diff(u) > 0) and u[-1] < 1.0


@pytest.mark.parametrize("path", DIGITS_FILES[:3], ids=lambda p: p.stem)
def test_averaging_m_fresh_draws_equals_one_draw_at_sigma_over_sqrt_m(path):
    z, y = _digits(path)
    n = z.shape[0]
    sigma = margin_scale(z) * math.sqrt(2.0)  # v = 2: well into the transition
    m, r = 4, 200
    perturber = Perturber(sigma, seeding="fresh", generator=np.random.default_rng(99))
    hits = 0
    for _ in range(r):
        avg = np.mean([perturber.perturb(z) for _ in range(m)], axis=0)
        hits += np.count_nonzero(np.argmax(avg, axis=1) == y)
    averaged = hits / (r * n)
    s_eff = float(sigma_after_averaging(sigma, m))
    assert s_eff == pytest.approx(sigma / 2)
    # Exact accuracy at sigma / sqrt(M) and the averaging Monte Carlo's error.
    p = survival_probability(sorted_gaps(z, y), s_eff)
    se = np.sqrt(np.sum(p * (1 - p)) / r) / n
    assert abs(averaged - p.mean()) <= N_SE * se, (averaged, p.mean(), se)
    # One draw at sigma / sqrt(M) (brute force, its own R draws): same accuracy.
    one_draw, _ = argmax_monte_carlo(z, y, [s_eff], realizations=r, seed=5)
    assert abs(averaged - one_draw[0]) <= N_SE * np.sqrt(2) * se
    # And clearly not the accuracy of one draw at sigma itself.
    at_sigma = CurveEngine(z, y, method="exact").accuracy(sigma)[0]
    assert averaged - at_sigma > 10 * se


def test_averaging_repeats_under_per_input_seeding_recovers_nothing():
    z, y = _digits(DIGITS_FILES[0])
    sigma = margin_scale(z) * math.sqrt(2.0)
    perturber = Perturber(sigma, seeding="per-input", key=b"test key, not a secret")
    ids = [f"input-{i}" for i in range(z.shape[0])]
    answers = [perturber.perturb(z, ids) for _ in range(8)]
    for a in answers[1:]:
        np.testing.assert_array_equal(a, answers[0])
    avg = np.mean(answers, axis=0)
    np.testing.assert_allclose(avg, answers[0], rtol=1e-15, atol=1e-12)
    assert float(sigma_after_averaging(sigma, 8, seeding="per-input")) == sigma


def test_recovered_utility_on_a_digits_model_matches_the_curve(calibrations):
    # The law at v / M is what the model's own curve gives at sigma / sqrt(M), to the fit's residual.
    cal = calibrations[0]
    v = 2.0
    for m in (1, 2, 4, 8):
        law = float(recovered_utility(cal.fit, v, m))
        sigma_m = cal.scale * math.sqrt(v / m)
        curve = (measured_accuracy(cal, sigma_m)[0] - 0.1) / (cal.clean_accuracy - 0.1)
        assert law == pytest.approx(curve, abs=0.05)
