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


# The pool is filled in this many blocks, each from its own child generator, on as many
# threads as there are cores: the same numbers whatever the number of threads.
POOL_BLOCKS = 8


def fill_normals(out: np.ndarray, rng: np.random.Generator, *, workers: int | None = None) -> None:
    """Fill a 2-D float32 array with standard normals from ``POOL_BLOCKS`` children of ``rng``.

    The same numbers for any number of threads: block i always comes from child i.

    Parameters
    ----------
    out : ndarray of float32, shape (rows, K)
        Filled in place.
    rng : numpy.random.Generator
        Spawns the children (advancing its spawn counter).
    workers : int, optional
        Threads; default :func:`available_cores`.
    """
    children = rng.spawn(POOL_BLOCKS)
    bounds = np.linspace(0, out.shape[0], POOL_BLOCKS + 1).astype(int)

    def fill(i):
        children[i].standard_normal(out=out[bounds[i]:bounds[i + 1]], dtype=np.float32)

    workers = available_cores() if workers is None else workers
    if workers <= 1:
        for i in range(POOL_BLOCKS):
            fill(i)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, POOL_BLOCKS)) as threads:
        list(threads.map(fill, range(POOL_BLOCKS)))  # numpy releases the GIL while it draws


def available_cores() -> int:
    """Cores this process may run on."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class DrawSource:
    """Standard-normal draws of shape (rows, r, K), reproducible for a generator.

    ``r`` is the number of vectors per input (half the realizations: each
    vector also serves its antithetic twin). Pooled, input i reads r distinct
    pool rows, base_i + t stride_i (mod P, t < r) with a random base and a random
    stride (P is prime, so they never repeat, and two inputs share only the few
    rows where their progressions cross), each cyclically shifted by one random
    offset s_i: class j gets pool[row, (j + s_i) mod K]. The rows are
    returned unshifted (a plain copy of whole rows), with the offsets: the
    caller rolls the input's logits by s_i instead, which pairs every class
    with the same normal and costs K numbers per input instead of r K.

    Parameters
    ----------
    rng : numpy.random.Generator
    n : int
        Inputs to draw for.
    k : int
        Classes K; from ``POOL_MIN_CLASSES`` on, draws come from a pool.
    r : int
        Vectors per input.
    """

    def __init__(self, rng: np.random.Generator, n: int, k: int, r: int):
        self.rng, self.k, self.r = rng, k, r
        self.pool = None
        self.pool_rows_used = None
        if k >= POOL_MIN_CLASSES:
            self.pool_rows_used = np.empty((n, r), dtype=np.int32)
            rows = max(r, POOL_ELEMENTS // k, min(-(-n * r // POOL_MAX_REUSE), POOL_MAX_ELEMENTS // k))
            self.n_pool = _next_prime(rows)
            self.pool = np.empty((self.n_pool, k), dtype=np.float32)
            fill_normals(self.pool, rng)

    @property
    def pooled(self) -> bool:
        """Whether draws come from the shared pool (K >= ``POOL_MIN_CLASSES``)."""
        return self.pool is not None

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Draws (rows, r, K) for inputs [start, stop) and each input's offset (None: fresh draws).

        Parameters
        ----------
        start, stop : int
            The input range; pooled rows used are recorded in ``pool_rows_used``.

        Returns
        -------
        xi : ndarray of float32, shape (stop - start, r, K)
        shifts : ndarray of int, shape (stop - start,), or None
        """
        rows = stop - start
        if self.pool is None:
            return self.rng.standard_normal((rows, self.r, self.k), dtype=np.float32), None
        # Distinct pool rows within one input: an arithmetic progression modulo a prime.
        base = self.rng.integers(0, self.n_pool, size=(rows, 1))
        stride = self.rng.integers(1, self.n_pool, size=(rows, 1))
        used = (base + stride * np.arange(self.r)[None, :]) % self.n_pool
        self.pool_rows_used[start:stop] = used
        shifts = self.rng.integers(0, self.k, size=rows)
        return np.take(self.pool, used, axis=0), shifts


def _next_prime(n: int) -> int:
    """The smallest prime >= n (n is a few thousand: trial division is instant)."""
    candidate = max(2, int(n))
    while any(candidate % d == 0 for d in range(2, int(candidate**0.5) + 1)):
        candidate += 1
    return candidate


