"""The row reduction of :mod:`.gap_histogram` as one compiled pass a row, with the numpy path as its fallback.

:func:`.gap_histogram.reduce_block` makes some ten array passes a row (max,
subtract, shift, a bin count over every bin, a cumulative sum, a mask);
``gap_rows.c`` makes three over a row that stays in cache (the top, the folded
histogram, the gaps at or below the bin where the kept ones end), and numpy
sorts that handful and takes the kept gaps (and a label's) out of the
histogram as before. The numbers are the same: the gaps are the same float32
differences and the counts integers (a self-check against the numpy path runs
whenever the library is loaded). On a 4,000 x 128,000 float32 dump it is
about three times cheaper than the numpy path.

The machine's C compiler builds it in one to two seconds, once per source,
flags and CPU, into a cache (``CALIBER_KERNEL_CACHE``, default
``~/.cache/caliber/kernels``); later processes load the cached library.
Where it cannot be built, loaded or fails its self-check (or
``CALIBER_GAP_KERNEL=0``), :func:`reduce_rows` is the numpy path, with the
same numbers; :func:`unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from .. import native_build
from .gap_histogram import HI_BIN, LABEL_BINNED, LABEL_IS_TOP, LO_BIN, N_BINS, SHIFT, TOP_GAPS, reduce_block

__all__ = ["available", "reduce_rows", "unavailable_reason"]

SOURCE = Path(__file__).with_name("gap_rows.c")
_ABI = 1
_FLAGS = ("-O3", "-fno-fast-math", "-fPIC", "-shared")
#: Gaps kept per row for numpy to sort; a row with more at or below its threshold bin (near-ties by the
#: thousand) is reduced by the numpy path.
NEAR_CAP = 1024
_lock = threading.Lock()
_state: dict = {}


def reduce_rows(block: np.ndarray, *, m: int = TOP_GAPS, labels: np.ndarray | None = None) -> tuple:
    """:func:`.gap_histogram.reduce_block`, through the compiled kernel where it is available.

    Parameters
    ----------
    block : ndarray of shape (n_rows, V), float32
        Not modified (a read-only memory map is fine).
    m : int, default TOP_GAPS
    labels : ndarray of shape (n_rows,), int, optional

    Returns
    -------
    tuple
        As :func:`.gap_histogram.reduce_block`, the same numbers.

    Raises
    ------
    ValueError
        A row whose largest value is not finite.
    """
    library = _library()
    if library is None or block.dtype != np.float32 or block.ndim != 2 or block.strides[1] != 4 \
            or block.strides[0] % 4 or block.shape[0] == 0 or block.shape[1] < 2:
        return reduce_block(block, m=m, labels=labels)
    return _reduce(library, block, m, labels)


def _reduce(library, block: np.ndarray, m: int, labels) -> tuple:
    n, v = block.shape
    m = min(m, v - 1)
    top = np.empty(n, dtype=np.float32)
    pred = np.empty(n, dtype=np.int64)
    counts = np.empty((n, N_BINS), dtype=np.int32)
    near = np.empty((n, NEAR_CAP), dtype=np.float32)
    near_count = np.empty(n, dtype=np.int64)
    top_gaps = np.empty((n, m))
    status = library.caliber_gap_rows(block.ctypes.data, n, v, block.strides[0] // 4, SHIFT, LO_BIN, HI_BIN, m + 1,
                                      int(labels is not None), top.ctypes.data, pred.ctypes.data, counts.ctypes.data,
                                      N_BINS, near.ctypes.data, NEAR_CAP, near_count.ctypes.data, top_gaps.ctypes.data)
    if status == -(n + 1):
        raise RuntimeError(f"the gap kernel refused its arguments: shape {(n, v)}, m {m}")
    if status < 0:
        raise ValueError(f"row {-status - 1} holds NaN or +inf (every logit must be finite or -inf)")
    label_gaps = np.empty(n) if labels is not None else None
    slots = np.empty(n, dtype=np.int32) if labels is not None else None
    for i in np.flatnonzero(near_count > NEAR_CAP):  # thousands of near-ties at the top: the numpy path
        one = reduce_block(block[i : i + 1], m=m, labels=None if labels is None else labels[i : i + 1])
        top_gaps[i], counts[i] = one[0][0], one[1][0]
        if labels is not None:
            label_gaps[i], slots[i] = one[2][0], one[3][0]
    if labels is None:
        return top_gaps, counts
    for i in np.flatnonzero(near_count <= NEAR_CAP):
        y = int(labels[i])
        h = top[i] - block[i, y]  # the same float32 difference as the row's gaps
        label_gaps[i] = h
        if pred[i] == y:
            slots[i] = LABEL_IS_TOP
            continue
        # A wrong row's label among the kept gaps: the first kept gap equal to h; otherwise it leaves the histogram.
        pos = int(np.searchsorted(top_gaps[i], h))
        if pos < m and top_gaps[i, pos] == h:
            slots[i] = pos
        else:
            slots[i] = LABEL_BINNED
            counts[i, _columns(np.array([h], dtype=np.float32).view(np.uint32) >> SHIFT)] -= 1
    if labels is None:
        return top_gaps, counts
    return top_gaps, counts, label_gaps, slots


def _columns(raw_bins: np.ndarray) -> np.ndarray:
    """The reduction's column of each raw bin (bins below LO_BIN in column 0, those from HI_BIN on in the last)."""
    raw_bins = raw_bins.astype(np.int64)
    return np.where(raw_bins < LO_BIN, 0, np.minimum(raw_bins, HI_BIN) - LO_BIN + 1)


