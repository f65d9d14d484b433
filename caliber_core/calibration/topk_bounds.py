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

The log's rows are :mod:`.topk_rows`; the tails that attain both bounds and
the proof that they are extremal, :mod:`.topk_tails`; the node-by-node bounds
that screen the search, :mod:`.topk_node_bounds`.
"""

from __future__ import annotations

import numpy as np

from ..validation import as_sigmas
from .topk_node_bounds import worst_slope_point
from .topk_rows import BOUND_STEP, U_MAX, TopKRows
from .topk_tails import Tails, extremal_tails

__all__ = ["BOUND_STEP", "SIDE_BOUND", "U_MAX", "Tails", "TopKRows", "agreement_bounds", "bound_value",
           "extremal_tails", "mean_agreement_bounds", "sigma_for_agreement_bound", "worst_slope_point"]

SIDE_BOUND = {"at-least": "lower", "at-most": "upper", "point": "midpoint"}


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
