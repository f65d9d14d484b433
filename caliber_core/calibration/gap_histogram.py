"""Full-vocabulary rows reduced to what agreement needs: the top gaps exactly, the rest as a histogram.

The agreement of one row (Eq. top1-exact) depends on its gaps g_j = z_top - z_j
only through prod_j Phi(g_j / sigma + u). A row of V = 128,000 logits is
reduced, in one pass, to

* its ``m`` smallest gaps, exactly (they carry nearly all of the sigma
  dependence: keeping only these is off by ~0.05% in sigma at m = 32);
* a histogram of every other gap over fixed bins whose edges are float32
  values: a gap's bin is its float32 bit pattern shifted right by
  ``SHIFT`` bits, so the bins are geometric (``2 ** (23 - SHIFT)`` per octave,
  relative width 1.1% at SHIFT = 17) and the binning is one integer shift, no
  logarithm.

Phi is increasing, so each bin's product lies between Phi(lower edge / sigma + u)
and Phi(upper edge / sigma + u) to the power of its count: the reduced row gives
a lower and an upper bound of pi(sigma), the gap between them set by the tail
(already a small share) times the bin's relative width. The quadrature then
costs (rows x m + rows x bins) per node instead of rows x V.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..validation import as_sigmas
from . import bound_kernel
from .survival import U_MAX

TOP_GAPS = 32
#: ``label_slots`` values: the label is the clean argmax, or its gap was taken out of the histogram.
LABEL_IS_TOP, LABEL_BINNED = -2, -1
SHIFT = 17
#: Gaps below 2 ** LOW_EXP share one bin [0, 2 ** LOW_EXP); gaps of 2 ** HIGH_EXP and more one [2 ** HIGH_EXP, inf).
LOW_EXP, HIGH_EXP = -12, 8
_PHI_ONE = 8.3  # ndtr(x) == 1.0 in float64 for x above
_STEP = 0.2
_NODES = np.arange(-U_MAX, U_MAX + _STEP / 2, _STEP)
_WEIGHTS = np.full(_NODES.shape, _STEP) * np.exp(-0.5 * _NODES**2) / np.sqrt(2 * np.pi)
#: The quadrature grid and where ndtr reaches 1.0, shared with the accuracy kernel (accuracy_bounds).
PHI_ONE, QUADRATURE_STEP, QUADRATURE_NODES = _PHI_ONE, _STEP, _NODES
_WEIGHTS[[0, -1]] *= 0.5


def _bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.int32)) >> SHIFT


_LO_BIN, _HI_BIN = _bits(2.0**LOW_EXP), _bits(2.0**HIGH_EXP)
N_BINS = _HI_BIN - _LO_BIN + 2  # bin 0: [0, 2^LOW); last: [2^HIGH, inf)
#: Raw bins (a gap's float32 bits >> SHIFT): those below LO_BIN fold into bin 0, those from HI_BIN on into the last.
LO_BIN, HI_BIN = _LO_BIN, _HI_BIN
#: The lower edge of the raw bin after each raw bin (float32): bin(g) <= b exactly when g < _EDGE_ABOVE[b].
_EDGE_ABOVE = np.left_shift(np.arange(1, _HI_BIN + 2, dtype=np.int64), SHIFT).astype(np.int32).view(np.float32)


def bin_edges() -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper edges of every bin (float64 values of float32 bit patterns)."""
    inner = np.arange(_LO_BIN, _HI_BIN, dtype=np.int64)
    lo = np.left_shift(inner, SHIFT).astype(np.int32).view(np.float32).astype(np.float64)
    hi = np.left_shift(inner + 1, SHIFT).astype(np.int32).view(np.float32).astype(np.float64)
    lower = np.concatenate([[0.0], lo, [2.0**HIGH_EXP]])
    upper = np.concatenate([[2.0**LOW_EXP], hi, [np.inf]])
    return lower, upper


