"""Node-by-node bounds of an unseen tail's contribution, proven without a search (top-k logs).

At each quadrature node u of Eq. top1-exact the unseen classes contribute
sum_i f(p_i), f(p) = log Phi((l_top - log p) / sigma + u), over the tails
{0 <= p_i <= p_k, sum p_i = r} the log allows (:mod:`.topk_rows`).
:mod:`.topk_tails` searches the tails that attain the bounds and never takes a
searched value past these.

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

import numpy as np

from .topk_rows import TopKRows


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


def tail_floor(rows: TopKRows, sl: slice, sigma: float, y_star: float, nodes: np.ndarray) -> np.ndarray:
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


def tail_ceiling(rows: TopKRows, sl: slice, sigma: float, nodes: np.ndarray) -> np.ndarray:
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
