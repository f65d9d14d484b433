"""Certified agreement bounds from top-k logprobs (Proposition 1 with an unseen tail).

A logged position shows the k largest logprobs of a V-class distribution.
The other m = V - k classes are unseen: each has probability at most p_k
(the smallest one shown), and together they hold the leftover mass
r = 1 - sum of the shown probabilities. The agreement of the position,

    pi(sigma) = int phi(u) prod_{j != top} Phi(g_j / sigma + u) du     (Eq. top1-exact)

with g_j = l_top - l_j (logprob differences are logit differences), is then
known only up to the tail. Both bounds below are **attained**: each is the
exact agreement of an unseen tail consistent with the row (:func:`extremal_tails`
returns those tails), so no method that sees the same log can certify a
narrower band.

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
row by a zooming grid search. Two node-by-node bounds below, proven without a
search, screen it: where the vertex or the even split is within
``SEARCH_SLACK`` of them, they are the answer, and a searched value is never
taken past them:

* **upper, node by node**: at each node the tail contributes at most
  m * f(r / m), the even split, wherever the tangent of f at r / m lies above
  f on all of [0, p_k] (f concave at r / m and the tangent above f(p_k): f is
  concave and then convex, so the tangent then dominates f everywhere and
  sum_i f(p_i) <= sum_i of the tangent = m f(r / m)); at a node where that
  check fails the tail is bounded by 0 (every factor at most 1);
* **lower, node by node**: at each quadrature node u the tail contributes
  sum_unseen f(p_i) with f(p) = log Phi((l_top - log p) / sigma + u), and

      min { sum_i f(p_i) : 0 <= p_i <= p_k, sum_i p_i = r }  >=  m * conv f (r / m),

  where conv f is the convex envelope of f on [0, p_k] (Jensen: the envelope
  is convex and below f). That minimum packs the mass differently at each
  node (and in fractional classes), so no single tail reaches it; on flat
  logs it sits up to ~2e-4 below the vertex tail.

Why the convex envelope and what it is
--------------------------------------
With s = 1/sigma, x = (l_top - log p) s + u and lambda = phi / Phi (the
inverse Mills ratio),

    f''(p) = s lambda(x) / p^2 * (1 - s (x + lambda(x))).

x + lambda(x) increases strictly in x (its derivative 1 - lambda (x + lambda)
lies in (0, 1)), and x decreases in p, so f is concave on (0, p*] and convex on
[p*, p_k]: concave near 0 (where f -> 0), convex beyond. For such a function
with f(0) = 0 the convex envelope on [0, p_k] is the chord from the origin to
the point q that minimizes the slope f(p) / p, then f itself on [q, p_k]:
h(p) = p f'(p) - f(p) has h(0+) = 0 and h' = p f'' (< 0 then > 0), so h is
negative and then crosses zero once, i.e. f(p) / p decreases to its minimum
at q and increases after it.

In terms of y = x, the slope f(p) / p = e^{sigma (y - u) - l_top} log Phi(y)
depends on the row only through its constant factor, so its unconstrained
minimizer y*(sigma) is one scalar per sigma: the root of
sigma log Phi(y) + lambda(y) = 0. The constraint p <= p_k is y >= y_k =
g_k / sigma + u, so q sits at y_q = max(y*, y_k) (the slope is unimodal).

The bounds are bounds on the integral; the quadrature (trapezoid, step
``BOUND_STEP`` on [-8, 8]) adds an error below 1e-6 at the tested shapes,
far inside the bounds' width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_sigmas

U_MAX = 8.0
#: Trapezoid spacing of the bounds' quadrature: the lower bound's integrand
#: has a kink where y_k crosses y*, so a finer grid than the plain survival's.
BOUND_STEP = 0.1
_CHUNK_ELEMENTS = 4_000_000
SIDE_BOUND = {"at-least": "lower", "at-most": "upper", "point": "midpoint"}


def _rule(step: float) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.arange(-U_MAX, U_MAX + step / 2, step)
    weights = np.full(nodes.shape, step) * np.exp(-0.5 * nodes**2) / np.sqrt(2 * np.pi)
    weights[[0, -1]] *= 0.5
    return nodes, weights


_NODES, _WEIGHTS = _rule(BOUND_STEP)


@dataclass(frozen=True)
class TopKRows:
    """What a top-k logprob log tells about each generated position.

    Attributes
    ----------
    gaps : ndarray of shape (n_rows, n_shown - 1)
        l_top - l_j for every shown class other than the top one, ascending
        per row; rows showing fewer classes are padded with +inf.
    top_logprob : ndarray of shape (n_rows,)
        l_top, the largest logprob of each row (<= 0).
    tail_mass : ndarray of shape (n_rows,)
        r = 1 - sum of the shown probabilities, clipped at 0.
    floor_gap : ndarray of shape (n_rows,)
        g_k = l_top - l_k: every unseen class is at least this far below the top.
    unseen : ndarray of int64, shape (n_rows,)
        m = V - (classes shown), the number of unseen classes.
    vocab_size : int
        V.
    """

    gaps: np.ndarray
    top_logprob: np.ndarray
    tail_mass: np.ndarray
    floor_gap: np.ndarray
    unseen: np.ndarray
    vocab_size: int

    @property
    def n_rows(self) -> int:
        """Rows (inputs) held."""
        return int(self.gaps.shape[0])

    @property
    def shown(self) -> int:
        """k: the largest number of classes a row shows."""
        return int(self.gaps.shape[1]) + 1

    @classmethod
    def from_logprobs(cls, logprobs, *, vocab_size: int) -> TopKRows:
        """Rows from shown logprobs, one row per position (NaN or -inf pads a row that shows fewer).

        Parameters
        ----------
        logprobs : array_like of shape (n_rows, n_shown)
            The shown logprobs of each position, in any order.
        vocab_size : int
            V, the number of classes of every row's distribution.

        Raises
        ------
        ValueError
            Fewer than two shown classes in a row, a positive logprob, shown
            mass above 1 beyond rounding, V not above the classes shown, or a
            leftover mass that V - k classes at or below the k-th cannot hold.
        """
        lp = np.array(logprobs, dtype=np.float64, copy=True)
        if lp.ndim != 2 or lp.shape[0] == 0:
            raise ValueError(f"logprobs must be a non-empty 2-D array, got shape {lp.shape}")
        lp[np.isnan(lp)] = -np.inf
        shown = np.sum(np.isfinite(lp), axis=1)
        if np.any(shown < 2):
            i = int(np.argmax(shown < 2))
            raise ValueError(f"row {i} shows {int(shown[i])} finite logprob(s); at least 2 are needed")
        if np.any(lp > 1e-6):
            i = int(np.argmax(np.any(lp > 1e-6, axis=1)))
            raise ValueError(f"row {i} has a positive logprob {float(np.max(lp[i])):.6g}")
        if not (isinstance(vocab_size, (int, np.integer)) and vocab_size > int(shown.max())):
            raise ValueError(f"vocab size must be an integer above the classes shown "
                             f"({int(shown.max())}), got {vocab_size!r}")
        lp = -np.sort(-lp, axis=1)  # descending, -inf padding last
        top = np.minimum(lp[:, 0], 0.0)
        mass = np.sum(np.exp(lp), axis=1)
        # Logprobs are rounded in transit: a shown mass a hair above 1 is rounding, more is not.
        if np.any(mass > 1.0 + 1e-3):
            i = int(np.argmax(mass > 1.0 + 1e-3))
            raise ValueError(f"row {i}'s shown probabilities sum to {float(mass[i]):.6g} > 1")
        rows = np.arange(lp.shape[0])
        # The unseen classes, each at most the k-th shown, must be able to hold the leftover mass.
        unseen = vocab_size - shown
        room = unseen * np.exp(lp[rows, shown - 1]) * (1.0 + 1e-3) + 1e-6
        if np.any(1.0 - mass > room):
            i = int(np.argmax(1.0 - mass > room))
            raise ValueError(f"row {i}'s leftover mass {float(1.0 - mass[i]):.4g} does not fit in its "
                             f"{int(unseen[i]):,} unseen classes at or below its smallest shown probability: "
                             f"the vocabulary size {vocab_size:,} is too small for this log")
        gaps = top[:, None] - lp[:, 1:]
        return cls(
            gaps=gaps,
            top_logprob=top,
            tail_mass=np.clip(1.0 - mass, 0.0, 1.0),
            floor_gap=top - lp[rows, shown - 1],
            unseen=(vocab_size - shown).astype(np.int64),
            vocab_size=int(vocab_size),
        )

    def top_two_gaps(self) -> np.ndarray:
        """l_top - l_2 per row: the margin of each position (the scale S is their median)."""
        return self.gaps[:, 0].copy()


def worst_slope_point(sigma: float) -> float:
    """y*(sigma): the minimizer of e^{sigma y} log Phi(y), root of sigma log Phi(y) + lambda(y) = 0.

    Parameters
    ----------
    sigma : float > 0

    Returns
    -------
    y : float
    """
    from scipy.optimize import brentq
    from scipy.special import log_ndtr

    def slope(y: float) -> float:
        lp = log_ndtr(y)
        # lambda(y) = phi(y) / Phi(y) = exp(log phi - log Phi), stable in both tails
        return sigma * lp + np.exp(-0.5 * y * y - 0.5 * np.log(2 * np.pi) - lp)

    lo, hi = -2.0 / sigma - 2.0, max(sigma, 1.0) + 2.0
    while slope(lo) > 0:
        lo = 2 * lo - 1.0
    while slope(hi) < 0:
        hi = 2 * hi + 1.0
    return float(brentq(slope, lo, hi, xtol=1e-12, rtol=1e-12))


def _tail_floor(rows: TopKRows, sl: slice, sigma: float, y_star: float, nodes: np.ndarray) -> np.ndarray:
    """Lower bound of sum_unseen log Phi(G_i / sigma + u) per (row, node): m * conv f (r / m)."""
    from scipy.special import log_ndtr

    r = rows.tail_mass[sl, None]
    m = rows.unseen[sl, None].astype(np.float64)
    top = rows.top_logprob[sl, None]
    y_k = rows.floor_gap[sl, None] / sigma + nodes[None, :]
    y_q = np.maximum(y_star, y_k)
    # Chord through the origin and (q, f(q)): slope f(q)/q, q = exp(l_top - sigma (y_q - u)).
    log_q = top - sigma * (y_q - nodes[None, :])
    # log Phi == 0 far in the tail gives a zero chord; a chord that overflows belongs to a q
    # below r / m, where np.where below takes the even split instead.
    with np.errstate(divide="ignore", over="ignore"):
        chord = -r * np.exp(np.log(-log_ndtr(y_q)) - log_q)
    # Beyond q the envelope is f itself at the even split r / m (convex there).
    with np.errstate(divide="ignore"):
        log_even = np.log(r) - np.log(m)
    even = m * log_ndtr((top - log_even) / sigma + nodes[None, :])
    out = np.where(log_even <= log_q, chord, even)
    return np.where(r > 0, out, 0.0)


def _tail_ceiling(rows: TopKRows, sl: slice, sigma: float, nodes: np.ndarray) -> np.ndarray:
    """Upper bound of sum_unseen log Phi(G_i / sigma + u) per (row, node): m f(r / m), or 0 where unproven.

    With x = (l_top - log p) / sigma + u and lambda = phi / Phi, f'(p) = -lambda(x) / (sigma p) and
    f''(p) <= 0 iff x + lambda(x) >= sigma. The tangent at r / m bounds f on [0, p_k] when f is
    concave there and the tangent is above f(p_k) (module docstring).
    """
    from scipy.special import log_ndtr

    r = rows.tail_mass[sl, None]
    m = rows.unseen[sl, None].astype(np.float64)
    top = rows.top_logprob[sl, None]
    with np.errstate(divide="ignore"):
        p = r / m
        x = (top - np.log(p)) / sigma + nodes[None, :]
    f = m * log_ndtr(x)  # the even split's sum
    lam = np.exp(-0.5 * x * x - 0.5 * np.log(2 * np.pi) - log_ndtr(x))
    concave = x + lam >= sigma
    p_k = np.exp(top - rows.floor_gap[sl, None])
    f_k = log_ndtr(rows.floor_gap[sl, None] / sigma + nodes[None, :])
    # Tangent at p: f(p) + f'(p) (p_k - p) >= f(p_k), with a hair of slack for rounding.
    above = log_ndtr(x) - lam / (sigma * p) * (p_k - p) >= f_k + 1e-12 * np.abs(f_k)
    ok = (r > 0) & (p <= p_k) & concave & above & np.isfinite(f)
    return np.where(ok, f, 0.0)


# --- Extremal tails: the bounds as agreements of tails the log allows --------------------------

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


_SEARCH_NODES, _SEARCH_WEIGHTS = _rule(SEARCH_STEP)


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
    per_row = max(1, _CHUNK_ELEMENTS // ((width + 1 + 3 * SEARCH_POINTS) * _NODES.size))
    for start in range(0, n, per_row):
        sl = slice(start, min(n, start + per_row))
        seen = log_ndtr(rows.gaps[sl, :, None] / s + _NODES[None, None, :]).sum(axis=1)
        env_lo = np.exp(seen + _tail_floor(rows, sl, s, y_star, _NODES)) @ _WEIGHTS
        env_hi = np.exp(seen + _tail_ceiling(rows, sl, s, _NODES)) @ _WEIGHTS
        top, r = rows.top_logprob[sl], rows.tail_mass[sl]
        m = rows.unseen[sl].astype(np.float64)
        p_k = np.exp(top - rows.floor_gap[sl])
        ends = [Tails(*(np.asarray(g, dtype=np.float64).copy() for g in _high_family(nu, r, m, p_k)))
                for nu in _high_range(r, m, p_k)[::-1]]  # the vertex and the even split
        end_vals = [np.exp(seen + _tail_sum(top, _groups(e), s, _NODES)) @ _WEIGHTS for e in ends]
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
                found = np.exp(seen[need] + _tail_sum(top[need], _groups(found_tails), s, _NODES)) @ _WEIGHTS
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


def agreement_bounds(rows: TopKRows, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-row lower and upper bounds of pi(sigma) over every tail consistent with the row.

    Parameters
    ----------
    rows : TopKRows
    sigma : float >= 0

    Returns
    -------
    lower, upper : ndarray of shape (n_rows,)
        Each attained by a tail the log allows (:func:`extremal_tails`), so no
        method that sees the same log can certify a narrower band.

    Notes
    -----
    Eq. top1-exact of Proposition 1 with the unseen classes bounded as in the
    module docstring.
    """
    s = float(as_sigmas(sigma)[0])
    if s == 0.0:
        ones = np.where(rows.gaps[:, 0] > 0, 1.0, 0.5) if rows.gaps.shape[1] else np.ones(rows.n_rows)
        return ones.copy(), ones
    lower, upper, _, _ = extremal_tails(rows, s)
    return lower, upper


