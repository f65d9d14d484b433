"""The unseen tails that attain the top-k agreement bounds, found per row.

Both bounds of :mod:`.topk_bounds` are the exact agreement of a tail the log
allows (:func:`extremal_tails` returns the tails), so no method that sees the
same log can certify a narrower band.

Extremal tails
--------------
Write J(p) = int w(u) prod_i Phi(x_i(p_i) + u) du for the agreement as a
function of the unseen probabilities p on the polytope {0 <= p_i <= p_k,
sum p_i = r} (w holds phi and the shown classes, x_i = (l_top - log p_i) /
sigma). J is continuous on a compact set, so both extremes are reached; the
constraints are linear, so they satisfy the KKT conditions. With E(u) the full
integrand and f_u(p) = log Phi(x(p) + u),

    dJ / dp_i = D(p_i),   D(p) = int E(u) f_u'(p) du = -Lambda(log p) / (sigma p),
    Lambda(t) = int E(u) lambda(l_top / sigma + u - t / sigma) du,

with lambda = phi / Phi. E is log-concave in u (phi and every Phi factor are)
and lambda is strictly log-concave ((log lambda)'' = -1 + lambda (x + lambda)
lies in (-1, 0)), so by Prekopa's theorem Lambda is log-concave and
g(t) = log Lambda(t) - t is strictly concave. Every interior p_i shares one
multiplier, D(p_i) = mu, so the interior probabilities take at most two
values a < b (the two roots of g = const), with g increasing at log a and
decreasing at log b. Moving mass between two classes at one level p changes
J at second order by 2 int E f_u''(p) du, whose sign is D'(p)'s, i.e. minus
g'(log p)'s. Hence:

* **minimum**: several classes may share b, at most one sits at a; a class
  at p_k needs D(p_k) <= mu, which g's decrease beyond log b rules out next to
  a class at b. So the minimizer is j classes at b plus one at
  a = r - j b in [0, b], the others at 0 (probability 0 is the limit of a
  vanishing logprob): with nu = r / b from max(1, r / p_k) (the *vertex*: as
  many classes at p_k as fit, one remainder) to m (the even split), one
  parameter;
* **maximum**: a class at 0 needs D(0) = 0 <= mu < 0, impossible beside any
  interior class, so every unseen class is positive; several share a, at most
  one sits at b, and the rest are at p_k: floor(nu) classes at p_k, one
  between, m - floor(nu) - 1 at a common level, with nu from 0 (the even split)
  to r / p_k (the vertex), one parameter.

Each bound is the extreme of the exact agreement along its family, found per
row by a zooming grid search. The node-by-node bounds of
:mod:`.topk_node_bounds` screen it: where the vertex or the even split is
within ``SEARCH_SLACK`` of them, they are the answer, and a searched value is
never taken past them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_sigmas
from .topk_node_bounds import tail_ceiling, tail_floor, worst_slope_point
from .topk_rows import BOUND_NODES, BOUND_WEIGHTS, TopKRows, quadrature_rule

_CHUNK_ELEMENTS = 4_000_000

#: Grid points per round and rounds of the zooming search along a family of tails.
SEARCH_POINTS = 9
SEARCH_ROUNDS = 6
#: The scallops' search: every integer count within this of the region found, then the two unit
#: segments around the best on 12 points each, then zooms.
INTEGER_WINDOW = 24
SEGMENT_POINTS = 25
SEGMENT_ROUNDS = 3
#: The search only ranks tails of one row, whose integrands are smooth (no envelope kink), so a
#: coarser rule suffices there; the tail it picks is then integrated on the bounds' own rule.
SEARCH_STEP = 0.25
#: What the search may leave: a row whose simple tails (vertex, even split) already reach the
#: proven per-node bound within this is not searched, and a searched bound is moved this far
#: towards the outside (never past the per-node bound) to cover the search's own resolution.
SEARCH_SLACK = 1e-6


@dataclass(frozen=True)
class Tails:
    """One unseen tail per row, in three groups of equal probabilities.

    Row i's unseen classes are ``count_a[i]`` classes at ``prob_a[i]``, one class
    at ``prob_b[i]`` and ``count_c[i]`` classes at ``prob_c[i]``; the rest of its
    m unseen classes are at probability 0 (a vanishing logprob). Counts are
    float64 holding integers.
    """

    count_a: np.ndarray
    prob_a: np.ndarray
    prob_b: np.ndarray
    count_c: np.ndarray
    prob_c: np.ndarray

    def take(self, keep: np.ndarray, into: Tails) -> None:
        """Write this tail's rows into ``into`` at the rows ``keep`` marks (a mask with as many True as rows here)."""
        for name in ("count_a", "prob_a", "prob_b", "count_c", "prob_c"):
            getattr(into, name)[keep] = getattr(self, name)

    def logprobs(self, i: int, unseen: int, *, floor: float = -1e4) -> np.ndarray:
        """Row i's m unseen logprobs (zero classes at ``floor``), for checks against a full row."""
        ca, cc = int(round(self.count_a[i])), int(round(self.count_c[i]))
        with np.errstate(divide="ignore"):
            parts = [np.full(ca, np.log(self.prob_a[i])), [np.log(self.prob_b[i])],
                     np.full(cc, np.log(self.prob_c[i]))]
        out = np.concatenate(parts + [np.full(unseen - ca - 1 - cc, -np.inf)])
        return np.maximum(out, floor)


