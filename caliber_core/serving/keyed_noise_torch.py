"""The torch twin of :func:`caliber_core.serving.keyed_noise.normals_from_seeds`, on the tensors' device.

Imported only when a torch tensor is served (importing torch costs seconds).
Same steps as the numpy version, in int64 arithmetic: multiplication wraps
modulo 2^64 exactly as uint64 does, and a logical right shift is an arithmetic
shift followed by a mask. Every float step is an exact subtraction or one
correctly rounded multiply or add, so the float64 results equal numpy's bit
for bit on any device with IEEE float64.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from . import fused_noise, keyed_noise, normal_table

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
_MASK52, _MASK_T = (1 << 52) - 1, (1 << _T_BITS) - 1
_BITS_OF_2_52, _BITS_OF_64 = int(np.float64(2.0 ** 52).view(np.int64)), int(np.float64(64.0).view(np.int64))
#: The derivation's constants as int64 words, one definition for every torch form of it (the compiled kernel's too).
WORD_CONSTANTS = {"T_BITS": _T_BITS, "SIGN_INDEX": _SIGN_INDEX, "GAMMA": _GAMMA, "M1": _M1, "M2": _M2,
                  "MASK52": _MASK52, "MASK_T": _MASK_T, "BITS_OF_2_52": _BITS_OF_2_52, "BITS_OF_64": _BITS_OF_64}

_cache: dict = {}
_cache_lock = threading.Lock()


def on_device(name: str, device, make):
    """The value ``make()`` for (name, device), made once per process (tables and constants on a device)."""
    key = (name, str(device))
    with _cache_lock:
        value = _cache.get(key)
        if value is None:
            value = _cache[key] = make()
    return value


def _table(device) -> tuple:
    """The gather table's rows on ``device`` (on the CPU they share numpy's untouched zero pages)."""
    return on_device("table", device, lambda: tuple(torch.from_numpy(keyed_noise.gather_table()).to(device)))


class _Constants:
    """Every step's operands as 0-dim tensors on the device: a Python number is wrapped into
    a tensor on every call, about a microsecond of each op's dispatch on the CPU."""

    def __init__(self, device):
        def int64(value: int) -> torch.Tensor:
            return torch.tensor(value, dtype=torch.int64, device=device)

        # SplitMix64's steps: (shift, mask making the arithmetic shift a logical one, multiplier).
        self.mix = [(int64(shift), int64((1 << (64 - shift)) - 1), int64(multiplier))
                    for shift, multiplier in ((30, _M1), (27, _M2))]
        self.last_shift, self.last_mask = int64(31), int64((1 << 33) - 1)
        self.mask52, self.bits_of_2_52, self.t_bits = int64(_MASK52), int64(_BITS_OF_2_52), int64(_T_BITS)
        self.sign_shift, self.sign_index = int64(63), int64(_SIGN_INDEX)
        self.mask_t, self.bits_of_64 = int64(_MASK_T), int64(_BITS_OF_64)
        self.two_52_less_half = torch.tensor(2.0 ** 52 - 0.5, dtype=torch.float64, device=device)
        self.sixty_four = torch.tensor(64.0, dtype=torch.float64, device=device)


def _constants(device) -> _Constants:
    return on_device("constants", device, lambda: _Constants(device))


