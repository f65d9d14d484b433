"""The torch twin of :func:`caliber_core.serving.keyed_noise.normals_from_seeds`, on the tensors' device.

Imported only when a torch tensor is served (importing torch costs seconds).
Same steps as the numpy version, in int64 arithmetic: multiplication wraps
modulo 2^64 exactly as uint64 does, and a logical right shift is an arithmetic
shift followed by a mask. Every float step is an exact conversion or one
correctly rounded multiply or add, so the float64 results equal numpy's bit
for bit on any device with IEEE float64.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from . import keyed_noise, normal_table

_T_BITS = 52 - normal_table.SUB_BITS
_FIRST_PIECE = 1023 << normal_table.SUB_BITS
_N_PIECES = normal_table.N_EXPONENTS << normal_table.SUB_BITS
_CHUNK = 1 << 16  # elements per block on the CPU (a GPU takes the whole batch at once)


def _signed(word: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return word - (1 << 64) if word >= 1 << 63 else word


_GAMMA = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)
_MASK52 = (1 << 52) - 1
_MASK_T = (1 << _T_BITS) - 1

_cache: dict = {}
_cache_lock = threading.Lock()


def _on_device(name: str, device, make):
    key = (name, str(device))
    with _cache_lock:
        value = _cache.get(key)
        if value is None:
            value = _cache[key] = make()
    return value


def _table(device) -> torch.Tensor:
    return _on_device("table", device, lambda: torch.from_numpy(np.array(keyed_noise.table())).to(device))


def _counters(n_classes: int, device) -> torch.Tensor:
    # Wrapping int64 product: the same bits as numpy's uint64 j * GAMMA.
    return _on_device(f"counters{n_classes}", device,
                      lambda: torch.arange(n_classes, dtype=torch.int64, device=device) * _GAMMA)


def normals_from_seeds(seeds: np.ndarray, n_classes: int, *, device, dtype=None) -> torch.Tensor:
    """Standard normals, (n_rows, n_classes), on ``device``; float64 unless ``dtype`` says otherwise."""
    device = torch.device(device)
    dtype = torch.float64 if dtype is None else dtype
    seeds64 = np.ascontiguousarray(np.asarray(seeds, dtype=np.uint64).reshape(-1)).view(np.int64)
    seeds_t = torch.from_numpy(seeds64.copy()).to(device)
    n_rows = seeds_t.shape[0]
    out = torch.empty((n_rows, n_classes), dtype=torch.float64, device=device)
    counters, table = _counters(n_classes, device), _table(device)
    rows_per_block = n_rows if device.type != "cpu" else max(1, _CHUNK // max(1, n_classes))
    for start in range(0, n_rows, max(1, rows_per_block)):
        stop = min(n_rows, start + rows_per_block)
        _transform_block(seeds_t[start:stop], counters, table, out[start:stop])
    return out if dtype == torch.float64 else out.to(dtype)


def _transform_block(seeds: torch.Tensor, counters: torch.Tensor, table: torch.Tensor, out: torch.Tensor) -> None:
    w = seeds[:, None] + counters[None, :]
    tmp = torch.empty_like(w)
    for shift, multiplier in ((30, _M1), (27, _M2)):
        torch.bitwise_right_shift(w, shift, out=tmp)
        tmp &= (1 << (64 - shift)) - 1  # a logical shift
        w ^= tmp
        w *= multiplier
    torch.bitwise_right_shift(w, 31, out=tmp)
    tmp &= (1 << 33) - 1
    w ^= tmp
    _words_to_normals(w, tmp, table, out)


def normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """Step 4 alone, for int64 words holding the uint64 bits: float64 normals of the same shape and device."""
    w = words.to(torch.int64).clone()
    out = torch.empty(w.shape, dtype=torch.float64, device=w.device)
    _words_to_normals(w.reshape(-1), torch.empty_like(w).reshape(-1), _table(w.device), out.reshape(-1))
    return out


def _words_to_normals(w: torch.Tensor, tmp: torch.Tensor, table: torch.Tensor, out: torch.Tensor) -> None:
    """Overwrites ``w`` and ``tmp`` (int64 buffers of out's shape) and fills ``out``."""
    torch.bitwise_and(w, _MASK52, out=tmp)
    tmp <<= 1
    tmp |= 1
    a_float = tmp.to(torch.float64)  # exact: a < 2^53
    a_bits = a_float.view(torch.int64)  # positive, so an arithmetic shift is a logical one
    w >>= 63  # -1 for a set sign bit, else 0 ...
    w &= _N_PIECES  # ... so this is the offset of the negated half of the table
    piece = torch.bitwise_right_shift(a_bits, _T_BITS, out=tmp)
    piece -= _FIRST_PIECE
    piece += w
    piece = piece.reshape(-1)
    t_bits = torch.bitwise_and(a_bits, _MASK_T, out=w)
    t = a_float.copy_(t_bits)  # a's bits are read; exact: fewer than 53 bits
    t *= 2.0 ** -_T_BITS
    flat_out = out.view(-1)
    coefficient = torch.empty_like(flat_out)
    torch.index_select(table[-1], 0, piece, out=flat_out)
    t = t.reshape(-1)
    for power in range(normal_table.DEGREE - 1, -1, -1):
        flat_out *= t
        torch.index_select(table[power], 0, piece, out=coefficient)
        flat_out += coefficient
