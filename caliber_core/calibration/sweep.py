"""Monte-Carlo noise sweep: accuracy and agreement under N(0, sigma^2) logit noise.

One pass for every sigma at once. For one input and one draw xi ~ N(0, I_K),
the noisy argmax is class c iff sigma * (xi_j - xi_c) < z_c - z_j = g_j for all
j, so the set of sigma at which c wins is an interval (lo, hi):

* j with g_j > 0 and xi_j > xi_c bound sigma from above by g_j / (xi_j - xi_c);
* j with g_j < 0 (c trails j) need xi_j < xi_c and bound sigma from below.

Computing (lo, hi) per (input, draw) takes one pass over the K classes; then
A(sigma) = mean 1[lo < sigma < hi] for any sigma, with common random numbers
across the whole grid (a smooth, monotone-in-expectation curve). Agreement is
the same with c = clean argmax (lo = 0).

Draws for large K come from a pool of standard-normal rows read at random
cyclic offsets: every vector is still i.i.d. N(0, 1) (a permutation of i.i.d.
normals), each input's draws use distinct pool rows, and generating normals
is what dominates the cost otherwise. tests/test_sweep.py checks the result
against the straightforward argmax Monte Carlo
(:mod:`caliber_core.simulation.reference`) within its standard error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..validation import as_labels, as_logits
from .margins import chance_level, normalized_utility, sigma_from_v

DEFAULT_REALIZATIONS = 64
# Above this many classes the draws come from a shifted pool (see module docstring).
POOL_MIN_CLASSES = 64
POOL_ELEMENTS = 4_000_000       # at least this many normals in the pool...
POOL_MAX_ELEMENTS = 32_000_000  # ...and at most this many (128 MB of float32)
# Each pool row serves about this many (input, draw) pairs at most, read at
# different offsets; more reuse measurably inflates the spread across seeds.
POOL_MAX_REUSE = 16
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
    """

    agree_hi: np.ndarray
    acc_lo: np.ndarray | None
    acc_hi: np.ndarray | None
    n_classes: int
    seed: int | None

    @property
    def n_samples(self) -> int:
        return self.agree_hi.shape[0]

    @property
    def realizations(self) -> int:
        return self.agree_hi.shape[1]

    @property
    def has_labels(self) -> bool:
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
        """Monte-Carlo accuracy at each sigma."""
        if not self.has_labels:
            raise ValueError("accuracy needs labels; the sweep was run without them")
        return _fraction_inside(*self._acc_sorted, sigma)

    def accuracy_stderr(self, sigma) -> np.ndarray:
        """Standard error of :meth:`accuracy` from the noise alone (inputs fixed)."""
        if not self.has_labels:
            raise ValueError("accuracy needs labels; the sweep was run without them")
        return np.array([_paired_stderr((self.acc_lo < s) & (s < self.acc_hi)) for s in _positive(sigma)])

    def agreement_stderr(self, sigma) -> np.ndarray:
        """Standard error of :meth:`agreement` from the noise alone."""
        return np.array([_paired_stderr(s < self.agree_hi) for s in _positive(sigma)])


def _positive(sigma) -> np.ndarray:
    # sigma = 0 is the clean limit sigma -> 0+; the open interval (lo, hi)
    # would otherwise miscount the empty (0, 0) intervals there.
    s = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    return np.maximum(s, np.finfo(np.float64).tiny)


def _paired_stderr(inside: np.ndarray) -> float:
    """Noise-only standard error of the mean of an (N, R) indicator of antithetic draws.

    Column r and column r + R/2 are the pair (xi, -xi); pairs are independent,
    so per input Var = Var(pair mean) / (R/2), estimated from the pairs, and
    the mean over N inputs has variance sum_i Var_i / N^2.
    """
    n, r = inside.shape
    half = r // 2
    pair = 0.5 * (inside[:, :half].astype(np.float64) + inside[:, half:])
    p = pair.mean(axis=1)
    var = np.maximum(np.mean(pair**2, axis=1) - p**2, 0.0)
    return float(np.sqrt(np.sum(var) / half) / n)