@dataclass
class ReducedRows:
    """Rows reduced by :func:`reduce_block` (appendable block by block).

    Attributes
    ----------
    top_gaps : ndarray of shape (n_rows, m), float64, ascending
        Each row's m smallest gaps to its top logit (the top itself excluded).
    counts : ndarray of shape (n_rows, N_BINS), int32
        How many of the other gaps fall in each bin of :func:`bin_edges` (the label's
        own gap excluded when labels were reduced: it is kept exactly in ``label_gaps``).
    n_classes : int
    label_gaps : ndarray of shape (n_rows,), float64, optional
        h_i = z_top - z_label >= 0 (0 on correct rows), exactly.
    label_slots : ndarray of shape (n_rows,), int32, optional
        Where the label's gap is: ``LABEL_IS_TOP`` (the clean argmax is the label),
        ``LABEL_BINNED`` (taken out of ``counts``) or its column in ``top_gaps``.
    """

    top_gaps: np.ndarray
    counts: np.ndarray
    n_classes: int
    label_gaps: np.ndarray | None = None
    label_slots: np.ndarray | None = None

    @property
    def has_labels(self) -> bool:
        """Whether each row's label was reduced with it (accuracy rows can be bounded)."""
        return self.label_gaps is not None

    @property
    def correct(self) -> np.ndarray | None:
        """c_i: the clean argmax is the label (None without labels)."""
        return None if self.label_slots is None else self.label_slots == LABEL_IS_TOP

    @property
    def n_rows(self) -> int:
        """Rows (inputs) held."""
        return int(self.top_gaps.shape[0])

    @property
    def elements(self) -> int:
        """Numbers held: what the element limit bounds for a streamed file."""
        return int(self.top_gaps.size + self.counts.size)


def reduce_block(block: np.ndarray, *, m: int = TOP_GAPS, labels: np.ndarray | None = None) -> tuple:
    """Top m gaps and the tail histogram of each row of a float32 block.

    Row by row, so that one row's gaps and bins (0.8 MB at V = 128,000) stay in
    cache while they are binned, counted and searched; the block itself is only read
    (it may be a read-only memory map).

    Parameters
    ----------
    block : ndarray of shape (n_rows, V), float32
        Not modified.
    m : int, default TOP_GAPS
    labels : ndarray of shape (n_rows,), int, optional
        Each row's label in [0, V) (checked by the caller). With them the label's
        gap is kept exactly and taken out of the histogram.

    Returns
    -------
    top_gaps : ndarray (n_rows, m) float64 ascending
    counts : ndarray (n_rows, N_BINS) int32
    label_gaps, label_slots : ndarray (n_rows,)
        Only with ``labels``: see :class:`ReducedRows`.

    Raises
    ------
    ValueError
        A row whose largest value is not finite (NaN anywhere in a row makes it so).
    """
    n, v = block.shape
    m = min(m, v - 1)
    top_gaps = np.empty((n, m))
    counts = np.empty((n, N_BINS), dtype=np.int32)
    label_gaps = np.empty(n) if labels is not None else None
    slots = np.empty(n, dtype=np.int32) if labels is not None else None
    gaps = np.empty(v, dtype=np.float32)
    # Bin indices straight into np.intp, the type np.bincount counts in: no cast, no copy of the row.
    bins = np.empty(v, dtype=np.intp)
    for i in range(n):
        z = block[i]
        if labels is None:
            top = z.max()  # a NaN anywhere makes it NaN; half the cost of argmax, whose index only labels need
        else:
            pred = int(z.argmax())  # the first largest, as the loader's argmax (a NaN is its own argmax)
            top = z[pred]
        if not np.isfinite(top):
            raise ValueError(f"row {i} holds NaN or +inf (every logit must be finite or -inf)")
        if top == 0.0:
            top = np.float32(0.0)  # -0.0 -> +0.0, so that a tie at a zero top has gap +0.0
        np.subtract(top, z, out=gaps)  # >= 0 (+inf for a -inf logit)
        # A gap's bin: its float32 bits >> SHIFT (geometric bins; gaps are >= +0.0, so the bits as int32
        # are >= 0). The bins from 2^HIGH_EXP on (+inf's included) are counted apart and summed into
        # one below: cheaper than clipping every gap's bin first.
        np.right_shift(gaps.view(np.int32), SHIFT, out=bins)
        raw = np.bincount(bins, minlength=_HI_BIN + 1)
        raw[_HI_BIN] = raw[_HI_BIN:].sum()
        raw = raw[: _HI_BIN + 1]
        # The m + 1 smallest gaps (the top's own 0 among them), exactly: every gap in a bin at or
        # below the one where the cumulative count reaches m + 1.
        threshold = int(np.searchsorted(np.cumsum(raw), m + 1))
        # A gap's bin is at most the threshold exactly when the gap is below the next bin's lower edge (its
        # bits are ordered as the gaps): a float32 comparison, half the bytes of the bins' one.
        near = gaps if threshold >= _HI_BIN else gaps[gaps < _EDGE_ABOVE[threshold]]  # the last bin: all past it
        values = np.sort(near)[: m + 1]
        top_gaps[i] = values[1:]  # the smallest is the top itself
        # Take the kept gaps (and the top's own) out of the histogram.
        np.subtract.at(raw, np.minimum(values.view(np.uint32) >> SHIFT, _HI_BIN), 1)
        if labels is not None:
            y = int(labels[i])
            h = gaps[y]
            label_gaps[i] = h
            if pred == y:
                slots[i] = LABEL_IS_TOP
            else:
                # A wrong row's label among the kept gaps: the first kept gap equal to h (equal gaps
                # are interchangeable in the product); otherwise its count leaves the histogram.
                pos = int(np.searchsorted(values[1:], h))
                if pos < m and values[1 + pos] == h:
                    slots[i] = pos
                else:
                    slots[i] = LABEL_BINNED
                    raw[min(int(h.view(np.uint32)) >> SHIFT, _HI_BIN)] -= 1
        counts[i, 0] = raw[:_LO_BIN].sum()
        counts[i, 1:] = raw[_LO_BIN:]
    if labels is None:
        return top_gaps, counts
    return top_gaps, counts, label_gaps, slots