def mean_agreement_bounds(rows: TopKRows, sigma) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the mean agreement over the rows at each sigma (means of the per-row bounds).

    Returns
    -------
    lower, upper : ndarray of shape (n_sigma,)
    """
    sig = as_sigmas(sigma)
    lo, hi = np.empty(sig.size), np.empty(sig.size)
    for j, s in enumerate(sig):
        a, b = agreement_bounds(rows, float(s))
        lo[j], hi[j] = a.mean(), b.mean()
    return lo, hi


def bound_value(rows: TopKRows, sigma: float, *, side: str) -> float:
    """The mean bound a side inverts: lower (at-least), upper (at-most), their midpoint (point).

    Parameters
    ----------
    rows : TopKRows
    sigma : float
        >= 0.
    side : {"at-least", "at-most", "point"}

    Returns
    -------
    float

    Raises
    ------
    KeyError
        An unknown ``side``.
    ValueError
        An invalid sigma.

    Notes
    -----
    Bounds on the mean of Eq. ``top1-exact`` with the unseen classes bounded.
    """
    lo, hi = mean_agreement_bounds(rows, sigma)
    which = SIDE_BOUND[side]
    return float(lo[0] if which == "lower" else hi[0] if which == "upper" else 0.5 * (lo[0] + hi[0]))


def sigma_for_agreement_bound(rows: TopKRows, target: float, *, side: str = "at-least",
                              rel_tol: float = 1e-6, guess: float | None = None) -> float:
    """The sigma at which the side's bound of the mean agreement equals ``target``.

    Parameters
    ----------
    rows : TopKRows
    target : float in (0, 1)
    side : {"at-least", "at-most", "point"}, default "at-least"
        at-least inverts the lower bound and returns a sigma at which the lower
        bound is checked to be >= target, so the true agreement there is at
        least the target; at-most inverts the upper bound and returns a sigma
        where it is checked to be <= target; point inverts the midpoint of the
        two bounds.
    rel_tol : float, default 1e-6
        Relative tolerance of Brent's method on sigma.
    guess : float, optional
        A sigma near the answer (from a curve on a grid): the first bracket is 5% around it.

    Returns
    -------
    sigma : float > 0

    Raises
    ------
    ValueError
        An unknown side, a target outside (0, 1), or one the bound never
        reaches (above its value near sigma = 0 or below its floor).
    """
    if side not in SIDE_BOUND:
        raise ValueError(f"side must be one of {tuple(SIDE_BOUND)}, got {side!r}")
    if not 0.0 < target < 1.0:
        raise ValueError(f"agreement target must be in (0, 1), got {target!r}")

    memo: dict[float, float] = {}

    def value(s: float) -> float:
        if s not in memo:  # Brent's method revisits its bracket's ends
            memo[s] = bound_value(rows, s, side=side)
        return memo[s]

    # As sigma -> 0 every bound tends to the share of rows with a unique top (a tie keeps 1/2).
    ceiling = float(np.mean(np.where(rows.gaps[:, 0] > 0, 1.0, 0.5)))
    if target >= ceiling:
        raise ValueError(f"agreement target {target:g} is above the {SIDE_BOUND[side]} bound at every "
                         f"sigma (ties at the top of some rows cap agreement at {ceiling:.4g})")
    if guess is not None:
        a, b = guess / 1.05, guess * 1.05
    else:
        positive = rows.gaps[np.isfinite(rows.gaps) & (rows.gaps > 0)]
        a = b = float(np.median(positive))
    for _ in range(60):  # bracket: value(a) >= target > value(b)
        if value(a) >= target:
            break
        b, a = a, a / 4.0
    else:
        raise ValueError(f"agreement target {target:g} is above the {SIDE_BOUND[side]} bound at every "
                         f"sigma down to {a:.3g}")
    for _ in range(60):
        if b > a and value(b) < target:
            break
        a, b = max(a, b), max(a, b) * 4.0
    else:
        raise ValueError(f"agreement target {target:g} is below the {SIDE_BOUND[side]} bound at every "
                         f"sigma up to {b:.3g}")
    from scipy.optimize import brentq

    root = float(brentq(lambda s: value(s) - target, a, b, xtol=1e-12, rtol=rel_tol))
    # Keep the side's promise at the sigma returned (Brent stops within rel_tol of the crossing).
    if side == "at-least":
        while value(root) < target:
            root *= 1.0 - rel_tol
    elif side == "at-most":
        while value(root) > target:
            root *= 1.0 + rel_tol
    return root