def _fraction_inside(lo_sorted, hi_sorted, sigma) -> np.ndarray:
    """Fraction of intervals (lo, hi) containing each sigma, from sorted endpoints.

    ``lo_sorted`` None means every interval starts at 0.
    """
    s = _positive(sigma)
    n = hi_sorted.size
    above_lo = n if lo_sorted is None else np.searchsorted(lo_sorted, s, side="left")
    # lo == hi == 0 marks an empty interval: it is counted by both terms and cancels.
    below_hi = np.searchsorted(hi_sorted, s, side="right")
    return (above_lo - below_hi) / n


# Draws that cost about a second here: below it, more draws are nearly free precision.
CHEAP_ELEMENTS = 120_000_000
MAX_REALIZATIONS = 256


def default_realizations(
    n_samples: int, n_classes: int | None = None, *, target_stderr: float = 0.0012
) -> int:
    """Draws per input: enough for a noise standard error of ``target_stderr``, more when cheap.

    The worst case per input is p(1-p) = 1/4, so R = 1 / (4 N se^2): a
    2,000-row file needs 87 draws, a 50,000-row file 8 (a floor). Antithetic
    pairs only lower the error further. When N x R x K stays
    under ``CHEAP_ELEMENTS`` the draws are raised to that budget (at most 256),
    so small files get a finer curve at no noticeable cost.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    r = int(np.ceil(0.25 / (n_samples * target_stderr**2)))
    if n_classes is not None:
        r = max(r, CHEAP_ELEMENTS // (n_samples * n_classes))
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
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
    realizations : int, default 64
        Noise draws per input, in antithetic pairs (xi, -xi); an odd count is
        rounded up to even.
    seed : int or None, default 0
        Same seed, same numbers.
    progress : callable, optional
        Called with the fraction done in [0, 1].
    """
    z = as_logits(logits)
    n, k = z.shape
    if isinstance(realizations, bool) or not isinstance(realizations, (int, np.integer)):
        raise TypeError(f"realizations must be an int, got {realizations!r}")
    if realizations < 1:
        raise ValueError(f"realizations must be >= 1, got {realizations}")
    y = None if labels is None else as_labels(labels, n_samples=n, n_classes=k)
    # Draws come in antithetic pairs (xi, -xi): half the normals, and the pair's
    # survival events are negatively correlated, so no precision is lost.
    realizations += realizations % 2
    rng = np.random.default_rng(seed)
    pred = np.argmax(z, axis=1)
    draws = _DrawSource(rng, n, k, realizations // 2)

    agree_hi = np.empty((n, realizations), dtype=np.float64)
    acc_lo = acc_hi = None
    if y is not None:
        acc_lo = np.zeros((n, realizations))
        acc_hi = np.empty((n, realizations))
        wrong = pred != y
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // (realizations // 2 * k))
    for start in range(0, n, rows_per_chunk):
        stop = min(n, start + rows_per_chunk)
        xi = draws.take(start, stop)  # (rows, R/2, K) float32
        zc = z[start:stop]
        agree_hi[start:stop] = _intervals(xi, zc, pred[start:stop])[1]
        if y is not None:
            acc_hi[start:stop] = agree_hi[start:stop]
            w = np.nonzero(wrong[start:stop])[0]
            if w.size:
                lo, hi = _intervals(xi[w], zc[w], y[start:stop][w])
                acc_lo[start + w] = lo
                acc_hi[start + w] = hi
        if progress is not None:
            progress(stop / n)
    return SurvivalIntervals(agree_hi=agree_hi, acc_lo=acc_lo, acc_hi=acc_hi, n_classes=k, seed=seed)


class _DrawSource:
    """Standard-normal draws of shape (rows, r, K), reproducible for a generator."""

    def __init__(self, rng: np.random.Generator, n: int, k: int, r: int):
        # r here is the number of draws generated: half the realizations (antithetic pairs).
        self.rng, self.k, self.r = rng, k, r
        self.pool = None
        if k >= POOL_MIN_CLASSES:
            rows = max(r, POOL_ELEMENTS // k, min(-(-n * r // POOL_MAX_REUSE), POOL_MAX_ELEMENTS // k))
            pool = rng.standard_normal((rows, k), dtype=np.float32)
            self.pool = np.concatenate([pool, pool], axis=1)  # read [s, s+K) cyclically
            self.windows = np.lib.stride_tricks.sliding_window_view(self.pool, k, axis=1)

    def take(self, start: int, stop: int) -> np.ndarray:
        rows = stop - start
        if self.pool is None:
            return self.rng.standard_normal((rows, self.r, self.k), dtype=np.float32)
        n_pool = self.pool.shape[0]
        # Distinct pool rows within one input (consecutive from a random base).
        base = self.rng.integers(0, n_pool, size=(rows, 1))
        pool_rows = (base + np.arange(self.r)[None, :]) % n_pool
        shifts = self.rng.integers(0, self.k, size=(rows, self.r))
        return self.windows[pool_rows, shifts]


# Stands in for 1/g on a class tied with the reference (g = 0): finite in float32,
# so w = d * _TIE is hugely positive when d < 0 (no bound) and negative otherwise
# (the tie is lost at every sigma).
_TIE = np.float32(-1e30)


def _intervals(xi: np.ndarray, z: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per draw: class ``ref`` is the noisy argmax iff lo < sigma < hi.

    With d_j = xi_j - xi_c and w_j = d_j / g_j, a class the reference leads
    (g_j > 0) caps sigma at 1 / w_j when w_j > 0, and a class ahead of it
    (g_j < 0) needs w_j > 0 and then floors sigma at 1 / w_j. So
    hi = 1 / max_{g>0} w and lo = 1 / min_{g<0} w. The antithetic draw -xi
    flips w, so its interval comes from the same array (max <-> -min).

    Returns (lo, hi) of shape (rows, 2 r): the r draws of ``xi``, then their
    r antithetic twins. Empty intervals are (0, 0).
    """
    rows = np.arange(z.shape[0])
    gaps = z[rows, ref][:, None] - z
    gaps[rows, ref] = np.inf  # the reference itself: w = 0, neutral everywhere
    leads = gaps > 0
    with np.errstate(divide="ignore"):
        inv = (1.0 / gaps).astype(np.float32)
    inv[gaps == 0] = _TIE
    w = xi - xi[rows, :, ref][:, :, None]
    w *= inv[:, None, :]
    trails = ~leads
    if not trails.any():
        # Every class trails the reference (the usual case): no floor, one cap per sign.
        cap = np.concatenate([w.max(axis=2), -w.min(axis=2)], axis=1).astype(np.float64)
        with np.errstate(divide="ignore"):
            return np.zeros_like(cap), np.where(cap > 0, 1.0 / cap, np.inf)
    lead_mask, trail_mask = leads[:, None, :], trails[:, None, :]
    cap = np.concatenate([w.max(axis=2, where=lead_mask, initial=0.0),
                          -w.min(axis=2, where=lead_mask, initial=0.0)], axis=1).astype(np.float64)
    floor = np.concatenate([w.min(axis=2, where=trail_mask, initial=np.inf),
                            -w.max(axis=2, where=trail_mask, initial=-np.inf)], axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        hi = np.where(cap > 0, 1.0 / cap, np.inf)
        lo = np.where(np.isfinite(floor) & (floor > 0), 1.0 / floor, 0.0)
    empty = (floor <= 0) | (lo >= hi)
    lo[empty] = 0.0
    hi[empty] = 0.0
    return lo, hi


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
    """Evaluate the intervals on a v grid (default :func:`default_v_grid`)."""
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

    Starts where the curve is still at its head (A~ > 0.99, or v = 1e-3) and
    extends until the normalized utility (agreement when there are no labels)
    has fallen to ``floor`` of its range.
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
