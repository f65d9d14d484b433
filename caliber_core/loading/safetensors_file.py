"""``.safetensors`` files: the header is checked here, then only wanted tensors are viewed.

Layout: an 8-byte little-endian header length n, n bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the data buffer the offsets index into.

The structural checks are those of the ``safetensors`` package (header at most
100 MiB, offsets inside the buffer, each tensor's byte span equal to shape times
dtype size, tensors tiling the buffer without gaps or overlaps; stricter, an
entry carries exactly those three keys); the tests run the package on the same
headers and require the same verdicts. They are
written out here because that package offers no safe in-memory reader for an
upload: ``safe_open`` needs a file on disk, and ``safetensors.deserialize`` /
``safetensors.numpy.load`` copy every tensor in the file, including ones never
used and dtypes numpy cannot hold (BF16); their errors also do not say which
entry is wrong. JSON parsing itself is the standard library's.
"""

from __future__ import annotations

import json
import math

import numpy as np

from .safety import (
    LogitsFileError,
    Unvalidated,
    check_count,
    clean_name,
    dtype_problem,
    fail,
    library_errors,
    list_keys,
    rule,
)

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors package's own cap

# dtype name -> (numpy dtype or None when numpy cannot hold it, itemsize in bytes)
DTYPES = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": (None, 2),
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "I16": ("<i2", 2),
    "I8": ("i1", 1),
    "U64": ("<u8", 8),
    "U32": ("<u4", 4),
    "U16": ("<u2", 2),
    "U8": ("u1", 1),
    "BOOL": ("?", 1),
    "C64": ("<c8", 8),
    "F8_E4M3": (None, 1),
    "F8_E5M2": (None, 1),
}


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """A safetensors file with a ``logits`` tensor, optional ``labels`` and metadata ``name``.

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
        Read-only views of the tensors, and the metadata's name.

    Raises
    ------
    LogitsFileError
        A header that is not valid, entries outside the data, no ``logits`` tensor, a dtype that is not real numeric, or too many elements.
    """
    header, data = _split(content, src)
    metadata = header.pop("__metadata__", None)
    entries = _check_entries(header, len(data), src)
    if "logits" not in entries:
        raise fail(
            src, f"no `logits` tensor in the safetensors file (found: {list_keys(entries)})"
        )
    logits = _view(entries["logits"], data, src, "logits", max_elements)
    labels = None
    if "labels" in entries:
        labels = _view(entries["labels"], data, src, "labels", max_elements)
    name = None
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        name = clean_name(metadata["name"]) or None
    return Unvalidated(logits=logits, labels=labels, name=name)


def _bad(src: str, reason: str) -> LogitsFileError:
    return fail(src, f"not a valid safetensors file ({reason})")


def _split(content: bytes, src: str) -> tuple[dict, memoryview]:
    """The JSON header as a dict, and the data buffer after it."""
    if len(content) < 8:
        raise _bad(src, f"{len(content)} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(content[:8], "little")
    if n > min(len(content) - 8, MAX_HEADER_BYTES):
        # The length is not shown: it is the file's first 8 bytes, and no error repeats a file's contents.
        raise _bad(src, f"its 8-byte header length exceeds the {len(content) - 8:,} bytes that follow")
    with library_errors(src, "not a valid safetensors file", where="header is not JSON"):
        header = json.loads(content[8 : 8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise _bad(src, f"header is a JSON {type(header).__name__}, not an object")
    return header, memoryview(content)[8 + n :]


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entries(header: dict, size: int, src: str) -> dict:
    """name -> (dtype, shape, (begin, end)) after the package's structural rules."""
    entries = {}
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _bad(src, f"entry {key!r} needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not (isinstance(shape, list) and all(map(_is_index, shape))):
            raise _bad(src, f"entry {key!r} has shape {shape!r}, not a list of non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_index, offsets))
                and offsets[0] <= offsets[1] <= size):
            raise _bad(src, f"entry {key!r} has data_offsets {offsets!r} "
                       f"outside the {size:,}-byte buffer")
        if not isinstance(dtype, str):
            raise _bad(src, f"entry {key!r} has dtype {dtype!r}")
        if dtype in DTYPES:
            expected = math.prod(shape) * DTYPES[dtype][1]
            if offsets[1] - offsets[0] != expected:
                raise _bad(src, f"entry {key!r}: shape {tuple(shape)} {dtype} needs {expected:,} "
                           f"bytes, data_offsets span {offsets[1] - offsets[0]:,}")
        entries[key] = (dtype, tuple(shape), tuple(offsets))
    position = 0  # tensors tile the buffer: no gaps, no overlaps
    for key, (_, _, (begin, end)) in sorted(entries.items(), key=lambda item: item[1][2]):
        if begin != position:
            raise _bad(src, f"entry {key!r} starts at byte {begin:,}, expected {position:,}")
        position = end
    if position != size:
        raise _bad(src, f"tensors cover {position:,} of the {size:,} data bytes")
    return entries


def _view(entry, data: memoryview, src: str, field: str, max_elements: int) -> np.ndarray:
    """A read-only view of one tensor's bytes (BF16 widened to float32)."""
    dtype_name, shape, (begin, end) = entry
    if dtype_name not in DTYPES:
        raise fail(src, f"{field} has unknown safetensors dtype {dtype_name!r}; {rule(field)}")
    count = check_count(src, field, shape, max_elements)
    np_dtype, _ = DTYPES[dtype_name]
    if dtype_name == "BF16":  # bfloat16 is the top half of a float32
        raw = np.frombuffer(data[begin:end], dtype="<u2", count=count)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if np_dtype is None:
        raise fail(src, f"{field} has dtype {dtype_name}, which is not supported; {rule(field)}")
    arr = np.frombuffer(data[begin:end], dtype=np_dtype, count=count).reshape(shape)
    problem = dtype_problem(arr.dtype)
    if problem is not None:
        raise fail(src, f"{field} has dtype {dtype_name} ({problem}); {rule(field)}")
    return arr
