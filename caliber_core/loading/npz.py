"""``.npz`` archives: zipfile's central directory, then each wanted member as an npy.

The archive's declared member sizes (zipfile's central directory) are checked
against the budget before any member is inflated. Each member's first bytes are
inflated and its header parsed by :mod:`.npy`; a member that unpacks to more
than its header describes is refused as a likely zip bomb; the data are then
read by numpy. Members other than ``logits``, ``labels`` and ``name`` are never
opened.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from . import npy
from .safety import (
    Unvalidated,
    check_dtype,
    check_unpacked_size,
    clean_name,
    fail,
    library_errors,
    list_keys,
    open_zip,
)

MEMBER_SLACK = 4096  # bytes tolerated after a member's data
NAME_MAX_BYTES = 4096  # itemsize cap for the `name` string


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """An ``.npz`` with a ``logits`` array and optional ``labels`` and ``name``.

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
        The logits, labels and name found (each member's header checked before it is inflated).

    Raises
    ------
    LogitsFileError
        Not a zip archive, no ``logits`` member, an object or text dtype, too many elements, a compression bomb, or a member that is not a valid npy array.
    """
    zf, found = _open(content, src, ("logits", "labels", "name"), max_elements=max_elements)
    logits = read_member(zf, found["logits"], src=src, field="logits", max_elements=max_elements)
    labels = name = None
    if "labels" in found:
        labels = read_member(
            zf, found["labels"], src=src, field="labels", max_elements=max_elements
        )
    if "name" in found:
        value = read_member(zf, found["name"], src=src, field="name", max_elements=1, scalar=True)
        name = _name_from_scalar(value)
    return Unvalidated(logits=logits, labels=labels, name=name)


def read_labels(content: bytes, src: str, *, max_elements: int) -> np.ndarray:
    """The ``labels`` array of an ``.npz`` labels file.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.
    max_elements : int
        The element budget.

    Returns
    -------
    ndarray
        The labels as stored (validated later, against the logits).

    Raises
    ------
    LogitsFileError
        Not a zip archive, no ``labels`` member, or a member that does not pass :func:`read_member`.
    """
    zf, found = _open(content, src, ("labels",), max_elements=max_elements)
    return read_member(zf, found["labels"], src=src, field="labels", max_elements=max_elements)


def _open(content: bytes, src: str, keys: tuple[str, ...], *, max_elements: int):
    """The archive and its ``.npy`` members by name; ``keys[0]`` is required.

    The members in ``keys`` are the only ones ever read: their declared sizes
    together must fit the budget.
    """
    zf = open_zip(content, src, "npz")
    found = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
    if keys[0] not in found:
        raise fail(src, f"no `{keys[0]}` array in the npz (found: {list_keys(found)})")
    what = f"the {', '.join(keys[:-1])} and {keys[-1]} arrays" if len(keys) > 1 else (
        f"the {keys[0]} array"
    )
    total = sum(found[k].file_size for k in keys if k in found)
    check_unpacked_size(src, total, max_elements, what)
    return zf, found


def read_member(
    zf: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    *,
    src: str,
    field: str,
    max_elements: int,
    scalar: bool = False,
) -> np.ndarray:
    """One member: its header is checked before its data are inflated.

    Parameters
    ----------
    zf : zipfile.ZipFile
        The open archive.
    info : zipfile.ZipInfo
        The member.
    src : str
        The file's display name.
    field : str
        "logits", "labels" or "name".
    max_elements : int
        The element budget.
    scalar : bool, default False
        Read a 0-d number or string (the ``name`` entry).

    Returns
    -------
    ndarray

    Raises
    ------
    LogitsFileError
        A header that is not valid, a dtype the field refuses, a non-scalar
        name or one too long, too many elements, more bytes than the header
        declares, or an archive zipfile cannot inflate.
    """
    where = f"npz member {info.filename}"
    with library_errors(src, "not a valid npz archive", where=where):
        with zf.open(info) as fp:
            head = fp.read(min(info.file_size, npy.HEAD_BYTES))
            header = npy.read_header(io.BytesIO(head), src=src, where=where)
            check_dtype(src, field, header.dtype, allow_text=scalar)
            if scalar and header.shape != ():
                raise fail(
                    src, f"{field} must be a 0-d string or number, got shape {header.shape}"
                )
            if scalar and header.dtype.itemsize > NAME_MAX_BYTES:
                raise fail(src, f"{field} has dtype {header.dtype}, too long for a name")
            nbytes = npy.check_data_size(
                header, size=info.file_size, src=src, field=field,
                max_elements=max_elements, what=where,
            )
            if info.file_size - header.data_offset - nbytes > MEMBER_SLACK:
                raise fail(
                    src,
                    f"{where} unpacks to {info.file_size:,} bytes but its header describes "
                    f"only {header.data_offset + nbytes:,} (refusing a possible zip bomb)",
                )
            array = npy.read_data(fp)
            fp.read(MEMBER_SLACK + 1)  # reach the end so that zipfile verifies the CRC
    return array


def _name_from_scalar(value: np.ndarray) -> str | None:
    item = value[()]
    if isinstance(item, bytes):
        item = item.decode("utf-8", errors="replace")
    elif isinstance(item, np.generic):
        item = item.item()
    return clean_name(item) or None
