"""Exact survival (Proposition 1), exact accuracy, the corridor (Corollary 1), inversion.

Statistical comparisons use 4 standard errors: a correct implementation fails one
such comparison with probability 6e-5. Every seed is fixed, so outcomes are
reproducible; the standard errors are computed from the exact per-input
probabilities, not estimated from the same draws.
"""

from __future__ import annotations

from pathlib import Path

import zlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from caliber_core.calibration.margins import clean_accuracy, margin_scale
from caliber_core.calibration.inversion import invert_decreasing, sigma_for_agreement
from caliber_core.calibration.engine import CurveEngine
from caliber_core.calibration.survival import (
    agreement_probability,
    sorted_gaps,
    survival_probability,
)
from caliber_core.simulation.reference import argmax_monte_carlo

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DIGITS_FILES = sorted(DATA_DIR.glob("digits_*.npz"))
N_SE = 4.0
# Quadrature error of the exact curves for K <= 100 (tests/test_survival_reference.py).
QUAD_TOL = 1e-9
SIGMA_GRID = np.geomspace(1e-3, 1e3, 25)  # ratio ~1.78 between neighbours


def _digits(path):
    with np.load(path, allow_pickle=False) as d:
        return d["logits"].astype(np.float64), d["labels"]


def _per_input_accuracy(logits, labels, sigma):
    """Exact P(noisy argmax == label) per input: the label as the reference class."""
    return survival_probability(sorted_gaps(logits, labels), sigma)


logit_arrays = st.tuples(st.integers(1, 6), st.integers(2, 12)).flatmap(
    lambda shape: hnp.arrays(
        np.float64, shape, elements=st.floats(-20, 20, allow_nan=False, allow_infinity=False)
    )
)


# --------------------------------------------------------------------------- properties of pi


@settings(max_examples=60, deadline=None)
@given(z=logit_arrays)
def test_pi_is_between_chance_and_one_and_non_increasing(z):
    k = z.shape[1]
    pi = agreement_probability(z, SIGMA_GRID)  # (n_sigma, n)
    assert pi.shape == (SIGMA_GRID.size, z.shape[0])
    assert np.all(pi <= 1.0)
    assert np.all(pi >= 1.0 / k - QUAD_TOL)
    assert np.all(np.diff(pi, axis=0) <= QUAD_TOL)


@settings(max_examples=60, deadline=None)
@given(z=st.tuples(st.integers(1, 6), st.integers(2, 12)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=st.integers(-1280, 1280).map(lambda i: i / 64.0))
))
def test_pi_is_strictly_decreasing_where_distinguishable(z):
    # Logits on a 1/64 grid: every gap is 0 or >= 1/64, so no gap is below float
    # resolution at sigma >= 1e-3 (a gap of 1e-55 would leave pi flat to the last bit).
    k = z.shape[1]
    pi = agreement_probability(z, SIGMA_GRID)
    s = np.sort(z, axis=1)
    unique = s[:, -1] > s[:, -2]  # Proposition 1 assumes a unique maximizer
    # Away from the limits 1 and 1/K, a factor 1.78 in sigma moves pi visibly.
    mid = (pi[:-1] < 1 - 1e-6) & (pi[1:] > 1.0 / k + 1e-6) & unique[None, :]
    assert np.all(np.diff(pi, axis=0)[mid] < 0)
    # A row tied at the top with everything else far away is flat at 1/2 instead.
    assert np.all(pi[:, ~unique] < 0.5 + QUAD_TOL)


@settings(max_examples=40, deadline=None)
@given(z=logit_arrays)
def test_pi_limits_at_zero_and_infinite_noise(z):
    k = z.shape[1]
    s = np.sort(z, axis=1)
    unique_top = s[:, -1] > s[:, -2]
    # sigma = 0: exactly 1 with a unique maximizer, 0 when the top is tied.
    np.testing.assert_array_equal(agreement_probability(z, 0.0), unique_top.astype(float))
    # sigma -> infinity: chance 1/K (gaps here are <= 40, so g/sigma <= 4e-7).
    np.testing.assert_allclose(agreement_probability(z, 1e8), 1.0 / k, atol=1e-6)


