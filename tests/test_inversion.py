"""Target -> sigma on a falling curve: the root, and the side known to satisfy the target.

Curves with a closed-form inverse check the root to a stated tolerance; the
property tests draw random targets and check that "at-most" never leaves the
curve above the target and "at-least" never below it (no overshoot), on
callables, tabulated curves and a model's exact accuracy curve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caliber_core.calibration.calibrate import calibrate_model
from caliber_core.calibration.fit import LogisticFit
from caliber_core.calibration.inversion import (
    as_curve,
    first_crossing,
    invert_decreasing,
    logistic_sigma,
    settle,
    solve_near,
)
from caliber_core.loading import load_logits

DIGITS = Path(__file__).resolve().parents[1] / "data" / "digits_mlp-brief.npz"


def falling(scale: float = 2.0):
    """1 / (1 + (s / scale)^2): strictly decreasing, inverse scale * sqrt(1 / y - 1)."""
    def curve(s):
        s = np.asarray(s, dtype=np.float64)
        return 1.0 / (1.0 + (s / scale) ** 2)

    def inverse(y):
        return scale * np.sqrt(1.0 / y - 1.0)

    return curve, inverse


@pytest.fixture(scope="module")
def exact_cal():
    data = load_logits(DIGITS)
    return calibrate_model(data.logits, data.labels, name=data.name)


def test_first_crossing_finds_the_root_and_both_sides():
    curve, inverse = falling()
    for target in (0.9, 0.5, 0.1):
        point = first_crossing(curve, target, lo=1e-3, hi=1e3)
        assert point == pytest.approx(inverse(target), rel=1e-12)
        below = first_crossing(curve, target, lo=1e-3, hi=1e3, side="at-most")
        above = first_crossing(curve, target, lo=1e-3, hi=1e3, side="at-least")
        assert above <= point <= below and (below - above) <= 1e-12 * point
        assert curve(below) <= target <= curve(above)


def test_first_crossing_edges():
    curve, _ = falling()
    with pytest.raises(ValueError, match=r"target 0.001 not reached for sigma in \[0.001, 10\]"):
        first_crossing(curve, 0.001, lo=1e-3, hi=10.0)
    # Already below the target where the range starts: the start, or no noise for "at-least".
    assert first_crossing(curve, 0.999, lo=1.0, hi=10.0) == 1.0
    assert first_crossing(curve, 0.999, lo=1.0, hi=10.0, side="at-least") == 0.0
    with pytest.raises(ValueError, match=r"side must be one of \('point', 'at-least', 'at-most'\), got 'up'"):
        first_crossing(curve, 0.5, lo=1e-3, hi=1e3, side="up")
    with pytest.raises(ValueError, match=r"need 0 < lo < hi < inf, got lo=2.0, hi=1.0"):
        first_crossing(curve, 0.5, lo=2.0, hi=1.0)


def test_tabulated_curve_interpolates_in_log_sigma():
    sigma = np.geomspace(0.01, 100.0, 9)
    values = np.linspace(1.0, 0.0, 9)  # linear in log sigma: interpolation is exact
    curve = as_curve((sigma, values))
    np.testing.assert_allclose(curve(np.sqrt(sigma[2] * sigma[3])), 0.5 * (values[2] + values[3]), rtol=1e-12)
    assert first_crossing((sigma, values), 0.5, lo=0.01, hi=100.0) == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(ValueError, match="increasing sigma > 0"):
        as_curve((sigma[::-1], values))
    with pytest.raises(ValueError, match="two 1-D arrays of equal length"):
        as_curve((sigma, values[:3]))
    with pytest.raises(TypeError, match="callable or a \\(sigma, values\\) pair, got int"):
        as_curve(3)


def test_scalar_solvers_find_the_root():
    curve, inverse = falling(3.0)

    def f(s):
        return float(curve(s))

    assert solve_near(f, 0.3, guess=4.0) == pytest.approx(inverse(0.3), rel=1e-6)
    assert invert_decreasing(f, 0.3, lo=100.0, hi=200.0) == pytest.approx(inverse(0.3), rel=1e-6)
    with pytest.raises(ValueError, match="not reachable"):
        invert_decreasing(f, -0.1, lo=0.5, hi=1.0)


@settings(max_examples=200, deadline=None)
@given(target=st.floats(0.02, 0.98), scale=st.floats(0.05, 50.0), guess_factor=st.floats(0.5, 2.0),
       side=st.sampled_from(["at-most", "at-least"]))
def test_sides_never_overshoot_on_random_targets(target, scale, guess_factor, side):
    curve, inverse = falling(scale)

    def f(s):
        return float(curve(s))

    root = inverse(target)
    ok = (lambda y: y <= target) if side == "at-most" else (lambda y: y >= target)
    for sigma in (
        first_crossing(curve, target, lo=scale * 1e-4, hi=scale * 1e4, side=side),
        solve_near(f, target, guess=root * guess_factor, side=side),
        invert_decreasing(f, target, lo=root / 3, hi=root * 3, side=side),
    ):
        assert ok(f(sigma)), (sigma, f(sigma), target)
        assert sigma == pytest.approx(root, rel=1e-3)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=30), target=st.floats(0.01, 0.99),
       side=st.sampled_from(["at-most", "at-least"]))
def test_sides_never_overshoot_on_tabulated_curves(values, target, side):
    y = np.sort(np.asarray(values))[::-1]  # non-increasing, ties allowed (a measured curve's steps)
    sigma = np.geomspace(0.1, 10.0, y.size)
    if not (y[-1] <= target < y[0]):
        return  # the crossing is outside the table
    s = first_crossing((sigma, y), target, lo=0.1, hi=10.0, side=side)
    got = as_curve((sigma, y))(s)[0]
    assert got <= target if side == "at-most" else got >= target


@pytest.mark.parametrize("retention", [0.95, 0.8, 0.6])
def test_sides_on_the_exact_accuracy_curve(exact_cal, retention):
    accuracy = retention * exact_cal.clean_accuracy

    def f(s):
        return float(exact_cal.engine.accuracy(s)[0])

    guess = first_crossing(exact_cal.intervals.accuracy, accuracy, lo=1e-3, hi=1e3)
    point = solve_near(f, accuracy, guess=guess)
    below = solve_near(f, accuracy, guess=guess, side="at-most")
    above = solve_near(f, accuracy, guess=guess, side="at-least")
    assert f(below) <= accuracy <= f(above)
    assert above <= point <= below and (below - above) / point < 1e-3


def test_settle_moves_only_as_far_as_needed():
    curve, inverse = falling()

    def f(s):
        return float(curve(s))

    root = inverse(0.5)
    assert settle(f, 0.5, root * 0.99, side="point") == root * 0.99
    up = settle(f, 0.5, root * 0.99, side="at-most", rtol=1e-4)
    assert f(up) <= 0.5 and up < root * 1.02
    down = settle(f, 0.5, root * 1.01, side="at-least", rtol=1e-4)
    assert f(down) >= 0.5 and down > root * 0.98


def test_logistic_sigma_is_the_closed_form():
    fit = LogisticFit(v50=0.5, p=2.0, c=0.1, r2=1.0, rmse=0.0, n_points=10)
    u = 0.6
    v = 0.5 * ((1 - u) / (u - 0.1)) ** 0.5
    assert logistic_sigma(fit, u, scale=3.0) == pytest.approx(3.0 * np.sqrt(v), rel=1e-15)
    assert logistic_sigma(fit, 0.05, scale=3.0, saturate=True) == np.inf
    with pytest.raises(ValueError, match="floor"):
        logistic_sigma(fit, 0.05, scale=3.0)