def _counters(n_classes: int, device) -> torch.Tensor:
    # Wrapping int64 product: the same bits as numpy's uint64 j * GAMMA.
    return on_device(f"counters{n_classes}", device,
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
        self._buffers = {name: torch.empty(size, dtype=torch.int64, device=device) for name in self._INT}
        self._buffers.update({name: torch.empty(size, dtype=torch.float64, device=device) for name in self._REAL})
        self._blocks: dict = {}

    def block(self, shape) -> "_Block":
        """The buffers' views for a block of ``shape``, made once per shape (a view costs microseconds)."""
        views = self._blocks.get(shape)
        if views is None:
            if len(self._blocks) >= 8:
                self._blocks.clear()
            views = self._blocks[shape] = _Block(self._buffers, shape)
        return views


class _Block:
    """Flat views of a block's buffers for the elementwise steps, and shaped ones where rows matter."""

    def __init__(self, buffers: dict, shape):
        n = shape[0] * shape[1]
        self.words, self.scratch, self.real, self.coefficient, self.noise, self.draw = (
            buffers[name][:n] for name in ("words", "scratch", "real", "coefficient", "noise", "draw"))
        self.words_2d, self.noise_2d = self.words.view(shape), self.noise.view(shape)


_workspaces = threading.local()


def _workspace(size: int, device: torch.device) -> _Workspace:
    if device.type != "cpu":
        return _Workspace(size, device)
    work = getattr(_workspaces, "work", None)
    if work is None or work.size < size:
        work = _workspaces.work = _Workspace(max(size, _CHUNK), device)
    return work


def normals_from_seeds(seeds: np.ndarray, n_classes: int, *, device, dtype=None) -> torch.Tensor:
    """Standard normals from row seeds on ``device`` (the numpy function's bits).

    Parameters
    ----------
    seeds : ndarray of shape (n_rows,), uint64
        :func:`keyed_noise.row_seeds`.
    n_classes : int
        K.
    device : str or torch.device
        Where the normals are made.
    dtype : torch.dtype, optional
        Default float64; another is one rounding of the float64 result.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes)
    """
    device = torch.device(device)
    dtype = torch.float64 if dtype is None else dtype
    seeds_t = _seeds_on(seeds, device)
    out = torch.empty((seeds_t.shape[0], n_classes), dtype=torch.float64, device=device)
    counters, table, const = _counters(n_classes, device), _table(device), _constants(device)
    for rows, cols in _blocks(seeds_t.shape[0], n_classes, device):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        block = _workspace(shape[0] * shape[1], device).block(shape)
        _transform_block(seeds_t[rows], counters[cols], table, const, block.noise, block)
        out[rows, cols] = block.noise_2d
    return out if dtype == torch.float64 else out.to(dtype)


#: Logits dtypes the fallback serves on the CPU by numpy's kernel on the tensor's own memory (numpy has no
#: bfloat16; its float64 -> float16 is one correct rounding, as the fused kernel's is).
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)
_FUSED_DTYPES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                 torch.bfloat16: "bfloat16"}


def _kernel_threads() -> int:
    """torch's thread count, capped at this thread's cores (vLLM's CPU backend pins a thread to one core)."""
    threads = torch.get_num_threads()
    if threads > 1 and hasattr(os, "sched_getaffinity"):
        threads = min(threads, len(os.sched_getaffinity(0)))
    return threads


def add_keyed_noise(logits: torch.Tensor, level_seeds, increments, served=None, *, out=None) -> torch.Tensor:
    """The torch twin of :func:`keyed_noise.add_keyed_noise`: same bits, on the logits' device.

    On the CPU the fused kernel (:mod:`.fused_noise`) serves every dtype in one
    pass; other devices, the kernel registered by :func:`use_device_kernel`
    (:mod:`.compiled_noise`'s, compiled when the server was built); elsewhere
    :func:`add_keyed_noise_op_by_op`. The same bits on every path.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_rows, n_classes)
        A floating dtype; not modified (unless passed as ``out``).
    level_seeds : sequence of array_like of shape (n_rows,), uint64
        Row seeds of each level.
    increments : sequence of float
        One per level.
    served : sequence of int, optional
        How many of the levels each row adds (0: a copy of the row). Every
        level is drawn for every row whatever it adds, so a row's time does
        not depend on it. Default: all of them.
    out : torch.Tensor, optional
        The logits themselves (served in place, as an engine's processor may), or a
        tensor of their shape and dtype not overlapping them. Default: a new tensor.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes), the logits' dtype and device: ``out`` where given

    Notes
    -----
    Eq. logits-noise.
    """
    n_rows, n_classes = logits.shape
    if served is not None and all(k == len(increments) for k in served):
        served = None
    name = _FUSED_DTYPES.get(logits.dtype)
    if (logits.device.type == "cpu" and name is not None and len(increments) <= fused_noise.MAX_LEVELS
            and fused_noise.prepare()):
        values = logits.detach()
        if values.stride(-1) != 1:
            values = values.contiguous()
        direct = (out is not None and out.device.type == "cpu" and out.dtype == values.dtype
                  and out.shape == values.shape and out.stride(-1) == 1)
        target = out if direct else torch.empty((n_rows, n_classes), dtype=values.dtype)
        ready = isinstance(level_seeds, np.ndarray) and level_seeds.dtype == np.uint64  # RowSeeder's array
        seeds = (level_seeds if ready else np.array([np.asarray(s, dtype=np.uint64).reshape(-1) for s in level_seeds],
                                                    dtype=np.uint64)).reshape(len(increments), n_rows)
        item = values.element_size()
        fused_noise.add_keyed_noise(values.data_ptr(), values.stride(0) * item, target.data_ptr(),
                                    target.stride(0) * item, (n_rows, n_classes), name, seeds, increments, served,
                                    n_threads=_kernel_threads())
    elif logits.device.type != "cpu" and len(increments) and _device_kernel:
        target = _device_kernel[0](logits, level_seeds, increments, served)
    else:
        target = add_keyed_noise_op_by_op(logits, level_seeds, increments, served)
    return target if out is None or target is out else out.copy_(target)


