"""Certified per-row accuracy bounds of a labelled reduction, each row on its own window of nodes.

A row's expected accuracy (Eq. top1-exact with the label as the reference,
see :func:`.gap_histogram.row_bounds`) is

    a_i(sigma) = int phi(w + c_i) T_i(w) prod_{j != top, label} Phi(g_j / sigma + w) dw,

with c_i = 0 and T_i = 1 on a correct row, c_i = h_i / sigma and T_i = Phi(w)
(the top's own factor) on a wrong one. Every other factor lies in [0, 1], so
a node's term of the trapezoid sum is at most its weight times T_i: a row's
window is the run of nodes outside which that ceiling sums to at most
``WINDOW_MASS``. The sum on the window alone is a lower bound of the sum on all
of [-U_MAX, U_MAX] (:func:`.gap_histogram.row_bounds`'s), and adding the
ceiling's sum outside (exact, on the grid) an upper one. A wrong row's
integrand sits around w = -c_i / 2 and narrows as c_i grows: 35 to 45 nodes a
row instead of 81, every factor evaluated once, no masks. The sigma search of
an accuracy or retention target evaluates these bounds a dozen times.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..validation import as_sigmas
from .gap_histogram import (H_CUT, LABEL_IS_TOP, PHI_ONE, QUADRATURE_NODES, QUADRATURE_STEP, ReducedRows, RowBounds,
                            bin_edges, row_bounds)
from .survival import U_MAX

#: What a row may leave out of its trapezoid sum by skipping nodes (then added to its upper bound);
#: the same order as a far row's slack (Phi(-H_CUT / sqrt 2) = 1.6e-9).
WINDOW_MASS = 1e-9
_LENGTH_STEP = 8  # window lengths rounded up to a multiple of this: rows of one length are evaluated together
_ROWS_PER_CHUNK = 256  # 256 x 32 x 64 float64: 4 MB a chunk


_COUNTS: list = []  # (reduction, its counts as float32): a sigma search reads them a dozen times


def _float_counts(reduced: ReducedRows) -> np.ndarray:
    """The reduction's bin counts as float32 (exact below 2^24), converted once per reduction."""
    for red, counts in _COUNTS:
        if red is reduced:
            return counts
    counts = reduced.counts.astype(np.float32)
    _COUNTS.append((reduced, counts))
    del _COUNTS[:-2]
    return counts


