"""The served keyed noise as one hand-written Triton kernel: CUDA's fastest path, same bits as numpy's reference.

:func:`compiled_noise.noisy_logits` compiled by Inductor runs the derivation
in int64 words as torch writes it (masked arithmetic shifts, 64-bit index
arithmetic). This kernel is the same derivation written for the GPU's
integer units: uint64 words whose right shifts are logical (no masks), the
gather index and the local coordinate built from the 32-bit high word only,
and every level's five coefficients gathered at immediate offsets from one
address. Each program serves one block of one row; the levels' seeds and
the row's served count are scalars.

The gathers read the table's positive half only, and the word's sign bit is
set on the result (as the CPU's fused kernel does): negating every
coefficient negates each rounded step exactly. The half is 135 KB, and the
pieces of the likeliest exponents span half the cache lines they did with
both signs in the index (5-7% less time a row at batch 64 and 256 on an
H200, paired in one process). Where the time goes there (K = 128,000,
batch 64, three levels; benchmarks/profile_triton_gathers.py,
docs/figures/triton-gathers.md): this kernel ran at 2.2x ``torch.randn`` +
add, the same kernel with no gathers at 1.2x, and with every gather inside
one exponent's 64 pieces at 1.6x. The gathers are half the time, and no
layout of this table can bring them under that last bound. Two layouts were
tried and left out: (c4, c3) and (c2, c1) side by side for 16-byte loads
(the same time), and the likeliest 128-512 pieces in shared memory through
``tl.gather`` (1.15-1.8x slower: a barrier per gather).

Bits: the same float64 steps in the same order (Horner's rule with separate
roundings: the kernel is launched with ``enable_fp_fusion=False``), the sum
rounded once to the logits' dtype (float16 and bfloat16 through a float32
rounded to odd). :mod:`.compiled_noise` checks every variant against numpy's
reference before it serves. Under ``TRITON_INTERPRET=1`` the kernel runs on
CPU tensors (the tests' way to check it without a GPU).

Launch configurations (block size, warps) are timed once per device when a
variant is prepared, never on a request.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import triton
import triton.language as tl

from . import keyed_noise, keyed_noise_torch, normal_table

__all__ = ["CONFIGS", "chosen_config", "noisy_logits", "positive_table", "select_config", "time_configs"]

_C = keyed_noise_torch.WORD_CONSTANTS
_T_HIGH = _C["T_BITS"] - 32  # the index's shift within the high word
_MASK_T_HIGH = _C["MASK_T"] >> 32
_FIRST_PIECE = 1022 << normal_table.SUB_BITS  # a / 2 >= 1/2: its first piece's (exponent, top bits)
_N_PIECES = normal_table.N_EXPONENTS << normal_table.SUB_BITS
_OUT_KIND = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
#: (elements a program serves, warps) candidates; the fastest on the device is chosen at prepare. On an H200
#: they ran within 25% of each other at K = 128,000 (docs/figures/triton-gathers.md).
CONFIGS = ((1024, 4), (512, 4), (2048, 8), (1024, 8))
_chosen: dict = {}


@triton.jit
def _word(z):
    """SplitMix64's output function on uint64 words (right shifts of unsigned words are logical)."""
    z = z ^ (z >> 30)
    z = z * 0xBF58476D1CE4E5B9
    z = z ^ (z >> 27)
    z = z * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _piece_and_t(z, T_HIGH: tl.constexpr, FIRST: tl.constexpr, MASK_T_HIGH: tl.constexpr):
    """A uint64 word's piece of the positive half (int32) and its local coordinate t (float64, exact)."""
    # a / 2 = low 52 bits + 1/2, exactly: the bits under 2^52's exponent, less 2^52 - 1/2.
    half_a = ((z & 0xFFFFFFFFFFFFF) | 0x4330000000000000).to(tl.float64, bitcast=True) - 4503599627370495.5
    bits = half_a.to(tl.uint64, bitcast=True)
    high = (bits >> 32).to(tl.uint32)
    piece = ((high >> T_HIGH) - FIRST).to(tl.int32)
    # The low T_BITS of a / 2 under 64.0's exponent read 64 + t exactly.
    t_bits = (bits & 0xFFFFFFFF) | ((((high & MASK_T_HIGH) | 0x40500000).to(tl.uint64)) << 32)
    return piece, t_bits.to(tl.float64, bitcast=True) - 64.0