def _rule(step: float) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.arange(-U_MAX, U_MAX + step / 2, step)
    weights = np.full(nodes.shape, step) * np.exp(-0.5 * nodes**2) / np.sqrt(2 * np.pi)
    weights[[0, -1]] *= 0.5
    return nodes, weights


def agreement_bounds(reduced: ReducedRows, sigma: float, *, step: float = _STEP) -> tuple[np.ndarray, np.ndarray]:
    """Per-row lower and upper bounds of pi(sigma) from the reduced rows (Eq. top1-exact).

    The top gaps enter exactly; each tail bin's count enters at its upper edge
    (upper bound) and its lower edge (lower bound), Phi being increasing.

    Returns
    -------
    lower, upper : ndarray of shape (n_rows,)
    """
    bounds = row_bounds(reduced, sigma, step=step, accuracy=False)
    return bounds.agree_lo, bounds.agree_hi


#: A wrong row whose label trails the top by more than this many sigma has accuracy
#: below Phi(-H_CUT / sqrt 2) = 1.6e-9 (the label must beat the top): bounded by that, not integrated.
H_CUT = 8.5


@dataclass(frozen=True)
class RowBounds:
    """Per-row bounds at one sigma (:func:`row_bounds`).

    Attributes
    ----------
    agree_lo, agree_hi : ndarray (n_rows,)
        pi_i(sigma), the clean argmax surviving.
    acc_lo, acc_hi : ndarray (n_rows,) or None
        a_i(sigma), the label winning; None without labels.
    """

    agree_lo: np.ndarray
    agree_hi: np.ndarray
    acc_lo: np.ndarray | None
    acc_hi: np.ndarray | None


def _float_counts(reduced: ReducedRows) -> np.ndarray:
    """``reduced.counts`` as float32 (exact: a count is below 2^24), made once and kept on the reduction.

    Every evaluation of :func:`row_bounds` multiplies them; converting them each time cost
    more than the product.
    """
    kept = reduced.__dict__.get("_float_counts")
    if kept is None or kept.shape != reduced.counts.shape:
        kept = reduced.counts.astype(np.float32)
        reduced.__dict__["_float_counts"] = kept
    return kept