def _windows(ceiling: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's run of nodes outside which its integrand's ceiling sums to at most ``mass``.

    Parameters
    ----------
    ceiling : ndarray (rows, nodes)
        An upper bound of each node's term of the trapezoid sum (unimodal along a row).
    mass : float

    Returns
    -------
    first : ndarray (rows,) int
        The window's first node.
    length : ndarray (rows,) int
        Its length, a multiple of ``_LENGTH_STEP`` (or every node).
    left_out : ndarray (rows,)
        The ceiling's sum over the nodes outside the window (exact, on the grid).
    """
    n_nodes = ceiling.shape[1]
    before = np.cumsum(ceiling, axis=1) - ceiling
    after = np.cumsum(ceiling[:, ::-1], axis=1)[:, ::-1] - ceiling
    lo = np.sum(before <= mass / 2, axis=1) - 1  # the last node with at most mass / 2 before it
    hi = n_nodes - np.sum(after <= mass / 2, axis=1)  # the first with at most mass / 2 after it
    length = np.minimum(n_nodes, -(-(hi - lo + 1) // _LENGTH_STEP) * _LENGTH_STEP)
    first = np.minimum(lo, n_nodes - length)
    inside = np.arange(n_nodes)[None, :]
    inside = (inside >= first[:, None]) & (inside < (first + length)[:, None])
    left_out = np.sum(np.where(inside, 0.0, ceiling), axis=1)
    return first, length, left_out


def accuracy_row_bounds(reduced: ReducedRows, sigma: float, *, window_mass: float = WINDOW_MASS) -> RowBounds:
    """Per-row lower and upper bounds of the expected accuracy at sigma, each row on its own window.

    Against :func:`.gap_histogram.row_bounds` on every node: the lower bound is at
    most its lower bound, and the upper bound at least its upper bound and at most
    ``window_mass`` above it.

    Parameters
    ----------
    reduced : ReducedRows
        With labels.
    sigma : float
        >= 0.
    window_mass : float, default ``WINDOW_MASS``
        What a row's window may leave out of its trapezoid sum (added to its upper bound).

    Returns
    -------
    RowBounds
        ``acc_lo`` and ``acc_hi`` for every row; the agreement bounds on the correct rows
        (where they are the accuracy), NaN on the wrong ones (as ``row_bounds(...,
        agreement=False)``).

    Raises
    ------
    ValueError
        A reduction without labels, or an invalid sigma.
    """
    from scipy.special import log_ndtr, ndtr

    if not reduced.has_labels:
        raise ValueError("accuracy bounds need labels; this reduction has none")
    s = float(as_sigmas(sigma)[0])
    if s == 0.0:
        return row_bounds(reduced, 0.0, agreement=False)
    n = reduced.n_rows
    correct = reduced.label_slots == LABEL_IS_TOP
    shift = np.where(correct, 0.0, reduced.label_gaps / s)  # c_i
    acc_lo, acc_hi = np.zeros(n), np.zeros(n)
    far = ~correct & (shift > H_CUT)
    acc_hi[far] = ndtr(-shift[far] / np.sqrt(2.0))  # the label must at least beat the top
    rows = np.flatnonzero(~far)
    # Tail bins at their lower and upper edges, on the whole grid (one matrix product), read per window.
    lower_edge, upper_edge = bin_edges()
    cut = (PHI_ONE + U_MAX) * s  # Phi == 1 in float64 beyond, on every node
    live = int(np.searchsorted(lower_edge, cut))  # the edges ascend: the live bins are the first ones
    counts = _float_counts(reduced)[:, :live]
    hi_edges = np.where(np.isfinite(upper_edge[:live]), upper_edge[:live], 1e300)
    tails = [(counts @ log_ndtr(e[:, None] / s + QUADRATURE_NODES[None, :]).astype(np.float32))[rows].astype(np.float64)
             for e in (lower_edge[:live], hi_edges)]
    # A node's term is its weight (times Phi(w) on a wrong row) times factors in [0, 1]: that is its ceiling.
    end_weights = np.ones(QUADRATURE_NODES.size)
    end_weights[[0, -1]] = 0.5
    weight = ((QUADRATURE_STEP / np.sqrt(2 * np.pi)) * end_weights
              * np.exp(-0.5 * (QUADRATURE_NODES[None, :] + shift[rows, None]) ** 2))
    ceiling = weight * np.where(correct[rows, None], 1.0, ndtr(QUADRATURE_NODES)[None, :])
    first, length, left_out = _windows(ceiling, window_mass)
    lo, hi = np.empty(rows.size), np.empty(rows.size)

    def chunk(part: np.ndarray) -> None:
        """Rows (positions in ``rows``) whose windows have one length."""
        r = rows[part]
        idx = first[part, None] + np.arange(int(length[part[0]]))[None, :]
        g = reduced.top_gaps[r]
        # Gaps whose factor is Phi == 1.0 (float64) on every node of the row's window need no evaluation.
        k = max(1, int(np.max(np.sum(g * (1.0 / s) + QUADRATURE_NODES[idx[:, 0], None] < PHI_ONE, axis=1))))
        x = g[:, :k, None] * (1.0 / s) + QUADRATURE_NODES[idx][:, None, :]
        slots = reduced.label_slots[r]
        own = np.flatnonzero((slots >= 0) & (slots < k))
        x[own, slots[own], :] = np.inf  # a wrong row's label leaves the product (Phi(inf) = 1)
        ndtr(x, out=x)
        head = np.prod(x, axis=1) * np.take_along_axis(ceiling[part], idx, axis=1)
        for out, tail in ((lo, tails[0]), (hi, tails[1])):
            out[part] = np.sum(head * np.exp(np.take_along_axis(tail[part], idx, axis=1)), axis=1)

    parts = []
    lo[length == 0] = hi[length == 0] = 0.0  # the whole row's ceiling is within the window mass: left_out bounds it
    for size in np.unique(length[length > 0]):
        same = np.flatnonzero(length == size)
        parts += [same[a : a + _ROWS_PER_CHUNK] for a in range(0, same.size, _ROWS_PER_CHUNK)]
    workers = min(len(parts), os.cpu_count() or 1)
    if workers <= 1:
        for part in parts:
            chunk(part)
    else:  # numpy lets go of the interpreter lock in the row work: one thread per core, same numbers
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(chunk, parts))
    acc_lo[rows] = lo
    acc_hi[rows] = hi + left_out
    acc_lo, acc_hi = np.clip(acc_lo, 0.0, 1.0), np.clip(acc_hi, 0.0, 1.0)
    agree_lo, agree_hi = np.full(n, np.nan), np.full(n, np.nan)
    agree_lo[correct], agree_hi[correct] = acc_lo[correct], acc_hi[correct]
    return RowBounds(agree_lo, agree_hi, acc_lo, acc_hi)
