"""The one-pass interval sweep against a straightforward Monte Carlo and the exact curves.

Statistical comparisons use 4 standard errors (a correct implementation fails one
with probability 6e-5); seeds are fixed, so outcomes are reproducible. The sweep's
standard error is its own ``accuracy_stderr`` / ``agreement_stderr`` (noise only,
inputs fixed); the brute-force Monte Carlo with R_b draws has the same per-input
variances, so its standard error is the sweep's times sqrt(R / R_b).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration import draws as draws_mod
from caliber_core.calibration.margins import clean_accuracy, margin_scale, normalized_utility
from caliber_core.calibration.engine import CurveEngine
from caliber_core.calibration.draws import POOL_MIN_CLASSES
from caliber_core.calibration.sweep import (
    default_realizations,
    default_v_grid,
    survival_intervals,
    sweep_from_intervals,
)
from caliber_core.simulation.reference import argmax_monte_carlo
from caliber_core.simulation.synthetic import make_synthetic_logits

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DIGITS_FILES = sorted(DATA_DIR.glob("digits_*.npz"))
N_SE = 4.0
V_POINTS = np.array([0.1, 0.5, 1.0, 2.0, 5.0])


def sweep_noise(logits, labels=None, *, scale, v_grid=None, realizations, seed):
    """Intervals, then the sweep on a v grid: what calibrate_model does before its fit."""
    intervals = survival_intervals(logits, labels, realizations=realizations, seed=seed)
    a0 = clean_accuracy(logits, labels) if labels is not None else None
    return sweep_from_intervals(intervals, scale=scale, clean_accuracy=a0, v_grid=v_grid)


def _digits(path):
    with np.load(path, allow_pickle=False) as d:
        return d["logits"], d["labels"]


def _shape(name):
    """(logits, labels) for a named test shape."""
    if name.startswith("digits"):
        return _digits(DATA_DIR / f"{name}.npz")
    n, k = {"synthetic-K20": (400, 20), "synthetic-K100": (400, 100), "synthetic-K1000": (200, 1000)}[name]
    return make_synthetic_logits(n, k, clean_accuracy=0.75, seed=k)


SHAPES = ["digits_cnn", "digits_mlp-narrow", "digits_logreg-pool", "synthetic-K20", "synthetic-K100",
          "synthetic-K1000"]


# --------------------------------------------------------------------------- vs brute force


@pytest.mark.parametrize("name", SHAPES)
def test_sweep_matches_brute_force_monte_carlo(name):
    z, y = _shape(name)
    k = z.shape[1]
    s = margin_scale(z)
    r, r_brute = 32, 32
    sw = sweep_noise(z, y, scale=s, v_grid=V_POINTS, realizations=r, seed=11)
    if k >= POOL_MIN_CLASSES:
        assert name.endswith(("K100", "K1000"))  # these exercise the pooled draws
    acc, agr = argmax_monte_carlo(z, y, sw.sigma, realizations=r_brute, seed=12345)
    se_acc = sw.accuracy_se * np.sqrt(1 + r / r_brute)
    se_agr = sw.agreement_se * np.sqrt(1 + r / r_brute)
    assert np.all(se_acc > 0) and np.all(se_agr > 0)
    assert np.all(np.abs(sw.accuracy - acc) <= N_SE * se_acc), (sw.accuracy, acc, se_acc)
    assert np.all(np.abs(sw.agreement - agr) <= N_SE * se_agr), (sw.agreement, agr, se_agr)


@pytest.mark.parametrize("name", SHAPES)
def test_sweep_matches_the_exact_quadrature_curves(name):
    z, y = _shape(name)
    s = margin_scale(z)
    iv = survival_intervals(z, y, realizations=32, seed=3)
    sigma = s * np.sqrt(V_POINTS)
    exact = CurveEngine(z, y, method="exact")
    assert np.all(np.abs(iv.agreement(sigma) - exact.agreement(sigma)) <= N_SE * iv.agreement_stderr(sigma))
    assert np.all(np.abs(iv.accuracy(sigma) - exact.accuracy(sigma)) <= N_SE * iv.accuracy_stderr(sigma))


# --------------------------------------------------------------------------- pooled draws


def _seed_spread(z, y, sigma, *, realizations, seeds=20):
    acc, se, agr, se_agr = [], [], [], []
    for seed in range(seeds):
        iv = survival_intervals(z, y, realizations=realizations, seed=seed)
        acc.append(iv.accuracy(sigma))
        se.append(iv.accuracy_stderr(sigma))
        agr.append(iv.agreement(sigma))
        se_agr.append(iv.agreement_stderr(sigma))
    acc_ratio = np.std(acc, axis=0, ddof=1) / np.mean(se, axis=0)
    agr_ratio = np.std(agr, axis=0, ddof=1) / np.mean(se_agr, axis=0)
    return acc_ratio, agr_ratio


# Bounds on std(20 seeds) / nominal stderr. With 19 degrees of freedom the ratio of
# a correct estimator exceeds 1.5 with probability ~0.0015 and falls under 0.5 with
# probability ~3e-4 (chi-square); an inflated error shows as a ratio well above 1.
RATIO_LO, RATIO_HI = 0.5, 1.5


def test_pooled_draws_do_not_inflate_the_error_at_the_largest_reuse(monkeypatch):
    # A large file's sweep reads each pool row up to POOL_MAX_REUSE times (the
    # pool grows with N up to POOL_MAX_ELEMENTS). The same reuse at a test-sized
    # N: shrink the pool floor so that the reuse bound sets the pool's size.
    n, k, r = 400, 1000, 40
    reuse = draws_mod.POOL_MAX_REUSE
    assert reuse == 16
    drawn = n * r // 2  # antithetic pairs: half the draws are generated
    monkeypatch.setattr(draws_mod, "POOL_ELEMENTS", (drawn // reuse) * k)
    z, y = make_synthetic_logits(n, k, seed=5)
    sigma = margin_scale(z) * np.sqrt([0.3, 1.0, 3.0])
    acc_ratio, agr_ratio = _seed_spread(z, y, sigma, realizations=r)
    assert np.all((RATIO_LO < acc_ratio) & (acc_ratio < RATIO_HI)), acc_ratio
    assert np.all((RATIO_LO < agr_ratio) & (agr_ratio < RATIO_HI)), agr_ratio


def test_pooled_draws_match_their_stderr_with_the_default_pool():
    # The unpatched 8e6-element pool at K = 100 (N R = 12,800 draws from 80,000 rows).
    z, y = make_synthetic_logits(400, 100, seed=6)
    sigma = margin_scale(z) * np.sqrt([0.3, 1.0, 3.0])
    acc_ratio, agr_ratio = _seed_spread(z, y, sigma, realizations=32)
    assert np.all((RATIO_LO < acc_ratio) & (acc_ratio < RATIO_HI)), acc_ratio
    assert np.all((RATIO_LO < agr_ratio) & (agr_ratio < RATIO_HI)), agr_ratio


def test_direct_draws_match_their_stderr():
    # The same check on the non-pooled path (K = 10), as a control.
    z, y = _digits(DIGITS_FILES[0])
    sigma = margin_scale(z) * np.sqrt([0.3, 1.0, 3.0])
    acc_ratio, agr_ratio = _seed_spread(z, y, sigma, realizations=16)
    assert np.all((RATIO_LO < acc_ratio) & (acc_ratio < RATIO_HI)), acc_ratio
    assert np.all((RATIO_LO < agr_ratio) & (agr_ratio < RATIO_HI)), agr_ratio


# --------------------------------------------------------------------------- the interval logic


@pytest.mark.parametrize("k", [2, 3, 10, 100])
def test_intervals_reproduce_the_noisy_argmax_draw_by_draw(k):
    # The interval rule with known draws: for every sigma, "lo < sigma < hi" must
    # be exactly "argmax(z + sigma xi) is the reference class" (away from the
    # endpoints, which are rounded in float32), for the draws and their
    # antithetic twins -xi alike.
    rng = np.random.default_rng(k)
    n, half = 50, 10
    z = rng.normal(0, 2, (n, k))
    labels = rng.integers(0, k, n)
    drawn = rng.standard_normal((n, half, k)).astype(np.float32)
    xi = np.concatenate([drawn, -drawn], axis=1)  # the order survival_bounds returns them in
    r = 2 * half
    pred = np.argmax(z, axis=1)
    hi = draws_mod.survival_bounds(drawn, z, pred)[1]
    wrong = np.nonzero(pred != labels)[0]
    lo_w, hi_w = draws_mod.survival_bounds(drawn[wrong], z[wrong], labels[wrong])
    acc_lo, acc_hi = np.zeros((n, r)), hi.copy()
    acc_lo[wrong], acc_hi[wrong] = lo_w, hi_w
    checked = 0
    for sigma in np.geomspace(1e-2, 1e2, 30):
        noisy = np.argmax(z[:, None, :] + sigma * xi.astype(np.float64), axis=2)
        agree = noisy == pred[:, None]
        correct = noisy == labels[:, None]
        clear = np.abs(hi - sigma) > 1e-4 * sigma
        np.testing.assert_array_equal((sigma < hi)[clear], agree[clear])
        clear_acc = (np.abs(acc_hi - sigma) > 1e-4 * sigma) & (np.abs(acc_lo - sigma) > 1e-4 * sigma)
        np.testing.assert_array_equal(((acc_lo < sigma) & (sigma < acc_hi))[clear_acc], correct[clear_acc])
        checked += int(np.sum(clear_acc))
    assert checked > 0.99 * 30 * n * r


def test_label_tied_with_the_prediction():
    # Ties are common in low-precision logits (fp16 / bf16 LLM outputs).
    z = np.tile([1.0, 1.0, 0.0], (200, 1))
    y = np.ones(200, dtype=np.int64)
    iv = survival_intervals(z, y, realizations=200, seed=0)
    sigma = np.array([0.1, 0.5, 1.0, 3.0])
    exact = CurveEngine(z, y, method="exact").accuracy(sigma)
    np.testing.assert_allclose(exact[0], 0.5, atol=1e-3)
    assert np.all(np.abs(iv.accuracy(sigma) - exact) <= N_SE * iv.accuracy_stderr(sigma) + 1e-12)


def test_ties_with_the_clean_prediction_in_agreement():
    # The agreement side handles ties: [1, 1, 0] keeps class 0 with probability ~1/2.
    z = np.tile([1.0, 1.0, 0.0], (200, 1))
    iv = survival_intervals(z, realizations=200, seed=0)
    sigma = np.array([0.1, 0.5, 1.0, 3.0])
    exact = CurveEngine(z, method="exact").agreement(sigma)
    # At small sigma each antithetic pair splits the tie exactly (one of xi, -xi
    # keeps class 0): the estimate is exactly 1/2 with a zero stderr.
    assert np.all(np.abs(iv.agreement(sigma) - exact) <= N_SE * iv.agreement_stderr(sigma) + 1e-12)


@pytest.mark.parametrize("name", ["digits_mlp-brief", "synthetic-K100"])
def test_interval_invariants(name):
    z, y = _shape(name)
    iv = survival_intervals(z, y, realizations=16, seed=0)
    correct = np.argmax(z, axis=1) == y
    assert iv.n_samples == z.shape[0] and iv.realizations == 16 and iv.n_classes == z.shape[1]
    assert np.all(iv.agree_hi > 0)
    # A correct row is right exactly while it agrees.
    np.testing.assert_array_equal(iv.acc_hi[correct], iv.agree_hi[correct])
    assert np.all(iv.acc_lo[correct] == 0)
    # A wrong row is right on (lo, hi) with lo > 0 (never at sigma = 0), or never (0, 0).
    lo, hi = iv.acc_lo[~correct], iv.acc_hi[~correct]
    assert np.all(lo <= hi)
    assert np.all((lo > 0) | (hi == 0))
    # Curves as sigma -> 0: agreement 1, accuracy A0 (sigma = 0 itself: see below).
    tiny = 1e-9 * margin_scale(z)
    assert iv.agreement([0.0, tiny]).tolist() == [1.0, 1.0]
    assert iv.accuracy(tiny)[0] == pytest.approx(clean_accuracy(z, y), abs=1e-15)


def test_accuracy_at_zero_noise_is_the_clean_accuracy():
    z, y = _digits(DATA_DIR / "digits_mlp-brief.npz")
    a0 = clean_accuracy(z, y)
    iv = survival_intervals(z, y, realizations=16, seed=0)
    assert iv.accuracy(0.0)[0] == pytest.approx(a0, abs=1e-15)
    sw = sweep_noise(z, y, scale=margin_scale(z), v_grid=[0.0, 1.0], realizations=16, seed=0)
    assert sw.accuracy[0] == pytest.approx(a0, abs=1e-15)
    assert sw.utility[0] == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("name", ["digits_cnn", "synthetic-K100"])
def test_same_seed_same_numbers_different_seed_different(name):
    z, y = _shape(name)
    s = margin_scale(z)
    a = sweep_noise(z, y, scale=s, realizations=8, seed=42)
    b = sweep_noise(z, y, scale=s, realizations=8, seed=42)
    c = sweep_noise(z, y, scale=s, realizations=8, seed=43)
    for field in ("sigma", "v", "accuracy", "accuracy_se", "agreement", "agreement_se", "utility"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.seed == 42 and c.seed == 43
    ia = survival_intervals(z, y, realizations=8, seed=42)
    ib = survival_intervals(z, y, realizations=8, seed=42)
    ic = survival_intervals(z, y, realizations=8, seed=43)
    np.testing.assert_array_equal(ia.agree_hi, ib.agree_hi)
    np.testing.assert_array_equal(ia.acc_lo, ib.acc_lo)
    np.testing.assert_array_equal(ia.acc_hi, ib.acc_hi)
    assert not np.array_equal(ia.agree_hi, ic.agree_hi)
    # Another seed moves the curve (at a single sigma two seeds can tie by chance).
    assert not np.array_equal(ia.accuracy(a.sigma), ic.accuracy(a.sigma))


# --------------------------------------------------------------------------- NoiseSweep


def test_noise_sweep_fields_are_consistent():
    z, y = _digits(DIGITS_FILES[1])
    s = margin_scale(z)
    a0 = clean_accuracy(z, y)
    sw = sweep_noise(z, y, scale=s, v_grid=V_POINTS, realizations=16, seed=0)
    np.testing.assert_allclose(sw.v, V_POINTS, rtol=1e-15)
    np.testing.assert_allclose(sw.sigma, s * np.sqrt(V_POINTS), rtol=1e-15)
    np.testing.assert_allclose(sw.utility, normalized_utility(sw.accuracy, clean=a0, n_classes=10), rtol=1e-15)
    assert sw.scale == s and sw.clean_accuracy == a0 and sw.n_classes == 10 and sw.realizations == 16
    iv = survival_intervals(z, y, realizations=16, seed=0)
    np.testing.assert_array_equal(sw.accuracy, iv.accuracy(sw.sigma))
    np.testing.assert_array_equal(sw.agreement_se, iv.agreement_stderr(sw.sigma))
    # Without labels: agreement only.
    sw2 = sweep_noise(z, scale=s, v_grid=V_POINTS, realizations=16, seed=0)
    assert sw2.accuracy is None and sw2.utility is None and sw2.clean_accuracy is None
    np.testing.assert_array_equal(sw2.agreement, sw.agreement)


@pytest.mark.parametrize("name", ["digits_cnn", "digits_logreg-raw", "digits_mlp-brief", "digits_mlp-smooth",
                                  "synthetic-K100"])
def test_default_v_grid_covers_the_transition(name):
    z, y = _shape(name)
    s = margin_scale(z)
    sw = sweep_noise(z, y, scale=s, realizations=16, seed=0)
    assert sw.v.size == 40
    assert np.all(np.diff(sw.v) > 0)
    np.testing.assert_allclose(sw.v[1:] / sw.v[:-1], sw.v[1] / sw.v[0], rtol=1e-12)  # log-spaced
    assert sw.utility[0] > 0.97
    assert sw.utility[-1] < 0.05
    # Without labels the grid follows normalized agreement the same way.
    iv = survival_intervals(z, realizations=16, seed=0)
    grid = default_v_grid(iv, scale=s, clean_accuracy=None)
    agr = (iv.agreement(s * np.sqrt(grid)) - 1 / z.shape[1]) / (1 - 1 / z.shape[1])
    assert agr[0] > 0.97 and agr[-1] < 0.05


def test_sweep_from_intervals_uses_the_given_grid():
    z, y = _digits(DIGITS_FILES[2])
    iv = survival_intervals(z, y, realizations=8, seed=0)
    s = margin_scale(z)
    sw = sweep_from_intervals(iv, scale=s, clean_accuracy=clean_accuracy(z, y), v_grid=[0.5, 2.0])
    np.testing.assert_array_equal(sw.v, [0.5, 2.0])
    assert sw.accuracy.shape == (2,) and sw.accuracy[0] > sw.accuracy[1]


def test_progress_is_reported_up_to_one():
    z, y = make_synthetic_logits(3000, 100, seed=0)
    seen = []
    survival_intervals(z, y, realizations=8, seed=0, progress=seen.append)
    assert len(seen) >= 2
    assert np.all(np.diff(seen) > 0) and seen[-1] == 1.0 and seen[0] > 0


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "realizations, exc, match",
    [
        (0, ValueError, r"realizations must be >= 1, got 0"),
        (-3, ValueError, r"realizations must be >= 1, got -3"),
        (2.5, TypeError, r"realizations must be an int, got 2.5"),
        (True, TypeError, r"realizations must be an int, got True"),
        ("8", TypeError, r"realizations must be an int, got '8'"),
    ],
)
def test_realizations_are_validated(realizations, exc, match):
    with pytest.raises(exc, match=match):
        survival_intervals(np.eye(3), realizations=realizations)


def test_numpy_integer_realizations_are_accepted():
    iv = survival_intervals(np.eye(3), realizations=np.int64(4), seed=0)
    assert iv.realizations == 4


@pytest.mark.parametrize(
    "labels, match",
    [
        ([0, 1], r"inconsistent numbers of samples: logits 3, labels \(2,\)"),
        ([0, 1, 3], r"labels must be integers in \[0, 3\), got range \[0, 3\]"),
        ([-1, 1, 2], r"labels must be integers in \[0, 3\), got range \[-1, 2\]"),
        ([0.0, 1.0, 2.0], r"labels must be integers in \[0, 3\)"),
    ],
)
def test_labels_are_validated(labels, match):
    with pytest.raises(ValueError, match=match):
        survival_intervals(np.eye(3), labels, realizations=4)


def test_accuracy_needs_labels():
    iv = survival_intervals(np.eye(3), realizations=4)
    assert not iv.has_labels
    with pytest.raises(ValueError, match=r"accuracy needs labels"):
        iv.accuracy(0.5)


def test_accuracy_stderr_needs_labels():
    iv = survival_intervals(np.eye(3), realizations=4)
    with pytest.raises(ValueError, match=r"accuracy needs labels"):
        iv.accuracy_stderr(0.5)


@pytest.mark.parametrize("n, k, expected", [(2000, None, 87), (50_000, None, 8), (10, None, 256),
                                             (2000, 1000, 87), (20_000, 100, 60), (500, 10, 256)])
def test_default_realizations(n, k, expected):
    assert default_realizations(n, k) == expected


def test_default_realizations_rejects_empty():
    with pytest.raises(ValueError, match=r"n_samples must be >= 1, got 0"):
        default_realizations(0)