# Dyadic logits and integer shifts: z + c is exact, so the gaps and pi are identical.
dyadic_logits = st.tuples(st.integers(1, 6), st.integers(2, 10)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=st.integers(-640, 640).map(lambda i: i / 64.0))
)


@settings(max_examples=40, deadline=None)
@given(z=dyadic_logits, data=st.data())
def test_adding_a_constant_to_a_row_leaves_pi_and_accuracy_unchanged(z, data):
    n, k = z.shape
    shifts = np.array(data.draw(st.lists(st.integers(-10**6, 10**6), min_size=n, max_size=n)), float)
    labels = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    # At least one wrong row: the all-correct case is a known bug (test_exact_curves_for_a_perfect_model).
    assume(np.any(np.argmax(z, axis=1) != labels))
    shifted = z + shifts[:, None]
    sig = np.array([0.0, 0.1, 1.0, 10.0])
    np.testing.assert_array_equal(agreement_probability(shifted, sig), agreement_probability(z, sig))
    a, b = CurveEngine(z, labels, method="exact"), CurveEngine(shifted, labels, method="exact")
    np.testing.assert_array_equal(a.accuracy(sig), b.accuracy(sig))
    for x, y in zip(a.corridor(sig), b.corridor(sig)):
        np.testing.assert_array_equal(x, y)


def test_agreement_probability_shapes():
    z = np.array([[2.0, 0.0, 1.0], [0.0, 3.0, 0.5]])
    assert agreement_probability(z, 0.7).shape == (2,)
    assert agreement_probability(z, [0.7]).shape == (1, 2)
    assert agreement_probability(z, np.array([0.1, 0.7, 2.0])).shape == (3, 2)


@pytest.mark.parametrize(
    "sigma, match",
    [(-0.1, r"finite and >= 0, got -0.1"), (np.nan, r"got nan"), (np.inf, r"got inf"),
     (np.ones((2, 2)), r"scalar or 1-D")],
)
def test_invalid_sigma_is_rejected(sigma, match):
    with pytest.raises(ValueError, match=match):
        agreement_probability(np.eye(3), sigma)
    curves = CurveEngine(np.eye(3), [0, 1, 0], method="exact")  # one wrong row
    for method in (curves.agreement, curves.accuracy, curves.corridor):
        with pytest.raises(ValueError, match=match):
            method(sigma)


def test_exact_curves_for_a_perfect_model():
    z = np.array([[3.0, 0.0, 1.0], [0.0, 2.0, 1.0]])
    curves = CurveEngine(z, [0, 1], method="exact")
    sigma = np.array([0.0, 0.5, 2.0])
    # Every row is correct: accuracy is agreement, the corridor has zero width.
    np.testing.assert_allclose(curves.accuracy(sigma), curves.agreement(sigma), rtol=1e-15)
    lower, upper = curves.corridor(sigma)
    np.testing.assert_allclose(lower, curves.agreement(sigma), rtol=1e-15)
    np.testing.assert_array_equal(upper, lower)


def test_exact_curves_need_labels_for_accuracy_and_corridor():
    curves = CurveEngine(np.eye(3), method="exact")
    assert curves.agreement(0.5).shape == (1,)
    with pytest.raises(ValueError, match=r"labels are required"):
        curves.accuracy(0.5)
    with pytest.raises(ValueError, match=r"labels are required"):
        curves.corridor(0.5)
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: logits 3, labels \(2,\)"):
        CurveEngine(np.eye(3), [0, 1], method="exact")


def test_sorted_gaps_by_hand():
    z = np.array([[1.0, 4.0, 2.0, 0.0]])
    np.testing.assert_array_equal(sorted_gaps(z, [1]), [[2.0, 3.0, 4.0]])
    np.testing.assert_array_equal(sorted_gaps(z, [3]), [[-4.0, -2.0, -1.0]])
    with pytest.raises(ValueError, match=r"reference must have shape \(1,\)"):
        sorted_gaps(z, [0, 1])


# --------------------------------------------------------------------------- against Monte Carlo