_SEARCH_NODES, _SEARCH_WEIGHTS = quadrature_rule(SEARCH_STEP)


def _groups(tails: Tails) -> tuple:
    return tails.count_a, tails.prob_a, tails.prob_b, tails.count_c, tails.prob_c


def _tail_sum(top, tails_groups, sigma, nodes):
    """sum over a tail's classes of log Phi((l_top - log p) / sigma + u): shape tails_groups[0].shape + nodes."""
    from scipy.special import log_ndtr

    count_a, prob_a, prob_b, count_c, prob_c = tails_groups
    total = 0.0
    for count, prob in ((count_a, prob_a), (1.0, prob_b), (count_c, prob_c)):
        if not np.any(count) or not np.any(prob):
            continue  # an empty group adds log Phi(+inf) = 0
        with np.errstate(divide="ignore"):
            x = (top[..., None] - np.log(prob)[..., None]) / sigma + nodes  # p = 0: x = +inf, term 0
        total = total + np.asarray(count)[..., None] * log_ndtr(x)
    return total


def _low_family(nu, r, m, p_k):
    """The family holding the minimizing tail (module docstring, "Extremal tails"), at nu.

    nu = r / b classes' worth of mass at b, from max(1, r / p_k) (the vertex: as many classes at
    p_k as fit and one remainder) to m (the even split): floor(nu) classes at b, one class at
    r - floor(nu) b, the rest at 0.
    """
    b = r / nu
    j = np.floor(nu)
    a = np.clip(r - j * b, 0.0, None)
    zero = np.zeros_like(b)
    return j, b, a, zero, zero


def _low_range(r, m, p_k):
    nu_0 = np.maximum(1.0, np.minimum(r / p_k, m))
    return nu_0, m


def _high_family(nu, r, m, p_k):
    """The family holding the maximizing tail, at nu.

    nu from 0 (the even split) to min(r / p_k, m - 1) (the vertex) classes' worth of mass at
    p_k: floor(nu) classes at p_k, one class between the rest's level and p_k, the other
    m - floor(nu) - 1 classes at an even level a = (r - nu p_k) / (m - nu).
    """
    n_c = np.floor(nu)
    a = np.clip((r - nu * p_k) / (m - nu), 0.0, None)
    b = a + (nu - n_c) * (p_k - a)
    return n_c, np.broadcast_to(p_k, nu.shape).copy(), b, m - n_c - 1.0, a


