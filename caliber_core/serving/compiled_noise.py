"""The served keyed noise on CUDA as one kernel per variant: Triton's hand-written one, else Inductor's compile.

:func:`keyed_noise_torch.add_keyed_noise_torch` runs the derivation of
:mod:`.keyed_noise` op by op: some 38 kernel launches per level, each writing
its intermediate to memory (24x ``torch.randn`` + add per row on an H200 for
one level, 81x for three). :func:`noisy_logits` is the same steps as one
function of tensors, with no Python loop over elements and no data-dependent
control flow: SplitMix64's words in wrapping int64 arithmetic, the normal
table's piecewise polynomial by Horner's rule, every level's scaled draw
summed in float64 in the reference's order, the logits added and the result
rounded once to their dtype (float16 and bfloat16 through a round-to-odd
float32, so that the second rounding is exact). ``torch.compile(dynamic=True)``
fuses it into one kernel that reads the logits and writes the result, for
every batch size and K.

Bits are numpy's (:func:`keyed_noise.add_keyed_noise`), given three compiler
settings: no multiply and add fused into one rounding (Triton's
``enable_fp_fusion``, turned off by Inductor's ``emulate_precision_casts``;
Inductor's C++ is built with ``-ffp-contract=off``), no flush of float32
subnormals to zero (``eager_numerics.disable_ftz``), and no device-side index
assertions (every gather index is in range by construction). A self-check
against numpy's reference runs on every compiled variant before it serves.

:func:`prepare` builds when a server is built (the Perturber, the
throttle's levels, the vLLM processors), never on a request: one variant per
(device, number of levels, dtype). On CUDA the hand-written Triton kernel of
:mod:`.triton_noise` is tried first (3.3 us a row served at K = 128,000,
batch 64, three levels on an H200, against 7.8 for Inductor's compile of
:func:`noisy_logits` and 76 for the op-by-op path), then
``torch.compile(dynamic=True)`` of :func:`noisy_logits`, warmed at batch 1 and
a larger batch (a dimension of size 1 is specialized by the compiler). A
self-check against numpy's reference runs on every variant before it serves;
one that fails gives way to the next kernel. Where none can serve, it warns
once (:class:`CompiledNoiseWarning`, naming the cost) and the op-by-op path
serves, with the same bits (``CALIBER_COMPILED_KERNEL=0`` selects it,
``CALIBER_NOISE_KERNEL=triton`` or ``inductor`` keeps one kernel). A request
whose variant was not prepared is served by the op-by-op path too (it never
waits for a compiler).
"""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import torch

from . import keyed_noise, keyed_noise_torch

__all__ = ["CompiledNoiseWarning", "FALLBACK_COST", "add_keyed_noise", "call", "compile_seconds", "kernel_name",
           "noisy_logits", "prepare", "ready", "triton_configs", "unavailable_reason"]

#: What serving a CUDA tensor costs without the compiled kernel (issue 34's H200 figures, K = 128,000, batch 64).
FALLBACK_COST = ("the op-by-op path: about 24x the time of torch.randn + add per row with one level and 81x with "
                 "three on an H200 at K = 128,000")
#: Inductor settings the bits depend on (see the module's docstring).
COMPILE_OPTIONS = {"emulate_precision_casts": True, "eager_numerics.disable_ftz": True,
                   "assert_indirect_indexing": False}
#: Logits dtypes served by the compiled kernel.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Warm-up shapes: batch 1 (specialized) and a batch whose size matches neither K nor a level count, so that
# the compiler's shape guards never tie two dimensions together.
_WARM_ROWS = (1, 5)
_WARM_CLASSES = 1_003

_T_BITS, _SIGN_INDEX, _GAMMA, _M1, _M2, _MASK52, _MASK_T, _BITS_OF_2_52, _BITS_OF_64 = (
    keyed_noise_torch.WORD_CONSTANTS[name] for name in
    ("T_BITS", "SIGN_INDEX", "GAMMA", "M1", "M2", "MASK52", "MASK_T", "BITS_OF_2_52", "BITS_OF_64"))