def _mc_survival(z, ref, sigma, draws, seed):
    """Fraction of draws where class ``ref`` is the argmax of z + sigma xi, and its standard error."""
    rng = np.random.default_rng(seed)
    hits = 0
    chunk = 20_000
    for start in range(0, draws, chunk):
        xi = rng.standard_normal((min(chunk, draws - start), z.size))
        hits += np.count_nonzero(np.argmax(z + sigma * xi, axis=1) == ref)
    return hits / draws


MC_CASES = [
    # (description, logits row, reference class, sigma)
    ("K3 agreement", [2.0, 0.0, 1.3], 0, 0.8),
    ("K3 label trails", [2.0, 0.0, 1.3], 2, 0.8),
    ("K10 agreement", [0.0, -0.4, -1.0, -1.1, -2.0, -2.5, -3.0, -0.2, -5.0, -0.9], 0, 0.5),
    ("K10 label trails", [0.0, -0.4, -1.0, -1.1, -2.0, -2.5, -3.0, -0.2, -5.0, -0.9], 3, 1.5),
    ("K100 agreement", np.r_[0.0, -np.linspace(0.3, 6.0, 99)], 0, 1.0),
]


@pytest.mark.parametrize("name, z, ref, sigma", MC_CASES, ids=[c[0] for c in MC_CASES])
def test_exact_survival_matches_a_large_monte_carlo(name, z, ref, sigma):
    # 200,000 draws: standard error sqrt(p(1-p)/2e5) <= 1.1e-3, compared at 4 SE.
    z = np.asarray(z, dtype=np.float64)
    draws = 200_000
    exact = survival_probability(sorted_gaps(z[None, :], [ref]), sigma)[0]
    assert 0.02 < exact < 0.98  # a case in the transition, where MC is informative
    mc = _mc_survival(z, ref, sigma, draws, seed=zlib.crc32(name.encode()))
    se = np.sqrt(exact * (1 - exact) / draws)
    assert abs(mc - exact) <= N_SE * se, (mc, exact, se)


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_exact_accuracy_matches_brute_force_monte_carlo(path):
    z, y = _digits(path)
    s = margin_scale(z)
    sigma = s * np.sqrt([0.3, 1.0, 3.0])  # before, in and after the transition
    curves = CurveEngine(z, y, method="exact")
    exact = curves.accuracy(sigma)
    r = 100
    acc, agr = argmax_monte_carlo(z, y, sigma, realizations=r, seed=7)
    exact_agr = curves.agreement(sigma)
    for i, si in enumerate(sigma):
        # Noise-only variance of the brute force mean: sum_i p_i (1 - p_i) / (R N^2).
        p = _per_input_accuracy(z, y, si)
        assert p.mean() == pytest.approx(exact[i], abs=1e-12)
        se = np.sqrt(np.sum(p * (1 - p)) / r) / z.shape[0]
        assert abs(acc[i] - exact[i]) <= N_SE * se, (si, acc[i], exact[i], se)
        q = agreement_probability(z, si)
        se_a = np.sqrt(np.sum(q * (1 - q)) / r) / z.shape[0]
        assert abs(agr[i] - exact_agr[i]) <= N_SE * se_a


def test_exact_accuracy_is_a0_at_zero_noise_and_chance_at_infinite_noise():
    for path in DIGITS_FILES:
        z, y = _digits(path)
        curves = CurveEngine(z, y, method="exact")
        assert curves.accuracy(0.0)[0] == clean_accuracy(z, y)
        assert curves.agreement(0.0)[0] == 1.0
        # sigma = 1e5 S: gaps / sigma ~ 1e-5, so accuracy is 1/K to ~1e-4.
        far = 1e5 * margin_scale(z)
        assert curves.accuracy(far)[0] == pytest.approx(0.1, abs=1e-3)
        assert curves.agreement(far)[0] == pytest.approx(0.1, abs=1e-3)