# The kernel for other devices' tensors, registered by compiled_noise when it is imported (at a server's build):
# it imports this module, so this one names no import of it.
_device_kernel: list = []


def use_device_kernel(function) -> None:
    """Serve tensors off the CPU by ``function(logits, level_seeds, increments, served)``, same bits."""
    _device_kernel[:] = [function]


def add_keyed_noise_op_by_op(logits: torch.Tensor, level_seeds, increments, served=None) -> torch.Tensor:
    """:func:`add_keyed_noise` without a fused or compiled kernel: numpy's kernel on a CPU tensor's memory, else
    torch's ops one at a time. The same bits; what serves where no kernel can be built.

    Parameters
    ----------
    logits, level_seeds, increments, served
        As :func:`add_keyed_noise`.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes), the logits' dtype and device
    """
    n_rows = logits.shape[0]
    if served is not None and all(k == len(increments) for k in served):
        served = None
    if served is not None:  # each run of rows with one count adds its levels and draws the rest
        out = logits.detach().clone()
        served, start = [int(k) for k in served], 0
        while start < n_rows:
            stop = start + 1
            while stop < n_rows and served[stop] == served[start]:
                stop += 1
            part, k = slice(start, stop), served[start]
            seeds = [np.asarray(s, dtype=np.uint64).reshape(-1)[part] for s in level_seeds]
            if k:
                out[part] = add_keyed_noise_op_by_op(logits[part], seeds[:k], increments[:k])
            if k < len(increments):
                add_keyed_noise_op_by_op(logits[part], seeds[k:], increments[k:])
            start = stop
        return out
    if logits.device.type == "cpu" and logits.dtype in _NUMPY_DTYPES:
        seeds = [np.asarray(s, dtype=np.uint64).reshape(-1) for s in level_seeds]
        return torch.from_numpy(keyed_noise.add_keyed_noise(logits.detach().numpy(), seeds, increments))
    return add_keyed_noise_torch(logits, level_seeds, increments)


def round_once(values: torch.Tensor, dtype) -> torch.Tensor:
    """float64 ``values`` rounded once to ``dtype`` (float16 and bfloat16 exactly, as numpy's float16).

    torch converts float64 to float16 and bfloat16 through float32, rounding
    twice (1 ulp off where the first rounding lands on a midpoint). Rounding
    to float32 *to odd* first keeps the information the second rounding
    needs: 24 bits are two more than either format's significand.

    Returns
    -------
    torch.Tensor of ``dtype``
    """
    if dtype not in (torch.float16, torch.bfloat16) or values.dtype != torch.float64:
        return values.to(dtype)
    nearest = values.to(torch.float32)
    back = nearest.to(torch.float64)
    bits = nearest.view(torch.int32)
    away = (back.abs() > values.abs()).to(torch.int32)  # rounded away from zero: step back one ulp
    odd = (back != values).to(torch.int32)
    return ((bits - away) | odd).view(torch.float32).to(dtype)


def add_keyed_noise_torch(logits: torch.Tensor, level_seeds, increments) -> torch.Tensor:
    """:func:`add_keyed_noise` in torch's own ops, on any device (what a GPU runs): the same bits.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_rows, n_classes)
        A floating dtype; not modified.
    level_seeds : sequence of array_like of shape (n_rows,), uint64
        Row seeds of each level.
    increments : sequence of float
        One per level.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes), the logits' dtype and device
    """
    device = logits.device
    n_rows, n_classes = logits.shape
    out = torch.empty_like(logits)
    counters, table, const = _counters(n_classes, device), _table(device), _constants(device)
    seeds = [_seeds_on(s, device) for s in level_seeds]
    for rows, cols in _blocks(n_rows, n_classes, device):
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        block = _workspace(shape[0] * shape[1], device).block(shape)
        for i, (level_seeds_t, increment) in enumerate(zip(seeds, increments)):
            target = block.noise if i == 0 else block.draw
            _transform_block(level_seeds_t[rows], counters[cols], table, const, target, block)
            target *= increment
            if i:
                block.noise += block.draw
        noisy = block.noise_2d
        noisy += logits[rows, cols]  # float64 + the logits' dtype: an exact upcast, as on numpy
        out[rows, cols] = round_once(noisy, out.dtype)
    return out


