"""The sweep's Monte-Carlo standard errors against the spread between seeds.

For K >= 64 the draws are read from a pool of normal rows that several inputs
share, so draws are not independent; the standard error treats each pool row
as one block. Here the reported error is compared with the standard deviation
of the estimate over independent seeds, on the same logits.

With 20 seeds the sample standard deviation is within 0.68-1.32 of the true
one with probability 0.95 (chi-square with 19 degrees of freedom), so an
honest standard error lands inside the 0.7-1.5 window; every seed is fixed,
so the outcome is reproducible.
"""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.calibration import draws as draws_mod
from caliber_core.calibration import sweep as sweep_mod
from caliber_core.calibration.margins import margin_scale
from caliber_core.calibration.sweep import block_stderr, default_realizations, survival_intervals
from caliber_core.simulation.synthetic import make_synthetic_logits

SEEDS = 20
WINDOW = (0.7, 1.5)


def _spread_and_errors(z, y, sigma, realizations, seeds):
    acc, agr, acc_se, agr_se, naive, reuse = [], [], [], [], [], []
    for seed in seeds:
        iv = survival_intervals(z, y, realizations=realizations, seed=seed)
        acc.append(iv.accuracy(sigma))
        agr.append(iv.agreement(sigma))
        acc_se.append(iv.accuracy_stderr(sigma))
        agr_se.append(iv.agreement_stderr(sigma))
        # What the error would be if the pool rows' sharing were ignored.
        naive.append([block_stderr(s < iv.agree_hi, None) for s in sigma])
        assert iv.pool_rows is not None and iv.pool_rows.shape == (z.shape[0], iv.realizations // 2)
        reuse.append(np.bincount(iv.pool_rows.ravel()).mean())
    return (np.std(acc, axis=0, ddof=1), np.std(agr, axis=0, ddof=1), np.mean(acc_se, axis=0),
            np.mean(agr_se, axis=0), np.mean(naive, axis=0), min(reuse))


def test_reported_error_matches_the_spread_over_seeds_at_2000_by_1000():
    z, y = make_synthetic_logits(2000, 1000, clean_accuracy=0.75, seed=0)
    r = default_realizations(2000, 1000)
    sigma = margin_scale(z) * np.sqrt([0.1, 0.3, 0.7])  # head, middle and tail of the transition
    sd_acc, sd_agr, se_acc, se_agr, _, reuse = _spread_and_errors(z, y, sigma, r, range(SEEDS))
    # The file's default draws use each pool row about the most the sweep allows.
    assert reuse >= 0.9 * draws_mod.POOL_MAX_REUSE
    for name, ratio in (("accuracy", se_acc / sd_acc), ("agreement", se_agr / sd_agr)):
        assert np.all((ratio > WINDOW[0]) & (ratio < WINDOW[1])), (name, ratio)


def test_heavy_pool_reuse_is_in_the_error(monkeypatch):
    # 17 pool rows for 500 x 16 vectors: draws share rows about 470 times over. Ignoring that
    # underestimates the error several times over; blocks of pool rows do not.
    monkeypatch.setattr(draws_mod, "POOL_ELEMENTS", 16 * 1000)
    monkeypatch.setattr(draws_mod, "POOL_MAX_REUSE", 10**9)
    z, y = make_synthetic_logits(500, 1000, clean_accuracy=0.75, seed=0)
    sigma = margin_scale(z) * np.sqrt([0.3, 0.7])
    _, sd_agr, _, se_agr, naive, reuse = _spread_and_errors(z, y, sigma, 32, range(30))
    assert reuse > 400  # 16 x 500 vectors on the 17 rows of a prime-sized pool
    ratio = se_agr / sd_agr
    assert np.all((ratio > WINDOW[0]) & (ratio < WINDOW[1])), ratio
    assert np.all(naive / sd_agr < 0.7), naive / sd_agr  # the independent-draws error is too small


def test_block_error_without_a_pool_is_the_paired_error():
    rng = np.random.default_rng(3)
    inside = rng.random((50, 8)) < 0.4
    half = 4
    pair = 0.5 * (inside[:, :half].astype(float) + inside[:, half:])
    var = np.mean(pair**2, axis=1) - pair.mean(axis=1) ** 2
    paired = np.sqrt(np.sum(var) / half) / 50
    assert block_stderr(inside) == pytest.approx(paired * np.sqrt(half / (half - 1)), rel=1e-12)
    # Every pair on its own pool row is the same estimate as no pool.
    own_rows = np.arange(50 * half).reshape(50, half)
    assert block_stderr(inside, own_rows) == pytest.approx(block_stderr(inside), rel=1e-12)
    # All pairs on one row: one block, whose residuals sum to zero per input.
    assert block_stderr(inside, np.zeros((50, half), dtype=int)) == pytest.approx(0.0, abs=1e-15)


def test_the_same_numbers_on_any_number_of_threads(monkeypatch):
    from caliber_core.calibration import sweep as sweep_mod

    z, y = make_synthetic_logits(300, 200, seed=4)
    runs = []
    for threads in (1, 3):
        monkeypatch.setattr(sweep_mod, "_workers", lambda n_chunks, t=threads: t)
        monkeypatch.setattr(draws_mod, "available_cores", lambda t=threads: t)
        seen = []
        runs.append(survival_intervals(z, y, realizations=24, seed=9, progress=seen.append))
        assert seen[-1] == 1.0 and np.all(np.diff(seen) > 0)
    for name in ("agree_hi", "acc_lo", "acc_hi", "pool_rows"):
        np.testing.assert_array_equal(getattr(runs[0], name), getattr(runs[1], name), err_msg=name)


def test_block_error_of_an_indicator_is_the_float64_computation_bit_for_bit():
    # Counted in integers for speed; a stored calibration's errors must not move by a bit.
    rng = np.random.default_rng(11)
    for trial in range(60):
        n, half = int(rng.integers(1, 2500)), int(rng.integers(1, 40))
        inside = rng.random((n, 2 * half)) < rng.uniform(0, 1)
        pool = None if trial % 2 else rng.integers(0, 3 * n + 1, size=(n, half)).astype(np.int32)
        assert block_stderr(inside, pool) == _float64_block_stderr(inside, pool)


def _float64_block_stderr(inside, pool_rows):
    """block_stderr as first written: pair sums and row means of float64 copies, in the same blocks."""
    n, r = inside.shape
    half, total = r // 2, 0.0
    rows = max(1, sweep_mod._CHUNK_ELEMENTS // max(1, half))
    per_row = None if pool_rows is None else np.zeros(int(pool_rows.max()) + 1 if pool_rows.size else 0)
    for start in range(0, n, rows):
        block = inside[start:start + rows]
        pair = block[:, :half].astype(np.float64) + block[:, half:]
        resid = pair - pair.mean(axis=1, keepdims=True)
        if pool_rows is None:
            total += float(np.sum(resid**2))
        else:
            per_row += np.bincount(pool_rows[start:start + rows].ravel(), weights=resid.ravel(),
                                   minlength=per_row.size)
    if per_row is not None:
        total = float(np.dot(per_row, per_row))
    correction = half / (half - 1) if half > 1 else 1.0
    return float(np.sqrt(total * correction) / (n * 2 * half))
