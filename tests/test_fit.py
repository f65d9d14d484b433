"""The logistic decay law (Eq. logistic-decay), its fit, and its inverse (Eq. inverse-v)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caliber_core.calibration.fit import (
    FitError,
    LogisticFit,
    bounded_least_squares,
    fit_logistic,
    invert_logistic,
    logistic_decay,
)

# Parameter ranges drawn in the property tests (inside the fit's bounds).
params = st.fixed_dictionaries(
    {
        "v50": st.floats(1e-3, 1e3),
        "p": st.floats(0.3, 10.0),
        "c": st.floats(0.0, 0.5),
    }
)


# --------------------------------------------------------------------------- the law


@pytest.mark.parametrize("v50, p, c", [(1.0, 2.0, 0.0), (0.3, 0.7, 0.1), (50.0, 8.0, 0.4)])
def test_law_is_one_at_zero_half_way_at_v50_and_tends_to_c(v50, p, c):
    assert logistic_decay(0.0, v50=v50, p=p, c=c) == 1.0
    assert logistic_decay(v50, v50=v50, p=p, c=c) == pytest.approx(c + (1 - c) / 2, rel=1e-15)
    far = logistic_decay(v50 * 1e30, v50=v50, p=p, c=c)
    assert far == pytest.approx(c, abs=1e-9)
    # Even where (v / v50)^p overflows the law returns c, not NaN.
    assert logistic_decay(1e300, v50=v50, p=p, c=c) == c


def test_law_by_hand():
    # v50 = 2, p = 2, c = 0.2: at v = 4, (v/v50)^p = 4, A~ = 0.2 + 0.8 / 5.
    assert logistic_decay(4.0, v50=2.0, p=2.0, c=0.2) == pytest.approx(0.36, rel=1e-15)
    np.testing.assert_allclose(
        logistic_decay([0.0, 1.0, 2.0], v50=2.0, p=1.0, c=0.0), [1.0, 2 / 3, 0.5], rtol=1e-15
    )


@settings(max_examples=100, deadline=None)
@given(params)
def test_law_is_decreasing_and_between_c_and_one(prm):
    v = np.geomspace(1e-6, 1e6, 200) * prm["v50"]
    u = logistic_decay(v, **prm)
    assert np.all(u <= 1.0) and np.all(u >= prm["c"])
    assert np.all(np.diff(u) <= 0)


def test_law_rejects_negative_v():
    with pytest.raises(ValueError, match=r"v must be >= 0, got min -0.5"):
        logistic_decay([1.0, -0.5], v50=1.0, p=2.0, c=0.0)


# --------------------------------------------------------------------------- the inverse


def test_inverse_by_hand():
    # v* = v50 ((1 - u) / (u - c))^(1/p): u = 0.36 -> ((0.64) / (0.16))^(1/2) * 2 = 4.
    assert invert_logistic(0.36, v50=2.0, p=2.0, c=0.2) == pytest.approx(4.0, rel=1e-14)
    out = invert_logistic(np.array([1.0, 0.6, 0.36]), v50=2.0, p=2.0, c=0.2)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [0.0, 2.0, 4.0], rtol=1e-14)


@settings(max_examples=200, deadline=None)
@given(prm=params, log_t=st.floats(np.log(1e-4), np.log(1e4)))
def test_inverse_of_the_law_round_trips(prm, log_t):
    # v placed so that (v / v50)^p = t in [1e-4, 1e4]: there A~ stays >= 1e-4 away
    # from both 1 and c, and the round trip is conditioned to ~1e-11 relative.
    # (Beyond, 1 - A~ or A~ - c falls below float resolution and no inverse can
    # recover v to 1e-9.)
    v = prm["v50"] * np.exp(log_t / prm["p"])
    u = logistic_decay(v, **prm)
    back = invert_logistic(u, **prm)
    assert back == pytest.approx(v, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(prm=params)
def test_sigma_star_increases_as_the_target_falls(prm):
    targets = np.linspace(0.999, prm["c"] + 1e-3, 60)  # falling
    v = invert_logistic(targets, **prm)
    scale = 2.5
    sigma = scale * np.sqrt(v)
    assert np.all(np.isfinite(sigma))
    assert np.all(np.diff(sigma) > 0)


@pytest.mark.parametrize("target", [1.0, 1.0 + 1e-12, 1.3, 5.0])
def test_targets_at_or_above_clean_need_no_noise(target):
    assert invert_logistic(target, v50=1.0, p=2.0, c=0.1) == 0.0
    np.testing.assert_array_equal(invert_logistic([target, 0.5], v50=1.0, p=1.0, c=0.0)[:1], [0.0])


@pytest.mark.parametrize("target", [0.1, 0.05, 0.0, -0.2])
def test_targets_at_or_below_the_floor_raise_or_saturate(target):
    with pytest.raises(ValueError, match=r"at or below the curve's floor c=0.1000.*saturate=True"):
        invert_logistic(target, v50=1.0, p=2.0, c=0.1)
    assert invert_logistic(target, v50=1.0, p=2.0, c=0.1, saturate=True) == np.inf
    fit = LogisticFit(v50=1.0, p=2.0, c=0.1, r2=1.0, rmse=0.0, n_points=3)
    with pytest.raises(ValueError, match=r"floor"):
        fit.inverse(target)
    assert fit.inverse(target, saturate=True) == np.inf


def test_an_array_with_one_unreachable_target_names_the_worst():
    with pytest.raises(ValueError, match=r"normalized target -0.3000 is at or below"):
        invert_logistic([0.5, 0.05, -0.3], v50=1.0, p=2.0, c=0.1)
    out = invert_logistic([0.5, 0.05, -0.3], v50=1.0, p=2.0, c=0.1, saturate=True)
    assert np.isfinite(out[0]) and out[0] > 0
    assert np.all(out[1:] == np.inf)


def test_nan_target_is_rejected():
    with pytest.raises(ValueError, match=r"NaN"):
        invert_logistic(float("nan"), v50=1.0, p=2.0, c=0.0)
    with pytest.raises(ValueError, match=r"NaN"):
        invert_logistic([0.5, float("nan")], v50=1.0, p=2.0, c=0.0, saturate=True)


@settings(max_examples=200, deadline=None)
@given(prm=params, target=st.floats(-1.0, 2.0))
def test_inverse_is_never_nan(prm, target):
    v = invert_logistic(target, saturate=True, **prm)
    assert not np.isnan(v)
    assert v >= 0
    if target >= 1.0:
        assert v == 0.0
    elif target <= prm["c"]:
        assert v == np.inf
    else:
        assert v > 0
        # Above the floor, saturate changes nothing (and nothing raises).
        assert invert_logistic(target, **prm) == v


# --------------------------------------------------------------------------- fitting


def _law_points(v50, p, c, n=40):
    v = v50 * np.geomspace(1e-2, 1e2, n)
    return v, logistic_decay(v, v50=v50, p=p, c=c)


@pytest.mark.parametrize(
    "v50, p, c, tol",
    [
        (0.05, 1.2, 0.05, 1e-6),
        (30.0, 4.0, 0.2, 1e-6),
        (500.0, 12.0, 0.1, 1e-6),
        (1.0, 2.0, 0.01, 1e-6),
        # c = 0 sits on the bound: the trust-region solver stops at its default
        # tolerances a little short (observed ~1e-5 relative, residual ~3e-6).
        (1.0, 2.0, 0.0, 1e-4),
        (2e-4, 0.8, 0.0, 1e-4),
    ],
)
def test_fit_recovers_parameters_from_noiseless_points(v50, p, c, tol):
    v, u = _law_points(v50, p, c)
    fit = fit_logistic(v, u)
    assert fit.v50 == pytest.approx(v50, rel=tol)
    assert fit.p == pytest.approx(p, rel=tol)
    assert fit.c == pytest.approx(c, abs=tol)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.rmse < 10 * tol
    assert fit.n_points == v.size
    np.testing.assert_allclose(fit.predict(v), u, atol=10 * tol)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_parameters_from_noisy_points(seed):
    rng = np.random.default_rng(seed)
    v50, p, c = rng.uniform(0.1, 10), rng.uniform(1.0, 4.0), rng.uniform(0.0, 0.15)
    v, u = _law_points(v50, p, c, n=60)
    noise = 0.005  # about the Monte-Carlo error of a sweep point
    fit = fit_logistic(v, u + noise * rng.standard_normal(v.size))
    # With 60 points and noise 0.005 the estimates are good to a few percent.
    assert fit.v50 == pytest.approx(v50, rel=0.05)
    assert fit.p == pytest.approx(p, rel=0.1)
    assert fit.c == pytest.approx(c, abs=0.02)
    assert 0.99 < fit.r2 <= 1.0
    assert fit.rmse == pytest.approx(noise, rel=0.3)


@settings(max_examples=30, deadline=None)
@given(prm=params, seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.05))
def test_r2_is_in_zero_one_and_the_inverse_is_monotone(prm, seed, noise):
    v, u = _law_points(**prm, n=30)
    rng = np.random.default_rng(seed)
    fit = fit_logistic(v, u + noise * rng.standard_normal(v.size))
    assert 0.0 <= fit.r2 <= 1.0
    # Whatever was fit, the inverse through it is monotone and never NaN.
    targets = np.linspace(0.99, fit.c + 1e-3, 20)
    vs = fit.inverse(targets)
    assert np.all(np.isfinite(vs)) and np.all(np.diff(vs) > 0)


def test_fit_skips_non_finite_and_non_positive_points():
    v, u = _law_points(1.0, 2.0, 0.1)
    v2 = np.concatenate([v, [0.0, -1.0, np.nan, 2.0]])
    u2 = np.concatenate([u, [1.0, 1.0, 0.5, np.inf]])
    fit = fit_logistic(v2, u2)
    assert fit.n_points == v.size
    assert fit.v50 == pytest.approx(1.0, rel=1e-6)


def test_fit_errors():
    with pytest.raises(ValueError, match=r"differ in length: 3 vs 2"):
        fit_logistic([1.0, 2.0, 3.0], [0.5, 0.4])
    with pytest.raises(ValueError, match=r"at least 3 finite points with v > 0.*got 2"):
        fit_logistic([0.0, 1.0, 2.0], [1.0, 0.5, 0.3])


def test_fit_to_dict_round_trip():
    v, u = _law_points(1.0, 2.0, 0.1)
    d = fit_logistic(v, u).to_dict()
    assert set(d) == {"v50", "p", "c", "r2", "rmse", "n_points"}
    assert LogisticFit(**d) == fit_logistic(v, u)


@pytest.mark.parametrize("seed", range(40))
def test_fit_reaches_the_minimum_scipy_least_squares_finds(seed):
    # Reference: scipy's trust-region reflective solver on the same residuals, bounds
    # and start. The fit must reach its cost to 1e-9 relative (observed: 3e-14 over 300 cases).
    from scipy import optimize

    rng = np.random.default_rng(seed)
    v50, p = np.exp(rng.uniform(-6, 6)), rng.uniform(0.3, 8.0)
    c = 0.0 if seed % 4 == 0 else rng.uniform(0.0, 0.3)
    v = v50 * np.geomspace(1e-3, 1e3, int(rng.integers(10, 60)))
    u = logistic_decay(v, v50=v50, p=p, c=c) + rng.uniform(0, 0.05) * rng.standard_normal(v.size)
    fit = fit_logistic(v, u)
    log_v = np.log(v)

    def residuals(x):
        return x[2] + (1 - x[2]) / (1 + np.exp(np.clip(x[1] * (log_v - x[0]), -700, 700))) - u

    order = np.argsort(v)
    below = np.nonzero(u[order] <= 0.5)[0]
    lower, upper = np.array([np.log(1e-8), 0.05, 0.0]), np.array([np.log(1e8), 50.0, 0.99])
    x0 = np.clip([np.log(v[order][below[0]] if below.size else v.max()), 2.0, np.clip(u.min(), 0, 0.5)],
                 lower + 1e-9, upper - 1e-9)
    ref = optimize.least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    assert ref.status > 0
    ours = float(np.sum(residuals([np.log(fit.v50), fit.p, fit.c]) ** 2))
    assert ours <= float(ref.fun @ ref.fun) * (1 + 1e-9) + 1e-300


def test_a_fit_that_does_not_converge_raises():
    v, u = _law_points(1.0, 2.0, 0.1)
    x0 = np.array([np.log(50.0), 8.0, 0.5])
    lower, upper = np.array([np.log(1e-8), 0.05, 0.0]), np.array([np.log(1e8), 50.0, 0.99])
    with pytest.raises(FitError, match=r"did not converge in 2 steps"):
        bounded_least_squares(np.log(v), u, x0, lower=lower, upper=upper, max_iterations=2)
    x, res = bounded_least_squares(np.log(v), u, x0, lower=lower, upper=upper)
    np.testing.assert_allclose(x, [0.0, 2.0, 0.1], atol=1e-6)
    assert np.max(np.abs(res)) < 1e-9


@pytest.mark.parametrize("v50, p, c, match", [
    (0.0, 2.0, 0.1, r"v50 must be a finite number > 0, got 0.0"),
    (-1.0, 2.0, 0.1, r"v50 must be a finite number > 0, got -1.0"),
    (np.inf, 2.0, 0.1, r"v50 must be a finite number > 0, got inf"),
    (1.0, 0.0, 0.1, r"p must be a finite number > 0, got 0.0"),
    (1.0, np.nan, 0.1, r"p must be a finite number > 0, got nan"),
    (1.0, 2.0, 1.0, r"c must be a finite number in \[0, 1\), got 1.0"),
    (1.0, 2.0, -0.1, r"c must be a finite number in \[0, 1\), got -0.1"),
    (1.0, 2.0, "0.1", r"c must be a finite number in \[0, 1\), got '0.1'"),
])
def test_inverse_rejects_parameters_outside_the_law(v50, p, c, match):
    with pytest.raises(ValueError, match=match):
        invert_logistic(0.5, v50=v50, p=p, c=c)
    with pytest.raises(ValueError, match=match):
        invert_logistic(0.5, v50=v50, p=p, c=c, saturate=True)