def _transform_block(seeds: torch.Tensor, counters: torch.Tensor, table: tuple, const: _Constants,
                     out: torch.Tensor, block: _Block) -> None:
    """Fills ``out`` (a flat float64 view) with the normals of the block's words; SplitMix64 here."""
    torch.add(seeds[:, None], counters[None, :], out=block.words_2d)
    w, tmp = block.words, block.scratch
    for shift, logical, multiplier in const.mix:
        torch.bitwise_right_shift(w, shift, out=tmp)
        tmp &= logical
        w ^= tmp
        w *= multiplier
    torch.bitwise_right_shift(w, const.last_shift, out=tmp)
    tmp &= const.last_mask
    w ^= tmp
    _words_to_normals(w, tmp, table, const, out, block.real, block.coefficient)


def normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """Step 4 alone, for int64 words holding the uint64 bits.

    Parameters
    ----------
    words : torch.Tensor, any shape
        Random words as int64 (two's complement of the uint64 bits).

    Returns
    -------
    torch.Tensor of the same shape and device, float64
    """
    w = words.to(torch.int64).reshape(-1).clone()
    out = torch.empty(w.shape, dtype=torch.float64, device=w.device)
    _words_to_normals(w, torch.empty_like(w), _table(w.device), _constants(w.device), out,
                      torch.empty_like(out), torch.empty_like(out))
    return out.view(words.shape)


def _words_to_normals(w: torch.Tensor, tmp: torch.Tensor, table: tuple, const: _Constants, out: torch.Tensor,
                      a_float: torch.Tensor, coefficient: torch.Tensor) -> None:
    """Overwrites ``w``, ``tmp`` (int64), ``a_float`` and ``coefficient`` (float64); fills ``out``; all flat.

    The steps of keyed_noise's transform; with only an arithmetic shift, the
    sign's half of the table is an offset added to the index.
    """
    torch.bitwise_and(w, const.mask52, out=tmp)
    tmp |= const.bits_of_2_52  # 2^52 + v as float64 bits
    half_a = torch.sub(tmp.view(torch.float64), const.two_52_less_half, out=a_float)  # a / 2, exactly
    half_a_bits = half_a.view(torch.int64)  # positive, so an arithmetic shift is a logical one
    piece = torch.bitwise_right_shift(half_a_bits, const.t_bits, out=tmp)
    w >>= const.sign_shift  # -1 for a set sign bit, else 0 ...
    w &= const.sign_index  # ... so this is the offset of the negated half of the table
    piece += w
    t_bits = torch.bitwise_and(half_a_bits, const.mask_t, out=w)
    t_bits |= const.bits_of_64  # 64 + t as float64 bits
    t = torch.sub(t_bits.view(torch.float64), const.sixty_four, out=a_float)  # exact: t has at most T_BITS bits
    torch.index_select(table[-1], 0, piece, out=out)
    for power in range(normal_table.DEGREE - 1, -1, -1):
        out *= t
        torch.index_select(table[power], 0, piece, out=coefficient)
        out += coefficient


def unit_normals_torch(key: bytes, binding: bytes, level: int, digests, n_classes: int, device,
                       dtype=None):
    """The torch twin of :func:`keyed_noise.unit_normals`, drawn on ``device``: bit-identical float64.

    Only the row seeds (8 bytes a row) cross from the host; the (n_rows, K)
    noise is made on the device. ``dtype`` (default float64) is applied by one
    rounding of the float64 result, so float32 equals numpy's float64 output rounded.

    Parameters
    ----------
    key : bytes
        The serving key.
    binding : bytes
        What the stream is bound to.
    level : int
        The noise level, >= 0.
    digests : array_like of shape (n_rows, 32), uint8
        :func:`keyed_noise.row_digests` of the ids.
    n_classes : int
        K.
    device : str or torch.device
        Where the normals are made.
    dtype : torch.dtype, optional
        Default float64.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_classes)

    Raises
    ------
    TypeError, ValueError
        As :func:`keyed_noise.row_seeds`.
    """
    seeds = keyed_noise.row_seeds(key, binding, level, digests, n_classes)
    return normals_from_seeds(seeds, int(n_classes), device=device, dtype=dtype)
