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
_CHUNK = 1 << 15  # elements per block on the CPU: fewer op dispatches than numpy's blocks need


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


def _seeds_on(seeds, device) -> torch.Tensor:
    seeds64 = np.ascontiguousarray(np.asarray(seeds, dtype=np.uint64).reshape(-1)).view(np.int64)
    return torch.from_numpy(seeds64.copy()).to(device)


def _blocks(n_rows: int, n_classes: int, device: torch.device):
    if device.type != "cpu":  # a GPU takes the whole batch in one launch per step
        return [(slice(0, n_rows), slice(0, n_classes))]
    return keyed_noise.blocks(n_rows, n_classes, _CHUNK)


class _Workspace:
    """Scratch buffers for one block: on the CPU reused per thread (a fresh allocation of a
    block's size is mapped and faulted in each time); on a GPU made per call (its
    caching allocator makes that cheap)."""

    _INT, _REAL = ("words", "scratch"), ("real", "coefficient", "noise", "draw")

    def __init__(self, size: int, device: torch.device):
        self.size, self.device = size, device
        for name in self._INT:
            setattr(self, name, torch.empty(size, dtype=torch.int64, device=device))
        for name in self._REAL:
            setattr(self, name, torch.empty(size, dtype=torch.float64, device=device))

    def view(self, name: str, shape) -> torch.Tensor:
        return getattr(self, name)[: shape[0] * shape[1]].view(shape)


_workspaces = threading.local()


def _workspace(size: int, device: torch.device) -> _Workspace:
    if device.type != "cpu":
        return _Workspace(size, device)
    work = getattr(_workspaces, "work", None)
    if work is None or work.size < size:
        work = _workspaces.work = _Workspace(max(size, _CHUNK), device)
    return work


def normals_from_seeds(seeds: np.ndarray, n_classes: int, *, device, dtype=None) -> torch.Tensor:
    """Standard normals, (n_rows, n_classes), on ``device``; float64 unless ``dtype`` says otherwise."""
    device = torch.device(device)
    dtype = torch.float64 if dtype is None else dtype
    seeds_t = _seeds_on(seeds, device)
    out = torch.empty((seeds_t.shape[0], n_classes), dtype=torch.float64, device=device)
    counters, table = _counters(n_classes, device), _table(device)
    for rows, cols in _blocks(seeds_t.shape[0], n_classes, device):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        work = _workspace(shape[0] * shape[1], device)
        block = work.view("noise", shape)
        _transform_block(seeds_t[rows], counters[cols], table, block, work)
        out[rows, cols] = block
    return out if dtype == torch.float64 else out.to(dtype)


def add_keyed_noise(logits: torch.Tensor, level_seeds, increments) -> torch.Tensor:
    """The torch twin of :func:`keyed_noise.add_keyed_noise`: same bits, on the logits' device."""
    device = logits.device
    n_rows, n_classes = logits.shape
    out = torch.empty_like(logits)
    counters, table = _counters(n_classes, device), _table(device)
    seeds = [_seeds_on(s, device) for s in level_seeds]
    for rows, cols in _blocks(n_rows, n_classes, device):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        work = _workspace(shape[0] * shape[1], device)
        noise, draw = work.view("noise", shape), work.view("draw", shape)
        for i, (level_seeds_t, increment) in enumerate(zip(seeds, increments)):
            target = noise if i == 0 else draw
            _transform_block(level_seeds_t[rows], counters[cols], table, target, work)
            target *= increment
            if i:
                noise += draw
        noise += logits[rows, cols]  # float64 + the logits' dtype: an exact upcast, as on numpy
        out[rows, cols] = noise
    return out


def _transform_block(seeds: torch.Tensor, counters: torch.Tensor, table: torch.Tensor, out: torch.Tensor,
                     work: _Workspace) -> None:
    w, tmp = work.view("words", out.shape), work.view("scratch", out.shape)
    torch.add(seeds[:, None], counters[None, :], out=w)
    for shift, multiplier in ((30, _M1), (27, _M2)):
        torch.bitwise_right_shift(w, shift, out=tmp)
        tmp &= (1 << (64 - shift)) - 1  # a logical shift
        w ^= tmp
        w *= multiplier
    torch.bitwise_right_shift(w, 31, out=tmp)
    tmp &= (1 << 33) - 1
    w ^= tmp
    _words_to_normals(w, tmp, table, out, work.view("real", out.shape), work.view("coefficient", out.shape))


def normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """Step 4 alone, for int64 words holding the uint64 bits: float64 normals of the same shape and device."""
    w = words.to(torch.int64).reshape(1, -1).clone()
    out = torch.empty(w.shape, dtype=torch.float64, device=w.device)
    _words_to_normals(w, torch.empty_like(w), _table(w.device), out, torch.empty_like(out), torch.empty_like(out))
    return out.view(words.shape)


def _words_to_normals(w: torch.Tensor, tmp: torch.Tensor, table: torch.Tensor, out: torch.Tensor,
                      a_float: torch.Tensor, coefficient: torch.Tensor) -> None:
    """Overwrites ``w``, ``tmp`` (int64), ``a_float`` and ``coefficient`` (float64); fills ``out``."""
    torch.bitwise_and(w, _MASK52, out=tmp)
    tmp <<= 1
    tmp |= 1
    a_float.copy_(tmp)  # exact: a < 2^53
    a_bits = a_float.view(torch.int64)  # positive, so an arithmetic shift is a logical one
    w >>= 63  # -1 for a set sign bit, else 0 ...
    w &= _N_PIECES  # ... so this is the offset of the negated half of the table
    piece = torch.bitwise_right_shift(a_bits, _T_BITS, out=tmp)
    piece -= _FIRST_PIECE
    piece += w
    piece = piece.view(-1)
    t_bits = torch.bitwise_and(a_bits, _MASK_T, out=w)
    t = a_float.copy_(t_bits).view(-1)  # a's bits are read; exact: fewer than 53 bits
    t *= 2.0 ** -_T_BITS
    flat_out, coefficient = out.view(-1), coefficient.view(-1)
    torch.index_select(table[-1], 0, piece, out=flat_out)
    for power in range(normal_table.DEGREE - 1, -1, -1):
        flat_out *= t
        torch.index_select(table[power], 0, piece, out=coefficient)
        flat_out += coefficient