def row_bounds(reduced: ReducedRows, sigma: float, *, step: float = _STEP,
               accuracy: bool = True, agreement: bool = True) -> RowBounds:
    """Per-row bounds of the agreement and, with labels, the accuracy at sigma (Eq. top1-exact).

    A wrong row's accuracy is the same integral with the label as the reference:
    substituting w = u - h / sigma (h the label's gap to the top),

        a_i(sigma) = int phi(w + h / sigma) Phi(w) prod_{j != top, label} Phi(g_j / sigma + w) dw,

    so it reads the same per-gap factors as the agreement, on the same nodes,
    with shifted Gaussian weights. The label's own factor is left out exactly;
    the top's, Phi(w), comes in, and bounds the integrand by Phi(-U_MAX) ~ 6e-16
    below the nodes, so they need no extension. The tail bins bound it from both
    sides as they bound the agreement. A row whose label trails by more than
    ``H_CUT`` sigma is bounded by [0, Phi(-h / (sigma sqrt 2))] (the label must beat the top).

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
        >= 0.
    step : float, default 0.2
        Trapezoid spacing.
    accuracy : bool, default True
        Also bound the accuracy rows (when the reduction has labels).
    agreement : bool, default True
        Bound every row's agreement; False (with labels) bounds it on the correct rows
        only, where it is their accuracy, and leaves the wrong rows' NaN.

    Returns
    -------
    RowBounds

    Raises
    ------
    ValueError
        An invalid sigma.
    """
    s = float(as_sigmas(sigma)[0])
    n = reduced.n_rows
    labelled = accuracy and reduced.has_labels
    if s == 0.0:
        one = np.where(reduced.top_gaps[:, 0] > 0, 1.0, 0.5)
        acc = reduced.correct.astype(np.float64) if labelled else None
        return RowBounds(one, one.copy(), acc, None if acc is None else acc.copy())
    nodes, weights = (_NODES, _WEIGHTS) if step == _STEP else _rule(step)
    if not reduced.has_labels and bound_kernel.available():
        return _compiled_agreement(reduced, s, nodes, weights)
    from scipy.special import log_ndtr, ndtr

    h_sig = None if not reduced.has_labels else reduced.label_gaps / s
    lower_edge, upper_edge = bin_edges()
    cut = (_PHI_ONE + U_MAX) * s  # Phi == 1 in float64 beyond, on every node
    live = lower_edge < cut
    every = np.arange(n)
    if labelled and not agreement:  # the rows an accuracy needs: correct ones and labels within H_CUT
        every = np.flatnonzero((reduced.label_slots == LABEL_IS_TOP) | (h_sig <= H_CUT))
    n_live = int(np.count_nonzero(live))  # the edges ascend: the live bins are the first ones
    if every.size == n:  # every row: the float32 counts made once per reduction, a view of the live bins
        counts = _float_counts(reduced)[:, :n_live]
    else:
        counts = reduced.counts[every][:, :n_live].astype(np.float32)  # float32 matmul: counts are exact
    lo_edge_log = log_ndtr(lower_edge[live, None] / s + nodes[None, :]).astype(np.float32)
    hi_edges = np.where(np.isfinite(upper_edge[live]), upper_edge[live], 1e300)
    hi_edge_log = log_ndtr(hi_edges[:, None] / s + nodes[None, :]).astype(np.float32)
    lower, upper = np.full(n, np.nan), np.full(n, np.nan)
    acc_lo = np.zeros(n) if labelled else None
    acc_hi = np.zeros(n) if labelled else None
    if labelled:
        far = (reduced.label_slots != LABEL_IS_TOP) & (h_sig > H_CUT)
        acc_hi[far] = ndtr(-h_sig[far] / np.sqrt(2.0))  # the label must at least beat the top
    per_chunk = max(1, 2_000_000 // (reduced.top_gaps.shape[1] * nodes.size))
    # As many chunks, of equal size: no thread idles on a short last one.
    per_chunk = max(1, -(-every.size // max(1, -(-every.size // per_chunk))))
    log_top = log_ndtr(nodes)  # the top's own factor in a wrong row's accuracy
    end_weights = np.ones(nodes.size)
    end_weights[[0, -1]] = 0.5

    def rows(a: int) -> None:
        b = min(every.size, a + per_chunk)
        r = every[a:b]  # the rows of this chunk; the tails are indexed by position a:b
        # Each chunk's tails in its own thread (float32 products: the counts are exact).
        lo_tail = (counts[a:b] @ lo_edge_log).astype(np.float64)
        hi_tail = (counts[a:b] @ hi_edge_log).astype(np.float64)
        g = reduced.top_gaps[r]
        k = max(1, int(np.max(np.sum(g < cut, axis=1))))
        x = g[:, :k, None] / s + nodes[None, None, :]
        live = x < _PHI_ONE  # Phi is 1.0 in float64 beyond: those factors need no evaluation
        if labelled and not agreement:
            # A wrong row's weight phi(u + h / sigma) is below phi(U_MAX) past u = U_MAX - h / sigma:
            # its factors there are left at 1 (the integrand moves by < 1e-14 of the weights' mass).
            skip = (reduced.label_slots[r] != LABEL_IS_TOP)[:, None] & (
                nodes[None, :] > U_MAX - h_sig[r][:, None])
            live &= ~skip[:, None, :]
        # Only the live entries evaluated (a third to two thirds of them near a target: the normal CDF
        # costs ten times the gather and scatter), the same values bit for bit.
        factors = np.ones(x.shape)
        factors[live] = ndtr(x[live])
        head = np.log(np.maximum(np.prod(factors, axis=1), 1e-300))
        agree = head
        if h_sig is not None:
            slots = reduced.label_slots[r]
            binned = np.flatnonzero(slots == LABEL_BINNED)
            if binned.size:  # a binned label left the histogram: its exact factor comes back
                agree = agree.copy()
                agree[binned] += log_ndtr(h_sig[r][binned, None] + nodes[None, :])
        lower[r] = np.exp(agree + lo_tail) @ weights
        upper[r] = np.exp(agree + hi_tail) @ weights
        if not labelled:
            return
        correct = slots == LABEL_IS_TOP
        if not agreement:
            lower[r[~correct]] = upper[r[~correct]] = np.nan
        acc_lo[r[correct]] = lower[r[correct]]
        acc_hi[r[correct]] = upper[r[correct]]
        hs = h_sig[r]
        near = np.flatnonzero(~correct & (hs <= H_CUT))
        if near.size == 0:
            return
        in_head = near[(slots[near] >= 0) & (slots[near] < k)]
        if in_head.size:  # the label's own factor leaves the product
            factors[in_head, slots[in_head], :] = 1.0
            head[in_head] = np.log(np.maximum(np.prod(factors[in_head], axis=1), 1e-300))
        w = step * end_weights * np.exp(-0.5 * (nodes[None, :] + hs[near, None]) ** 2) / np.sqrt(2 * np.pi)
        base = head[near] + log_top[None, :]
        acc_lo[r[near]] = np.sum(np.exp(base + lo_tail[near]) * w, axis=1)
        acc_hi[r[near]] = np.sum(np.exp(base + hi_tail[near]) * w, axis=1)

    starts = range(0, every.size, per_chunk)
    if len(starts) == 1:
        rows(0)
    else:  # chunks are independent and numpy releases the GIL: one thread per core, same numbers
        with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
            list(pool.map(rows, starts))
    clip = (lambda x: None if x is None else np.clip(x, 0.0, 1.0))
    return RowBounds(clip(lower), clip(upper), clip(acc_lo), clip(acc_hi))


def _compiled_agreement(reduced: ReducedRows, s: float, nodes: np.ndarray, weights: np.ndarray) -> RowBounds:
    """:func:`row_bounds` of a reduction without labels through :mod:`.bound_kernel` (no scipy, no temporaries)."""
    lower_edge, upper_edge = bin_edges()
    n_live = int(np.count_nonzero(lower_edge < (_PHI_ONE + U_MAX) * s))  # Phi == 1 beyond, on every node
    first, counts = _occupied_counts(reduced)
    live = slice(first, max(first, min(n_live, first + counts.shape[1])))  # occupied and not yet Phi == 1
    counts = counts[:, : live.stop - first]
    lo_table = bound_kernel.log_phi_table(lower_edge[live], s, nodes)
    hi_table = bound_kernel.log_phi_table(upper_edge[live], s, nodes)
    lower, upper = np.empty(reduced.n_rows), np.empty(reduced.n_rows)
    # A few chunks a core, none idling long; a small reduction (the display curve's rows, itself one thread
    # a sigma) in the calling thread: a pool's wake-ups cost more than its rows.
    workers = 1 if reduced.n_rows <= _INLINE_ROWS else os.cpu_count() or 1
    starts = np.linspace(0, reduced.n_rows, 2 * workers + 1 if workers > 1 else 2).astype(int)

    def rows(a: int, b: int) -> None:
        # float32 products of exact counts, then the kept gaps and the node sums in one compiled pass
        lower[a:b], upper[a:b] = bound_kernel.agreement_rows(reduced.top_gaps[a:b], s, nodes, weights, _PHI_ONE,
                                                             counts[a:b] @ lo_table, counts[a:b] @ hi_table)

    if workers == 1:
        rows(0, reduced.n_rows)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(rows, starts[:-1], starts[1:]))
    return RowBounds(np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), None, None)


#: Reductions of at most this many rows are bounded in the calling thread (:func:`_compiled_agreement`).
_INLINE_ROWS = 1000


def _occupied_counts(reduced: ReducedRows) -> tuple[int, np.ndarray]:
    """The first bin any row counts in, and float32 counts from it to the last such bin (kept on the reduction).

    A language model's gaps fill a few octaves of the histogram: on a 4,000 x 128,000 dump some 220 of
    its 1,282 bins, so the tails' products skip four fifths of zeros (a zero count adds exactly 0).
    """
    kept = reduced.__dict__.get("_occupied_counts")
    if kept is None or kept[1].shape[0] != reduced.n_rows:
        used = np.flatnonzero(reduced.counts.any(axis=0))
        first, stop = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 0)
        kept = (first, reduced.counts[:, first:stop].astype(np.float32))
        reduced.__dict__["_occupied_counts"] = kept
    return kept
