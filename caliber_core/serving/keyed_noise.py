"""One keyed, counter-based generator of standard normals, on numpy and on torch.

A draw is a pure function of (key, binding, level, row id, K): the same
numbers on numpy, on torch's CPU and on any torch device, because every step
is an integer operation or a correctly rounded float operation (+, -, *, and
exact conversions), never a library's log/exp/cos, whose last bits differ
between numpy, torch's CPU kernels and CUDA.

Derivation (domain :data:`DOMAIN`, bumped whenever any step changes):

1. Row id digest (host): ``d = SHA-256(id)``.
2. Row seed (host): the stream key
   ``k = HMAC-SHA256(key, DOMAIN || u64(len(binding)) || binding || u64(level) || u64(K))``
   (u64: 8 bytes big-endian), once per call and level, folds in everything
   that must separate two streams; then each row's seed is
   ``s = BLAKE2b(d, key=k, digest_size=8)`` read little-endian (keyed BLAKE2b
   is a MAC, and one call a row is the cheapest keyed hash in Python).
3. Bits (vectorized over rows and classes): class j of the row gets the
   64-bit word ``w = mix(s + j * GAMMA mod 2^64)``, SplitMix64's output
   function (a bijection of 64-bit words; a counter through it passes BigCrush).
4. Normal: the top bit of ``w`` is the sign; its low 52 bits ``v`` give
   ``a = 2v + 1`` and the two-sided tail probability ``q = a * 2^-53`` in (0, 1)
   (never 0 or 1, so no infinity). ``|x| = Phi^-1(1 - q/2)`` is evaluated by a
   piecewise polynomial (:mod:`.normal_table`): ``a``'s float64 exponent and the
   next 6 bits pick the piece, the remaining bits are the local coordinate ``t``
   in [0, 1), and Horner's rule with separate multiplies and adds (no fused
   multiply-add) gives |x|. Largest value: |x| at q = 2^-53, about 8.3.

The row seed is 64 bits: two (row, level) streams overlap in a stretch of
classes with probability about 2K / 2^64 per pair, far below anything a
thief can find or use. Knowing one row's noise (from a clean copy of that
row's logits) reveals that row's seed, never the key or any other row's.
"""

from __future__ import annotations

import base64
import math
import threading
from functools import lru_cache

import numpy as np

from . import normal_table
# Steps 1 and 2 (ids to row seeds) live in keyed_seeds; their names are this module's too.
from .keyed_seeds import DOMAIN, RowSeeder, checked_digests, encode_ids, joined_digests, row_digests, row_seeds

__all__ = ["DOMAIN", "MAX_ABS_NORMAL", "level_increments", "nested_noise", "encode_ids", "row_digests",
           "joined_digests", "row_seeds", "RowSeeder", "checked_digests", "normals_from_seeds",
           "normals_from_words", "add_keyed_noise", "blocks", "table", "gather_table",
           "unit_normals"]


_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (odd: the counter visits every word)
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK52 = (1 << 52) - 1
_T_BITS = 52 - normal_table.SUB_BITS
_MASK_T = (1 << _T_BITS) - 1
_FIRST_PIECE = 1023 << normal_table.SUB_BITS  # biased exponent of 1.0, shifted like the piece index
_N_PIECES = normal_table.N_EXPONENTS << normal_table.SUB_BITS
_SIGN_INDEX = 1 << (63 - _T_BITS)  # where a float's sign bit lands in the gather index
# Elements per block: each block costs some 35 numpy calls of about 1 us each, and at K = 1,000
# one block of 64 rows ran faster than blocks of 16 or 32 (2^16 floats: 512 KB a buffer, in L2/L3).
_CHUNK = 1 << 16