def _high_range(r, m, p_k):
    return np.zeros_like(r), np.minimum(r / p_k, m - 1.0)


def _zoom(value, lo, hi, rounds, *, log_scale, points=SEARCH_POINTS, within=None):
    """Zooming grid search of ``value(nu)`` (smaller is better) on [lo, hi] per row: best nu and value.

    ``within`` (a pair of arrays) clips the grid to the family's range when [lo, hi] overhangs it.
    """
    grid = np.linspace(0.0, 1.0, points)
    rows = np.arange(lo.size)
    low_end, high_end = within if within is not None else (lo, hi)
    best_val, best_nu = np.full(lo.shape, np.inf), np.clip(lo, low_end, high_end)
    a, b = (np.log(lo), np.log(hi)) if log_scale else (lo.copy(), hi.copy())
    for _ in range(rounds):
        t = a[:, None] + (b - a)[:, None] * grid[None, :]
        nu = np.exp(t) if log_scale else t
        nu = np.clip(nu, low_end[:, None], high_end[:, None])  # exp(log) may round past an end
        vals = value(nu)
        k = np.argmin(vals, axis=1)
        better = vals[rows, k] < best_val
        best_val = np.where(better, vals[rows, k], best_val)
        best_nu = np.where(better, nu[rows, k], best_nu)
        a, b = t[rows, np.maximum(k - 1, 0)], t[rows, np.minimum(k + 1, points - 1)]
    return best_nu, best_val


def _search(family, span, seen_coarse, top, r, m, p_k, sigma, nodes, weights, *, maximize: bool):
    """The tail of a family with the best agreement, per row (``nodes``, ``weights``: the search's rule).

    A zoom over the whole family (log-spaced for the minimum's, which runs up to m classes) finds
    the region; the family is continuous but scalloped, one scallop per integer nu (one class
    moving between two levels), so every integer nu near the region is then tried and the two
    scallops beside the best one searched.
    """
    sign = -1.0 if maximize else 1.0

    def value(nu):
        groups = family(nu, r[:, None], m[:, None], p_k[:, None])
        return sign * (np.exp(seen_coarse[:, None, :] + _tail_sum(top[:, None], groups, sigma, nodes)) @ weights)

    lo, hi = span(r, m, p_k)
    best_nu, best_val = _zoom(value, lo, hi, SEARCH_ROUNDS, log_scale=not maximize)
    # Where the family is flat the scallops' bottoms differ by ~1e-6 over tens of counts: every
    # integer count near the region first, then the scallops either side of the best one.
    centre = np.floor(best_nu)
    nu, val = _zoom(value, centre - INTEGER_WINDOW, centre + INTEGER_WINDOW, 1, log_scale=False,
                    points=2 * INTEGER_WINDOW + 1, within=(lo, hi))
    better = val < best_val
    best_val, best_nu = np.where(better, val, best_val), np.where(better, nu, best_nu)
    centre = np.round(best_nu)
    nu, val = _zoom(value, centre - 1.0, centre + 1.0, SEGMENT_ROUNDS, log_scale=False,
                    points=SEGMENT_POINTS, within=(lo, hi))
    better = val < best_val
    best_nu = np.where(better, nu, best_nu)
    return Tails(*(np.asarray(g, dtype=np.float64).copy() for g in family(best_nu, r, m, p_k)))