def roll_classes(z: np.ndarray, classes: np.ndarray, shifts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logits and class indices with class j moved to column (j + s) mod K, per row.

    Parameters
    ----------
    z : ndarray of shape (rows, K)
    classes : ndarray of int, shape (rows,)
    shifts : ndarray of int, shape (rows,)

    Returns
    -------
    z_rolled : ndarray of shape (rows, K)
    classes_rolled : ndarray of int, shape (rows,)
    """
    k = z.shape[1]
    cols = (np.arange(k)[None, :] - shifts[:, None]) % k
    return np.take_along_axis(z, cols, axis=1), (classes + shifts) % k


def survival_bounds(xi: np.ndarray, z: np.ndarray, ref: np.ndarray, *,
                    overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per draw: class ``ref`` is the noisy argmax iff lo < sigma < hi.

    With d_j = xi_j - xi_c and w_j = d_j / g_j, a class the reference leads
    (g_j > 0) caps sigma at 1 / w_j when w_j > 0, and a class ahead of it
    (g_j < 0) needs w_j > 0 and then floors sigma at 1 / w_j. So
    hi = 1 / max_{g>0} w and lo = 1 / min_{g<0} w. The antithetic draw -xi
    flips w, so its interval comes from the same array (max <-> -min).

    Parameters
    ----------
    xi : ndarray of float32, shape (rows, r, K)
        Standard-normal draws.
    z : ndarray of shape (rows, K)
        Logits.
    ref : ndarray of int, shape (rows,)
        The reference class per row (clean argmax or label).
    overwrite : bool, default False
        Use the float32 ``xi`` as the work array (no 4 MB allocation per
        chunk), leaving it holding w.

    Returns
    -------
    lo, hi : ndarray of float64, shape (rows, 2 r)
        The r draws of ``xi``, then their r antithetic twins; empty intervals are (0, 0).
    """
    rows = np.arange(z.shape[0])
    gaps = z[rows, ref][:, None] - z
    gaps[rows, ref] = np.inf  # the reference itself: w = 0, neutral everywhere
    leads = gaps > 0
    inv = _inverse_gaps(gaps)
    xi_ref = xi[rows, :, ref][:, :, None]
    w = np.subtract(xi, xi_ref, out=xi if overwrite and xi.dtype == np.float32 else None)
    w *= inv[:, None, :]
    trails = ~leads
    if not trails.any():
        # Every class trails the reference (the usual case): no floor, one cap per sign.
        return np.zeros((z.shape[0], 2 * xi.shape[1])), _caps_to_hi(w.max(axis=2), -w.min(axis=2))
    # Caps: classes the reference leads; setting w to 0 on the others is absorbed by the caps'
    # floor of 0, so plain max and min over all K give the masked ones (masked reductions are
    # several times slower in numpy).
    lead_mask = leads[:, None, :]
    w_cap = np.where(lead_mask, w, np.float32(0))
    cap = _caps(w_cap.max(axis=2), -w_cap.min(axis=2))
    # Floors: the classes ahead of the reference; +inf (for the min) and -inf (for the max)
    # rule out the leads.
    w_trail = np.where(lead_mask, np.float32(np.inf), w)
    floor_min = w_trail.min(axis=2)
    np.negative(w_trail, out=w_trail, where=lead_mask)
    floor = np.concatenate([floor_min, -w_trail.max(axis=2)], axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        hi = np.where(cap > 0, 1.0 / cap, np.inf)
        lo = np.where(np.isfinite(floor) & (floor > 0), 1.0 / floor, 0.0)
    empty = (floor <= 0) | (lo >= hi)
    lo[empty] = 0.0
    hi[empty] = 0.0
    return lo, hi


def _caps(cap_plus: np.ndarray, cap_minus: np.ndarray) -> np.ndarray:
    return np.maximum(np.concatenate([cap_plus, cap_minus], axis=1), np.float32(0)).astype(np.float64)


def _inverse_gaps(gaps: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        inv = (1.0 / gaps).astype(np.float32)
    inv[gaps == 0] = TIE
    return inv


def _caps_to_hi(cap_plus: np.ndarray, cap_minus: np.ndarray) -> np.ndarray:
    cap = np.concatenate([cap_plus, cap_minus], axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        return np.where(cap > 0, 1.0 / cap, np.inf)
