"""Noise draws for the sweep and the sigma-interval each draw survives on.

For one input, reference class c, and draw xi ~ N(0, I_K), class c is the
noisy argmax iff lo < sigma < hi (:func:`survival_bounds`). Draws for large K
come from a pool of standard-normal rows read at random cyclic offsets
(:class:`DrawSource`): every vector is still i.i.d. N(0, 1), each input's
draws use distinct pool rows, and generating normals is what dominates the
cost otherwise. Which pool row each draw came from is recorded: draws that
share a row are correlated, and the sweep's standard errors treat a pool row
as one block.
"""

from __future__ import annotations

import numpy as np

# Above this many classes the draws come from a shifted pool.
POOL_MIN_CLASSES = 64
POOL_ELEMENTS = 4_000_000       # at least this many normals in the pool...
POOL_MAX_ELEMENTS = 32_000_000  # ...and at most this many (128 MB of float32)
# Each pool row serves about this many (input, draw) pairs at most, read at
# different offsets; more reuse measurably inflates the spread across seeds.
POOL_MAX_REUSE = 16

# Stands in for 1/g on a class tied with the reference (g = 0): finite in float32,
# so w = d * TIE is hugely positive when d < 0 (no bound) and negative otherwise
# (the tie is lost at every sigma).
TIE = np.float32(-1e30)


class DrawSource:
    """Standard-normal draws of shape (rows, r, K), reproducible for a generator.

    ``r`` is the number of vectors per input (half the realizations: each
    vector also serves its antithetic twin).
    """

    def __init__(self, rng: np.random.Generator, n: int, k: int, r: int):
        self.rng, self.k, self.r = rng, k, r
        self.pool = None
        self.pool_rows_used = None
        if k >= POOL_MIN_CLASSES:
            self.pool_rows_used = np.empty((n, r), dtype=np.int32)
            rows = max(r, POOL_ELEMENTS // k, min(-(-n * r // POOL_MAX_REUSE), POOL_MAX_ELEMENTS // k))
            pool = rng.standard_normal((rows, k), dtype=np.float32)
            self.pool = np.concatenate([pool, pool], axis=1)  # read [s, s+K) cyclically
            self.windows = np.lib.stride_tricks.sliding_window_view(self.pool, k, axis=1)

    @property
    def pooled(self) -> bool:
        return self.pool is not None

    def locate(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Pool rows and shifts of inputs [start, stop): two (rows, r) int arrays (pool only)."""
        rows = stop - start
        n_pool = self.pool.shape[0]
        # Distinct pool rows within one input (consecutive from a random base).
        base = self.rng.integers(0, n_pool, size=(rows, 1))
        pool_rows = (base + np.arange(self.r)[None, :]) % n_pool
        self.pool_rows_used[start:stop] = pool_rows
        shifts = self.rng.integers(0, self.k, size=(rows, self.r))
        return pool_rows, shifts

    def gather(self, pool_rows: np.ndarray, shifts: np.ndarray) -> np.ndarray:
        """The full vectors at (pool_rows, shifts): shape pool_rows.shape + (K,)."""
        return self.windows[pool_rows, shifts]

    def take(self, start: int, stop: int) -> np.ndarray:
        """Full draws (rows, r, K) for inputs [start, stop)."""
        if self.pool is None:
            return self.rng.standard_normal((stop - start, self.r, self.k), dtype=np.float32)
        return self.gather(*self.locate(start, stop))


def survival_bounds(xi: np.ndarray, z: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    inv = _inverse_gaps(gaps)
    w = xi - xi[rows, :, ref][:, :, None]
    w *= inv[:, None, :]
    trails = ~leads
    if not trails.any():
        # Every class trails the reference (the usual case): no floor, one cap per sign.
        return np.zeros((z.shape[0], 2 * xi.shape[1])), _caps_to_hi(w.max(axis=2), -w.min(axis=2))
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


def _inverse_gaps(gaps: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        inv = (1.0 / gaps).astype(np.float32)
    inv[gaps == 0] = TIE
    return inv


def _caps_to_hi(cap_plus: np.ndarray, cap_minus: np.ndarray) -> np.ndarray:
    cap = np.concatenate([cap_plus, cap_minus], axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        return np.where(cap > 0, 1.0 / cap, np.inf)