@triton.jit
def _normal(z, table, N: tl.constexpr, T_HIGH: tl.constexpr, FIRST: tl.constexpr, MASK_T_HIGH: tl.constexpr):
    """Step 4 of the derivation on uint64 words: one standard normal (float64) a word.

    Horner's rule on the positive half's coefficients, then the word's sign bit
    set on the result: negating every coefficient negates each rounded step
    exactly, so this is the reference's gather from the negated half.
    """
    piece, t = _piece_and_t(z, T_HIGH, FIRST, MASK_T_HIGH)
    at = table + piece  # the powers N apart: immediate offsets from one address
    out = tl.load(at + 4 * N) * t + tl.load(at + 3 * N)  # two roundings: the launch turns fused multiply-adds off
    out = out * t + tl.load(at + 2 * N)
    out = out * t + tl.load(at + N)
    out = out * t + tl.load(at)
    return (out.to(tl.uint64, bitcast=True) ^ (z & 0x8000000000000000)).to(tl.float64, bitcast=True)


# Triton specializes an integer argument that is 1 or a multiple of 16 (and a pointer aligned to 16 bytes) by
# default: a batch or K of another kind would compile anew on a request. The sizes are not specialized, and
# logits at an unaligned address are copied first.
@triton.jit(do_not_specialize=["n_rows", "n_classes", "n_blocks"])
def _noise_kernel(logits, out, rows, increments, table, n_rows, n_classes, n_blocks,
                  N_LEVELS: tl.constexpr, BLOCK: tl.constexpr, N: tl.constexpr, OUT_KIND: tl.constexpr,
                  T_HIGH: tl.constexpr, FIRST: tl.constexpr, MASK_T_HIGH: tl.constexpr):
    program = tl.program_id(0)
    row = program // n_blocks
    cols = (program % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_classes
    at = row.to(tl.int64) * n_classes + cols
    wide = tl.load(logits + at, mask=inside, other=0.0).to(tl.float64)
    counters = cols.to(tl.uint64) * 0x9E3779B97F4A7C15  # wraps as the reference's uint64 does
    served = tl.load(rows + N_LEVELS * n_rows + row)
    noise = tl.zeros((BLOCK,), dtype=tl.float64)
    for level in tl.static_range(N_LEVELS):
        seed = tl.load(rows + level * n_rows + row).to(tl.uint64, bitcast=True)
        term = _normal(_word(seed + counters), table, N, T_HIGH, FIRST, MASK_T_HIGH)
        term = term * tl.load(increments + level)
        if level == 0:
            noise = term
        else:  # every level drawn; the ones above the row's count discarded by an exact select
            noise = tl.where(served > level, noise + term, noise)
    wide = tl.where(served > 0, noise + wide, wide)
    if OUT_KIND == 0:
        tl.store(out + at, wide, mask=inside)
    else:
        nearest = wide.to(tl.float32)
        if OUT_KIND == 1:
            tl.store(out + at, nearest, mask=inside)
        else:  # round to odd at float32, so that the rounding to 16 bits is the only one that counts
            back = nearest.to(tl.float64)
            away = (tl.abs(back) > tl.abs(wide)).to(tl.int32)
            odd = (back != wide).to(tl.int32)
            odd32 = ((nearest.to(tl.int32, bitcast=True) - away) | odd).to(tl.float32, bitcast=True)
            if OUT_KIND == 2:
                tl.store(out + at, odd32.to(tl.float16), mask=inside)
            else:  # to nearest even in integers: the same on every device (Triton's interpreter truncates)
                bits = odd32.to(tl.uint32, bitcast=True)
                bits = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
                tl.store(out + at, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=inside)


def positive_table() -> np.ndarray:
    """The positive half's coefficients, one flat float64 array: power p of piece i at p N + i."""
    return np.ascontiguousarray(keyed_noise.table()[:, :_N_PIECES]).reshape(-1)


def _table_on(device) -> torch.Tensor:
    return keyed_noise_torch.on_device("table-positive-triton", device,
                                       lambda: torch.from_numpy(positive_table()).to(device))


def _launch(logits: torch.Tensor, rows: torch.Tensor, increments: torch.Tensor, config) -> torch.Tensor:
    block, warps = config
    n_rows, n_classes = logits.shape
    out = torch.empty_like(logits)
    if n_rows == 0 or n_classes == 0:
        return out
    n_blocks = triton.cdiv(n_classes, block)
    options = {} if os.environ.get("TRITON_INTERPRET") == "1" else {"num_warps": warps, "enable_fp_fusion": False}
    _noise_kernel[(n_rows * n_blocks,)](
        logits, out, rows, increments, _table_on(logits.device), n_rows, n_classes, n_blocks,
        N_LEVELS=increments.shape[0], BLOCK=block, N=_N_PIECES, OUT_KIND=_OUT_KIND[logits.dtype], T_HIGH=_T_HIGH,
        FIRST=_FIRST_PIECE, MASK_T_HIGH=_MASK_T_HIGH, **options)
    return out


def chosen_config(device) -> tuple:
    """The launch configuration :func:`time_configs` chose for ``device`` (the first candidate before it ran)."""
    return _chosen.get(str(torch.device(device)), CONFIGS[0])


def select_config(device, config: tuple) -> None:
    """Serve ``device`` with ``config`` (one of :data:`CONFIGS`) from now on: for checks of each configuration's
    bits and for figures per configuration; servers keep what :func:`time_configs` chose."""
    if tuple(config) not in CONFIGS:
        raise ValueError(f"config must be one of {CONFIGS}, got {config!r}")
    _chosen[str(torch.device(device))] = tuple(config)


def noisy_logits(logits: torch.Tensor, rows: torch.Tensor, increments: torch.Tensor,
                 table: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`compiled_noise.noisy_logits`'s contract, by the Triton kernel.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_rows, n_classes), contiguous
        float32, float64, float16 or bfloat16; not modified.
    rows : torch.Tensor of shape (n_levels + 1, n_rows), int64, contiguous
        Each level's row seeds (uint64 bits), then each row's served count.
    increments : torch.Tensor of shape (n_levels,), float64
    table : torch.Tensor, optional
        Not read: accepted so that one call serves every kernel. This one reads
        the positive half only (:func:`positive_table`).

    Returns
    -------
    torch.Tensor of the logits' shape, dtype and device
    """
    if increments.shape[0] < 1:
        return logits.clone()
    if logits.data_ptr() % 16:  # a view at an odd offset: the kernel was compiled for aligned logits
        logits = logits.clone()
    return _launch(logits, rows, increments, chosen_config(logits.device))


def time_configs(device, *, n_rows: int = 64, n_classes: int = 131_072, repeats: int = 15) -> dict:
    """Time each candidate configuration on ``device`` (three levels, float32) and keep the fastest.

    Called when a variant is prepared (a fraction of a second on a GPU), so that
    no request waits for it. The shape is one where the device's work outweighs
    the launch (at K = 32,768 the four took 60 +- 1 us a call on an H200: the
    launch's time). The candidates take turns in each repeat, so that
    a drift of the device's clock or load reaches them alike (five repeats, one
    configuration after another, ranked them differently from run to run on an
    H200). Returns the median seconds per configuration.
    """
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(n_rows, n_classes, generator=generator).to(device)
    rows = torch.randint(-2**62, 2**62, (4, n_rows), generator=generator).to(device)
    rows[3] = 3
    increments = torch.tensor([0.5, 0.8, 1.7], dtype=torch.float64, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    built = []
    for config in CONFIGS:
        try:  # a configuration this device cannot build (registers, shared memory) is left out
            _launch(logits, rows, increments, config=config)  # compiles this configuration
            sync()
        except Exception:
            continue
        built.append(config)
    if not built:
        raise RuntimeError("no Triton launch configuration could be built")
    times = {config: [] for config in built}
    for _ in range(repeats):
        for config in built:
            start = time.perf_counter()
            _launch(logits, rows, increments, config=config)
            sync()
            times[config].append(time.perf_counter() - start)
    medians = {config: sorted(values)[len(values) // 2] for config, values in times.items()}
    _chosen[str(device)] = min(medians, key=medians.get)
    return medians
