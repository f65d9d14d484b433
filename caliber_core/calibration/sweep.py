"""Monte-Carlo noise sweep: accuracy and agreement under N(0, sigma^2) logit noise.

One pass for every sigma at once. For one input and one draw xi ~ N(0, I_K), the noisy argmax is
class c iff sigma * (xi_j - xi_c) < z_c - z_j = g_j for all j, so the set of sigma at which c wins
is an interval (lo, hi):

* j with g_j > 0 and xi_j > xi_c bound sigma from above by g_j / (xi_j - xi_c);
* j with g_j < 0 (c trails j) need xi_j < xi_c and bound sigma from below.

Computing (lo, hi) per (input, draw) takes one pass over the K classes; then A(sigma) = mean
1[lo < sigma < hi] for any sigma, with common random numbers across the whole grid (a smooth,
monotone-in-expectation curve). Agreement is the same with c = clean argmax (lo = 0).

Draws for large K come from a pool of standard-normal rows (:class:`.draws.DrawSource`), each
input's rows read at one random cyclic offset: each vector is still i.i.d. N(0, 1), each input uses
distinct pool rows, and far fewer normals are generated (otherwise the dominant cost). The pool is
filled and the inputs' chunks run on threads, with the same numbers for any thread count. Inputs do
share pool rows (up to ``POOL_MAX_REUSE`` times), and draws sharing a row are correlated, so the
standard errors treat each pool row as one independent block: given the rows and shifts drawn, the
estimate is a sum of independent per-row terms, whose variances are estimated from each row's
residuals about its inputs' own means (:func:`block_stderr`). tests/test_sweep.py checks the curves
against a plain argmax Monte Carlo (:mod:`caliber_core.simulation.reference`),
tests/test_mc_stderr.py the standard error against the spread over seeds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .draws import DrawSource, available_cores, roll_classes, survival_bounds
from .margins import chance_level, normalized_utility, sigma_from_v
from .sample import LogitSample

DEFAULT_REALIZATIONS = 64
#: dtype of the stored interval ends: 6e-8 relative rounding of a sigma at which one draw
#: flips, far below the Monte-Carlo error of any curve built from them.
ENDS_DTYPE = np.float32
_CHUNK_ELEMENTS = 1 << 20  # draws per chunk: ~4 MB of float32, stays in cache


@dataclass(frozen=True, kw_only=True)
class SurvivalIntervals:
    """Per (input, draw) sigma-intervals on which the prediction survives.

    Attributes
    ----------
    agree_hi : ndarray (n_samples, realizations)
        Noisy argmax equals the clean argmax iff sigma < agree_hi.
    acc_lo, acc_hi : ndarray (n_samples, realizations) or None
        Noisy argmax equals the label iff acc_lo < sigma < acc_hi
        (empty intervals are stored as lo = hi = 0). None without labels.
    pool_rows : ndarray (n_samples, realizations // 2) of int, or None
        The pool row each antithetic pair was read from, when draws share a
        pool; None when every pair is its own fresh vector.
    """

    agree_hi: np.ndarray
    acc_lo: np.ndarray | None
    acc_hi: np.ndarray | None
    n_classes: int
    seed: int | None
    pool_rows: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        """N, the inputs swept."""
        return self.agree_hi.shape[0]

    @property
    def realizations(self) -> int:
        """R, the draws per input."""
        return self.agree_hi.shape[1]

    @property
    def has_labels(self) -> bool:
        """Whether the accuracy intervals were computed (labels were given)."""
        return self.acc_hi is not None

    # Sorted endpoints, computed once: every curve evaluation is then a binary search.
    @cached_property
    def _agree_sorted(self) -> np.ndarray:
        return np.sort(self.agree_hi, axis=None)

    @cached_property
    def _acc_sorted(self) -> tuple[np.ndarray, np.ndarray]:
        return np.sort(self.acc_lo, axis=None), np.sort(self.acc_hi, axis=None)

    def agreement(self, sigma) -> np.ndarray:
        """Monte-Carlo mean agreement at each sigma."""
        return _fraction_inside(None, self._agree_sorted, sigma)

    def accuracy(self, sigma) -> np.ndarray:
        """Monte-Carlo accuracy at each sigma (ValueError when the sweep had no labels)."""
        if not self.has_labels:
            raise ValueError("accuracy needs labels; the sweep was run without them")
        return _fraction_inside(*self._acc_sorted, sigma)

    def guide(self, quantity: str) -> Callable[[np.ndarray], np.ndarray]:
        """The curve a search over many sigmas reads: :meth:`accuracy` or :meth:`agreement` (instant here)."""
        if quantity not in ("accuracy", "agreement"):
            raise ValueError(f"quantity must be 'accuracy' or 'agreement', got {quantity!r}")
        return self.accuracy if quantity == "accuracy" else self.agreement

    def accuracy_stderr(self, sigma) -> np.ndarray:
        """Standard error of :meth:`accuracy` from the noise alone (inputs fixed); ValueError without labels."""
        if not self.has_labels:
            raise ValueError("accuracy needs labels; the sweep was run without them")
        return np.array([block_stderr((self.acc_lo < s) & (s < self.acc_hi), self.pool_rows)
                         for s in _positive(sigma)])

    def agreement_stderr(self, sigma, *, rows: np.ndarray | None = None) -> np.ndarray:
        """Standard error of :meth:`agreement` from the noise alone.

        With ``rows`` (a boolean mask) it is the error of the sum of those rows'
        agreement divided by all N (the corridor's floor).
        """
        hi, pool = self.agree_hi, self.pool_rows
        if rows is None:
            return np.array([block_stderr(s < hi, pool) for s in _positive(sigma)])
        hi, pool = hi[rows], (None if pool is None else pool[rows])
        if hi.shape[0] == 0:
            return np.zeros(_positive(sigma).shape)
        share = hi.shape[0] / self.n_samples
        return np.array([block_stderr(s < hi, pool) * share for s in _positive(sigma)])


def _positive(sigma) -> np.ndarray:
    # sigma = 0 is the clean limit sigma -> 0+; the open interval (lo, hi)
    # would otherwise miscount the empty (0, 0) intervals there.
    s = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    return np.maximum(s, np.finfo(np.float64).tiny)


def block_stderr(inside: np.ndarray, pool_rows: np.ndarray | None = None) -> float:
    """Noise-only standard error of the mean of an (N, R) indicator of antithetic draws.

    Column r and column r + R/2 are the pair (xi, -xi), read from one vector. Given which vectors
    were drawn, the mean is a sum of independent terms, one per vector: one per pair with fresh
    draws (``pool_rows`` None), one per pool row when pairs share rows (``pool_rows[i, r]`` names
    the row of pair r of input i). Each term's variance is estimated by its squared residual about
    the inputs' own means, times half / (half - 1) for the mean being estimated from the same R/2
    pairs.

    Returns
    -------
    float
    """
    n, r = inside.shape
    half = r // 2
    # A block of rows at a time: the float64 pair sums and residuals of all N rows at once
    # would be 16 bytes per draw pair, more than the sweep's own arrays.
    rows = max(1, _CHUNK_ELEMENTS // max(1, half))
    total = 0.0
    per_row = None if pool_rows is None else np.zeros(int(pool_rows.max()) + 1 if pool_rows.size else 0)
    for start in range(0, n, rows):
        block = inside[start:start + rows]
        # Pair counts and row sums in integers (exact, as float64 sums of 0/1 are): a third of the time.
        counts = block.view(np.uint8) if block.dtype == np.bool_ else block.astype(np.uint8)
        pair = counts[:, :half] + counts[:, half:]
        resid = pair.astype(np.float64) - pair.sum(axis=1, dtype=np.int64, keepdims=True) / half
        if pool_rows is None:
            total += float(np.sum(resid**2))
        else:
            per_row += np.bincount(pool_rows[start:start + rows].ravel(), weights=resid.ravel(),
                                   minlength=per_row.size)
    if per_row is not None:
        total = float(np.dot(per_row, per_row))
    correction = half / (half - 1) if half > 1 else 1.0
    return float(np.sqrt(total * correction) / (n * 2 * half))


def _fraction_inside(lo_sorted, hi_sorted, sigma) -> np.ndarray:
    """Fraction of intervals (lo, hi) containing each sigma, from sorted endpoints (lo None: all 0)."""
    s = _positive(sigma)
    n = hi_sorted.size
    above_lo = n if lo_sorted is None else _count_below(lo_sorted, s)
    # lo == hi == 0 marks an empty interval: it is counted by both terms and cancels.
    below_hi = _count_at_most(hi_sorted, s)
    return (above_lo - below_hi) / n


def _count_below(ends: np.ndarray, s: np.ndarray) -> np.ndarray:
    """How many of the sorted ``ends`` are < each float64 ``s``, exactly, searched in their own dtype.

    ``searchsorted`` of float64 values in a float32 array would first copy the whole array
    to float64 (twice its size). x < s for a float32 x iff x < the smallest float32 >= s.
    """
    if ends.dtype == np.float64:
        return np.searchsorted(ends, s, side="left")
    with np.errstate(over="ignore"):
        up = s.astype(ends.dtype)
    low = up.astype(np.float64) < s
    up[low] = np.nextafter(up[low], np.inf)
    return np.searchsorted(ends, up, side="left")


def _count_at_most(ends: np.ndarray, s: np.ndarray) -> np.ndarray:
    """How many of the sorted ``ends`` are <= each float64 ``s`` (x <= s iff x <= the largest float32 <= s)."""
    if ends.dtype == np.float64:
        return np.searchsorted(ends, s, side="right")
    with np.errstate(over="ignore"):
        down = s.astype(ends.dtype)
    high = down.astype(np.float64) > s
    down[high] = np.nextafter(down[high], -np.inf)
    return np.searchsorted(ends, down, side="right")


# Draws that cost about a second here: below it, more draws are nearly free precision.
CHEAP_ELEMENTS = 120_000_000
MAX_REALIZATIONS = 256
#: Bytes the sweep holds per input and draw: three float32 ends and their sorted copies.
BYTES_PER_DRAW = 6 * np.dtype(ENDS_DTYPE).itemsize
#: What extra (cheap) draws may hold: this many bytes per logit element, or the floor below.
DRAWS_BYTES_PER_ELEMENT = 12
DRAWS_MEMORY_FLOOR = 256 << 20


def default_realizations(
    n_samples: int, n_classes: int | None = None, *, target_stderr: float = 0.0012
) -> int:
    """Draws per input: enough for a noise standard error of ``target_stderr``, more when cheap.

    The worst case per input is p(1-p) = 1/4, so R = 1 / (4 N se^2): a 2,000-row file needs 87
    draws, a 50,000-row file 8 (a floor). Antithetic pairs only lower the error further. When N x R
    x K stays under ``CHEAP_ELEMENTS`` the draws are raised to that budget (at most 256), so small
    files get a finer curve at no noticeable cost, as long as the sweep's arrays
    (:data:`BYTES_PER_DRAW` per input and draw) stay within ``max(DRAWS_MEMORY_FLOOR,
    DRAWS_BYTES_PER_ELEMENT x N x K)``: at K = 2 the extra draws would otherwise cost hundreds of
    bytes per logit.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``n_samples < 1``.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    r = int(np.ceil(0.25 / (n_samples * target_stderr**2)))
    if n_classes is not None:
        cheap = CHEAP_ELEMENTS // (n_samples * n_classes)
        affordable = max(DRAWS_MEMORY_FLOOR, DRAWS_BYTES_PER_ELEMENT * n_samples * n_classes) // (
            BYTES_PER_DRAW * n_samples)
        r = max(r, min(cheap, affordable))
    return int(np.clip(r, 8, MAX_REALIZATIONS))


def survival_intervals(
    logits,
    labels=None,
    *,
    realizations: int = DEFAULT_REALIZATIONS,
    seed: int | None = 0,
    progress: Callable[[float], None] | None = None,
) -> SurvivalIntervals:
    """Survival intervals for every input and draw (see the module docstring).

    Parameters
    ----------
    logits : LogitSample, or array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
        Only with raw logits (a sample carries its own).
    realizations : int, default 64
        Noise draws per input, in antithetic pairs (xi, -xi); an odd count is
        rounded up to even.
    seed : int or None, default 0
        Same seed, same numbers.
    progress : callable, optional
        Called with the fraction done in [0, 1].
    """
    sample = LogitSample.of(logits, labels)
    z, y = sample.logits, sample.labels
    n, k = z.shape
    if isinstance(realizations, bool) or not isinstance(realizations, (int, np.integer)):
        raise TypeError(f"realizations must be an int, got {realizations!r}")
    if realizations < 1:
        raise ValueError(f"realizations must be >= 1, got {realizations}")
    # Draws come in antithetic pairs (xi, -xi): half the normals, and the pair's
    # survival events are negatively correlated, so no precision is lost.
    realizations += realizations % 2
    rng = np.random.default_rng(seed)
    pred = sample.pred
    draws = DrawSource(rng, n, k, realizations // 2)

    # float32 ends: half the memory of the sweep's largest arrays (and of their sorted copies).
    # A sigma is compared with them in float64 (``_positive``), so a stored calibration, whose
    # arrays are float64 copies of the same values, gives the same counts.
    agree_hi = np.empty((n, realizations), dtype=ENDS_DTYPE)
    acc_lo = acc_hi = None
    if y is not None:
        acc_lo = np.zeros((n, realizations), dtype=ENDS_DTYPE)
        acc_hi = np.empty((n, realizations), dtype=ENDS_DTYPE)
        wrong = pred != y
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // (realizations // 2 * k))
    starts = range(0, n, rows_per_chunk)

    def chunk(start, drawn):
        stop = min(n, start + rows_per_chunk)
        xi, shifts = drawn
        zc, ref, lab = z[start:stop], pred[start:stop], None if y is None else y[start:stop]
        if shifts is not None:  # pooled rows come unshifted: roll the classes instead
            zc, ref = roll_classes(zc, ref, shifts)
            lab = None if lab is None else (lab + shifts) % k
        if y is not None:
            w = np.nonzero(wrong[start:stop])[0]
            if w.size:  # before the agreement overwrites xi; xi[w] is a copy
                lo, hi = survival_bounds(xi[w], zc[w], lab[w], overwrite=True)
                acc_lo[start + w] = lo
                acc_hi[start + w] = hi
        agree_hi[start:stop] = survival_bounds(xi, zc, ref, overwrite=True)[1]
        if y is not None:
            right = np.ones(stop - start, dtype=bool)
            right[w] = False
            acc_hi[start:stop][right] = agree_hi[start:stop][right]
        return stop

    workers = _workers(len(starts)) if draws.pooled else 1
    if workers == 1:
        for start in starts:
            stop = chunk(start, draws.take(start, min(n, start + rows_per_chunk)))
            if progress is not None:
                progress(stop / n)
    else:
        # The draws are taken in order on this thread (the same numbers as one thread),
        # and the chunks' work runs on the others: numpy releases the GIL in it.
        # At most two chunks per thread in flight: their draws are the memory the sweep holds.
        in_flight = deque()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for start in starts:
                drawn = draws.take(start, min(n, start + rows_per_chunk))
                in_flight.append(pool.submit(chunk, start, drawn))
                while len(in_flight) >= 2 * workers or (start == starts[-1] and in_flight):
                    stop = in_flight.popleft().result()
                    if progress is not None:
                        progress(stop / n)
    return SurvivalIntervals(agree_hi=agree_hi, acc_lo=acc_lo, acc_hi=acc_hi, n_classes=k, seed=seed,
                             pool_rows=draws.pool_rows_used)


def _workers(n_chunks: int) -> int:
    """Threads for the pooled sweep: the cores this process may use, at most 8 and one per chunk."""
    return max(1, min(available_cores(), 8, n_chunks))


@dataclass(frozen=True, kw_only=True)
class NoiseSweep:
    """Accuracy and agreement on a sigma grid, with the normalized axes.

    Attributes
    ----------
    sigma, v : ndarray (n_points,)
        Noise scales and v = sigma^2 / S^2.
    accuracy, accuracy_se : ndarray or None
        Monte-Carlo accuracy and its standard error (None without labels).
    agreement, agreement_se : ndarray
    utility : ndarray or None
        Normalized utility A~ (Eq. util-norm).
    """

    sigma: np.ndarray
    v: np.ndarray
    accuracy: np.ndarray | None
    accuracy_se: np.ndarray | None
    agreement: np.ndarray
    agreement_se: np.ndarray
    utility: np.ndarray | None
    scale: float
    clean_accuracy: float | None
    n_classes: int
    realizations: int
    seed: int | None


def sweep_from_intervals(
    intervals: SurvivalIntervals,
    *,
    scale: float,
    clean_accuracy: float | None,
    v_grid=None,
) -> NoiseSweep:
    """Evaluate the intervals on a v grid (default :func:`default_v_grid`); A~ is Eq. ``util-norm``.

    Returns
    -------
    NoiseSweep

    Raises
    ------
    ValueError
        A non-positive scale, a negative v, or A0 not above chance.
    """
    if v_grid is None:
        v_grid = default_v_grid(intervals, scale=scale, clean_accuracy=clean_accuracy)
    v = np.asarray(v_grid, dtype=np.float64)
    sigma = sigma_from_v(v, scale)
    agreement = intervals.agreement(sigma)
    agreement_se = intervals.agreement_stderr(sigma)
    accuracy = accuracy_se = utility = None
    if intervals.has_labels and clean_accuracy is not None:
        accuracy = intervals.accuracy(sigma)
        accuracy_se = intervals.accuracy_stderr(sigma)
        utility = normalized_utility(accuracy, clean=clean_accuracy, n_classes=intervals.n_classes)
    return NoiseSweep(
        sigma=sigma, v=v, accuracy=accuracy, accuracy_se=accuracy_se, agreement=agreement,
        agreement_se=agreement_se, utility=utility, scale=scale, clean_accuracy=clean_accuracy,
        n_classes=intervals.n_classes, realizations=intervals.realizations, seed=intervals.seed,
    )


def default_v_grid(
    intervals: SurvivalIntervals,
    *,
    scale: float,
    clean_accuracy: float | None,
    n_points: int = 40,
    floor: float = 0.03,
) -> np.ndarray:
    """A log-spaced v grid spanning the whole transition.

    Starts where the curve is still at its head (A~ > 0.99, or v = 1e-3) and extends until the
    normalized utility (agreement when there are no labels) has fallen to ``floor`` of its range.

    Returns
    -------
    ndarray of shape (n_points,)
    """
    chance = chance_level(intervals.n_classes)

    def level(v):
        s = sigma_from_v(v, scale)
        if intervals.has_labels and clean_accuracy is not None and clean_accuracy > chance:
            return (intervals.accuracy(s) - chance) / (clean_accuracy - chance)
        return (intervals.agreement(s) - chance) / (1 - chance)

    v_lo = 1e-3
    while v_lo > 1e-8 and level(v_lo)[0] < 0.99:
        v_lo /= 10
    v_hi = 1.0
    while v_hi < 1e6 and level(v_hi)[0] > floor:
        v_hi *= 2
    return np.geomspace(v_lo, v_hi, n_points)