def _load_table() -> np.ndarray:
    flat = np.frombuffer(base64.b64decode("".join(normal_table.COEFFICIENTS_B64)), dtype="<f8")
    half = flat.reshape(_N_PIECES, normal_table.DEGREE + 1)
    # Rows [0, P) serve a clear sign bit, rows [P, 2P) a set one: negation is exact.
    both = np.concatenate([half, -half]).astype(np.float64)
    return np.ascontiguousarray(both.T)  # (DEGREE + 1, 2P): one contiguous row per power


_TABLE = _load_table()
_TABLE.flags.writeable = False


def gather_table() -> np.ndarray:
    """The coefficients laid out for the gather index of a / 2, a fresh writable array (DEGREE + 1, N).

    The index is sign bit << 17 | biased exponent << 6 | top bits of a / 2's
    float64, read straight from its bits: no subtraction of the first piece and
    no arithmetic for the sign's half. a / 2 has a's mantissa and an exponent
    one lower, so its first piece sits 64 entries before a's. The unused
    stretches are zero pages never touched (2 x 27 KB per power are).
    """
    first = _FIRST_PIECE - (1 << normal_table.SUB_BITS)
    out = np.zeros((_TABLE.shape[0], _SIGN_INDEX + first + _N_PIECES))
    out[:, first:first + _N_PIECES] = _TABLE[:, :_N_PIECES]
    out[:, _SIGN_INDEX + first:] = _TABLE[:, _N_PIECES:]
    return out


_GATHER = gather_table()
_GATHER.flags.writeable = False
_GATHER_ROWS = tuple(_GATHER)
# uint64 operands made once (a Python int in a uint64 ufunc is checked on every call).
_MIX_STEPS = ((np.uint64(30), np.uint64(_M1)), (np.uint64(27), np.uint64(_M2)))
_U_LAST_SHIFT = np.uint64(31)
_U_MASK52, _U_MASK_T = np.uint64(_MASK52), np.uint64(_MASK_T)
_U_SIGN, _U_T_BITS = np.uint64(1 << 63), np.uint64(_T_BITS)
_U_BITS_OF_2_52, _U_BITS_OF_64 = np.float64(2.0 ** 52).view(np.uint64), np.float64(64.0).view(np.uint64)

#: Largest |normal| the transform can return (q = 2^-53, the smallest tail probability).
MAX_ABS_NORMAL = float(np.polynomial.polynomial.polyval(0.0, _TABLE[:, 0]))


@lru_cache(maxsize=8)
def _counters(n_classes: int) -> np.ndarray:
    out = np.arange(n_classes, dtype=np.uint64) * np.uint64(_GAMMA)
    out.flags.writeable = False
    return out


