"""The unlabelled agreement bounds of :func:`.gap_histogram.row_bounds` as one compiled pass a row.

The numpy path builds a rows x kept gaps x nodes array of arguments, a mask of
the live ones, the normal CDF of those and their product: some 7 million
entries and 100 MB of temporaries per evaluation of a 4,000-row reduction.
``bound_rows.c`` walks each row's gaps per node instead, stopping at the
first factor that is 1.0 (the gaps ascend), and sums the node's weighted
bounds in place; it also makes the tail bins' log-CDF tables. It needs no
scipy: an unlabelled dump is calibrated without importing ``scipy.special``
(about half a CPU-second).

The head's factors are Phi read from a cubic Hermite table, within
:func:`phi_table_error` (4e-13) of the exact value; the product of factors in
[0, 1] moves by at most that times their number, and the lower bound's head
is lowered and the upper one's raised by it. So the rows' bounds stay bounds
of the same quadrature, each at most 32 x 4e-13 ~ 1.3e-11 wider than the
numpy path's (whose ``ndtr`` and the C library's erfc differ by ulps; the
tail tables' float32 rounding moves a row's bound by < 1e-7 relative). The
self-check on load and tests/test_bound_kernel.py hold it to that.

Built, cached and switched off (``CALIBER_BOUND_KERNEL=0``) as
:mod:`.gap_kernel`; where it is not available the numpy path serves.
"""

from __future__ import annotations

import ctypes
import math
import threading
from pathlib import Path

import numpy as np

from .. import native_build

__all__ = ["agreement_rows", "available", "log_phi_table", "phi_read", "phi_table_error", "unavailable_reason"]

SOURCE = Path(__file__).with_name("bound_rows.c")
_ABI = 2
_FLAGS = ("-O3", "-fno-fast-math", "-fPIC", "-shared", "-lm")
_lock = threading.Lock()
_state: dict = {}


def log_phi_table(edges: np.ndarray, sigma: float, nodes: np.ndarray) -> np.ndarray:
    """float32 log Phi(edge / sigma + node) for every edge (rows) and node (columns).

    Parameters
    ----------
    edges : ndarray of shape (n_edges,), float64
        >= 0; +inf is taken as 1e300 (its log Phi is 0).
    sigma : float
        > 0.
    nodes : ndarray of shape (n_nodes,), float64
        >= -37 (the C library's erfc keeps its relative accuracy above).

    Returns
    -------
    ndarray of shape (n_edges, n_nodes), float32
    """
    return _table(_require(), edges, sigma, nodes)


def _table(library, edges, sigma, nodes) -> np.ndarray:
    edges = np.ascontiguousarray(np.where(np.isfinite(edges), edges, 1e300), dtype=np.float64)
    nodes = np.ascontiguousarray(nodes, dtype=np.float64)
    out = np.empty((edges.size, nodes.size), dtype=np.float32)
    library.caliber_log_phi_table(edges.ctypes.data, edges.size, nodes.ctypes.data, nodes.size, float(sigma),
                                  out.ctypes.data)
    return out