def available() -> bool:
    """Whether the compiled kernel reduces rows in this process (built or loaded on first use).

    Returns
    -------
    bool
    """
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why rows are reduced by the numpy path (None when the kernel serves them)."""
    _library()
    return _state.get("reason")


def _library():
    return native_build.load_once(_state, _lock, _load)  # on a failure the numpy path serves


def _load():
    return native_build.load_checked(SOURCE, _FLAGS, "CALIBER_GAP_KERNEL", _bind, _self_check)


def _bind(library):
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.caliber_gap_rows_abi.restype = i32
    library.caliber_gap_rows.argtypes = [pointer, i64, i64, i64, i32, i64, i64, i64, i32, pointer, pointer, pointer,
                                         i64, pointer, i64, pointer, pointer]
    library.caliber_gap_rows.restype = i64
    if library.caliber_gap_rows_abi() != _ABI:
        raise RuntimeError(f"the library's ABI is {library.caliber_gap_rows_abi()}, expected {_ABI}")
    return library


def _self_check(library) -> None:
    """The kernel against the numpy path on awkward rows: ties, zeros, -inf, far gaps, labels on and off the top."""
    rng = np.random.default_rng(20261127)
    x = (rng.standard_normal((9, 3000)) * 4).astype(np.float32)
    x[0, :-20] = -np.inf
    x[1, ::2] = x[1].max()  # ties at the top: more near gaps than NEAR_CAP
    x[2] = 0.0
    x[2, 5] = -0.0
    x[3, 100:] -= 1e4
    x[4, :-5] = -1e30
    x[5, 7] = x[5].max() + 1e-3
    labels = np.array([2999, 0, 5, 3, 2998, 7, 11, 12, 13])
    for y in (None, labels):  # other widths and m: tests/test_gap_kernel.py
        want = reduce_block(x, labels=y)
        got = _reduce(library, x, TOP_GAPS, y)
        if not all(np.array_equal(a, b) for a, b in zip(want, got)):
            raise RuntimeError("the compiled reduction differs from the numpy path")
    x[6, 9] = np.nan
    try:
        _reduce(library, x, 32, None)
    except ValueError as exc:
        if "row 6 " not in str(exc):
            raise RuntimeError("the compiled reduction names another row for a NaN") from exc
    else:
        raise RuntimeError("the compiled reduction let a NaN row through")
