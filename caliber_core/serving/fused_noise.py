"""The served keyed noise as one compiled CPU kernel: numpy's bits, at the speed of ``torch.randn`` + add.

:func:`caliber_core.serving.keyed_noise.add_keyed_noise` makes some 38 array
passes per element and level; ``fused_noise.c`` makes the words, the normal
transform, every level's draw, the scaling, the sum and the add in one pass
over 256-column blocks that stay in L1, and rounds once to the logits' dtype
(float16 and bfloat16 exactly, through a round-to-odd float32). Every float
step is the reference's correctly rounded operation (built with
``-ffp-contract=off``), so the output equals numpy's float64 reference bit for
bit; a self-check against it runs whenever the kernel is loaded.

The kernel is plain C (no Python or torch headers): the machine's C compiler
builds it in about a second, once per source, flags and CPU, into a cache
(``CALIBER_KERNEL_CACHE``, default ``~/.cache/caliber/kernels``), and later
processes load the cached library. :func:`prepare` does that when a server is
built (Perturber, throttle, vLLM processor), never on a request. Where it
cannot be built or fails its self-check, :func:`prepare` warns once
(:class:`FusedKernelWarning`, naming the cost) and serving falls back to the
op-by-op path, which gives the same bits.

No torch import here: callers pass raw pointers.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from pathlib import Path

import numpy as np

from .. import native_build
from . import keyed_noise

__all__ = ["DTYPE_CODES", "FusedKernelWarning", "FALLBACK_COST", "add_keyed_noise", "add_to_array", "available",
           "min_max", "normals_from_words", "prepare", "round_to", "unavailable_reason", "widen"]

SOURCE = Path(__file__).with_name("fused_noise.c")
#: The kernel's dtype codes (fused_noise.c's DT_*), by numpy/torch dtype name.
DTYPE_CODES = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}
#: Levels one call can add (fused_noise.c's MAX_LEVELS).
MAX_LEVELS = 64
_BITS = {"float64": np.uint64, "float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}
_ABI = 2
# Without -ffp-contract=off a compiler may fuse y * t + c into one rounding (GCC does by default).
_FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-pthread")
#: What serving costs without the kernel (benchmarks/bench_fused_noise.py, docs/figures/fused-noise.md).
FALLBACK_COST = ("the op-by-op path: about 6x the time of torch.randn + add per row at K = 128,000 on the CPU, "
                 "more with several levels")


class FusedKernelWarning(RuntimeWarning):
    """The fused kernel could not be built or loaded: tensors are served by the slower op-by-op path."""


_lock = threading.Lock()
_state: dict = {}


def _bind(library: ctypes.CDLL) -> ctypes.CDLL:
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.caliber_kernel_abi.restype = i32
    library.caliber_set_table.argtypes, library.caliber_set_table.restype = [pointer, i64], i32
    library.caliber_normals_from_words.argtypes = [pointer, pointer, i64]
    library.caliber_normals_from_words.restype = None
    for name in ("caliber_round_to", "caliber_widen"):
        getattr(library, name).argtypes, getattr(library, name).restype = [pointer, pointer, i64, i32], None
    library.caliber_add_keyed_noise.argtypes = [pointer, i64, pointer, i64, i64, i64, i32, pointer, pointer, i32,
                                                pointer, i32]
    library.caliber_add_keyed_noise.restype = i32
    library.caliber_min_max.argtypes, library.caliber_min_max.restype = [pointer, i64, i64, i64, i32, pointer], None
    if library.caliber_kernel_abi() != _ABI:
        raise RuntimeError(f"the library's ABI is {library.caliber_kernel_abi()}, expected {_ABI}")
    table = np.ascontiguousarray(keyed_noise.table())
    if library.caliber_set_table(table.ctypes.data, table.shape[1]) != 0:
        raise RuntimeError("the library refused the coefficient table")
    return library


def _self_check(library: ctypes.CDLL) -> None:
    """The loaded kernel against numpy's reference on words at the transform's seams and on a small
    batch of every dtype: a compiler that fused or reordered a rounding is caught here, not in service."""
    rng = np.random.default_rng(20261127)
    words = np.concatenate([rng.integers(0, 2**64 - 1, size=4096, dtype=np.uint64, endpoint=True),
                            np.array([0, (1 << 52) - 1, 1 << 63, (1 << 64) - 1, 1 << 51], dtype=np.uint64)])
    want = keyed_noise.normals_from_words(words).view(np.uint64)
    if not np.array_equal(_normals(library, words).view(np.uint64), want):
        raise RuntimeError("the compiled transform differs from numpy's reference")
    seeds = rng.integers(0, 2**64 - 1, size=(3, 3), dtype=np.uint64, endpoint=True)
    increments = np.array([0.5, 0.75, 1.25])
    logits = rng.standard_normal((3, 1000)) * 8
    for name in ("float64", "float32", "float16"):
        rows = logits.astype(name)
        want = keyed_noise.add_keyed_noise(rows, list(seeds), list(increments))
        got = np.empty_like(rows)
        _call(library, rows.ctypes.data, rows.strides[0], got.ctypes.data, got.strides[0], rows.shape, name,
              seeds, increments, None, 1)
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            raise RuntimeError(f"the compiled kernel differs from numpy's reference on {name} logits")


def _normals(library, words: np.ndarray) -> np.ndarray:
    words = np.ascontiguousarray(words, dtype=np.uint64)
    out = np.empty(words.shape, dtype=np.float64)
    library.caliber_normals_from_words(words.ctypes.data, out.ctypes.data, words.size)
    return out


def _call(library, logits_ptr, logit_stride, out_ptr, out_stride, shape, dtype_name, seeds, increments, served,
          n_threads) -> None:
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    increments = np.ascontiguousarray(increments, dtype=np.float64)
    served_ptr = None
    if served is not None:
        served = np.ascontiguousarray(served, dtype=np.int32)
        served_ptr = served.ctypes.data
    status = library.caliber_add_keyed_noise(
        logits_ptr, logit_stride, out_ptr, out_stride, shape[0], shape[1], DTYPE_CODES[dtype_name],
        seeds.ctypes.data, increments.ctypes.data, increments.shape[0], served_ptr, n_threads)
    if status != 0:
        raise ValueError(f"the fused kernel refused its arguments: shape {shape}, dtype {dtype_name}, "
                         f"{increments.shape[0]} levels")


def _load() -> ctypes.CDLL:
    return native_build.load_checked(SOURCE, _FLAGS, "CALIBER_FUSED_KERNEL", _bind, _self_check)


def prepare() -> bool:
    """Build or load the kernel now (once per process); warn once and return False where it cannot be.

    Servers call this when they are built, so no request waits for a compiler.

    Returns
    -------
    bool
        Whether tensors are served by the fused kernel.

    Warns
    -----
    FusedKernelWarning
        Once per process: the kernel is not available (the reason, and :data:`FALLBACK_COST`).
    """
    return native_build.load_once(_state, _lock, _load, on_failure=_warn_unavailable) is not None


def _warn_unavailable(reason: str) -> None:
    warnings.warn(f"caliber's fused noise kernel is unavailable ({reason}); torch tensors are served by "
                  f"{FALLBACK_COST}", FusedKernelWarning, stacklevel=4)


def available() -> bool:
    """Whether :func:`prepare` loaded the kernel (False before it was called)."""
    return _state.get("library") is not None


def unavailable_reason() -> str | None:
    """Why the kernel is not served (None when it is, or before :func:`prepare`)."""
    return _state.get("reason")


def normals_from_words(words) -> np.ndarray:
    """Step 4 of the derivation in the compiled kernel (for tests against numpy's).

    Returns
    -------
    ndarray of the words' shape, float64
    """
    words = np.asarray(words, dtype=np.uint64)
    return _normals(_library(), words.reshape(-1)).reshape(words.shape)


def _library():
    if not prepare():
        raise RuntimeError(f"the fused kernel is unavailable: {unavailable_reason()}")
    return _state["library"]


def round_to(values, dtype_name: str) -> np.ndarray:
    """float64 values rounded once to ``dtype_name`` by the kernel's conversion, as raw bits (for tests).

    Returns
    -------
    ndarray of uint64 (float64), uint32 (float32) or uint16 (float16, bfloat16)
    """
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    out = np.empty(values.size, dtype=_BITS[dtype_name])
    _library().caliber_round_to(values.ctypes.data, out.ctypes.data, values.size, DTYPE_CODES[dtype_name])
    return out


def widen(bits, dtype_name: str) -> np.ndarray:
    """Raw bits of ``dtype_name`` as float64 by the kernel's conversion (for tests).

    Returns
    -------
    ndarray of float64
    """
    bits = np.ascontiguousarray(bits, dtype=_BITS[dtype_name]).reshape(-1)
    out = np.empty(bits.size, dtype=np.float64)
    _library().caliber_widen(bits.ctypes.data, out.ctypes.data, bits.size, DTYPE_CODES[dtype_name])
    return out


def add_keyed_noise(logits_ptr: int, logit_stride: int, out_ptr: int, out_stride: int, shape, dtype_name: str,
                    seeds, increments, served=None, *, n_threads: int = 1) -> None:
    """``out = logits + sum_i increments[i] * xi_i`` rounded once, for raw row-major CPU buffers.

    Parameters
    ----------
    logits_ptr, out_ptr : int
        Addresses of (n_rows, n_classes) buffers whose rows are contiguous.
    logit_stride, out_stride : int
        Bytes from one row to the next.
    shape : (int, int)
        (n_rows, n_classes).
    dtype_name : {"float64", "float32", "float16", "bfloat16"}
        Both buffers' dtype.
    seeds : array_like of shape (n_levels, n_rows), uint64
        Row seeds of each drawn level (:func:`keyed_noise.row_seeds`).
    increments : array_like of shape (n_levels,)
        The levels' scales, in the order they are summed.
    served : array_like of shape (n_rows,), optional
        How many of the levels each row adds (0: the row is copied); the rest
        are drawn all the same and discarded, so a row's time does not depend
        on it. Default: all.
    n_threads : int, default 1
        Threads to split a large batch over (each takes at least 16,384 elements).
    """
    _call(_library(), logits_ptr, logit_stride, out_ptr, out_stride, shape, dtype_name, seeds, increments,
          served, n_threads)


def add_to_array(logits: np.ndarray, level_seeds, increments) -> np.ndarray:
    """:func:`keyed_noise.add_keyed_noise` for a numpy array, by the kernel once it is loaded.

    The same bits either way (the kernel's self-check compares them); numpy's
    op-by-op path serves where the kernel is not loaded (:func:`prepare` not
    called, or it failed), and for a dtype, layout or level count the kernel
    does not take. One thread: a server runs its requests side by side.

    Returns
    -------
    ndarray of the logits' shape (n_rows, n_classes) and dtype
    """
    name = logits.dtype.name
    if (not available() or logits.ndim != 2 or 0 in logits.shape or not 0 < len(increments) <= MAX_LEVELS
            or name not in DTYPE_CODES or not logits.dtype.isnative or logits.strides[-1] != logits.itemsize):
        return keyed_noise.add_keyed_noise(logits, level_seeds, increments)
    n_rows, n_classes = logits.shape
    seeds = np.array([np.asarray(s, dtype=np.uint64).reshape(-1) for s in level_seeds], dtype=np.uint64)
    out = np.empty((n_rows, n_classes), dtype=logits.dtype)
    _call(_state["library"], logits.ctypes.data, logits.strides[0], out.ctypes.data, out.strides[0],
          (n_rows, n_classes), name, seeds.reshape(len(increments), n_rows), increments, None, 1)
    return out


def min_max(pointer: int, shape, row_stride: int, dtype_name: str) -> tuple[float, float, bool]:
    """The smallest and largest value of a row-major CPU buffer and whether it holds a NaN, in one pass.

    Only once the kernel is loaded (:func:`available`): a request never waits for a compiler.

    Parameters
    ----------
    pointer : int
        Address of (n_rows, n_classes) values whose rows are contiguous.
    shape : (int, int)
        (n_rows, n_classes), both positive.
    row_stride : int
        Bytes from one row to the next.
    dtype_name : {"float64", "float32", "float16", "bfloat16"}

    Returns
    -------
    (float, float, bool)
        min and max over the non-NaN values, and whether any value is NaN.
    """
    out = np.empty(3, dtype=np.float64)
    _state["library"].caliber_min_max(pointer, shape[0], shape[1], row_stride, DTYPE_CODES[dtype_name],
                                      out.ctypes.data)
    return float(out[0]), float(out[1]), bool(out[2])
