"""Top-two margins, the margin scale S, and the normalized axes v and A~."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import trim_mean

from caliber_core.calibration import margins as M
from caliber_core.calibration.survival import agreement_probability
from caliber_core.calibration.sweep import survival_intervals

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DIGITS_FILES = sorted(DATA_DIR.glob("digits_*.npz"))


def _digits(path):
    with np.load(path, allow_pickle=False) as d:
        return d["logits"], d["labels"]


# --------------------------------------------------------------------------- margins


def test_top_two_margins_by_hand():
    z = np.array([[3.0, 1.0, 2.5], [0.0, -1.0, -4.0], [2.0, 2.0, 1.0], [-1.0, 5.0, -2.0]])
    np.testing.assert_array_equal(M.top_two_margins(z), [0.5, 1.0, 0.0, 6.0])


def test_top_two_margins_two_classes_is_absolute_difference():
    z = np.array([[1.0, 4.0], [4.0, 1.0], [2.5, 2.5]])
    np.testing.assert_array_equal(M.top_two_margins(z), [3.0, 3.0, 0.0])


@pytest.mark.parametrize("shape", [(1, 2), (40_000, 3), (300, 1_000), (3, 70_000)])
def test_margins_match_a_full_sort_across_blocks_ties_and_wide_rows(shape):
    """Many blocks of rows, one row a block (K over the block's size), and rows with tied maxima."""
    rng = np.random.default_rng(sum(shape))
    z = rng.standard_normal(shape)
    z[::3] = np.round(z[::3])  # ties, tied maxima among them
    s = np.sort(z, axis=1)
    np.testing.assert_array_equal(M.top_two_margins(z), s[:, -1] - s[:, -2])


def test_margins_of_rows_with_infinities_and_nan_follow_the_arithmetic():
    inf, nan = np.inf, np.nan
    z = np.array([[inf, 1.0, 2.0], [inf, inf, 0.0], [-inf, -inf, 3.0], [nan, 1.0, 2.0], [2.0, 2.0, 1.0]])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(M.top_two_margins(z), [inf, nan, inf, nan, 0.0])


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_margins_on_digits_match_a_full_sort(path):
    z, _ = _digits(path)
    s = np.sort(z.astype(np.float64), axis=1)
    np.testing.assert_array_equal(M.top_two_margins(z), s[:, -1] - s[:, -2])


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.arange(5.0), r"2-D .*got shape \(5,\)"),
        (np.zeros((2, 3, 4)), r"2-D .*got shape \(2, 3, 4\)"),
        (np.ones((4, 1)), r"at least 2 classes, got n_classes=1"),
        (np.ones((0, 3)), r"no rows"),
        (np.array([["a", "b"], ["c", "d"]]), r"real numbers, got dtype <U1"),
        (np.array([[1 + 1j, 0], [0, 1]]), r"real numbers, got dtype complex"),
        (np.array([[True, False]]), r"real numbers, got dtype bool"),
    ],
)
def test_invalid_logits_raise_with_the_rule_and_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        M.top_two_margins(bad)
    with pytest.raises(ValueError, match=match):
        M.margin_scale(bad)


# --------------------------------------------------------------------------- the scale S


MARGINS = np.array([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 1000.0])


@pytest.mark.parametrize(
    "statistic, expected",
    [
        ("median", 3.2),
        ("mean", float(np.mean(MARGINS))),
        # 10% of 11 rounds down to 1 cut from each end: mean of the middle 9.
        ("trimmed", float(np.mean(MARGINS[1:-1]))),
    ],
)
def test_scale_statistics_by_hand(statistic, expected):
    rng = np.random.default_rng(0)
    m = rng.permutation(MARGINS)
    assert M.scale_from_margins(m, statistic=statistic) == pytest.approx(expected, rel=1e-15)


