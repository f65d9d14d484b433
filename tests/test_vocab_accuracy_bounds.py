"""Windowed accuracy bounds of a labelled reduction: within their stated slack of the all-node bounds, around the truth."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.calibration.accuracy_bounds import WINDOW_MASS, accuracy_row_bounds
from caliber_core.calibration.gap_histogram import LABEL_BINNED, ReducedRows, reduce_block, row_bounds


def labelled_rows(n, k, seed):
    """Standard-normal logits with the label's raised by 2.5, a tie at the top and a label among the kept gaps."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k), dtype=np.float32)
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += 2.5
    z[1, y[1]] = z[1].max()
    z[2, y[2]] = np.sort(z[2])[-6]
    g, c, h, slots = reduce_block(z, labels=y)
    return z, y, ReducedRows(g, c, k, h, slots)


@pytest.mark.parametrize("sigma", [0.02, 0.15, 0.3, 0.6, 1.5, 4.0])
def test_windowed_bounds_bracket_the_all_node_bounds_within_the_window_mass(sigma):
    _, _, red = labelled_rows(300, 2000, seed=2)
    assert red.label_slots[2] >= 0 and (red.label_slots == LABEL_BINNED).any()
    full = row_bounds(red, sigma, agreement=False)
    fast = accuracy_row_bounds(red, sigma)
    # The window drops non-negative terms (lower bound) and adds their ceiling back (upper bound); both
    # paths sum the tail bins' logs as float32 products (relative rounding ~1e-7), hence rtol.
    rtol = 1e-6
    assert np.all(fast.acc_lo <= full.acc_lo * (1 + rtol) + 1e-15)
    assert np.all(full.acc_lo - fast.acc_lo <= WINDOW_MASS + rtol * full.acc_lo)
    assert np.all(full.acc_hi <= fast.acc_hi * (1 + rtol) + 1e-15)
    assert np.all(fast.acc_hi - full.acc_hi <= WINDOW_MASS + rtol * full.acc_hi)
    correct = red.correct
    np.testing.assert_array_equal(fast.agree_lo[correct], fast.acc_lo[correct])
    assert np.isnan(fast.agree_lo[~correct]).all()


def test_windowed_bounds_contain_the_exact_accuracy_of_every_row():
    from caliber_core.calibration.survival import sorted_gaps, survival_probability

    z, y, red = labelled_rows(60, 3000, seed=9)
    full = z.astype(np.float64)
    for sigma in (0.05, 0.3, 1.2):
        b = accuracy_row_bounds(red, sigma)
        exact = survival_probability(sorted_gaps(full, y), sigma)
        assert np.all(b.acc_lo <= exact + 1e-9) and np.all(exact <= b.acc_hi + 1e-9), sigma


def test_sigma_zero_and_missing_labels():
    _, _, red = labelled_rows(20, 500, seed=1)
    b = accuracy_row_bounds(red, 0.0)
    np.testing.assert_array_equal(b.acc_lo, red.correct.astype(float))
    with pytest.raises(ValueError, match="need labels"):
        accuracy_row_bounds(ReducedRows(red.top_gaps, red.counts, red.n_classes), 0.3)
