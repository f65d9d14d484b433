"""K = 2: the closed form Phi(g / (sigma sqrt 2)) against the quadrature, the sweep and plain simulation.

Statistical comparisons use 4 standard errors (a correct implementation fails one
with probability 6e-5) at fixed seeds. The integral references come from
``scipy.integrate.quad`` of Eq. top1-exact (tolerance 1e-12), independent of the
module's trapezoid rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy.special import ndtr
from scipy.stats import norm

from caliber_core.calibration.calibrate import calibrate_model, draws_per_input, sigma_for_target
from caliber_core.calibration.calibration_arrays import (
    CalibrationArraysError,
    calibration_from_arrays,
    calibration_from_bytes,
    calibration_to_arrays,
    calibration_to_bytes,
)
from caliber_core.calibration.engine import EXACT_BUDGET, CurveEngine, choose_method, exact_cost
from caliber_core.calibration.sample import LogitSample
from caliber_core.calibration.survival import sorted_gaps, survival_probability
from caliber_core.calibration.sweep import SurvivalIntervals, survival_intervals
from caliber_core.calibration.two_class import SKETCH_POINTS, TwoClassCurves, quantile_sketch
from caliber_core.simulation.reference import argmax_monte_carlo

N_SE = 4.0


def two_class(n, *, seed, lift=1.2):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n)
    logits = rng.standard_normal((n, 2))
    logits[np.arange(n), labels] += lift
    return logits, labels


def quad_survival(gap, sigma):
    """Eq. top1-exact with one gap, integrated adaptively: int phi(u) Phi(g / sigma + u) du."""
    value, _ = integrate.quad(lambda u: norm.pdf(u) * norm.cdf(gap / sigma + u), -np.inf, np.inf,
                              epsabs=1e-13, epsrel=1e-12)
    return value


@pytest.mark.parametrize("sigma", [0.05, 0.7, 3.0, 40.0])
def test_closed_form_matches_the_integral(sigma):
    gaps = np.array([-3.0, -0.4, 0.0, 1e-3, 0.25, 1.0, 2.5, 7.0])
    got = survival_probability(gaps[:, None], sigma)
    want = np.array([quad_survival(g, sigma) for g in gaps])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


def test_zero_gap_is_one_half_exactly_and_sigma_zero_is_the_clean_model():
    gaps = np.array([[0.0], [0.3], [-0.3]])
    assert survival_probability(gaps, 1.7)[0] == 0.5
    np.testing.assert_array_equal(survival_probability(gaps, 0.0), [0.0, 1.0, 0.0])


def test_closed_form_is_exact_in_row_blocks():
    gaps = np.linspace(-4, 4, 4_500_001)[:, None]  # more rows than one block of the evaluation
    got = survival_probability(gaps, 1.3)
    np.testing.assert_array_equal(got, ndtr(gaps[:, 0] * (1.0 / (1.3 * np.sqrt(2.0)))))


def test_two_class_gaps_are_a_compact_array():
    z, _ = two_class(1000, seed=1)
    gaps = sorted_gaps(z, np.argmax(z, axis=1))
    assert gaps.shape == (1000, 1) and (gaps.base is None or gaps.base.size == 1000)
    np.testing.assert_array_equal(gaps[:, 0], np.abs(z[:, 0] - z[:, 1]))


def test_two_classes_are_always_exact_at_one_cdf_per_row():
    assert exact_cost(10**9, 2) == 1e9 > EXACT_BUDGET
    assert choose_method(10**9, 2) == "exact"
    assert choose_method(10**7, 3) == "monte-carlo"


def test_curves_match_the_sweep_within_its_standard_error():
    z, y = two_class(3000, seed=2)
    curves = TwoClassCurves(LogitSample(z, y))
    draws = survival_intervals(z, y, realizations=64, seed=5)
    sigma = np.array([0.2, 0.8, 2.0, 6.0])
    for quantity in ("accuracy", "agreement"):
        exact = getattr(curves, quantity)(sigma)
        mc = getattr(draws, quantity)(sigma)
        se = getattr(draws, f"{quantity}_stderr")(sigma)
        assert np.all(np.abs(exact - mc) <= N_SE * se + 1e-12), (quantity, exact, mc, se)
        np.testing.assert_array_equal(getattr(curves, f"{quantity}_stderr")(sigma), np.zeros(4))


def test_curves_match_plain_argmax_simulation():
    z, y = two_class(400, seed=3)
    curves = TwoClassCurves(LogitSample(z, y))
    sigma = np.array([0.3, 1.0, 3.0])
    reps = 400
    acc, agr = argmax_monte_carlo(z, y, sigma, realizations=reps, seed=11)
    for sim, exact in ((acc, curves.accuracy(sigma)), (agr, curves.agreement(sigma))):
        # Per-input Bernoulli draws: the simulation's error is at most sqrt(p(1-p) / (N R)) <= 1 / (2 sqrt(N R)).
        se = 0.5 / np.sqrt(z.shape[0] * reps)
        assert np.all(np.abs(sim - exact) <= N_SE * se), (sim, exact)


def test_clean_values_at_sigma_zero():
    z, y = two_class(500, seed=4)
    curves = TwoClassCurves(LogitSample(z, y))
    assert curves.agreement(0.0)[0] == 1.0
    assert curves.accuracy(0.0)[0] == np.mean(np.argmax(z, axis=1) == y)


@pytest.mark.parametrize("quantity", ["accuracy", "agreement"])
def test_guide_is_within_one_over_the_sketch_points(quantity):
    z, y = two_class(50_000, seed=5, lift=0.8)
    curves = TwoClassCurves(LogitSample(z, y))
    sigma = np.geomspace(0.01, 100, 25)
    exact = getattr(curves, quantity)(sigma)
    guided = curves.guide(quantity)(sigma)
    assert np.max(np.abs(guided - exact)) <= 1.0 / SKETCH_POINTS


def test_quantile_sketch_keeps_small_inputs_whole():
    values = np.array([3.0, -1.0, 2.0])
    np.testing.assert_array_equal(quantile_sketch(values, points=8), [-1.0, 2.0, 3.0])
    np.testing.assert_array_equal(quantile_sketch(np.arange(8.0), points=4), [1.0, 3.0, 5.0, 7.0])


def test_refusals():
    z, y = two_class(100, seed=6)
    with pytest.raises(ValueError, match="n_classes == 2, got 3"):
        TwoClassCurves(LogitSample(np.zeros((4, 3)) + np.arange(3)))
    curves = TwoClassCurves(LogitSample(z))
    with pytest.raises(ValueError, match="accuracy needs labels"):
        curves.accuracy(1.0)
    with pytest.raises(ValueError, match="accuracy needs labels"):
        curves.accuracy_stderr(1.0)
    with pytest.raises(ValueError, match="quantity must be 'accuracy' or 'agreement', got 'retention'"):
        curves.guide("retention")


def test_calibration_at_two_classes_has_no_draws():
    z, y = two_class(5000, seed=7)
    cal = calibrate_model(z, y, realizations=64)
    assert isinstance(cal.intervals, TwoClassCurves) and cal.intervals.realizations == 0
    assert cal.curve_method == "exact" and cal.sweep.realizations == 0
    np.testing.assert_array_equal(cal.sweep.accuracy_se, np.zeros(cal.sweep.sigma.size))
    np.testing.assert_allclose(cal.sweep.accuracy, cal.engine.accuracy(cal.sweep.sigma), rtol=0, atol=0)
    for kind, value in (("retention", 0.8), ("accuracy", 0.7), ("agreement", 0.75)):
        rec = sigma_for_target(cal, value, kind=kind)
        assert rec.method in ("exact-curve", "exact-agreement")
        got = cal.engine.agreement(rec.sigma)[0] if kind == "agreement" else cal.engine.accuracy(rec.sigma)[0]
        want = value * cal.clean_accuracy if kind == "retention" else value
        assert abs(got - want) < 1e-6


def test_monte_carlo_at_two_classes_still_sweeps_and_agrees():
    z, y = two_class(5000, seed=8)
    exact = sigma_for_target(calibrate_model(z, y), 0.8)
    mc_cal = calibrate_model(z, y, curve="monte-carlo", realizations=32)
    assert isinstance(mc_cal.intervals, SurvivalIntervals) and mc_cal.intervals.realizations == 32
    mc = sigma_for_target(mc_cal, 0.8)
    assert mc.method == "monte-carlo-curve"
    assert abs(mc.sigma - exact.sigma) / exact.sigma < 0.02


def test_engine_takes_closed_form_curves_as_no_draws():
    z, y = two_class(300, seed=9)
    sample = LogitSample(z, y)
    engine = CurveEngine(sample, method="monte-carlo", draws=TwoClassCurves(sample), seed=1)
    assert isinstance(engine.draws, SurvivalIntervals)  # its own sweep, run on first use


def test_draws_per_input():
    assert draws_per_input(10**6, 2) == 0
    assert draws_per_input(10**6, 2, realizations=63) == 0
    assert draws_per_input(10**6, 2, realizations=63, curve="monte-carlo") == 64
    assert draws_per_input(2000, 10, realizations=7) == 8
    assert draws_per_input(50_000, 10) >= 8


def test_stored_two_class_calibration_round_trips_bit_identically():
    z, y = two_class(3000, seed=10)
    cal = calibrate_model(z, y, name="pair")
    header, arrays = calibration_to_arrays(cal)
    assert header["realizations"] == 0 and not ({"agree_hi", "acc_lo", "acc_hi"} & set(arrays))
    back = calibration_from_bytes(calibration_to_bytes(cal), logits=z, labels=y)
    assert isinstance(back.intervals, TwoClassCurves)
    for name in ("sigma", "v", "accuracy", "accuracy_se", "agreement", "agreement_se", "utility"):
        np.testing.assert_array_equal(getattr(back.sweep, name), getattr(cal.sweep, name))
    for kind, value in (("retention", 0.75), ("agreement", 0.8)):
        assert sigma_for_target(back, value, kind=kind) == sigma_for_target(cal, value, kind=kind)
    sigma = cal.sweep.sigma
    np.testing.assert_array_equal(back.engine.at(sigma).accuracy, cal.engine.at(sigma).accuracy)


def test_stored_header_without_draws_is_refused_off_two_classes():
    z, y = two_class(500, seed=11)
    header, arrays = calibration_to_arrays(calibrate_model(z, y))
    bad = dict(header, n_classes=3)
    with pytest.raises(CalibrationArraysError, match="realizations must be 0 exactly at K = 2"):
        calibration_from_bytes(_bytes(bad, arrays), logits=z, labels=y)
    bad = dict(header, pooled=True)
    with pytest.raises(CalibrationArraysError, match="pooled must be false without draws"):
        calibration_from_bytes(_bytes(bad, arrays), logits=z, labels=y)
    with pytest.raises(CalibrationArraysError, match=r"stored calibration is of 500 x 2 logits"):
        calibration_from_arrays(header, arrays, logits=z[:10], labels=y[:10])


def _bytes(header, arrays):
    import io
    import json
    import zipfile

    buf = io.BytesIO()
    entries = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays}
    with zipfile.ZipFile(buf, "w") as zf:
        for name, arr in entries.items():
            with zf.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    return buf.getvalue()
