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
_SIGN_INDEX = 1 << (63 - _T_BITS)  # the gather index of a set sign bit (keyed_noise.gather_table)
# Elements per block on the CPU: some 38 ops a block at several microseconds of dispatch each,
# so one block of 64 rows at K = 1,000 beat two or four.
_CHUNK = 1 << 16


def _signed(word: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return word - (1 << 64) if word >= 1 << 63 else word


_GAMMA = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)
_MASK52 = (1 << 52) - 1
_MASK_T = (1 << _T_BITS) - 1
_BITS_OF_2_52 = int(np.float64(2.0 ** 52).view(np.int64))
_BITS_OF_64 = int(np.float64(64.0).view(np.int64))

_cache: dict = {}
_cache_lock = threading.Lock()


def _on_device(name: str, device, make):
    key = (name, str(device))
    with _cache_lock:
        value = _cache.get(key)
        if value is None:
            value = _cache[key] = make()
    return value


def _table(device) -> tuple:
    """The gather table's rows on ``device`` (on the CPU they share numpy's untouched zero pages)."""
    return _on_device("table", device, lambda: tuple(torch.from_numpy(keyed_noise.gather_table()).to(device)))


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


def _transform_block(seeds: torch.Tensor, counters: torch.Tensor, table: tuple, out: torch.Tensor,
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


def _words_to_normals(w: torch.Tensor, tmp: torch.Tensor, table: tuple, out: torch.Tensor,
                      a_float: torch.Tensor, coefficient: torch.Tensor) -> None:
    """Overwrites ``w``, ``tmp`` (int64), ``a_float`` and ``coefficient`` (float64); fills ``out``.

    The steps of keyed_noise._words_to_normals; an arithmetic shift keeps the
    sign's offset as an addition here (three ops, as the numpy version's two plus a mask).
    """
    torch.bitwise_and(w, _MASK52, out=tmp)
    tmp |= _BITS_OF_2_52  # 2^52 + v as float64 bits
    half_a = torch.sub(tmp.view(torch.float64), 2.0 ** 52 - 0.5, out=a_float)  # a / 2, exactly
    half_a_bits = half_a.view(torch.int64)  # positive, so an arithmetic shift is a logical one
    piece = torch.bitwise_right_shift(half_a_bits, _T_BITS, out=tmp)
    w >>= 63  # -1 for a set sign bit, else 0 ...
    w &= _SIGN_INDEX  # ... so this is the offset of the negated half of the table
    piece += w
    piece = piece.view(-1)
    t_bits = torch.bitwise_and(half_a_bits, _MASK_T, out=w)
    t_bits |= _BITS_OF_64  # 64 + t as float64 bits
    t = torch.sub(t_bits.view(torch.float64), 64.0, out=a_float).view(-1)  # exact: t has at most T_BITS bits
    flat_out, coefficient = out.view(-1), coefficient.view(-1)
    torch.index_select(table[-1], 0, piece, out=flat_out)
    for power in range(normal_table.DEGREE - 1, -1, -1):
        flat_out *= t
        torch.index_select(table[power], 0, piece, out=coefficient)
        flat_out += coefficient