def blocks(n_rows: int, n_classes: int, size: int = _CHUNK):
    """(row slice, class slice) pairs covering (n_rows, n_classes) in blocks of about ``size`` elements.

    Yields
    ------
    tuple of (slice, slice)
    """
    if n_classes >= size:
        for row in range(n_rows):
            for start in range(0, n_classes, size):
                yield slice(row, row + 1), slice(start, min(n_classes, start + size))
        return
    step = max(1, size // max(1, n_classes))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step)), slice(0, n_classes)


class _Workspace:
    """Block-sized scratch buffers, reused across blocks and calls (one set per thread).

    Fresh arrays of a block's size would be mapped and faulted in on every block.
    """

    def __init__(self, size: int):
        self.size = size
        self.words = np.empty(size, dtype=np.uint64)
        self.scratch = np.empty(size, dtype=np.uint64)
        self.real = np.empty(size, dtype=np.float64)
        self.coefficient = np.empty(size, dtype=np.float64)
        self.noise = np.empty(size, dtype=np.float64)
        self.draw = np.empty(size, dtype=np.float64)

    def view(self, name: str, shape) -> np.ndarray:
        return getattr(self, name)[: shape[0] * shape[1]].reshape(shape)


_workspaces = threading.local()


def _workspace(size: int) -> _Workspace:
    work = getattr(_workspaces, "work", None)
    if work is None or work.size < size:
        work = _workspaces.work = _Workspace(max(size, _CHUNK))
    return work


def normals_from_seeds(seeds, n_classes: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Standard normals, shape (n_rows, n_classes) float64, from row seeds (steps 3-4 of the derivation).

    Returns
    -------
    ndarray
        ``out`` when given, else a new array.
    """
    seeds = np.asarray(seeds, dtype=np.uint64).reshape(-1)
    if out is None:
        out = np.empty((seeds.shape[0], n_classes), dtype=np.float64)
    counters = _counters(int(n_classes))
    for rows, cols in blocks(seeds.shape[0], n_classes):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        work = _workspace(shape[0] * shape[1])
        block = work.view("noise", shape)
        _transform_block(seeds[rows], counters[cols], block, work)
        out[rows, cols] = block
    return out


def add_keyed_noise(logits: np.ndarray, level_seeds, increments) -> np.ndarray:
    """``logits + sum_i increments[i] * xi_i`` in float64, rounded once to the logits' dtype.

    ``level_seeds[i]`` are the row seeds of level i + 1 (:func:`row_seeds`). Block
    by block, so each block's noise is summed, added and rounded while in cache;
    the result equals, bit for bit, the sum in that order of whole arrays:
    ``((inc_1 * xi_1 + inc_2 * xi_2) + ...) + logits`` (Eq. logits-noise).

    Returns
    -------
    ndarray of the logits' shape and dtype
    """
    n_rows, n_classes = logits.shape
    out = np.empty(logits.shape, dtype=logits.dtype)
    wider = np.result_type(np.float64, logits.dtype) != np.float64
    counters = _counters(int(n_classes))
    for rows, cols in blocks(n_rows, n_classes):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        work = _workspace(shape[0] * shape[1])
        noise, draw = work.view("noise", shape), work.view("draw", shape)
        for i, (seeds, increment) in enumerate(zip(level_seeds, increments)):
            target = noise if i == 0 else draw
            _transform_block(seeds[rows], counters[cols], target, work)
            target *= increment
            if i:
                noise += draw
        if wider:  # longdouble logits: their sum rounded to float64 first, as the level path does
            noise += logits[rows, cols]
            out[rows, cols] = noise
        else:  # float64 + the logits' dtype (an exact upcast), rounded once into the output: one pass
            np.add(noise, logits[rows, cols], out=out[rows, cols], casting="unsafe")
    return out


def _transform_block(seeds: np.ndarray, counters: np.ndarray, out: np.ndarray, work: _Workspace) -> None:
    w, tmp = work.view("words", out.shape), work.view("scratch", out.shape)
    np.add(seeds[:, None], counters[None, :], out=w)
    for shift, multiplier in _MIX_STEPS:
        np.right_shift(w, shift, out=tmp)
        w ^= tmp
        w *= multiplier
    np.right_shift(w, _U_LAST_SHIFT, out=tmp)
    w ^= tmp
    _words_to_normals(w, tmp, out, work.view("real", out.shape), work.view("coefficient", out.shape))


def normals_from_words(words) -> np.ndarray:
    """Step 4 of the derivation alone: one standard normal per 64-bit word (any shape), float64.

    Returns
    -------
    ndarray of the words' shape, float64
    """
    w = np.array(words, dtype=np.uint64)
    out = np.empty(w.shape, dtype=np.float64)
    flat = (1, w.size)
    _words_to_normals(w.reshape(flat), np.empty(flat, dtype=np.uint64), out.reshape(flat),
                      np.empty(flat), np.empty(flat))
    return out


def _words_to_normals(w: np.ndarray, tmp: np.ndarray, out: np.ndarray, a_float: np.ndarray,
                      coefficient: np.ndarray) -> None:
    """Overwrites ``w`` and ``tmp`` (uint64) and ``a_float``, ``coefficient`` (float64); fills ``out``."""
    # v under 2^52's exponent reads 2^52 + v; minus (2^52 - 1/2) that is v + 1/2 = a / 2, exactly
    # (a / 2 < 2^52 has 53 significant bits at most). It has a's mantissa, so its exponent and top
    # bits name the piece, and no int-to-float conversion is needed (numpy's is unvectorized).
    np.bitwise_and(w, _U_MASK52, out=tmp)
    tmp |= _U_BITS_OF_2_52
    half_a = np.subtract(tmp.view(np.float64), 2.0 ** 52 - 0.5, out=a_float)
    half_a_bits = half_a.view(np.uint64)
    # The word's sign bit set on it: (sign, exponent, top bits) >> T_BITS is the gather index.
    w &= _U_SIGN
    half_a_bits |= w
    piece = np.right_shift(half_a_bits, _U_T_BITS, out=tmp).view(np.int64)
    # The low T_BITS of the mantissa under 64.0's exponent read 64 + t exactly.
    t_bits = np.bitwise_and(half_a_bits, _U_MASK_T, out=w)
    t_bits |= _U_BITS_OF_64
    t = np.subtract(t_bits.view(np.float64), 64.0, out=a_float)  # exact: t has at most T_BITS bits
    # Every index is in range by construction, so "wrap" never wraps: it only skips "raise"'s error
    # path, and its loop measured faster than "clip"'s (3.3 against 4.4-5.1 ns an element). The method:
    # np.take adds a Python call.
    _GATHER_ROWS[-1].take(piece, out=out, mode="wrap")
    for power in range(normal_table.DEGREE - 1, -1, -1):
        out *= t
        _GATHER_ROWS[power].take(piece, out=coefficient, mode="wrap")
        out += coefficient


def unit_normals(key: bytes, binding: bytes, level: int, digests, n_classes: int) -> np.ndarray:
    """Standard normals, (n_rows, n_classes) float64, as a pure function of (key, binding, level, id, K).

    Parameters
    ----------
    key : bytes
        The provider's secret (at least 16 bytes).
    binding : bytes
        The noise's identity (per-input seeding passes the config digest), so two
        configs never share a draw.
    level : int
        The level of a nested draw (1-based), or any label the caller reserves.
    digests : ndarray (n_rows, 32) uint8
        :func:`row_digests` of the row ids.
    n_classes : int
        K, the row length; part of the derivation.
    """
    return normals_from_seeds(row_seeds(key, binding, level, digests, n_classes), n_classes)


def table() -> np.ndarray:
    """The transform's coefficients (read-only), shape (DEGREE + 1, 2 * pieces): [P, 2P) the negated half."""
    return _TABLE


def level_increments(levels, level: int) -> tuple[float, ...]:
    """sqrt(sigma_i^2 - sigma_{i-1}^2) for i = 1..level (sigma_0 = 0), each as sqrt((s_i - s_{i-1})(s_i + s_{i-1})).

    Returns
    -------
    tuple of float
        Their squares sum to ``levels[level - 1]`` squared: nested noise of variance sigma^2 (Eq. logits-noise).
    """
    out, previous = [], 0.0
    for sigma in levels[:level]:
        out.append(math.sqrt((sigma - previous) * (sigma + previous)))
        previous = sigma
    return tuple(out)


def nested_noise(increments, unit_draw):
    """sum_i increments[i] * unit_draw(i + 1), skipping zero increments: the one nested-level sum.

    Parameters
    ----------
    increments : sequence of float
        :func:`level_increments` of the served level.
    unit_draw : callable
        level (1-based) -> a fresh float64 array or tensor of unit noise (modified in place).

    Returns
    -------
    The sum (None when every increment is zero).

    Notes
    -----
    Level j serves eps_j = sum_{i <= j} sqrt(sigma_i^2 - sigma_{i-1}^2) xi_i, so a lower
    level's noise is part of every higher level's (nested levels).
    """
    noise = None
    for level, increment in enumerate(increments, start=1):
        if increment == 0.0:
            continue
        xi = unit_draw(level)
        xi *= increment
        noise = xi if noise is None else noise.__iadd__(xi)
    return noise
