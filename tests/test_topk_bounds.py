"""Certified agreement bounds from top-k logprobs, against full vocabularies kept by the test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_ndtr

from caliber_core.calibration import topk_bounds as tb
from caliber_core.calibration import topk_node_bounds as tn
from caliber_core.calibration import topk_rows as tr
from caliber_core.calibration import topk_tails as tt
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
    ours = tn.tail_floor(rows, slice(0, 1), sigma, worst_slope_point(sigma), np.array([u]))[0, 0]
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
        lo, hi = mean_agreement_bounds(rows, sigma)
        # Delivered within [target - 0.0005, target + the width the log allows at the sigma served].
        assert target - 0.0005 <= truth <= target + (hi[0] - lo[0]) + 1e-6
        assert truth <= target + 0.01
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
    with pytest.raises(ValueError, match=r"row 1's leftover mass 0.69 does not fit .* vocabulary size 12 is too small"):
        TopKRows.from_logprobs([[-0.01, -5.0, -6.0], [np.log(0.3), np.log(0.01), -np.inf]], vocab_size=12)
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


SHAPES = {"steep": (1.6, 2.4), "default": (1.2, 1.8), "flat": (0.9, 1.3)}
#: From agreement ~0.95 down to ~0.01: the even split is the top of the band at small sigma and
#: the bottom at large sigma, so the families' interiors are reached on both sides.
SIGMAS = (0.5, 1.0, 2.0, 4.0, 8.0)


@pytest.fixture(scope="module")
def shapes():
    out = {}
    for name, zipf in SHAPES.items():
        lp = log_softmax(llm_like_logits(8, V, seed=5, zipf=zipf))
        shown = -np.sort(-lp, axis=1)[:, :20]
        out[name] = (shown, TopKRows.from_logprobs(shown, vocab_size=V))
    return out


def tail_agreement(rows, i, sigma, counts, probs):
    """Exact agreement of row i with an unseen tail of ``counts[l]`` classes at ``probs[l]``, on the bounds' rule."""
    g = rows.gaps[i][np.isfinite(rows.gaps[i])]
    log_f = log_ndtr(g[:, None] / sigma + tr.BOUND_NODES[None, :]).sum(axis=0)
    for c, p in zip(counts, probs):
        if c and p > 0:
            log_f = log_f + c * log_ndtr((rows.top_logprob[i] - np.log(p)) / sigma + tr.BOUND_NODES)
    return float(np.exp(log_f) @ tr.BOUND_WEIGHTS)


@pytest.mark.parametrize("shape", SHAPES)
def test_both_bounds_are_attained_by_tails_the_log_allows(shapes, shape):
    """Each row's lower and upper bound is the exact agreement (over the full row, by the survival
    quadrature of exact_agreement) of a constructed unseen tail consistent with the log: within 1e-4."""
    shown, rows = shapes[shape]
    for sigma in SIGMAS:
        lo, hi, lowest, highest = tb.extremal_tails(rows, sigma)
        assert np.all(lo <= hi)
        for i in range(rows.n_rows):
            p_k = np.exp(shown[i, -1])
            for tails, bound in ((lowest, lo[i]), (highest, hi[i])):
                unseen = tails.logprobs(i, int(rows.unseen[i]))
                assert unseen.size == V - 20
                assert np.all(np.exp(unseen) <= p_k * (1 + 1e-9))  # none above the k-th shown
                assert np.exp(unseen).sum() == pytest.approx(rows.tail_mass[i], rel=1e-9, abs=1e-12)
                full = np.concatenate([shown[i], unseen])[None, :]
                assert abs(exact_agreement(full, sigma)[0] - bound) < 1e-4, (shape, sigma, i)


