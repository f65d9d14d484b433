"""Certified bounds of a reduction's mean agreement, accuracy and retention, and the sigma that meets a target.

The reduced rows (:mod:`.vocab_stream`) bracket the full vocabulary's
agreement and (with labels) expected accuracy: the classes far below the top,
which cannot win, enter only through the bounds (:func:`row_bounds`). The side
picks the bound: lower for at-least, upper for at-most, the midpoint for point.
"""

from __future__ import annotations

import numpy as np

from .accuracy_bounds import accuracy_row_bounds
from .gap_histogram import ReducedRows, row_bounds
from .vocab_stream import SUBSET_ROWS, subset

_BOUND = {"at-least": 0, "at-most": 1}

KINDS = ("agreement", "accuracy", "retention")


def mean_bounds(reduced: ReducedRows, sigma: float, kind: str = "agreement") -> tuple[float, float]:
    """Lower and upper bound of the mean agreement, expected accuracy or retention at sigma.

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
        >= 0.
    kind : {"agreement", "accuracy", "retention"}, default "agreement"
        The last two need a reduction with labels; retention is accuracy / A0.

    Returns
    -------
    lower, upper : float

    Raises
    ------
    ValueError
        An invalid sigma, an unknown kind, or accuracy without labels.

    Notes
    -----
    Means of the per-row bounds on Eq. ``top1-exact`` (:func:`row_bounds`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind != "agreement" and not reduced.has_labels:
        raise ValueError(f"{kind} targets need labels; this reduction has none")
    b = bounds_at(reduced, sigma, agreement=kind == "agreement")
    if kind == "agreement":
        return float(b.agree_lo.mean()), float(b.agree_hi.mean())
    scale = 1.0 if kind == "accuracy" else 1.0 / clean_accuracy(reduced)
    return float(b.acc_lo.mean()) * scale, float(b.acc_hi.mean()) * scale


_CACHE: list = []  # the last few (reduction, sigma, bounds): a target's record reads its solve's last sigma
_CACHE_SIZE = 8

#: Trapezoid spacing of an unlabelled reduction's agreement bounds: 54 nodes on [-8, 8] instead of
#: 81, a third fewer normal CDFs per evaluation. Against a 4x finer rule, on llm-like rows, the sigma
#: that meets a target moves by < 2e-5 relative for targets down to 0.01 and by < 1e-7 from 0.5 up
#: (the bar is 2e-4), a row's bound by < 5e-5 (tests/test_full_vocab_agreement_search.py; the
#: quadrature column of docs/figures/full_vocab.md). Labelled reductions keep the default rule.
AGREEMENT_STEP = 0.3


def quadrature_step(reduced: ReducedRows) -> float | None:
    """The trapezoid spacing the bounds of this reduction use (None: :func:`row_bounds`' default)."""
    return None if reduced.has_labels else AGREEMENT_STEP


def bounds_at(reduced: ReducedRows, sigma: float, *, agreement: bool = True):
    """:func:`row_bounds` at sigma, the last few evaluations on the same reduction kept.

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
    agreement : bool, default True
        False: the accuracy rows only, each on its own window of nodes
        (:func:`.accuracy_bounds.accuracy_row_bounds`); True: :func:`row_bounds`.

    Returns
    -------
    RowBounds
    """
    s = float(sigma)
    for red, at, full, b in _CACHE:
        if red is reduced and at == s and (full or not agreement):
            return b
    step = quadrature_step(reduced)  # None: labelled, where accuracy-only passes take their own windows
    if step is not None:
        b = row_bounds(reduced, s, step=step)
    else:
        b = row_bounds(reduced, s) if agreement else accuracy_row_bounds(reduced, s)
    _CACHE.append((reduced, s, agreement or not reduced.has_labels, b))
    del _CACHE[:-_CACHE_SIZE]
    return b


def clean_accuracy(reduced: ReducedRows) -> float:
    """A0, the share of rows whose clean argmax is the label.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        A reduction without labels.
    """
    if not reduced.has_labels:
        raise ValueError("the clean accuracy needs labels; this reduction has none")
    return float(np.mean(reduced.correct))


def side_value(lo: float, hi: float, side: str) -> float:
    """The bounds' midpoint for ``side="point"``, else the bound that keeps the side's promise."""
    return 0.5 * (lo + hi) if side == "point" else (lo, hi)[_BOUND[side]]


def guess_sigma(grid, lower, upper, target: float, *, side: str = "point") -> float | None:
    """sigma where a curve measured on a grid crosses ``target`` (log-linear), or None outside it.

    Parameters
    ----------
    grid : ndarray of float > 0, increasing
    lower, upper : sequence of float
        The curve's bounds at each grid point.
    target : float
    side : {"point", "at-least", "at-most"}, default "point"
        Which curve: the bounds' midpoint, the lower bound or the upper bound.

    Returns
    -------
    float or None
        None when the curve is already below ``target`` at the first point or never falls below it.

    Raises
    ------
    KeyError
        An unknown ``side``.
    """
    values = np.array([side_value(a, b, side) for a, b in zip(lower, upper)])
    below = np.flatnonzero(values < target)
    if below.size == 0 or below[0] == 0:
        return None
    j = int(below[0])
    x0, x1, y0, y1 = np.log(grid[j - 1]), np.log(grid[j]), values[j - 1], values[j]
    return float(np.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0)))