def test_median_is_the_default_statistic():
    assert M.scale_from_margins(MARGINS) == 3.2
    z = np.stack([np.zeros_like(MARGINS), MARGINS], axis=1)
    assert M.margin_scale(z) == 3.2


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 200),
        elements=st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False),
    )
)
def test_trimmed_scale_is_scipy_trim_mean(m):
    expected = float(trim_mean(m, 0.10))
    assert M.scale_from_margins(m, statistic="trimmed") == pytest.approx(expected, rel=1e-12)
    assert M.scale_from_margins(m, statistic="median") == pytest.approx(float(np.median(m)), rel=1e-15)
    assert M.scale_from_margins(m, statistic="mean") == pytest.approx(float(np.mean(m)), rel=1e-12)


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_all_scales_on_digits(path):
    z, _ = _digits(path)
    m = M.top_two_margins(z)
    scales = M.all_scales(z)
    assert set(scales) == set(M.MARGIN_STATISTICS) == {"median", "mean", "trimmed"}
    assert scales["median"] == pytest.approx(np.median(m), rel=1e-15)
    assert scales["mean"] == pytest.approx(np.mean(m), rel=1e-12)
    assert scales["trimmed"] == pytest.approx(trim_mean(m, 0.1), rel=1e-12)
    for stat, s in scales.items():
        assert s == M.margin_scale(z, statistic=stat)


def test_unknown_statistic_is_rejected():
    with pytest.raises(ValueError, match=r"statistic must be one of .*'mode'"):
        M.margin_scale(np.eye(3), statistic="mode")


def test_all_tied_rows_give_a_zero_scale_error():
    z = np.ones((6, 4))
    with pytest.raises(ValueError, match=r"S=0 \(median\) is not positive: 100% of rows tie"):
        M.margin_scale(z)
    with pytest.raises(ValueError, match=r"S=0 \(mean\) is not positive"):
        M.margin_scale(z, statistic="mean")


def test_mostly_tied_rows_zero_median_but_positive_mean():
    # 4 of 6 rows tie: the median is 0 (error) while the mean is not.
    z = np.array([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [5.0, 5.0], [0.0, 3.0], [6.0, 0.0]])
    with pytest.raises(ValueError, match=r"67% of rows tie"):
        M.margin_scale(z)
    assert M.margin_scale(z, statistic="mean") == pytest.approx(1.5)
    scales = M.all_scales(z)
    assert np.isnan(scales["median"]) and scales["mean"] == pytest.approx(1.5)


# --------------------------------------------------------------------------- A0 and chance