class CompiledNoiseWarning(RuntimeWarning):
    """The compiled kernel is unavailable for a device or variant: the slower op-by-op path serves it."""


def _mix(words: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 words holding uint64 bits (a masked arithmetic shift is a logical one)."""
    words = words ^ ((words >> 30) & ((1 << 34) - 1))
    words = words * _M1
    words = words ^ ((words >> 27) & ((1 << 37) - 1))
    words = words * _M2
    return words ^ ((words >> 31) & ((1 << 33) - 1))


def _normals(words: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Step 4 of the derivation: one standard normal (float64) per word, through the gather table's rows."""
    half_a = ((words & _MASK52) | _BITS_OF_2_52).view(torch.float64) - (2.0 ** 52 - 0.5)  # a / 2, exactly
    half_a_bits = half_a.view(torch.int64)  # positive: the arithmetic shift is a logical one
    piece = (half_a_bits >> _T_BITS) + ((words >> 63) & _SIGN_INDEX)  # the sign bit picks the negated half
    t = ((half_a_bits & _MASK_T) | _BITS_OF_64).view(torch.float64) - 64.0  # exact: t has at most T_BITS bits
    out = table[4][piece]
    for power in (3, 2, 1, 0):  # Horner's rule: each multiply and add rounded on its own
        out = out * t
        out = out + table[power][piece]
    return out


def _round_once(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 rounded once to ``dtype``: float16 and bfloat16 through float32 rounded to odd (two spare bits)."""
    if dtype == torch.float64:
        return values
    nearest = values.to(torch.float32)
    if dtype == torch.float32:
        return nearest
    back = nearest.to(torch.float64)
    away = (back.abs() > values.abs()).to(torch.int32)  # rounded away from zero: one ulp back toward it
    odd = (back != values).to(torch.int32)
    return ((nearest.view(torch.int32) - away) | odd).view(torch.float32).to(dtype)


def noisy_logits(logits: torch.Tensor, rows: torch.Tensor, increments: torch.Tensor,
                 table: torch.Tensor) -> torch.Tensor:
    """``logits + sum_i increments[i] * xi_i`` in float64, rounded once: the served noise as one pure function.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_rows, n_classes)
        float32, float64, float16 or bfloat16; not modified.
    rows : torch.Tensor of shape (n_levels + 1, n_rows), int64
        Rows 0 to n_levels - 1: each level's row seeds (:func:`keyed_noise.row_seeds`,
        the uint64 bits as int64); the last row: how many levels each row adds
        (0: the row as it came). Every level is drawn for every row, so a row's
        work does not depend on its count. One tensor, so one copy to the device.
    increments : torch.Tensor of shape (n_levels,), float64
        Each level's scale, in the order the levels are summed.
    table : torch.Tensor of shape (DEGREE + 1, N), float64
        :func:`keyed_noise.gather_table` on the logits' device.

    Returns
    -------
    torch.Tensor of the logits' shape, dtype and device
        Bit for bit :func:`keyed_noise.add_keyed_noise` of the rows' served levels.

    Notes
    -----
    Eq. logits-noise. A row at k levels is ``((inc_1 xi_1 + inc_2 xi_2) + ...) + logits``
    over its first k levels, the reference's order; the levels above k are
    computed and discarded by an exact select.
    """
    n_classes = logits.shape[1]
    counters = torch.arange(n_classes, dtype=torch.int64, device=logits.device) * _GAMMA  # wraps as uint64 does
    n_levels = increments.shape[0]
    rows_served = rows[n_levels][:, None]
    noise = None
    for level in range(n_levels):
        term = _normals(_mix(rows[level][:, None] + counters[None, :]), table) * increments[level]
        noise = term if noise is None else torch.where(rows_served > level, noise + term, noise)
    wide = logits.to(torch.float64)  # exact
    if noise is not None:
        wide = torch.where(rows_served > 0, noise + wide, wide)
    return _round_once(wide, logits.dtype)


# -- compiling, per device and variant -------------------------------------------------------------------

_lock = threading.RLock()
_variants: dict = {}  # (device, n_levels, dtype) -> compiled callable, or None where it failed
_device_failure: dict = {}  # device -> the reason torch.compile cannot serve it
_compile_seconds: dict = {}
_kernel_names: dict = {}  # (device, n_levels, dtype) -> "triton" or "inductor"
_triton_configs: dict = {}  # device -> seconds per launch configuration, timed once
_warned: set = set()
_reads_own_table: set = set()  # kernels called without the gather table (they read their own layout of it)


def _device_key(device) -> str:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def _own_function(name: str):
    """:func:`noisy_logits` under a code object of its own: the compiler keeps its graphs and its recompile
    budget per code object, so one variant's guards never evict or crowd out another's."""
    code = noisy_logits.__code__.replace(co_name=name)
    function = type(noisy_logits)(code, noisy_logits.__globals__, name, noisy_logits.__defaults__,
                                  noisy_logits.__closure__)
    return function


def _compile(variant_name: str):
    return torch.compile(_own_function(variant_name), dynamic=True, fullgraph=True, options=dict(COMPILE_OPTIONS))


def _warn(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CompiledNoiseWarning, stacklevel=3)


def _warm_and_check(function, device: str, n_levels: int, dtype: torch.dtype) -> None:
    """Compile ``function`` at the warm-up shapes and compare each with numpy's reference, bit for bit
    (rows at every count of levels, 0 included)."""
    rng = np.random.default_rng(20261127 + n_levels)
    for n_rows in _WARM_ROWS:
        wide = rng.standard_normal((n_rows, _WARM_CLASSES)) * 8
        logits = torch.from_numpy(wide).to(dtype)
        wide = logits.to(torch.float64).numpy()  # exact
        level_seeds = [rng.integers(0, 2**64 - 1, size=n_rows, dtype=np.uint64, endpoint=True)
                       for _ in range(n_levels)]
        increments = [float(x) for x in rng.uniform(0.25, 2.0, size=n_levels)]
        served = [n_levels - row % (n_levels + 1) for row in range(n_rows)]
        got = call(function, logits.to(device), level_seeds, increments, served)
        want = wide.copy()
        for row, k in enumerate(served):
            if k:
                want[row] = keyed_noise.add_keyed_noise(wide[row:row + 1], [s[row:row + 1] for s in level_seeds[:k]],
                                                        increments[:k])[0]
        want = _round_once(torch.from_numpy(want), dtype)
        if not torch.equal(got.cpu().view(_BITS_VIEW[dtype]), want.view(_BITS_VIEW[dtype])):
            raise RuntimeError(f"the compiled kernel differs from numpy's reference on {dtype} logits")


_BITS_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16}


def prepare(device=None, *, n_levels: int = 1, dtypes=(torch.float32,)) -> bool:
    """Compile (or load from the compiler's cache) the kernel for ``device`` now, and check its bits.

    Servers call this when they are built, so no request waits for a compiler.
    Once per (device, ``n_levels``, dtype) per process.

    Parameters
    ----------
    device : str or torch.device, optional
        Where the logits will live. Default: the current CUDA device when
        torch can reach one, else nothing is compiled (the CPU is served by
        :mod:`.fused_noise`) and False is returned.
    n_levels : int, default 1
        Levels each request draws (the served level's nonzero increments).
    dtypes : sequence of torch.dtype, default (torch.float32,)
        Logits dtypes to compile for.

    Returns
    -------
    bool
        Whether every requested variant is served by the compiled kernel.

    Warns
    -----
    CompiledNoiseWarning
        Once per device: ``torch.compile`` cannot build or run the kernel
        there (the reason, and :data:`FALLBACK_COST`); once per variant: it
        failed its self-check.
    """
    if device is None:
        if not torch.cuda.is_available():
            return False
        device = "cuda"
    if isinstance(n_levels, bool) or not isinstance(n_levels, int) or n_levels < 1:
        raise ValueError(f"n_levels must be a positive integer, got {n_levels!r}")
    dtypes = tuple(dtypes)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes must be among {DTYPES}, got {unknown}")
    device = _device_key(device)
    ok = True
    with _lock:
        for dtype in dtypes:
            key = (device, n_levels, dtype)
            if key in _variants:
                ok = ok and _variants[key] is not None
                continue
            if device in _device_failure:
                _variants[key], ok = None, False
                continue
            name = f"noisy_logits_{device.replace(':', '')}_{n_levels}_{str(dtype).split('.')[-1]}"
            started = time.perf_counter()
            if os.environ.get("CALIBER_COMPILED_KERNEL", "").lower() in ("0", "off", "no"):
                _fail_device(device, RuntimeError("CALIBER_COMPILED_KERNEL is off"))
                _variants[key], ok = None, False
                continue
            function, failures = None, []
            for kernel, build in _candidates(name, device):
                try:
                    candidate = build()
                    _warm_and_check(candidate, device, n_levels, dtype)
                except Exception as exc:  # no compiler, no Triton, an unsupported op, a bit difference: next one
                    failures.append((kernel, exc))
                    continue
                function = candidate
                _kernel_names[key] = kernel
                break
            if function is None:
                _fail_variant(device, key, failures)
                _variants[key], ok = None, False
                continue
            _variants[key] = function
            _compile_seconds[key] = time.perf_counter() - started
    return ok


def _candidates(name: str, device: str) -> list:
    """(kernel, build) pairs to try for a variant, fastest first: the hand-written Triton kernel on CUDA
    (:mod:`.triton_noise`), then Inductor's compile of :func:`noisy_logits`. ``CALIBER_NOISE_KERNEL`` =
    ``triton`` or ``inductor`` keeps one."""
    choice = os.environ.get("CALIBER_NOISE_KERNEL", "").lower()
    out = []
    if device.startswith("cuda") and choice in ("", "triton"):
        out.append(("triton", lambda: _triton_kernel(device)))
    if choice in ("", "inductor"):
        out.append(("inductor", lambda: _compile(name)))
    return out


def _triton_kernel(device: str):
    from . import triton_noise  # imports Triton: only where a CUDA variant is prepared

    if device not in _triton_configs:
        _triton_configs[device] = triton_noise.time_configs(device)
    _reads_own_table.add(triton_noise.noisy_logits)
    return triton_noise.noisy_logits


def _fail_variant(device: str, key, failures: list) -> None:
    """No kernel could serve a variant: a bit difference warns for the variant, anything else for the device."""
    if failures and all("differs from numpy" in str(exc) for _, exc in failures):
        _warn(key, f"caliber's compiled noise kernel for {key[1]} level(s) of {key[2]} logits on {device} is not "
                   f"served ({'; '.join(f'{k}: {e}' for k, e in failures)}); they are served by {FALLBACK_COST}")
        return
    _fail_device(device, next((exc for _, exc in reversed(failures) if "differs from numpy" not in str(exc)),
                              RuntimeError("no kernel to try")))


def _fail_device(device: str, exc: Exception) -> None:
    reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    _device_failure[device] = reason
    _warn(("device", device), f"caliber's compiled noise kernel is unavailable on {device} ({reason}); "
                              f"tensors there are served by {FALLBACK_COST}")


def ready(device, n_levels: int, dtype: torch.dtype) -> bool:
    """Whether :func:`prepare` compiled and checked this variant (False before it was called)."""
    return _variants.get((_device_key(device), n_levels, dtype)) is not None


def unavailable_reason(device) -> str | None:
    """Why ``device`` is not served by the compiled kernel (None when it may be, or before :func:`prepare`)."""
    return _device_failure.get(_device_key(device))


def kernel_name(device, n_levels: int, dtype: torch.dtype) -> str | None:
    """Which kernel serves a prepared variant: ``"triton"``, ``"inductor"``, or None (the op-by-op path)."""
    return _kernel_names.get((_device_key(device), n_levels, dtype))


def triton_configs(device) -> dict:
    """Median seconds per Triton launch configuration (block, warps) timed on ``device`` at prepare ({} before)."""
    return dict(_triton_configs.get(_device_key(device), {}))


def compile_seconds() -> dict:
    """Seconds each prepared variant took to compile and check, by (device, n_levels, dtype)."""
    return dict(_compile_seconds)


def _static(tensor: torch.Tensor, *dims) -> torch.Tensor:
    """Mark dims the compiler must not make symbolic (a level count, the table's width): a symbolic one could be
    tied by its guards to an equal batch size and specialize it."""
    for dim in dims:
        torch._dynamo.mark_static(tensor, dim)
    return tensor


def _increments_on(increments, device) -> torch.Tensor:
    key = ("increments", tuple(float(x) for x in increments))
    return keyed_noise_torch.on_device(key, device, lambda: _static(
        torch.tensor(key[1], dtype=torch.float64, device=device), 0))


def _table_on(device) -> torch.Tensor:
    return keyed_noise_torch.on_device("table-2d", device, lambda: _static(
        torch.from_numpy(keyed_noise.gather_table()).to(device), 0, 1))


def call(function, logits: torch.Tensor, level_seeds, increments, served=None) -> torch.Tensor:
    """``function`` (a :func:`noisy_logits`-shaped kernel) on the logits, the seeds packed into one device copy."""
    device = logits.device
    n_rows, n_levels = logits.shape[0], len(increments)
    # On CUDA the seeds are packed into page-locked memory and uploaded without a host-side wait (the kernel
    # queued behind the copy on the same stream reads it complete; torch's host allocator recycles the block
    # only once the copy is done), so a server whose stream is busy does not stall on it. On an idle H200 it
    # measured the same as a pageable copy (114-120 against 103 us a call at batch 1, 183 against 192 at 64).
    staged = torch.empty((n_levels + 1, n_rows), dtype=torch.int64, pin_memory=device.type == "cuda")
    rows = staged.numpy()
    for level, seeds in enumerate(level_seeds):
        rows[level] = np.asarray(seeds, dtype=np.uint64).reshape(-1).view(np.int64)
    rows[n_levels] = n_levels if served is None else np.asarray(served, dtype=np.int64)
    values = logits.detach()
    if not values.is_contiguous():  # one stride layout: another would be a new graph, so a compile
        values = values.contiguous()
    rows_there = staged.to(device, non_blocking=True)
    if function in _reads_own_table:  # the Triton kernel: no compiler guards to mark, its own table
        return function(values, rows_there, _increments_on(increments, device))
    return function(values, _static(rows_there, 0), _increments_on(increments, device), _table_on(device))


def add_keyed_noise(logits: torch.Tensor, level_seeds, increments, served=None) -> torch.Tensor:
    """:func:`keyed_noise_torch.add_keyed_noise` by the compiled kernel where it is prepared, else the op-by-op path.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_rows, n_classes)
        A floating dtype; not modified.
    level_seeds : sequence of array_like of shape (n_rows,), uint64
        Row seeds of each level.
    increments : sequence of float
        One per level.
    served : sequence of int, optional
        How many of the levels each row adds (0: a copy of the row); every level
        is drawn for every row. Default: all of them.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes), the logits' dtype and device
        The same bits as numpy's reference either way.
    """
    function = _variants.get((_device_key(logits.device), len(increments), logits.dtype))
    if function is None or len(increments) == 0:
        key = (_device_key(logits.device), len(increments), logits.dtype)
        if len(increments) and key not in _variants and _device_key(logits.device) not in _device_failure:
            _warn(("unprepared",) + key, f"caliber's compiled noise kernel was not prepared for {len(increments)} "
                                         f"level(s) of {logits.dtype} logits on {key[0]} (compiled_noise.prepare at "
                                         f"start); they are served by {FALLBACK_COST}")
        return keyed_noise_torch.add_keyed_noise_op_by_op(logits, level_seeds, increments, served)
    return call(function, logits, level_seeds, increments, served)


keyed_noise_torch.use_device_kernel(add_keyed_noise)