def sigma_for_agreement(reduced: ReducedRows, target: float, *, side: str = "point",
                        rel_tol: float = 1e-5, guess: float | None = None) -> float:
    """sigma at which the side's bound of the mean agreement equals ``target`` (:func:`sigma_for`).

    Returns
    -------
    float
    """
    return sigma_for(reduced, target, kind="agreement", side=side, rel_tol=rel_tol, guess=guess)


#: How far past the median margin a target is sought before it is called out of reach.
SEARCH_REACH = 1e4


def sigma_for(reduced: ReducedRows, target: float, *, kind: str = "agreement", side: str = "point",
              rel_tol: float = 1e-5, guess: float | None = None, slope: float | None = None) -> float:
    """sigma at which the side's bound of the mean ``kind`` equals ``target`` (Brent's method).

    ``guess`` (from :func:`guess_sigma` on evenly spaced rows) starts a 3% bracket,
    so the full rows are evaluated a few times only.

    Parameters
    ----------
    reduced : ReducedRows
    target : float
        Agreement or accuracy in (0, 1); retention > 0 (a fraction of A0).
    kind : {"agreement", "accuracy", "retention"}, default "agreement"
    side : {"point", "at-least", "at-most"}, default "point"
        The bounds' midpoint, or the bound that keeps the target.
    rel_tol : float, default 1e-5
        Brent's relative tolerance, and the step by which the root is moved to the side.
    guess : float, optional
        Without it, a large reduction is first solved on :func:`subset` rows.
    slope : float, optional
        d(side's value) / d sigma near ``guess`` (negative), for the first secant step.

    Returns
    -------
    float
        0 when the target asks for no degradation (accuracy >= A0, retention >= 1).

    Raises
    ------
    ValueError
        A target outside its range, one above the clean model's value (ties at the top),
        or one the curve does not reach before sigma = ``SEARCH_REACH`` x the median margin.

    Notes
    -----
    Eq. ``top1-exact`` inverted through its per-row bounds.
    """
    if kind == "agreement":
        if not 0.0 < target < 1.0:
            raise ValueError(f"agreement target must be in (0, 1), got {target!r}")
        ceiling = float(np.mean(np.where(reduced.top_gaps[:, 0] > 0, 1.0, 0.5)))
        if target >= ceiling:
            raise ValueError(f"agreement target {target:g} is above {ceiling:.4g}, the agreement as sigma -> 0 "
                             "(ties at the top of some rows)")
    else:
        a0 = clean_accuracy(reduced)
        if not (np.isfinite(target) and target > 0.0) or (kind == "accuracy" and target > 1.0):
            raise ValueError(f"{kind} target must be in (0, 1]{' (of A0)' if kind == 'retention' else ''}, "
                             f"got {target!r}")
        if target >= (a0 if kind == "accuracy" else 1.0):
            return 0.0

    memo: dict[float, float] = {}

    def gap(s: float) -> float:
        if s not in memo:  # brentq evaluates the bracket's ends again
            memo[s] = side_value(*mean_bounds(reduced, s, kind), side) - target
        return memo[s]

    positive = reduced.top_gaps[:, 0][reduced.top_gaps[:, 0] > 0]
    median = float(np.median(positive)) if positive.size else 1.0
    if guess is None and reduced.n_rows > 2 * SUBSET_ROWS:
        try:
            guess = sigma_for(subset(reduced), target, kind=kind, side=side, rel_tol=1e-3)
        except ValueError:
            guess = None  # the evenly spaced rows alone miss it: search the whole
        guess = guess or None
    root = _secant(gap, guess, rel_tol, slope, side) if guess is not None else None
    if root is None:
        root = _bracketed(gap, guess, median, rel_tol, kind, target, reduced.n_classes)
    # Keep the side's promise at the returned sigma (Brent returns a point within rel_tol).
    if side == "at-least":
        while gap(root) < 0:
            root *= 1 - rel_tol
    elif side == "at-most":
        while gap(root) > 0:
            root *= 1 + rel_tol
    return float(root)