# --------------------------------------------------------------------------- corridor


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_corridor_contains_the_exact_accuracy_on_digits(path):
    z, y = _digits(path)
    a0 = clean_accuracy(z, y)
    curves = CurveEngine(z, y, method="exact")
    sigma = margin_scale(z) * np.sqrt(np.geomspace(1e-2, 1e2, 13))
    lower, upper = curves.corridor(sigma)
    acc = curves.accuracy(sigma)
    assert np.all(lower <= acc + QUAD_TOL)
    assert np.all(acc <= upper + QUAD_TOL)
    # The floor is strictly decreasing from A0 towards A0 / K (Corollary 1).
    assert np.all(np.diff(lower) < 0)
    assert lower[0] <= a0
    far_lower, far_upper = curves.corridor(1e5 * margin_scale(z))
    assert far_lower[0] == pytest.approx(a0 / 10, abs=1e-3)
    # The width is (1 - A0) beta with beta < 1/2, and positive when some row is wrong.
    width = upper - lower
    assert np.all(width >= 0) and np.all(width < 0.5 * (1 - a0) + 1e-15)
    if a0 < 1:
        assert np.all(width[1:] > 0)


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_corridor_floor_tends_to_a0_as_sigma_vanishes(path):
    z, y = _digits(path)
    a0 = clean_accuracy(z, y)
    lower, upper = CurveEngine(z, y, method="exact").corridor([0.0, 1e-9, 1e-6 * margin_scale(z)])
    np.testing.assert_array_equal(lower, a0)
    np.testing.assert_allclose(upper, a0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(z=logit_arrays, data=st.data())
def test_corridor_contains_the_exact_accuracy_on_random_logits(z, data):
    n, k = z.shape
    labels = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    s = np.sort(z, axis=1)
    assume(np.all(s[:, -1] > s[:, -2]))  # Corollary 1 assumes a unique maximizer
    # At least one wrong row: the all-correct case is a known bug (test_exact_curves_for_a_perfect_model).
    assume(np.any(np.argmax(z, axis=1) != labels))
    curves = CurveEngine(z, labels, method="exact")
    lower, upper = curves.corridor(SIGMA_GRID)
    acc = curves.accuracy(SIGMA_GRID)
    assert np.all(lower <= acc + QUAD_TOL)
    assert np.all(acc <= upper + QUAD_TOL)


# --------------------------------------------------------------------------- inversion


@pytest.mark.parametrize("path", DIGITS_FILES[:4], ids=lambda p: p.stem)
@pytest.mark.parametrize("target", [0.95, 0.9, 0.75, 0.6, 0.3])
def test_sigma_for_agreement_hits_the_target(path, target):
    z, _ = _digits(path)
    curves = CurveEngine(z, method="exact")
    s = margin_scale(z)
    # A deliberately poor guess (the scale S itself), no slope: the solver must still converge.
    sigma = sigma_for_agreement(curves, target, guess=s)
    assert sigma > 0
    assert abs(curves.agreement(sigma)[0] - target) <= 1e-6


def test_sigma_for_agreement_is_monotone_in_the_target():
    z, _ = _digits(DIGITS_FILES[0])
    curves = CurveEngine(z, method="exact")
    s = margin_scale(z)
    sig = [sigma_for_agreement(curves, t, guess=s) for t in (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)]
    assert np.all(np.diff(sig) > 0)


@pytest.mark.parametrize("target", [0.1, 0.05, 1.0, 1.2])
def test_sigma_for_agreement_rejects_targets_outside_chance_and_one(target):
    z, _ = _digits(DIGITS_FILES[0])
    with pytest.raises(ValueError, match=r"strictly between 1/K=0.1 and 1"):
        sigma_for_agreement(CurveEngine(z, method="exact"), target, guess=1.0)


def test_invert_decreasing_expands_its_bracket_and_reports_unreachable():
    f = lambda s: float(np.exp(-s))  # noqa: E731
    root = invert_decreasing(f, 0.25, lo=100.0, hi=200.0)  # bracket far to the right
    assert root == pytest.approx(np.log(4), rel=1e-6)
    root = invert_decreasing(f, 0.25, lo=1e-4, hi=2e-4)  # bracket far to the left
    assert root == pytest.approx(np.log(4), rel=1e-6)
    with pytest.raises(ValueError, match=r"target -0.5 is not reachable"):
        invert_decreasing(f, -0.5, lo=0.5, hi=1.0)