def test_clean_accuracy_by_hand_and_ties_go_to_the_lowest_index():
    z = np.array([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    # argmax: 1, 0 (tie), 0 (tie), 2
    assert M.clean_accuracy(z, [1, 0, 0, 2]) == 1.0
    assert M.clean_accuracy(z, [1, 1, 2, 2]) == 0.5
    assert M.clean_accuracy(z, [0, 2, 1, 0]) == 0.0


@pytest.mark.parametrize("path", DIGITS_FILES, ids=lambda p: p.stem)
def test_clean_accuracy_on_digits(path):
    z, y = _digits(path)
    a0 = M.clean_accuracy(z, y)
    assert a0 == np.count_nonzero(np.argmax(z, axis=1) == y) / y.size
    assert 0.1 < a0 <= 1.0


def test_clean_accuracy_rejects_mismatched_labels():
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: logits 3, labels \(2,\)"):
        M.clean_accuracy(np.eye(3), [0, 1])
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples"):
        M.clean_accuracy(np.eye(3), [[0, 1, 2]])


@pytest.mark.parametrize("k", [2, 3, 10, 1000])
def test_chance_level(k):
    assert M.chance_level(k) == 1.0 / k


@pytest.mark.parametrize("k", [1, 0, -3])
def test_chance_level_needs_two_classes(k):
    with pytest.raises(ValueError, match=rf"n_classes must be >= 2, got {k}"):
        M.chance_level(k)


# --------------------------------------------------------------------------- v and A~


def test_normalized_noise_and_inverse_by_hand():
    assert M.normalized_noise(3.0, 2.0) == 2.25
    np.testing.assert_array_equal(M.normalized_noise([0.0, 1.0, 4.0], 2.0), [0.0, 0.25, 4.0])
    assert M.sigma_from_v(2.25, 2.0) == 3.0
    np.testing.assert_array_equal(M.sigma_from_v([0.0, 0.25, 4.0], 2.0), [0.0, 1.0, 4.0])


@settings(max_examples=100, deadline=None)
@given(
    # sigma^2 must not underflow: sigma = 0 exactly, or >= 1e-100.
    sigma=st.just(0.0) | st.floats(1e-100, 1e4),
    scale=st.floats(1e-4, 1e4),
)
def test_normalized_noise_round_trip(sigma, scale):
    v = M.normalized_noise(sigma, scale)
    assert v >= 0
    assert M.sigma_from_v(v, scale) == pytest.approx(sigma, rel=1e-12)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_normalized_noise_needs_a_positive_scale(scale):
    with pytest.raises(ValueError, match=r"scale S must be positive"):
        M.normalized_noise(1.0, scale)
    with pytest.raises(ValueError, match=r"scale S must be positive"):
        M.sigma_from_v(1.0, scale)


def test_negative_noise_is_rejected():
    with pytest.raises(ValueError, match=r"v"), np.errstate(invalid="ignore"):
        M.sigma_from_v(-1.0, 1.0)
    with pytest.raises(ValueError, match=r"sigma"):
        M.normalized_noise(-2.0, 1.0)


def test_normalized_utility_by_hand():
    # K = 10: chance 0.1; A0 = 0.9 -> range 0.8.
    np.testing.assert_allclose(
        M.normalized_utility([0.9, 0.5, 0.1, 0.05], clean=0.9, n_classes=10),
        [1.0, 0.5, 0.0, -0.0625],
        rtol=1e-15,
    )
    assert M.accuracy_from_normalized(0.5, clean=0.9, n_classes=10) == pytest.approx(0.5, rel=1e-15)


@settings(max_examples=100, deadline=None)
@given(
    k=st.integers(2, 1000),
    data=st.data(),
)
def test_normalized_utility_round_trip(k, data):
    chance = 1.0 / k
    clean = data.draw(st.floats(chance + 1e-3, 1.0))
    acc = data.draw(st.floats(0.0, 1.0))
    u = M.normalized_utility(acc, clean=clean, n_classes=k)
    assert M.accuracy_from_normalized(u, clean=clean, n_classes=k) == pytest.approx(acc, rel=1e-9, abs=1e-12)
    # The endpoints map to 0 and 1.
    assert M.normalized_utility(chance, clean=clean, n_classes=k) == 0.0
    assert M.normalized_utility(clean, clean=clean, n_classes=k) == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize("clean", [0.1, 0.05, 0.0])
def test_normalized_utility_needs_a_model_above_chance(clean):
    with pytest.raises(ValueError, match=r"A0=.* is not above chance 1/K=0.1"):
        M.normalized_utility(0.5, clean=clean, n_classes=10)


# --------------------------------------------------------------------------- shift invariance


# Dyadic logits (multiples of 1/64, |z| <= 64) and integer shifts are exact in
# float64, so z + c and z give bitwise-identical gaps: the invariance is exact.
dyadic_logits = st.integers(2, 12).flatmap(
    lambda k: hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 12), st.just(k)),
        elements=st.integers(-64 * 64, 64 * 64).map(lambda i: i / 64.0),
    )
)


@settings(max_examples=40, deadline=None)
@given(z=dyadic_logits, data=st.data())
def test_shift_invariance_of_margins_scale_and_agreement(z, data):
    n = z.shape[0]
    shifts = np.array(data.draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)), dtype=np.float64)
    shifted = z + shifts[:, None]
    np.testing.assert_array_equal(M.top_two_margins(shifted), M.top_two_margins(z))
    for stat in M.MARGIN_STATISTICS:
        a, b = M.all_scales(z)[stat], M.all_scales(shifted)[stat]
        assert a == b or (np.isnan(a) and np.isnan(b))
    # Exact agreement (Proposition 1) and the Monte-Carlo agreement with one seed.
    sigma = data.draw(st.sampled_from([0.05, 0.5, 3.0]))
    np.testing.assert_array_equal(agreement_probability(shifted, sigma), agreement_probability(z, sigma))
    a = survival_intervals(z, realizations=4, seed=1)
    b = survival_intervals(shifted, realizations=4, seed=1)
    np.testing.assert_array_equal(a.agree_hi, b.agree_hi)


@settings(max_examples=40, deadline=None)
@given(
    z=hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(2, 8)),
                 elements=st.floats(-50, 50, allow_nan=False)),
    c=st.floats(-1e3, 1e3, allow_nan=False),
)
def test_shift_invariance_for_general_floats_up_to_rounding(z, c):
    # With arbitrary floats z + c rounds: margins agree to that rounding (|c| + |z|) * eps.
    got = M.top_two_margins(z + c)
    np.testing.assert_allclose(got, M.top_two_margins(z), rtol=0, atol=4 * (abs(c) + 50) * 2.3e-16)
