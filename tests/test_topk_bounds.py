"""Certified agreement bounds from top-k logprobs, against full vocabularies kept by the test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_ndtr

from caliber_core.calibration import topk_bounds as tb
from caliber_core.calibration.topk_bounds import (
    TopKRows,
    agreement_bounds,
    mean_agreement_bounds,
    sigma_for_agreement_bound,
    worst_slope_point,
)
from caliber_core.simulation.llm_like import exact_agreement, llm_like_logits, log_softmax

V = 32_000


@pytest.fixture(scope="module")
def full():
    """60 positions of a 32,000-token vocabulary, top-1 confidence from ~0.1 to ~1."""
    return llm_like_logits(60, V, seed=11)


def top_k_rows(logits, k=20):
    lp = log_softmax(logits)
    return TopKRows.from_logprobs(-np.sort(-lp, axis=1)[:, :k], vocab_size=logits.shape[1])


def test_worst_slope_point_is_the_minimizer_of_the_chord_slope():
    for sigma in (0.2, 0.7, 1.5, 4.0):
        y_star = worst_slope_point(sigma)
        ys = np.linspace(y_star - 6, y_star + 6, 20001)
        slope = np.exp(sigma * ys) * log_ndtr(ys)
        assert ys[np.argmin(slope)] == pytest.approx(y_star, abs=1e-3)


def brute_force_min(sigma, u, top, p_k, r, m):
    """min of sum f(p_i) by the lower convex hull of f on a fine grid of [0, p_k] (independent of the proof)."""
    p = np.concatenate([[0.0], np.geomspace(p_k * 1e-9, p_k, 4000)])
    f = np.where(p > 0, log_ndtr((top - np.log(np.maximum(p, 1e-300))) / sigma + u), 0.0)
    x = r / m
    # Convex envelope at x: the lowest chord between grid points bracketing x.
    left, right = p <= x, p >= x
    pl, fl = p[left][:, None], f[left][:, None]
    pr, fr = p[right][None, :], f[right][None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(pr > pl, (x - pl) / (pr - pl), 0.0)
    return m * float(np.min(fl + t * (fr - fl)))


@pytest.mark.parametrize("sigma,u,top,p_k,r,m", [
    (1.0, 0.0, -0.1, 1e-3, 0.05, 31_980),
    (0.5, -1.5, -0.5, 2e-2, 0.3, 31_980),
    (2.0, 1.0, -0.01, 1e-5, 0.004, 127_980),
    (3.0, -2.0, -2.0, 5e-3, 0.6, 31_980),
])
def test_tail_floor_is_the_convex_envelope_minimum(sigma, u, top, p_k, r, m):
    rows = TopKRows(gaps=np.array([[top - np.log(p_k)]]), top_logprob=np.array([top]),
                    tail_mass=np.array([r]), floor_gap=np.array([top - np.log(p_k)]),
                    unseen=np.array([m]), vocab_size=m + 2)
    ours = tb._tail_floor(rows, slice(0, 1), sigma, worst_slope_point(sigma), np.array([u]))[0, 0]
    brute = brute_force_min(sigma, u, top, p_k, r, m)
    assert ours <= brute + 1e-9 * abs(brute)
    assert ours == pytest.approx(brute, rel=2e-3, abs=1e-9)


def test_the_true_agreement_lies_inside_the_bounds_and_they_are_tight_above_0_8(full):
    rows = top_k_rows(full)
    for sigma in (0.1, 0.3, 0.6, 1.0, 1.5, 2.5, 4.0):
        truth = exact_agreement(full, sigma)
        lo, hi = agreement_bounds(rows, sigma)
        assert np.all(lo <= truth + 1e-7) and np.all(truth <= hi + 1e-7), sigma
        if truth.mean() >= 0.8:
            assert hi.mean() - lo.mean() <= 0.01, sigma


def test_the_lower_bound_is_attained_by_the_worst_tail():
    # A row whose unseen mass sits in r / p_k classes at exactly p_k: the lower bound is its truth.
    rng = np.random.default_rng(2)
    shown = np.sort(rng.uniform(-9, 0, 20))[::-1]
    shown[0] = 0.0
    p = np.exp(shown)
    p /= p.sum() / 0.9  # the shown classes hold 0.9
    lp = np.log(p)
    n_worst = int(round(0.1 / p[-1]))
    p_k = 0.1 / n_worst
    assert p_k <= p[-1]
    vocab = 20 + n_worst + 500
    full = np.concatenate([lp, np.full(n_worst, np.log(p_k)), np.full(500, -200.0)])[None, :]
    rows = TopKRows.from_logprobs(lp[None, :], vocab_size=vocab)
    for sigma in (0.5, 1.0, 2.0):
        lo, hi = agreement_bounds(rows, sigma)
        truth = exact_agreement(full, sigma)
        assert lo[0] <= truth[0] + 1e-9
        assert truth[0] - lo[0] < 2e-3 * (1 - truth[0]) + 1e-7


def test_at_least_serves_a_sigma_whose_true_agreement_is_at_least_and_near_the_target(full):
    rows = top_k_rows(full)
    for target in (0.9, 0.8):
        sigma = sigma_for_agreement_bound(rows, target, side="at-least")
        truth = exact_agreement(full, sigma).mean()
        assert target <= truth <= target + 0.01
    sigma = sigma_for_agreement_bound(rows, 0.8, side="at-most")
    assert exact_agreement(full, sigma).mean() <= 0.8 + 1e-9
    lo_s = sigma_for_agreement_bound(rows, 0.8, side="at-least")
    pt_s = sigma_for_agreement_bound(rows, 0.8, side="point")
    assert lo_s <= pt_s <= sigma


def test_ignoring_the_tail_would_overshoot(full):
    # The upper bound (the even-split tail) inverted for at-least would serve too much noise.
    rows = top_k_rows(full)
    sigma = sigma_for_agreement_bound(rows, 0.8, side="at-most")
    lo, _ = mean_agreement_bounds(rows, sigma)
    assert lo[0] < 0.8


def test_bad_rows_and_targets_are_refused():
    with pytest.raises(ValueError, match="at least 2 are needed"):
        TopKRows.from_logprobs([[-0.1, -np.inf]], vocab_size=10)
    with pytest.raises(ValueError, match="positive logprob"):
        TopKRows.from_logprobs([[0.5, -1.0]], vocab_size=10)
    with pytest.raises(ValueError, match="sum to"):
        TopKRows.from_logprobs([[-0.1, -0.2]], vocab_size=10)
    with pytest.raises(ValueError, match="vocab size must be an integer above"):
        TopKRows.from_logprobs([[-0.1, -3.0, -4.0]], vocab_size=3)
    rows = TopKRows.from_logprobs([[-0.1, -3.0, -4.0]], vocab_size=100)
    with pytest.raises(ValueError, match="side must be one of"):
        sigma_for_agreement_bound(rows, 0.8, side="both")
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        sigma_for_agreement_bound(rows, 1.0)
    tied = TopKRows.from_logprobs([[-0.7, -0.7, -9.0]], vocab_size=100)
    with pytest.raises(ValueError, match="above the lower bound at every sigma"):
        sigma_for_agreement_bound(tied, 0.9)


def even_split_agreement(rows, i, sigma):
    """Exact agreement of row i with its unseen mass spread evenly (m classes at r / m), by a fine quadrature."""
    from scipy.special import log_ndtr as lnd

    u = np.arange(-9.0, 9.0, 0.01)
    w = np.full(u.shape, 0.01) * np.exp(-0.5 * u * u) / np.sqrt(2 * np.pi)
    g = rows.gaps[i][np.isfinite(rows.gaps[i])]
    log_f = lnd(g[:, None] / sigma + u[None, :]).sum(axis=0)
    r, m = rows.tail_mass[i], float(rows.unseen[i])
    if r > 0:
        log_f += m * lnd((rows.top_logprob[i] - np.log(r / m)) / sigma + u)
    return float(np.exp(log_f) @ w)


def test_the_upper_bound_is_attained_by_the_even_split_tail(full):
    """Each row's upper bound is the exact agreement of a tail the log allows: no method can do better."""
    rows = top_k_rows(full)
    for sigma in (0.3, 0.8, 1.5):  # mean agreement from ~1 down to ~0.6
        _, hi = agreement_bounds(rows, sigma)
        for i in range(rows.n_rows):
            assert abs(even_split_agreement(rows, i, sigma) - hi[i]) < 1e-4, (sigma, i)
    for sigma in (0.3, 1.5, 3.0):  # and it still bounds the true vocabulary's agreement from above
        _, hi = agreement_bounds(rows, sigma)
        assert np.all(exact_agreement(full, sigma, step=0.1) <= hi + 1e-6)