def agreement_rows(top_gaps: np.ndarray, sigma: float, nodes: np.ndarray, weights: np.ndarray, phi_one: float,
                   lo_tail: np.ndarray, hi_tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's lower and upper agreement bound: sum_u w_u exp(log prod_j Phi(g_j / sigma + u) + tail).

    Parameters
    ----------
    top_gaps : ndarray of shape (n_rows, m), float64
        Ascending along each row.
    sigma : float
        > 0.
    nodes, weights : ndarray of shape (n_nodes,), float64
        The trapezoid rule.
    phi_one : float
        Phi(x) is taken as 1.0 from here on (where it is 1.0 in float64).
    lo_tail, hi_tail : ndarray of shape (n_rows, n_nodes), float32
        The tail bins' log-sums at their lower and upper edges.

    Returns
    -------
    lower, upper : ndarray of shape (n_rows,), float64
        Not clipped to [0, 1].
    """
    library = _require()
    gaps = np.ascontiguousarray(top_gaps, dtype=np.float64)
    nodes = np.ascontiguousarray(nodes, dtype=np.float64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    lo_tail = np.ascontiguousarray(lo_tail, dtype=np.float32)
    hi_tail = np.ascontiguousarray(hi_tail, dtype=np.float32)
    n, m = gaps.shape
    if lo_tail.shape != (n, nodes.size) or hi_tail.shape != lo_tail.shape or weights.shape != nodes.shape:
        raise ValueError(f"tails of shape {lo_tail.shape} and {hi_tail.shape} for {n} rows and {nodes.size} nodes")
    lower, upper = np.empty(n), np.empty(n)
    library.caliber_agreement_rows(gaps.ctypes.data, n, m, m, float(sigma), nodes.ctypes.data, weights.ctypes.data,
                                   nodes.size, float(phi_one), lo_tail.ctypes.data, hi_tail.ctypes.data,
                                   lower.ctypes.data, upper.ctypes.data)
    return lower, upper


def phi_read(x: np.ndarray) -> np.ndarray:
    """Phi(x) as the kernel reads it from its table (within :func:`phi_table_error`).

    Parameters
    ----------
    x : array_like of float

    Returns
    -------
    ndarray of float64, the shape of ``x``
    """
    library = _require()
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    library.caliber_phi_read(x.ctypes.data, x.size, out.ctypes.data)
    return out


def phi_table_error() -> float:
    """How far a Phi read from the kernel's table may be from the exact value (a bound, 4e-13).

    Returns
    -------
    float
    """
    return float(_require().caliber_phi_table_error())


def available() -> bool:
    """Whether the compiled bounds serve in this process (built or loaded on first use).

    Returns
    -------
    bool
    """
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why the numpy path serves the bounds (None when the kernel does)."""
    _library()
    return _state.get("reason")


def _require():
    library = _library()
    if library is None:
        raise RuntimeError(f"the bound kernel is not available: {_state.get('reason')}")
    return library


def _library():
    return native_build.load_once(_state, _lock, _load)  # on a failure the numpy path serves


def _load():
    return native_build.load_checked(SOURCE, _FLAGS, "CALIBER_BOUND_KERNEL", _bind, _self_check)


def _bind(library):
    pointer, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    library.caliber_bound_rows_abi.restype = ctypes.c_int
    if library.caliber_bound_rows_abi() != _ABI:
        raise RuntimeError(f"the library's ABI is {library.caliber_bound_rows_abi()}, expected {_ABI}")
    library.caliber_log_phi_table.argtypes = [pointer, i64, pointer, i64, f64, pointer]
    library.caliber_log_phi_table.restype = None
    library.caliber_agreement_rows.argtypes = [pointer, i64, i64, i64, f64, pointer, pointer, i64, f64, pointer,
                                               pointer, pointer, pointer]
    library.caliber_agreement_rows.restype = None
    library.caliber_phi_read.argtypes = [pointer, i64, pointer]
    library.caliber_phi_read.restype = None
    library.caliber_phi_table_error.restype = f64
    library.caliber_bound_rows_init.restype = None
    library.caliber_bound_rows_init()  # the table, before any thread reads it
    return library


def _phi(x: np.ndarray) -> np.ndarray:
    """The normal CDF from Python's math.erfc (a reference independent of the kernel and of scipy)."""
    return np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)), otypes=[float])(x)


def _self_check(library) -> None:
    """The kernel against a plain reference on rows with ties, far gaps, +inf gaps and a zero gap: its
    bounds contain the reference's and are no more than the table's error wider."""
    rng = np.random.default_rng(20261127)
    gaps = np.sort(rng.exponential(1.5, size=(5, 12)), axis=1)
    gaps[1, :6] = 0.25  # ties
    gaps[2, 3:] = np.inf  # fewer finite gaps than kept ones
    gaps[3, 0] = 0.0  # a tie at the top
    gaps[4] += 40.0  # every factor 1.0
    sigma, phi_one = 0.7, 8.3
    nodes = np.arange(-8.0, 8.0 + 0.25, 0.5)
    weights = 0.5 * np.exp(-0.5 * nodes**2) / math.sqrt(2 * math.pi)
    edges = np.array([0.0, 0.5, 3.0, 30.0, np.inf])
    table = _table(library, edges, sigma, nodes)
    x = np.where(np.isfinite(edges), edges, 1e300)[:, None] / sigma + nodes[None, :]
    want_table = np.where(x > 6.0, -_phi(-x), np.log(_phi(x)))  # log1p(-Phi(-x)) to float32 past 6
    if not np.allclose(table, want_table, rtol=1e-6, atol=1e-30):
        raise RuntimeError("the compiled log-CDF table differs from its reference")
    counts = rng.integers(0, 50, size=(5, edges.size)).astype(np.float32)
    lo_tail, hi_tail = counts @ table, counts[:, ::-1] @ table
    lower, upper = np.empty(5), np.empty(5)
    library.caliber_agreement_rows(gaps.ctypes.data, 5, 12, 12, sigma, nodes.ctypes.data, weights.ctypes.data,
                                   nodes.size, phi_one, lo_tail.ctypes.data, hi_tail.ctypes.data, lower.ctypes.data,
                                   upper.ctypes.data)
    arg = gaps[:, :, None] / sigma + nodes[None, None, :]
    factors = np.where(arg < phi_one, _phi(np.where(np.isfinite(arg), arg, 0.0)), 1.0)
    head = np.log(np.maximum(np.prod(factors, axis=1), 1e-300))
    slack = 12 * library.caliber_phi_table_error() + 1e-15
    want_lo, want_hi = np.exp(head + lo_tail) @ weights, np.exp(head + hi_tail) @ weights
    if not (np.all(lower <= want_lo * (1 + 1e-12)) and np.all(lower >= want_lo - slack)
            and np.all(upper >= want_hi * (1 - 1e-12)) and np.all(upper <= want_hi + slack)):
        raise RuntimeError("the compiled agreement bounds differ from their reference")
    x = np.linspace(-8.5, 8.5, 1001)
    read = np.empty_like(x)
    library.caliber_phi_read(x.ctypes.data, x.size, read.ctypes.data)
    if np.max(np.abs(read - _phi(x))) > library.caliber_phi_table_error():
        raise RuntimeError("the compiled normal CDF table is off by more than its stated error")