def random_tails(rng, r, m, p_k, n):
    """n random unseen tails of up to four levels with random class counts, each consistent with (r, m, p_k)."""
    out = []
    while len(out) < n:
        levels = rng.integers(1, 5)
        counts = rng.integers(1, max(2, m // rng.choice([1, 10, 100, 1000])), levels)
        if counts.sum() > m or counts.sum() * p_k < r:
            continue
        probs = rng.uniform(0.0, 1.0, levels) ** rng.choice([1, 4])
        probs *= r / float(counts @ probs)
        if probs.max() <= p_k:
            out.append((counts, probs))
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_no_tail_the_log_allows_goes_beyond_the_bounds(shapes, shape):
    """A numeric search over other tails: a dense scan of both extremal families, random multi-level
    tails and perturbations of the extremal tails themselves never leave [lower, upper]."""
    _, rows = shapes[shape]
    rng = np.random.default_rng(7)
    for sigma in SIGMAS:
        lo, hi, lowest, highest = tb.extremal_tails(rows, sigma)
        for i in range(0, rows.n_rows, 2):
            r, m, top = rows.tail_mass[i], float(rows.unseen[i]), rows.top_logprob[i]
            p_k = np.exp(top - rows.floor_gap[i])
            seen = log_ndtr(rows.gaps[i][:, None] / sigma + tr.BOUND_NODES).sum(axis=0)
            for family, span, bound, side in ((tt._low_family, tt._low_range, lo[i], -1),
                                              (tt._high_family, tt._high_range, hi[i], 1)):
                a, b = (float(x) for x in span(r, m, p_k))
                # The families are scalloped at integer nu: scan every integer near the vertex too.
                nu = np.concatenate([a + (b - a) * np.linspace(0.0, 1.0, 801) ** 3,
                                     np.arange(np.ceil(a), min(b, a + 400) + 1), [a, b]])
                nu = np.clip(nu, a, b)
                scan = np.exp(seen[None, :] + tt._tail_sum(np.full(nu.shape, top), family(nu, r, m, p_k), sigma,
                                                           tr.BOUND_NODES)) @ tr.BOUND_WEIGHTS
                assert side * (scan.max() if side > 0 else scan.min()) <= side * bound + 1e-9, (sigma, i)
            values = [tail_agreement(rows, i, sigma, c, p) for c, p in random_tails(rng, r, int(m), p_k, 40)]
            # Perturb the extremal tails: move mass between a class of one group and another class.
            for tails, sign in ((lowest, 1), (highest, -1)):
                ca, pa, pb, cc, pc = (float(x[i]) for x in tt._groups(tails))
                for frac in (0.01, 0.1, 0.5):
                    if ca >= 1 and pa > 0:
                        d = frac * min(pa, p_k - pb)
                        values.append(tail_agreement(rows, i, sigma, [ca - 1, 1, 1, cc], [pa, pa - d, pb + d, pc]))
                        d = frac * min(pb, p_k - pa)
                        values.append(tail_agreement(rows, i, sigma, [ca - 1, 1, 1, cc], [pa, pa + d, pb - d, pc]))
                    if cc >= 1 and pc > 0:
                        d = frac * min(pc, p_k - pb)
                        values.append(tail_agreement(rows, i, sigma, [ca, 1, 1, cc - 1], [pa, pb + d, pc - d, pc]))
            values = np.array(values)
            assert values.min() >= lo[i] - 1e-9, (shape, sigma, i)
            assert values.max() <= hi[i] + 1e-9, (shape, sigma, i)


def test_where_the_vertex_is_the_worst_tail_the_old_envelope_was_not_attained():
    """On flat logs at sigma = 2 the node-by-node envelope sits below every tail; the bound is now the vertex."""
    full = llm_like_logits(30, V, seed=3, zipf=(0.9, 1.3))
    rows = top_k_rows(full)
    sigma = 2.0
    lo, _, lowest, _ = tb.extremal_tails(rows, sigma)
    seen = log_ndtr(rows.gaps[:, :, None] / sigma + tr.BOUND_NODES).sum(axis=1)
    envelope = np.exp(seen + tn.tail_floor(rows, slice(None), sigma, worst_slope_point(sigma), tr.BOUND_NODES)) \
        @ tr.BOUND_WEIGHTS
    assert np.max(lo - envelope) > 1e-4  # what the envelope left open
    assert np.all(lo >= envelope - 1e-12)
    p_k = np.exp(rows.top_logprob - rows.floor_gap)
    assert np.mean(np.isclose(lowest.prob_a, p_k, rtol=1e-9)) > 0.9  # mostly classes packed at p_k


@pytest.mark.parametrize("vocab,k,zipf,seed", [(300, 3, (0.8, 1.0), 4), (5_000, 10, (1.2, 1.8), 2),
                                               (128_000, 20, (1.0, 1.4), 3)])
def test_the_search_finds_the_extreme_of_each_family_at_other_vocabularies(vocab, k, zipf, seed):
    """Against a dense scan with every integer count (and counts a hair below each, where the scallops'
    bottoms sit): at V = 128,000 the flat stretch of the family has bottoms 1e-6 apart over tens of counts."""
    lp = log_softmax(llm_like_logits(6, vocab, seed=seed, zipf=zipf))
    rows = TopKRows.from_logprobs(-np.sort(-lp, axis=1)[:, :k], vocab_size=vocab)
    for sigma in (1.0, 3.0, 10.0):
        lo, hi, lowest, highest = tb.extremal_tails(rows, sigma)
        for i in range(rows.n_rows):
            r, m, top = rows.tail_mass[i], float(rows.unseen[i]), rows.top_logprob[i]
            p_k = np.exp(top - rows.floor_gap[i])
            seen = log_ndtr(rows.gaps[i][:, None] / sigma + tr.BOUND_NODES).sum(axis=0)
            for family, span, bound, side, tails in ((tt._low_family, tt._low_range, lo[i], -1, lowest),
                                                     (tt._high_family, tt._high_range, hi[i], 1, highest)):
                a, b = (float(x) for x in span(r, m, p_k))
                counts = np.arange(np.ceil(a), min(b, a + 400) + 1)
                nu = np.clip(np.concatenate([a + (b - a) * np.linspace(0.0, 1.0, 2001) ** 3, counts, counts - 0.03,
                                             [a, b]]), a, b)
                scan = np.exp(seen[None, :] + tt._tail_sum(np.full(nu.shape, top), family(nu, r, m, p_k), sigma,
                                                           tr.BOUND_NODES)) @ tr.BOUND_WEIGHTS
                extreme = scan.max() if side > 0 else scan.min()
                assert side * extreme <= side * bound + 1e-9, (sigma, i)
                # ... and the bound is the agreement of the tail found (the scan may miss a sharper peak).
                found = tail_agreement(rows, i, sigma, [tails.count_a[i], 1, tails.count_c[i]],
                                       [tails.prob_a[i], tails.prob_b[i], tails.prob_c[i]])
                assert abs(found - bound) <= 1.0001e-6, (sigma, i, side)