def packed_tail_minimum(rows, i, sigma):
    """The lowest exact agreement over tails packing the leftover mass into n equal classes (n on a grid)."""
    from scipy.special import log_ndtr as lnd

    u = np.arange(-9.0, 9.0, 0.02)
    w = np.full(u.shape, 0.02) * np.exp(-0.5 * u * u) / np.sqrt(2 * np.pi)
    g = rows.gaps[i][np.isfinite(rows.gaps[i])]
    seen = lnd(g[:, None] / sigma + u[None, :]).sum(axis=0)
    r, m, top = rows.tail_mass[i], int(rows.unseen[i]), rows.top_logprob[i]
    p_k = np.exp(top - rows.floor_gap[i])
    counts = np.unique(np.geomspace(max(1, int(np.ceil(r / p_k))), m, 300).astype(int))
    q = r / counts[counts * p_k >= r]
    return float(np.min(np.exp(seen[None, :] + (r / q)[:, None] * lnd((top - np.log(q))[:, None] / sigma + u))
                        @ w))


def test_the_lower_bound_is_reached_by_packed_tails_to_within_its_stated_slack():
    """A tail the log allows (the leftover mass packed into equal classes) comes within 1e-3 of each row's lower
    bound and 2e-4 of the mean: the band's low side is what the logs force, not slack of the method."""
    full = llm_like_logits(30, V, seed=3, zipf=(0.9, 1.3))  # flat tails: the widest bands
    rows = top_k_rows(full)
    for sigma in (0.5, 1.0, 2.0):
        lo, _ = agreement_bounds(rows, sigma)
        reached = np.array([packed_tail_minimum(rows, i, sigma) for i in range(rows.n_rows)])
        assert np.all(reached >= lo - 1e-9), sigma  # a real tail never goes below the certified bound
        assert np.max(reached - lo) < 1e-3 and np.mean(reached - lo) < 2e-4, (sigma, np.max(reached - lo))
