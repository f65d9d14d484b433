"""``.npy`` arrays: numpy's own header and array readers, with the budget in between.

``numpy.lib.format.read_magic`` and ``read_array_header_1_0``/``_2_0`` parse
the header (at most :data:`HEADER_MAX_BYTES` bytes, a ``literal_eval`` of a
dict, never an unpickle). The declared dtype and element count are checked
next, and only then is the data read: a whole ``.npy`` file as a read-only view
of its bytes (:func:`view_data`), an ``.npz`` member by
``numpy.lib.format.read_array`` (``allow_pickle=False``). ``read_array`` on its
own would allocate as many elements as the header claims before reading a byte
of data.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from .safety import Unvalidated, check_count, check_dtype, fail, library_errors

HEADER_MAX_BYTES = 10_000  # numpy's own default max_header_size
NPY_MAGIC = b"\x93NUMPY"
HEAD_BYTES = 16 + HEADER_MAX_BYTES  # magic, version and length field, then the header


@dataclass(frozen=True)
class NpyHeader:
    """What an npy header declares.

    Attributes
    ----------
    shape : tuple of int
    fortran_order : bool
    dtype : numpy.dtype
    data_offset : int
        Where the data starts, in bytes from the start of the array.
    """

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    data_offset: int


def read_header(fp, *, src: str, where: str) -> NpyHeader:
    """Parse the header at the start of ``fp`` (an in-memory stream) with numpy.

    Parameters
    ----------
    fp : binary file-like
        Positioned at the header's start.
    src : str
        The file's display name.
    where : str
        What holds the array ("the file", "npz member logits.npy"), for messages.

    Returns
    -------
    NpyHeader
        Shape, Fortran order, dtype and the data's offset from the stream's start.

    Raises
    ------
    LogitsFileError
        ``"<src>: <where> is not a valid npy array (...)"``, or a negative dimension.
    """
    start = fp.tell()
    if fp.read(len(NPY_MAGIC)) != NPY_MAGIC:
        # numpy's own message would quote the bytes found: never a file's contents in an error
        raise fail(src, f"{where} is not an npy array (it does not start with numpy's magic string)")
    fp.seek(start)
    with library_errors(src, f"{where} is not a valid npy array"):
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            read = npy_format.read_array_header_1_0
        elif version == (2, 0):
            read = npy_format.read_array_header_2_0
        else:
            # 3.0 only adds utf-8 field names, i.e. structured dtypes, refused anyway
            raise ValueError(f"npy format version {version[0]}.{version[1]} is not supported")
        shape, fortran_order, dtype = read(fp, max_header_size=HEADER_MAX_BYTES)
    if any(d < 0 for d in shape):
        raise fail(src, f"{where} declares a negative dimension in shape {shape}")
    return NpyHeader(tuple(int(d) for d in shape), bool(fortran_order), dtype, fp.tell())


def check_data_size(
    header: NpyHeader, *, size: int, src: str, field: str, max_elements: int, what: str
) -> int:
    """The element budget, then the declared data bytes against the ``size`` present.

    Returns
    -------
    int
        The number of data bytes the header declares.
    """
    count = check_count(src, field, header.shape, max_elements)
    nbytes = count * header.dtype.itemsize
    available = size - header.data_offset
    if available < nbytes:
        raise fail(
            src,
            f"truncated {what}: the header declares {field} shape {header.shape} "
            f"{header.dtype} ({nbytes:,} bytes) but only {max(available, 0):,} bytes follow",
        )
    return nbytes


def read_data(fp) -> np.ndarray:
    """Rewind ``fp`` and let numpy read the array whose header passed the checks.

    Parameters
    ----------
    fp : binary file-like
        The whole ``.npy`` stream.

    Returns
    -------
    ndarray
        Read with ``allow_pickle=False`` and the header-size limit.
    """
    fp.seek(0)
    return npy_format.read_array(fp, allow_pickle=False, max_header_size=HEADER_MAX_BYTES)


def read_npy(content: bytes, *, src: str, field: str, max_elements: int) -> np.ndarray:
    """A whole ``.npy`` file held in ``content``.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.
    field : str
        "logits" or "labels": selects the dtype rule and names the field in messages.
    max_elements : int
        The element budget.

    Returns
    -------
    ndarray
        A read-only view into ``content`` (:func:`view_data`).

    Raises
    ------
    LogitsFileError
        A header that is not valid, a dtype that is not real numeric, too many
        elements, or fewer data bytes than the header declares.
    """
    fp = io.BytesIO(content)
    header = read_header(fp, src=src, where="the file")
    check_dtype(src, field, header.dtype)
    check_data_size(
        header, size=len(content), src=src, field=field, max_elements=max_elements, what="npy"
    )
    with library_errors(src, "the file is not a valid npy array"):
        return view_data(content, header)


def view_data(content: bytes, header: NpyHeader) -> np.ndarray:
    """A read-only view of the data a checked header declares, inside ``content`` (no copy).

    ``check_dtype`` and ``check_data_size`` must have passed: the dtype holds no
    objects and the bytes are all there. The validators copy what they keep, so
    a 180 MB float32 file is not copied once more before its float64 conversion.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    header : NpyHeader
        Its checked header.

    Returns
    -------
    ndarray of ``header.shape``
    """
    count = math.prod(header.shape)
    if count == 0:
        return np.empty(header.shape, dtype=header.dtype)
    flat = np.frombuffer(content, dtype=header.dtype, count=count, offset=header.data_offset)
    if header.fortran_order:
        return flat.reshape(header.shape[::-1]).T
    return flat.reshape(header.shape)


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """A ``.npy`` logits file (it carries no labels).

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name, for messages.
    max_elements : int
        The element budget, checked before the data are read.

    Returns
    -------
    Unvalidated
        The logits, a read-only view into ``content``.

    Raises
    ------
    LogitsFileError
        A header that is not valid, a dtype that is not real numeric, too many elements, or missing data.
    """
    return Unvalidated(logits=read_npy(content, src=src, field="logits", max_elements=max_elements))