def _secant(gap, guess: float, rel_tol: float, slope: float | None = None, side: str = "point",
            steps: int = 8) -> float | None:
    """The root by secant steps from a close guess (a few evaluations), or None when they stray.

    The curves are smooth and monotone in sigma and the guess comes from evenly
    spaced rows, so two or three steps reach ``rel_tol``. The sigma returned is
    one already evaluated (its bounds are cached for the record) whose next step
    would move it by at most ``rel_tol``, on the side's side of the target;
    anything else falls back to the bracketed search.
    """
    s0, f0 = guess, gap(guess)
    if slope is not None and slope < 0:
        s1 = min(max(guess - f0 / slope, guess / 1.1), guess * 1.1)
    else:
        s1 = guess * (1.01 if f0 > 0 else 1 / 1.01)  # the curves fall with sigma
    if s1 == s0:
        return s0 if _on_side(f0, side) else None
    for _ in range(steps):
        f1 = gap(s1)
        if f1 == f0:
            return None
        s2 = s1 - f1 * (s1 - s0) / (f1 - f0)
        if not (s2 > 0 and guess / 2 < s2 < guess * 2):
            return None
        if abs(s2 - s1) <= rel_tol * s1:
            if _on_side(f1, side):
                return s1
            s2 = s2 * (1 - rel_tol) if side == "at-least" else s2 * (1 + rel_tol)  # just past the root
        s0, f0, s1 = s1, f1, s2
    return None


def _on_side(f: float, side: str) -> bool:
    """Whether a point whose side value minus the target is ``f`` keeps the side's promise."""
    return side == "point" or (f >= 0 if side == "at-least" else f <= 0)


def _bracketed(gap, guess, median, rel_tol, kind, target, n_classes) -> float:
    """The root by Brent's method in a bracket grown from ``guess`` (3% around it) or the median margin."""
    from scipy.optimize import brentq

    a, b = (guess / 1.03, guess * 1.03) if guess is not None else (median, median)
    while gap(a) < 0:
        if a < 1e-9 * median:
            raise ValueError(f"{kind} target {target:g} is above what the clean model delivers as sigma -> 0 "
                             "(ties at the top of some rows)")
        a /= 3.0
    if b <= a:
        b = a * 3.0
    while gap(b) >= 0:
        if b > SEARCH_REACH * median:
            raise ValueError(f"{kind} target {target:g} is out of reach: it only falls towards chance "
                             f"1/K={1 / n_classes:.3g} and the bounds never cross it")
        a, b = b, b * 3.0
    return brentq(gap, a, b, xtol=1e-12, rtol=rel_tol)