def extremal_tails(rows: TopKRows, sigma: float) -> tuple[np.ndarray, np.ndarray, Tails, Tails]:
    """Per-row lower and upper bounds of pi(sigma), and the tails the log allows that reach them.

    Parameters
    ----------
    rows : TopKRows
    sigma : float > 0

    Returns
    -------
    lower, upper : ndarray of shape (n_rows,)
        The smallest and largest agreement of any tail consistent with each row,
        to within ``SEARCH_SLACK`` towards the outside.
    lowest, highest : Tails
        A tail consistent with each row whose agreement is within ``SEARCH_SLACK``
        of ``lower`` (of ``upper``): the bounds are attained.

    Notes
    -----
    Each bound is first taken node by node (the convex envelope below, the
    tangent above); where a simple tail (the vertex or the even split) reaches
    it, that is the bound. Elsewhere the bound is the best agreement along the
    one-parameter family that holds the extremal tail (module docstring), never
    past the node-by-node bound.
    """
    from scipy.special import log_ndtr

    s = float(as_sigmas(sigma)[0])
    if s == 0.0:
        raise ValueError("extremal tails need sigma > 0 (at sigma = 0 the tail cannot matter)")
    n = rows.n_rows
    y_star = worst_slope_point(s)
    lower, upper = np.empty(n), np.empty(n)
    empty = [np.zeros(n) for _ in range(5)]
    lowest, highest = Tails(*empty), Tails(*(x.copy() for x in empty))
    width = rows.gaps.shape[1]
    per_row = max(1, _CHUNK_ELEMENTS // ((width + 1 + 3 * SEARCH_POINTS) * BOUND_NODES.size))
    for start in range(0, n, per_row):
        sl = slice(start, min(n, start + per_row))
        seen = log_ndtr(rows.gaps[sl, :, None] / s + BOUND_NODES[None, None, :]).sum(axis=1)
        env_lo = np.exp(seen + tail_floor(rows, sl, s, y_star, BOUND_NODES)) @ BOUND_WEIGHTS
        env_hi = np.exp(seen + tail_ceiling(rows, sl, s, BOUND_NODES)) @ BOUND_WEIGHTS
        top, r = rows.top_logprob[sl], rows.tail_mass[sl]
        m = rows.unseen[sl].astype(np.float64)
        p_k = np.exp(top - rows.floor_gap[sl])
        ends = [Tails(*(np.asarray(g, dtype=np.float64).copy() for g in _high_family(nu, r, m, p_k)))
                for nu in _high_range(r, m, p_k)[::-1]]  # the vertex and the even split
        end_vals = [np.exp(seen + _tail_sum(top, _groups(e), s, BOUND_NODES)) @ BOUND_WEIGHTS for e in ends]
        for env, family, span, maximize, out, tails in ((env_lo, _low_family, _low_range, False, lower, lowest),
                                                        (env_hi, _high_family, _high_range, True, upper, highest)):
            pick = (end_vals[0] >= end_vals[1]) if maximize else (end_vals[0] <= end_vals[1])
            best = np.where(pick, end_vals[0], end_vals[1])
            chosen = Tails(*(np.where(pick, a, b) for a, b in zip(_groups(ends[0]), _groups(ends[1]))))
            gap = env - best if maximize else best - env
            need = gap > SEARCH_SLACK
            if np.any(need):
                seen_coarse = log_ndtr(rows.gaps[sl][need][:, :, None] / s + _SEARCH_NODES).sum(axis=1)
                found_tails = _search(family, span, seen_coarse, top[need], r[need], m[need], p_k[need], s,
                                      _SEARCH_NODES, _SEARCH_WEIGHTS, maximize=maximize)
                found = np.exp(seen[need] + _tail_sum(top[need], _groups(found_tails), s, BOUND_NODES)) @ BOUND_WEIGHTS
                better = (found > best[need]) if maximize else (found < best[need])
                idx = np.flatnonzero(need)[better]
                best[idx] = found[better]
                mask = np.zeros(r.size, dtype=bool)
                mask[idx] = True
                Tails(*(g[better] for g in _groups(found_tails))).take(mask, chosen)
            out[sl] = (np.minimum(env, best + SEARCH_SLACK) if maximize
                       else np.maximum(env, best - SEARCH_SLACK))
            rows_here = np.zeros(n, dtype=bool)
            rows_here[sl] = True
            chosen.take(rows_here, tails)
    return np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), lowest, highest
