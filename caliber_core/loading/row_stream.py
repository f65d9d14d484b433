"""Full-vocabulary logits read a block of rows at a time, never the whole matrix.

A language model's positions x vocabulary dump (``generate(output_logits=True)``,
vLLM raw logits) is 4,000 x 128,000 float32 = 2 GB: more than any reader here
should hold. :func:`open_rows` parses only the header of a ``.npy``, ``.npz``,
``.safetensors`` or ``.pt`` file and finds where the row-major ``logits``
matrix lies; :meth:`RowSource.blocks` then reads it with plain file reads into
one reused buffer (a ``np.savez_compressed`` member inflated as it goes),
converting float16 / bfloat16 / float64 rows to float32 block by block. Nothing
is memory-mapped: a mapped file counts every page it touches as resident.
``.pt`` files are zip archives of uncompressed tensors: shape, dtype and storage
come from ``torch.load(weights_only=True, mmap=True)``, which maps but does not
read the data, and the bytes are read through the archive member's offset.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import npy
from .early_digest import STREAM_EXTENSIONS
from .safety import clean_name, display_name, fail

#: Bytes read per block (the buffer is reused; the float32 copy is the same size or twice it).
BLOCK_BYTES = 32 * 1024 * 1024
_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "bfloat16": "<u2"}
_SAFETENSORS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass(frozen=True)
class RowSource:
    """Where a row-major (n_rows, n_classes) matrix lies in a file.

    Attributes
    ----------
    path : str
    n_rows, n_classes : int
    dtype : {"float32", "float16", "bfloat16", "float64"}
    offset : int
        Byte offset of the first element (in the member's inflated bytes when ``member`` is set).
    name : str
    member : str, optional
        A compressed ``.npz`` member the matrix is inflated from as it streams (never mapped).
    """

    path: str
    n_rows: int
    n_classes: int
    dtype: str
    offset: int
    name: str
    member: str | None = None

    @property
    def itemsize(self) -> int:
        """Bytes per stored value (2 for float16 and bfloat16, 4 for float32, 8 for float64)."""
        return np.dtype(_NUMPY_DTYPES[self.dtype]).itemsize

    def blocks(self, *, block_bytes: int = BLOCK_BYTES, buffers: int = 1) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, float32 block of shape (rows, n_classes)) over the whole matrix.

        The blocks rotate through ``buffers`` reused buffers: a block stays
        valid until ``buffers`` more have been read (use or overwrite it before).

        Parameters
        ----------
        block_bytes : int, default :data:`BLOCK_BYTES`
            About how many stored bytes a block holds (at least one row).
        buffers : int, default 1
            How many buffers rotate.

        Yields
        ------
        first_row : int
        block : ndarray of shape (rows, n_classes), float32

        Raises
        ------
        LogitsFileError
            The file ends inside a row (truncated).
        """
        row_bytes = self.n_classes * self.itemsize
        per_block = max(1, block_bytes // row_bytes)
        src = display_name(self.path)
        pool = []
        for _ in range(buffers):
            raw = np.empty(per_block * self.n_classes, dtype=_NUMPY_DTYPES[self.dtype])
            pool.append((raw, raw if self.dtype == "float32" else np.empty(raw.size, dtype=np.float32)))
        with self._opened() as fh:
            for number, start in enumerate(range(0, self.n_rows, per_block)):
                raw, out = pool[number % buffers]
                rows = min(per_block, self.n_rows - start)
                want = rows * row_bytes
                view = memoryview(raw.view(np.uint8))[:want]
                got = 0
                while got < want:
                    n = self._read_into(fh, view[got:], src)
                    if not n:
                        raise fail(src, f"the file ends inside row {start + got // row_bytes} "
                                   f"(truncated: {self.n_rows:,} rows declared)")
                    got += n
                count = rows * self.n_classes
                if self.dtype == "bfloat16":
                    out[:count] = np.left_shift(raw[:count].astype(np.uint32), 16).view(np.float32)
                elif self.dtype != "float32":
                    out[:count] = raw[:count]
                yield start, out[:count].reshape(rows, self.n_classes)

    @staticmethod
    def _read_into(fh, view: memoryview, src: str) -> int:
        """``fh.readinto(view)``; a member that does not inflate is refused in one line."""
        try:
            return fh.readinto(view)
        except (zlib.error, zipfile.BadZipFile, EOFError):
            raise fail(src, "the `logits` member of the npz does not inflate (corrupt archive)") from None

    @contextmanager
    def _opened(self):
        """The file, or the inflating member, positioned at the first element."""
        if self.member is None:
            with open(self.path, "rb", buffering=0) as fh:
                fh.seek(self.offset)
                yield fh
            return
        with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as fh:
            remaining = self.offset
            while remaining and (got := len(fh.read(min(remaining, 1 << 20)))):
                remaining -= got  # a short member stops here: the row reads report the truncation
            yield fh


class MappedMatrix:
    """A float32 matrix read through a read-only memory map, its pages let go block by block.

    Mapped pages count in the process's resident memory while they stay mapped:
    :meth:`release` drops a span once it has been used (the page cache keeps
    it), so the resident set holds only the blocks in flight. A context manager.

    Attributes
    ----------
    rows : ndarray of shape (n_rows, n_classes), float32, read-only
    """

    def __init__(self, source: RowSource, mapping=None):
        import mmap

        self.source = source
        if mapping is None:  # given: the file's map made before its header was read (an early digest's)
            with open(source.path, "rb") as fh:
                mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
        self._map = mapping
        self.row_bytes = source.n_classes * 4
        self.rows = np.frombuffer(self._map, dtype="<f4", count=source.n_rows * source.n_classes,
                                  offset=source.offset).reshape(source.n_rows, source.n_classes)

    def bytes_between(self, start: int, stop: int) -> memoryview:
        """The file's bytes [start, stop) (for hashing)."""
        return memoryview(self._map)[start:stop]

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return len(self._map)

    def release(self, first_row: int, stop_row: int) -> None:
        """Let go of the pages that hold rows [first_row, stop_row) (whole pages inside the span)."""
        import mmap

        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = -(-(self.source.offset + first_row * self.row_bytes) // page) * page
        hi = (self.source.offset + stop_row * self.row_bytes) // page * page
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.rows = None
        try:
            self._map.close()
        except BufferError:  # a view still held elsewhere: the map closes when it goes
            pass


def can_map(source: RowSource) -> bool:
    """Whether the matrix can be read in place (float32, little-endian platform): no copy, no conversion.

    Returns
    -------
    bool
    """
    import sys

    return source.dtype == "float32" and sys.byteorder == "little" and source.member is None


def _matrix_check(src: str, shape, dtype: str, *, what: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise fail(src, f"{what} must be 2-D (positions x vocabulary), got shape {tuple(shape)}")
    if dtype not in _NUMPY_DTYPES:
        raise fail(src, f"{what} has dtype {dtype}; a streamed vocabulary is float32, float16, "
                   "bfloat16 or float64")
    n, v = int(shape[0]), int(shape[1])
    if n < 1 or v < 2:
        raise fail(src, f"{what} has shape {(n, v)}: at least 1 row and 2 classes are needed")
    return n, v


def _check_span(src: str, size: int, offset: int, n: int, v: int, itemsize: int) -> None:
    need = offset + n * v * itemsize
    if need > size:
        raise fail(src, f"the header declares {n:,} x {v:,} values ({need - offset:,} bytes) but the "
                   f"file holds {max(0, size - offset):,} after the header (truncated?)")


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return clean_name(base.rsplit(".", 1)[0]) or "logits"


def _open_npy(path: str, src: str, size: int) -> RowSource:
    with open(path, "rb") as fh:
        head = fh.read(npy.HEAD_BYTES)
    header = npy.read_header(io.BytesIO(head), src=src, where="the file")
    if header.fortran_order:
        raise fail(src, "the array is stored column-major (fortran order); a streamed vocabulary "
                   "needs rows contiguous (save it with np.ascontiguousarray)")
    dtype = {np.dtype("<f4"): "float32", np.dtype("<f2"): "float16",
             np.dtype("<f8"): "float64"}.get(header.dtype, str(header.dtype))
    n, v = _matrix_check(src, header.shape, dtype, what="the array")
    _check_span(src, size, header.data_offset, n, v, np.dtype(_NUMPY_DTYPES[dtype]).itemsize)
    return RowSource(path, n, v, dtype, header.data_offset, _stem(path))


def _open_safetensors(path: str, src: str, size: int) -> RowSource:
    with open(path, "rb") as fh:
        first = fh.read(8)
        if len(first) < 8:
            raise fail(src, "not a valid safetensors file (shorter than the 8-byte header length)")
        n_header = struct.unpack("<Q", first)[0]
        if n_header > min(size - 8, 100 * 1024 * 1024):
            raise fail(src, f"not a valid safetensors file (header length {n_header:,} exceeds the file)")
        try:
            header = json.loads(fh.read(n_header).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise fail(src, "not a valid safetensors file (header is not JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("logits"), dict):
        raise fail(src, "no `logits` tensor in the safetensors file")
    entry = header["logits"]
    shape, offsets, kind = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    if not (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(x, int) and x >= 0 for x in [*shape, *offsets])):
        raise fail(src, "not a valid safetensors file (logits entry needs shape and data_offsets)")
    dtype = _SAFETENSORS.get(kind, str(kind))
    n, v = _matrix_check(src, shape, dtype, what="`logits`")
    itemsize = np.dtype(_NUMPY_DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != n * v * itemsize:
        raise fail(src, f"not a valid safetensors file (logits span {offsets[1] - offsets[0]:,} bytes, "
                   f"shape needs {n * v * itemsize:,})")
    start = 8 + n_header + offsets[0]
    _check_span(src, size, start, n, v, itemsize)
    meta = header.get("__metadata__")
    name = clean_name(meta["name"]) if isinstance(meta, dict) and isinstance(meta.get("name"), str) else ""
    return RowSource(path, n, v, dtype, start, name or _stem(path))


def _open_pt(path: str, src: str, size: int) -> RowSource:
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
        raise fail(src, f"not a torch.save file torch can read with weights_only=True "
                   f"({type(err).__name__})") from None
    name = None
    if isinstance(obj, dict):
        name = obj.get("name") if isinstance(obj.get("name"), str) else None
        obj = obj.get("logits")
    if not isinstance(obj, torch.Tensor):
        raise fail(src, "no `logits` tensor in the .pt file (a tensor, or a dict with `logits`)")
    dtype = str(obj.dtype).replace("torch.", "")
    n, v = _matrix_check(src, tuple(obj.shape), dtype, what="`logits`")
    if not obj.is_contiguous():
        raise fail(src, "`logits` is not stored row-major contiguous (save tensor.contiguous())")
    nbytes = obj.untyped_storage().nbytes()
    with zipfile.ZipFile(path) as zf:
        members = [i for i in zf.infolist() if "/data/" in i.filename and i.file_size == nbytes]
        if len(members) != 1:
            raise fail(src, "cannot locate the `logits` storage in the archive (one data record of "
                       f"{nbytes:,} bytes expected, found {len(members)})")
        info = members[0]
        if info.compress_type != zipfile.ZIP_STORED:
            raise fail(src, "the `logits` storage is compressed in the archive; it cannot be streamed")
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
        name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len + obj.storage_offset() * obj.element_size()
    _check_span(src, size, start, n, v, obj.element_size())
    return RowSource(path, n, v, dtype, start, clean_name(name) if name else _stem(path))


def open_rows(path) -> RowSource:
    """Locate the logits matrix of a ``.npy``, ``.safetensors`` or ``.pt`` file without reading it.

    Parameters
    ----------
    path : str or os.PathLike
        The file.

    Returns
    -------
    RowSource
        Where the matrix lies in the file, its shape and dtype.

    Raises
    ------
    LogitsFileError
        Another extension, a missing file, a header that is not valid, a
        matrix that is not 2-D float, not row-major, or longer than the file.
    """
    path = os.fspath(path)
    src = display_name(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in STREAM_EXTENSIONS:
        raise fail(src, f"a full vocabulary streams from {', '.join(STREAM_EXTENSIONS)}, not {ext or 'no extension'}")
    try:
        size = os.stat(path).st_size
    except OSError:
        raise fail(src, "no such file") from None
    if ext == ".npy":
        return _open_npy(path, src, size)
    if ext == ".safetensors":
        return _open_safetensors(path, src, size)
    if ext == ".npz":
        return _open_npz(path, src, size)
    return _open_pt(path, src, size)


def _member_start(fh, info: zipfile.ZipInfo) -> int:
    """Byte offset of a stored zip member's data (past its local header)."""
    fh.seek(info.header_offset)
    local = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _open_npz(path: str, src: str, size: int) -> RowSource:
    try:
        with zipfile.ZipFile(path) as zf:
            members = {i.filename: i for i in zf.infolist()}
    except (zipfile.BadZipFile, OSError):
        raise fail(src, "not a valid npz archive") from None
    info = members.get("logits.npy")
    if info is None:
        raise fail(src, "no `logits` array in the npz")
    compressed = info.compress_type != zipfile.ZIP_STORED
    if compressed:  # np.savez_compressed: the member is inflated block by block as it streams
        start = 0
        try:
            with zipfile.ZipFile(path) as zf, zf.open(info) as member:
                head = member.read(min(info.file_size, npy.HEAD_BYTES))
        except (zipfile.BadZipFile, OSError, NotImplementedError, EOFError, zlib.error):
            raise fail(src, "the `logits` member of the npz cannot be inflated") from None
    else:
        with open(path, "rb") as fh:
            start = _member_start(fh, info)
            fh.seek(start)
            head = fh.read(min(info.file_size, npy.HEAD_BYTES))
    header = npy.read_header(io.BytesIO(head), src=src, where="npz member logits.npy")
    if header.fortran_order:
        raise fail(src, "the logits array is stored column-major (fortran order); a streamed vocabulary "
                   "needs rows contiguous (save it with np.ascontiguousarray)")
    dtype = {np.dtype("<f4"): "float32", np.dtype("<f2"): "float16",
             np.dtype("<f8"): "float64"}.get(header.dtype, str(header.dtype))
    n, v = _matrix_check(src, header.shape, dtype, what="the logits array")
    itemsize = np.dtype(_NUMPY_DTYPES[dtype]).itemsize
    if header.data_offset + n * v * itemsize > info.file_size:
        raise fail(src, f"the logits header declares {n:,} x {v:,} values but the member holds "
                   f"{info.file_size - header.data_offset:,} bytes (truncated?)")
    if compressed:
        return RowSource(path, n, v, dtype, header.data_offset, _stem(path), member=info.filename)
    _check_span(src, size, start + header.data_offset, n, v, itemsize)
    return RowSource(path, n, v, dtype, start + header.data_offset, _stem(path))


def npz_labels(source: RowSource, *, max_elements: int):
    """The ``labels`` array of a streamed ``.npz``, or None (another format, or no such array).

    Parameters
    ----------
    source : RowSource
    max_elements : int
        The element budget of the member read.

    Returns
    -------
    ndarray or None
        As stored (validated by the caller against the logits).

    Raises
    ------
    LogitsFileError
        A labels member that is not a valid array.
    """
    from .npz import read_member

    if not source.path.lower().endswith(".npz"):
        return None
    with zipfile.ZipFile(source.path) as zf:
        info = next((i for i in zf.infolist() if i.filename == "labels.npy"), None)
        if info is None:
            return None
        return read_member(zf, info, src=display_name(source.path), field="labels", max_elements=max_elements)


def declared_shape(path) -> tuple[int, int] | None:
    """(rows, classes) of a streamable file's matrix, or None when it cannot be told cheaply.

    Parameters
    ----------
    path : str or os.PathLike
        The file.

    Returns
    -------
    tuple of (int, int) or None
        None for any file :func:`open_rows` refuses (the ordinary loader then reports why).
    """
    try:
        src = open_rows(path)
    except Exception:  # noqa: BLE001 - the ordinary loader reports the problem
        return None
    return src.n_rows, src.n_classes

