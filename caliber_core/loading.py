"""Reading cached validation logits safely: every supported format, one error type.

Providers upload the logits their classifier produced on a validation set (and
usually the true labels). This module turns such a file into a validated
:class:`LogitsData` or raises :class:`LogitsFileError` with one short line that
names the file, the field and the offending value.

Safety rules, enforced for every format:

* nothing is ever unpickled: ``.npy``/``.npz`` headers are parsed without
  ``allow_pickle`` and object dtypes are refused; ``.pt`` files go through
  ``torch.load(weights_only=True)`` only; safetensors, CSV and parquet carry no
  code at all;
* no allocation is sized from an untrusted header before the declared element
  count has been checked against ``max_elements`` (so a file claiming a 10**14
  element array is refused in microseconds), and zip members are checked for
  their declared uncompressed size before they are inflated (zip bombs);
* arrays the caller does not need (``inputs``, ``heldout_logits``, ... in the
  demo archives) are never read.

Validation happens before any numerics: 2-D real logits with at least one row
and two classes, every value finite, integer labels in ``[0, K)`` of matching
length, and a positive median top-two margin (the margin scale S of
``margins.margin_scale``; v = sigma^2 / S^2 is undefined otherwise).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from .calibration.margins import top_two_margins

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "LABELS_EXTENSIONS",
    "LogitsData",
    "LogitsFileError",
    "MIN_ROWS_FOR_PRECISION",
    "SUPPORTED_EXTENSIONS",
    "describe",
    "load_logits",
    "load_logits_bytes",
    "require_labels",
]

DEFAULT_MAX_ELEMENTS = 200_000_000  # 1.6 GB once converted to float64
SUPPORTED_EXTENSIONS: tuple[str, ...] = (
    ".npz",
    ".npy",
    ".pt",
    ".pth",
    ".safetensors",
    ".csv",
    ".parquet",
)
LABELS_EXTENSIONS: tuple[str, ...] = (".npy", ".npz", ".csv", ".txt")
MIN_ROWS_FOR_PRECISION = 200  # below this, warn: accuracy estimates are too noisy

_LABEL_COLUMNS = ("label", "labels")  # csv / parquet column holding the labels
_MAX_ITEMSIZE = 16  # largest real numeric itemsize (longdouble); bounds member bytes
_ZIP_MEMBER_SLACK = 4096  # bytes tolerated after an npy member's data
_NPY_HEAD_BYTES = 16 + 10_000  # magic + length field + numpy's max_header_size
_NAME_MAX_CHARS = 200
_NAME_MAX_BYTES = 4096  # itemsize cap for an npz `name` string
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own cap
_MESSAGE_MAX_CHARS = 400


class LogitsFileError(ValueError):
    """The one error type for a bad logits or labels file.

    ``str(err)`` is a single short line naming the file, the field and the
    offending value or index, e.g.
    ``"bad.npz: logits row 12, column 3 is nan (every value must be finite)"``.
    """


@dataclass(frozen=True, eq=False)
class LogitsData:
    """Validated logits (and optional labels) read from one file.

    Attributes
    ----------
    name : str
        From an npz ``name`` entry (or a ``name`` in a .pt dict / safetensors
        metadata) if present, else the file stem.
    logits : ndarray of shape (n_samples, n_classes), float64, C-contiguous
    labels : ndarray of shape (n_samples,), int64, or None when the file has none
    sha256 : str
        Hex SHA-256 of the logits file's bytes.
    source : str
        The logits file name as given.
    labels_source : str or None
        Where the labels came from (the logits file or a separate labels file).
    warnings : tuple of str
        Non-fatal remarks, e.g. ``"N=57 rows: calibration precision will be poor"``.
    """

    name: str
    logits: np.ndarray
    labels: np.ndarray | None
    sha256: str
    source: str
    labels_source: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def n_samples(self) -> int:
        return int(self.logits.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.logits.shape[1])

    @property
    def has_labels(self) -> bool:
        return self.labels is not None


# --------------------------------------------------------------------------- public


def load_logits(path, *, labels_path=None, max_elements: int = DEFAULT_MAX_ELEMENTS) -> LogitsData:
    """Read and validate a logits file (and optionally a separate labels file).

    Parameters
    ----------
    path : str or os.PathLike
        The logits file; its extension picks the format (``SUPPORTED_EXTENSIONS``).
    labels_path : str or os.PathLike, optional
        A labels file (``LABELS_EXTENSIONS``) for logits files that carry none;
        it replaces labels found in the logits file (with a warning).
    max_elements : int, default DEFAULT_MAX_ELEMENTS
        Largest number of elements accepted for the logits (and for the labels).

    Returns
    -------
    LogitsData

    Raises
    ------
    LogitsFileError
        Missing or unreadable file, unsupported format, or invalid contents.
    """
    _check_max_elements(max_elements)
    source = str(path)
    content = _read_file(
        path, max_elements=max_elements, extensions=SUPPORTED_EXTENSIONS, what="logits"
    )
    labels_content = labels_filename = None
    if labels_path is not None:
        labels_filename = str(labels_path)
        labels_content = _read_file(
            labels_path, max_elements=max_elements, extensions=LABELS_EXTENSIONS, what="labels"
        )
    return load_logits_bytes(
        content,
        source,
        labels_content=labels_content,
        labels_filename=labels_filename,
        max_elements=max_elements,
    )


def load_logits_bytes(
    content: bytes,
    filename: str,
    *,
    labels_content: bytes | None = None,
    labels_filename: str | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> LogitsData:
    """Validate logits from in-memory bytes (an upload); the format follows ``filename``.

    Parameters
    ----------
    content : bytes
        The logits file's bytes.
    filename : str
        Its name; the extension picks the format and messages name it.
    labels_content, labels_filename : bytes and str, optional
        A separate labels file (``.npy`` 1-D integers, ``.csv``/``.txt`` one
        integer per line, or ``.npz`` with a ``labels`` array). Give both or neither.
    max_elements : int, default DEFAULT_MAX_ELEMENTS

    Returns
    -------
    LogitsData

    Raises
    ------
    LogitsFileError
        Unsupported extension or invalid contents (see the module docstring).
    """
    _check_max_elements(max_elements)
    if (labels_content is None) != (labels_filename is None):
        raise TypeError("labels_content and labels_filename must be given together")
    content = _as_bytes(content, "content")
    src = _display(filename)
    ext = _extension(filename, SUPPORTED_EXTENSIONS, src, what="logits")
    labels_src = None
    if labels_content is not None:
        labels_content = _as_bytes(labels_content, "labels_content")
        labels_src = _display(labels_filename)
        labels_ext = _extension(labels_filename, LABELS_EXTENSIONS, labels_src, what="labels")
    if len(content) == 0:
        raise _fail(src, "the file is empty (0 bytes)")

    raw = _READERS[ext](content, src, max_elements)
    logits = _validate_logits(raw.logits, src, max_elements)
    warnings = list(raw.warnings)
    labels, labels_from, labels_origin = raw.labels, src, str(filename)
    if labels_content is not None:
        if len(labels_content) == 0:
            raise _fail(labels_src, "the file is empty (0 bytes)")
        if labels is not None:
            warnings.append(f"labels from {labels_src} replace the labels stored in {src}")
        labels = _read_labels_file(labels_content, labels_ext, labels_src, max_elements)
        labels_from, labels_origin = labels_src, str(labels_filename)

    if labels is not None:
        labels = _validate_labels(
            labels, labels_from, n_samples=logits.shape[0], n_classes=logits.shape[1],
            logits_src=src,
        )
    _check_margin_scale(logits, src)
    if logits.shape[0] < MIN_ROWS_FOR_PRECISION:
        warnings.append(f"N={logits.shape[0]} rows: calibration precision will be poor")

    return LogitsData(
        name=raw.name if raw.name else _stem(filename),
        logits=logits,
        labels=labels,
        sha256=hashlib.sha256(content).hexdigest(),
        source=str(filename),
        labels_source=labels_origin if labels is not None else None,
        warnings=tuple(warnings),
    )


def require_labels(data: LogitsData, purpose: str) -> np.ndarray:
    """Return ``data.labels``, or raise when the file had none.

    Raises
    ------
    LogitsFileError
        ``"<file>: no labels in the file; <purpose> needs labels (...)"``.
    """
    if data.labels is None:
        raise _fail(
            _display(data.source),
            f"no labels in the file; {purpose} needs labels "
            "(add a `labels` array or pass a labels file)",
        )
    return data.labels


def describe(data: LogitsData) -> str:
    """One display line: ``"name: N=…, K=…, labels yes/no"``."""
    return (
        f"{data.name}: N={data.n_samples}, K={data.n_classes}, "
        f"labels {'yes' if data.has_labels else 'no'}"
    )


# ------------------------------------------------------------------------ plumbing


@dataclass
class _Raw:
    """What a format reader found, before validation."""

    logits: np.ndarray
    labels: np.ndarray | None = None
    name: str | None = None
    warnings: tuple[str, ...] = ()


def _check_max_elements(max_elements) -> None:
    if isinstance(max_elements, bool) or not isinstance(max_elements, (int, np.integer)):
        raise TypeError(f"max_elements must be an int, got {type(max_elements).__name__}")
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")


def _as_bytes(content, argname: str) -> bytes:
    if isinstance(content, (bytearray, memoryview)):
        return bytes(content)
    if not isinstance(content, bytes):
        raise TypeError(f"{argname} must be bytes, got {type(content).__name__}")
    return content


def _oneline(text: str) -> str:
    # names and keys come from untrusted files: no control characters, one line
    line = " ".join(re.sub(r"[\x00-\x1f\x7f]", "?", str(text).replace("\n", " ")).split())
    if len(line) > _MESSAGE_MAX_CHARS:
        line = line[: _MESSAGE_MAX_CHARS - 1] + "…"
    return line


def _display(filename) -> str:
    """The file name for messages: as given, minus control characters, bounded."""
    text = re.sub(r"[\x00-\x1f\x7f]", "?", str(filename))
    return text if len(text) <= 120 else "…" + text[-119:]


def _fail(src: str, message: str) -> LogitsFileError:
    return LogitsFileError(_oneline(f"{src}: {message}"))


def _exc(err: BaseException) -> str:
    """A library exception as a short clause for our one-line messages."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= 120 else text[:119] + "…"


def _basename(filename) -> str:
    return re.split(r"[\\/]", str(filename))[-1]


def _stem(filename) -> str:
    base = _basename(filename)
    stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
    return _clean_name(stem) or "logits"


def _clean_name(text: str) -> str:
    text = " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", text).split())
    return text[:_NAME_MAX_CHARS]


def _extension(filename, allowed: tuple[str, ...], src: str, *, what: str) -> str:
    base = _basename(filename)
    ext = "." + base.rsplit(".", 1)[1].lower() if "." in base[1:] else ""
    if ext not in allowed:
        shown = repr(ext) if ext else "no extension"
        raise _fail(
            src,
            f"unsupported {what} file type ({shown}); supported: {', '.join(allowed)}",
        )
    return ext


def _max_file_bytes(max_elements: int) -> int:
    """A sane upper bound on a file's size for a given element budget.

    Text formats spend up to a few dozen bytes per value, and archives may carry
    arrays we ignore; the bound only stops absurd files before they are read.
    """
    return 64 * max_elements + 256 * 1024 * 1024


def _max_member_bytes(max_elements: int) -> int:
    """Upper bound on the uncompressed bytes of the zip members we read."""
    return _MAX_ITEMSIZE * max_elements + 1024 * 1024


def _read_file(path, *, max_elements: int, extensions: tuple[str, ...], what: str) -> bytes:
    src = _display(path)
    try:
        p = Path(path)
    except TypeError as err:
        raise TypeError(f"path must be str or os.PathLike, got {type(path).__name__}") from err
    _extension(p.name, extensions, src, what=what)
    try:
        if not p.exists():
            raise _fail(src, "no such file")
        if not p.is_file():
            raise _fail(src, "not a regular file")
        size = p.stat().st_size
        limit = _max_file_bytes(max_elements)
        if size > limit:
            raise _fail(
                src,
                f"the file is {size:,} bytes, more than the {limit:,} allowed "
                f"for max_elements={max_elements:,}",
            )
        return p.read_bytes()
    except LogitsFileError:
        raise
    except (OSError, ValueError) as err:  # ValueError: e.g. an embedded NUL in the path
        raise _fail(src, f"cannot read the file ({_exc(err)})") from None


# ------------------------------------------------------------------ dtype rules


def _dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` is not a real numeric dtype, or None when it is."""
    kind = dtype.kind
    if kind in "iuf":
        return None
    if dtype.hasobject or kind == "O":
        return "an object array (pickled Python objects are never loaded)"
    return {
        "b": "bool",
        "c": "complex",
        "U": "string",
        "S": "bytes string",
        "V": "structured/void",
        "M": "datetime",
        "m": "timedelta",
    }.get(kind, f"unsupported kind {kind!r}")


def _refuse_dtype(src: str, field: str, dtype, problem: str) -> LogitsFileError:
    rule = "labels must be integers" if field == "labels" else "logits must be real numbers"
    if problem.startswith("an object array"):
        return _fail(src, f"{field} is {problem}")
    return _fail(src, f"{field} has dtype {dtype} ({problem}); {rule}")


def _check_count(src: str, field: str, shape: tuple[int, ...], max_elements: int) -> int:
    count = math.prod(shape)
    if count > max_elements:
        raise _fail(
            src,
            f"{field} shape {tuple(shape)} has {count:,} elements, more than "
            f"max_elements={max_elements:,}",
        )
    return count


# -------------------------------------------------------------------- npy / npz


def _parse_npy_header(head: bytes, src: str, where: str):
    """(shape, fortran_order, dtype, data_offset) from the first bytes of an npy stream."""
    buf = io.BytesIO(head)
    try:
        version = npy_format.read_magic(buf)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(buf)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(buf)
        else:
            # 3.0 only adds utf-8 field names, i.e. structured dtypes we refuse anyway
            raise ValueError(f"npy format version {version[0]}.{version[1]} is not supported")
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"{where} is not a valid npy array ({_exc(err)})") from None
    if any(d < 0 for d in shape):
        raise _fail(src, f"{where} declares a negative dimension in shape {shape}")
    return tuple(int(d) for d in shape), bool(fortran_order), dtype, buf.tell()


def _check_npy_dtype(src: str, field: str, dtype: np.dtype, *, allow_text: bool = False) -> None:
    problem = _dtype_problem(dtype)
    if problem is None:
        return
    if allow_text and dtype.kind in "US" and not dtype.hasobject:
        return
    raise _refuse_dtype(src, field, dtype, problem)


def _array_from_buffer(data, dtype: np.dtype, shape, fortran_order: bool, count: int) -> np.ndarray:
    arr = np.frombuffer(data, dtype=dtype, count=count)
    if fortran_order:
        return arr.reshape(shape[::-1]).transpose()
    return arr.reshape(shape)


def _read_npy_bytes(content: bytes, src: str, field: str, max_elements: int) -> np.ndarray:
    """A plain .npy file; only the declared data bytes are viewed, never unpickled."""
    shape, fortran_order, dtype, offset = _parse_npy_header(
        content[:_NPY_HEAD_BYTES], src, "the file"
    )
    _check_npy_dtype(src, field, dtype)
    count = _check_count(src, field, shape, max_elements)
    nbytes = count * dtype.itemsize
    available = len(content) - offset
    if available < nbytes:
        raise _fail(
            src,
            f"truncated npy: the header declares {field} shape {shape} {dtype} "
            f"({nbytes:,} bytes) but only {available:,} bytes follow",
        )
    return _array_from_buffer(
        memoryview(content)[offset : offset + nbytes], dtype, shape, fortran_order, count
    )


def _open_zip(content: bytes, src: str, kind: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(io.BytesIO(content))
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"not a valid {kind} archive ({_exc(err)})") from None


def _npz_members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    return {
        info.filename[:-4]: info for info in zf.infolist() if info.filename.endswith(".npy")
    }


def _read_npz_member(
    zf: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    src: str,
    field: str,
    max_elements: int,
    *,
    allow_text: bool = False,
) -> np.ndarray:
    """One npz member: header checked before its data is inflated."""
    where = f"npz member {info.filename}"
    try:
        with zf.open(info) as fp:
            head = fp.read(min(info.file_size, _NPY_HEAD_BYTES))
            shape, fortran_order, dtype, offset = _parse_npy_header(head, src, where)
            _check_npy_dtype(src, field, dtype, allow_text=allow_text)
            if allow_text and shape != ():
                raise _fail(src, f"{field} must be a 0-d string or number, got shape {shape}")
            if allow_text and dtype.itemsize > _NAME_MAX_BYTES:
                raise _fail(src, f"{field} has dtype {dtype}, too long for a name")
            count = _check_count(src, field, shape, max_elements)
            nbytes = count * dtype.itemsize
            available = info.file_size - offset
            if available < nbytes:
                raise _fail(
                    src,
                    f"truncated {where}: its header declares shape {shape} {dtype} "
                    f"({nbytes:,} bytes) but only {max(available, 0):,} bytes follow",
                )
            if available - nbytes > _ZIP_MEMBER_SLACK:
                raise _fail(
                    src,
                    f"{where} unpacks to {info.file_size:,} bytes but its header "
                    f"describes only {offset + nbytes:,} (refusing a possible zip bomb)",
                )
            data = bytearray(nbytes)  # inflated straight into its final buffer
            part = head[offset : offset + nbytes]
            data[: len(part)] = part
            filled = len(part)
            while filled < nbytes:  # in chunks: no second full-size copy
                chunk = fp.read(min(nbytes - filled, 1 << 24))
                if not chunk:
                    raise _fail(src, f"truncated {where}: {filled:,} of {nbytes:,} data bytes")
                data[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
            fp.read(_ZIP_MEMBER_SLACK + 1)  # reach the end so the CRC is verified
    except LogitsFileError:
        raise
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"not a valid npz archive ({where}: {_exc(err)})") from None
    return _array_from_buffer(data, dtype, shape, fortran_order, count)


def _check_zip_budget(
    src: str, infos: list[zipfile.ZipInfo], max_elements: int, what: str
) -> None:
    total = sum(info.file_size for info in infos)
    limit = _max_member_bytes(max_elements)
    if total > limit:
        raise _fail(
            src,
            f"{what} unpack to {total:,} bytes, more than the {limit:,} allowed "
            f"for max_elements={max_elements:,} (refusing a possible zip bomb)",
        )


def _list_keys(keys) -> str:
    keys = sorted(str(k) for k in keys)
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    return shown or "none"


def _read_npz(content: bytes, src: str, max_elements: int) -> _Raw:
    zf = _open_zip(content, src, "npz")
    members = _npz_members(zf)
    if "logits" not in members:
        raise _fail(src, f"no `logits` array in the npz (found: {_list_keys(members)})")
    wanted = [members[k] for k in ("logits", "labels", "name") if k in members]
    _check_zip_budget(src, wanted, max_elements, "the logits, labels and name arrays")
    logits = _read_npz_member(zf, members["logits"], src, "logits", max_elements)
    labels = None
    if "labels" in members:
        labels = _read_npz_member(zf, members["labels"], src, "labels", max_elements)
    name = None
    if "name" in members:
        value = _read_npz_member(zf, members["name"], src, "name", 1, allow_text=True)
        name = _name_from_scalar(value)
    return _Raw(logits=logits, labels=labels, name=name)


def _name_from_scalar(value: np.ndarray) -> str | None:
    item = value[()]
    if isinstance(item, bytes):
        item = item.decode("utf-8", errors="replace")
    elif isinstance(item, np.generic):
        item = item.item()
    return _clean_name(str(item)) or None


def _read_npy(content: bytes, src: str, max_elements: int) -> _Raw:
    return _Raw(logits=_read_npy_bytes(content, src, "logits", max_elements))


# ------------------------------------------------------------------------ torch


_WEIGHTS_ONLY_HINT = re.compile(r"Unsupported (?:global|class): (?:GLOBAL )?([\w.<>]+)")


def _read_torch(content: bytes, src: str, max_elements: int) -> _Raw:
    """A ``torch.save`` zip archive of a dict of tensors (or a bare logits tensor)."""
    zf = _open_zip(content, src, "torch (.pt zip)")
    infos = zf.infolist()
    if not any(info.filename.endswith("data.pkl") for info in infos):
        raise _fail(
            src,
            "not a valid torch archive (no data.pkl; only the zip format torch.save "
            "writes since torch 1.6 is accepted)",
        )
    _check_zip_budget(src, infos, max_elements, "the archive's members")

    import torch  # lazily: importing torch costs seconds

    try:
        obj = torch.load(io.BytesIO(content), weights_only=True, map_location="cpu")
    except MemoryError:
        raise
    except Exception as err:
        text = str(err)
        if "Weights only load failed" in text or "WeightsUnpickler" in text:
            hint = _WEIGHTS_ONLY_HINT.search(text)
            what = f" (it references {hint.group(1)})" if hint else ""
            raise _fail(
                src,
                f"refused: the file holds Python objects other than tensors{what}; "
                "it would need unpickling arbitrary code, which is never done "
                "(save a dict of tensors)",
            ) from None
        raise _fail(src, f"not a valid torch file ({_exc(err)})") from None

    if isinstance(obj, torch.Tensor):
        return _Raw(logits=_tensor_to_numpy(obj, src, "logits", max_elements, torch))
    if not isinstance(obj, dict):
        raise _fail(
            src, f"expected a dict of tensors with a `logits` key, got {type(obj).__name__}"
        )
    if "logits" not in obj:
        raise _fail(src, f"no `logits` tensor in the dict (keys: {_list_keys(obj)})")
    logits = _tensor_to_numpy(obj["logits"], src, "logits", max_elements, torch)
    labels = None
    if obj.get("labels") is not None:
        labels = _tensor_to_numpy(obj["labels"], src, "labels", max_elements, torch)
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        raise _fail(src, f"name must be a string, got {type(name).__name__}")
    return _Raw(logits=logits, labels=labels, name=_clean_name(name) if name else None)


def _tensor_to_numpy(t, src: str, field: str, max_elements: int, torch) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise _fail(src, f"{field} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided or t.is_quantized:
        raise _fail(src, f"{field} is a {t.layout} tensor; save a dense tensor")
    # zero strides let a 1-element storage claim any shape: count before converting
    _check_count(src, field, tuple(int(d) for d in t.shape), max_elements)
    if t.dtype == torch.bool:
        raise _fail(src, f"{field} has dtype torch.bool (bool); {_rule(field)}")
    if t.is_complex():
        raise _fail(src, f"{field} has dtype {t.dtype} (complex); {_rule(field)}")
    try:
        t = t.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.to(torch.float64)  # bfloat16, float8, ...: numpy has no such dtype
        return t.numpy()
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(
            src, f"{field} tensor of dtype {t.dtype} cannot be read ({_exc(err)})"
        ) from None


def _rule(field: str) -> str:
    return "labels must be integers" if field == "labels" else "logits must be real numbers"


# ------------------------------------------------------------------ safetensors


# dtype name -> (numpy dtype or None when numpy cannot hold it, itemsize in bytes)
_SAFETENSORS_DTYPES = {
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


def _read_safetensors(content: bytes, src: str, max_elements: int) -> _Raw:
    """Parse and check the JSON header ourselves, then view only the tensors we need.

    Layout: an 8-byte little-endian header length n, n bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
    then the data buffer the offsets index into.
    """
    def bad(reason: str) -> LogitsFileError:
        return _fail(src, f"not a valid safetensors file ({reason})")

    if len(content) < 8:
        raise bad(f"{len(content)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", content[:8])
    if n > min(len(content) - 8, _SAFETENSORS_MAX_HEADER):
        raise bad(f"header length {n:,} exceeds the {len(content) - 8:,} bytes that follow")
    try:
        header = json.loads(content[8 : 8 + n].decode("utf-8"))
    except MemoryError:
        raise
    except Exception as err:
        raise bad(f"header is not JSON: {_exc(err)}") from None
    if not isinstance(header, dict):
        raise bad(f"header is a JSON {type(header).__name__}, not an object")

    data = memoryview(content)[8 + n :]
    metadata = header.pop("__metadata__", None)
    spans = []
    entries = {}
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"entry {key!r} needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not (isinstance(shape, list) and all(_is_index(d) for d in shape)):
            raise bad(f"entry {key!r} has shape {shape!r}, not a list of non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_index, offsets))
                and offsets[0] <= offsets[1] <= len(data)):
            raise bad(
                f"entry {key!r} has data_offsets {offsets!r} "
                f"outside the {len(data):,}-byte buffer"
            )
        if not isinstance(dtype, str):
            raise bad(f"entry {key!r} has dtype {dtype!r}")
        if dtype in _SAFETENSORS_DTYPES:
            expected = math.prod(shape) * _SAFETENSORS_DTYPES[dtype][1]
            if offsets[1] - offsets[0] != expected:
                raise bad(f"entry {key!r}: shape {tuple(shape)} {dtype} needs {expected:,} "
                          f"bytes, data_offsets span {offsets[1] - offsets[0]:,}")
        spans.append((offsets[0], offsets[1], key))
        entries[key] = (dtype, tuple(shape), offsets)
    # like the safetensors library: tensors tile the buffer, no gaps, no overlaps
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            raise bad(f"entry {key!r} starts at byte {begin:,}, expected {position:,}")
        position = end
    if position != len(data):
        raise bad(f"tensors cover {position:,} of the {len(data):,} data bytes")

    if "logits" not in entries:
        raise _fail(
            src, f"no `logits` tensor in the safetensors file (found: {_list_keys(entries)})"
        )
    logits = _safetensors_tensor(entries["logits"], data, src, "logits", max_elements)
    labels = None
    if "labels" in entries:
        labels = _safetensors_tensor(entries["labels"], data, src, "labels", max_elements)
    name = None
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        name = _clean_name(metadata["name"]) or None
    return _Raw(logits=logits, labels=labels, name=name)


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _safetensors_tensor(
    entry, data: memoryview, src: str, field: str, max_elements: int
) -> np.ndarray:
    dtype_name, shape, (begin, end) = entry
    if dtype_name not in _SAFETENSORS_DTYPES:
        raise _fail(src, f"{field} has unknown safetensors dtype {dtype_name!r}; {_rule(field)}")
    count = _check_count(src, field, shape, max_elements)
    np_dtype, _ = _SAFETENSORS_DTYPES[dtype_name]
    if dtype_name == "BF16":
        # bfloat16 is the top half of a float32
        raw = np.frombuffer(data[begin:end], dtype="<u2", count=count)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if np_dtype is None:
        raise _fail(src, f"{field} has dtype {dtype_name}, which is not supported; {_rule(field)}")
    arr = np.frombuffer(data[begin:end], dtype=np_dtype, count=count).reshape(shape)
    problem = _dtype_problem(arr.dtype)
    if problem is not None:
        raise _fail(src, f"{field} has dtype {dtype_name} ({problem}); {_rule(field)}")
    return arr


# -------------------------------------------------------------------- csv / parquet


def _read_csv(content: bytes, src: str, max_elements: int) -> _Raw:
    """A header row with one numeric column per class, plus an optional `label` column.

    A file whose first row is all numbers (``np.savetxt``) is read as headerless
    logits without labels, except the header ``0,1,...,K-1`` that pandas writes
    for a DataFrame with default column names.
    """
    text = _decode_text(content, src)
    first = next((ln.strip() for ln in io.StringIO(text) if ln.strip()), None)
    if first is None:
        raise _fail(src, "the CSV has no rows")
    n_lines = text.count("\n") + 1
    n_fields = first.count(",") + 1
    if n_lines * n_fields > max_elements + n_fields:  # checked before pandas allocates
        raise _fail(
            src,
            f"about {n_lines:,} rows × {n_fields:,} columns, more than "
            f"max_elements={max_elements:,}",
        )
    fields = [f.strip() for f in first.split(",")]
    # pandas writes integer column names 0..K-1 as the header: that row is not data
    class_index_header = fields == [str(i) for i in range(len(fields))]
    headerless = all(map(_is_number, fields)) and not class_index_header

    import pandas as pd

    pandas_major = int(pd.__version__.split(".")[0])
    try:
        df = pd.read_csv(
            io.StringIO(text),
            header=None if headerless else 0,
            sep=",",
            # exact float64 values as written; the default from pandas 3 on
            **({"float_precision": "round_trip"} if pandas_major < 3 else {}),
        )
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"not a valid CSV file ({_exc(err)})") from None

    warnings = []
    columns = [str(c) for c in df.columns]
    if headerless:
        warnings.append("no header row: every column is read as a class logit, no labels")
    if columns and columns[0] == "Unnamed: 0" and _is_row_index(df.iloc[:, 0]):
        df = df.iloc[:, 1:]
        columns = columns[1:]
        warnings.append("dropped an unnamed first column holding the row numbers (an index)")
    for i, c in enumerate(columns):
        if not headerless and c.startswith("Unnamed: "):
            raise _fail(src, f"column {i + 1} has an empty header; name every column")

    label_cols = [
        i for i, c in enumerate(columns) if not headerless and c.strip() in _LABEL_COLUMNS
    ]
    if len(label_cols) > 1:
        raise _fail(src, "more than one label column ("
                    + ", ".join(repr(columns[i]) for i in label_cols) + ")")
    class_cols = [i for i in range(len(columns)) if i not in label_cols]
    arrays = [_csv_column(df.iloc[:, i], columns[i], src) for i in class_cols]
    logits = np.column_stack(arrays) if arrays else np.empty((len(df), 0))
    labels = _csv_column(df.iloc[:, label_cols[0]], columns[label_cols[0]], src,
                         field="labels") if label_cols else None
    return _Raw(logits=logits, labels=labels, warnings=tuple(warnings))


def _decode_text(content: bytes, src: str) -> str:
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise _fail(src, f"not UTF-8 text (invalid byte at offset {err.start})") from None
    if "\x00" in text:
        raise _fail(
            src,
            f"contains a NUL byte at character {text.index(chr(0))} (binary data, not text)",
        )
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_row_index(column) -> bool:
    values = column.to_numpy()
    return values.dtype.kind in "iu" and np.array_equal(values, np.arange(len(values)))


def _csv_column(column, header: str, src: str, *, field: str = "logits") -> np.ndarray:
    import pandas as pd

    values = column.to_numpy()
    if values.dtype.kind in "iuf":
        return values
    if values.dtype.kind == "b":
        raise _fail(src, f"column {header!r} is bool; {_rule(field)}")
    converted = pd.to_numeric(column, errors="coerce")
    bad = converted.isna().to_numpy() & column.notna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise _fail(
            src, f"column {header!r} row {row} is {str(values[row])[:40]!r}, not a number"
        )
    return converted.to_numpy(dtype=np.float64)


def _read_parquet(content: bytes, src: str, max_elements: int) -> _Raw:
    """Like CSV: one numeric column per class plus an optional `label` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(content))
        metadata = pf.metadata
        schema = pf.schema_arrow
        rows, cols = metadata.num_rows, metadata.num_columns
        declared = sum(
            metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)
        )
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"not a valid parquet file ({_exc(err)})") from None
    if rows < 0 or cols < 0 or rows * cols > max_elements:
        raise _fail(
            src, f"{rows:,} rows × {cols:,} columns, more than max_elements={max_elements:,}"
        )
    limit = _max_member_bytes(max_elements)
    if declared > limit:
        raise _fail(src, f"the row groups unpack to {declared:,} bytes, more than the "
                    f"{limit:,} allowed for max_elements={max_elements:,}")

    names = [f.name for f in schema if not re.fullmatch(r"__index_level_\d+__", f.name)]
    label_names = [n for n in names if n.strip() in _LABEL_COLUMNS]
    if len(label_names) > 1:
        raise _fail(src, f"more than one label column ({', '.join(map(repr, label_names))})")
    if len(set(names)) != len(names):
        raise _fail(src, "duplicate column names")
    for f in schema:
        if f.name not in names:
            continue
        field = "labels" if f.name in label_names else "logits"
        if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
            continue
        kind = "bool" if pa.types.is_boolean(f.type) else f"type {f.type}"
        raise _fail(src, f"column {f.name!r} is {kind}; {_rule(field)}")

    try:
        table = pf.read(columns=names, use_threads=False)
        arrays = {n: table.column(n).to_numpy() for n in names}
    except MemoryError:
        raise
    except Exception as err:
        raise _fail(src, f"not a valid parquet file ({_exc(err)})") from None
    class_arrays = [arrays[n] for n in names if n not in label_names]
    logits = np.column_stack(class_arrays) if class_arrays else np.empty((table.num_rows, 0))
    labels = arrays[label_names[0]] if label_names else None
    return _Raw(logits=logits, labels=labels)


_READERS = {
    ".npz": _read_npz,
    ".npy": _read_npy,
    ".pt": _read_torch,
    ".pth": _read_torch,
    ".safetensors": _read_safetensors,
    ".csv": _read_csv,
    ".parquet": _read_parquet,
}


# -------------------------------------------------------------------- labels file


def _read_labels_file(content: bytes, ext: str, src: str, max_elements: int) -> np.ndarray:
    if ext == ".npy":
        return _read_npy_bytes(content, src, "labels", max_elements)
    if ext == ".npz":
        zf = _open_zip(content, src, "npz")
        members = _npz_members(zf)
        if "labels" not in members:
            raise _fail(src, f"no `labels` array in the npz (found: {_list_keys(members)})")
        _check_zip_budget(src, [members["labels"]], max_elements, "the labels array")
        return _read_npz_member(zf, members["labels"], src, "labels", max_elements)
    return _read_labels_text(content, src, max_elements)


def _read_labels_text(content: bytes, src: str, max_elements: int) -> np.ndarray:
    """One integer per line; blank lines skipped; an optional non-numeric header line."""
    lines = _decode_text(content, src).splitlines()
    if len(lines) > max_elements + 1:
        raise _fail(src, f"{len(lines):,} lines, more than max_elements={max_elements:,}")
    numbered = [(i + 1, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    if numbered and not _is_number(numbered[0][1]):
        numbered = numbered[1:]  # a header such as "label"
    tokens = [tok for _, tok in numbered]
    try:
        return np.array(tokens, dtype=np.str_).astype(np.int64) if tokens else np.empty(0, np.int64)
    except (ValueError, OverflowError):
        pass
    values = np.empty(len(tokens), dtype=np.float64)
    for j, (lineno, tok) in enumerate(numbered):
        if "," in tok:
            raise _fail(src, f"line {lineno} has {tok.count(',') + 1} comma-separated fields "
                        "(expected one integer per line)")
        try:
            values[j] = float(tok)
        except ValueError:
            raise _fail(src, f"line {lineno} is {tok[:40]!r}, not an integer label") from None
    return values  # integrality and range are checked with the logits' K


# ---------------------------------------------------------------------- validation


def _validate_logits(raw, src: str, max_elements: int) -> np.ndarray:
    arr = np.asarray(raw)
    problem = _dtype_problem(arr.dtype)
    if problem is not None:
        raise _refuse_dtype(src, "logits", arr.dtype, problem)
    if arr.ndim != 2:
        raise _fail(src, f"logits must be 2-D (n_samples, n_classes), got shape {arr.shape}")
    n, k = arr.shape
    if n < 1:
        raise _fail(src, f"logits have no rows (shape {arr.shape}); need at least 1")
    if k < 2:
        raise _fail(
            src, f"logits have {k} class column(s) (shape {arr.shape}); need at least 2 classes"
        )
    _check_count(src, "logits", arr.shape, max_elements)
    z = np.asarray(arr, dtype=np.float64, order="C")
    if not z.flags.writeable:  # a view of the caller's bytes: hand back our own copy
        z = z.copy()
    finite = np.isfinite(z)
    if not finite.all():
        flat = int(np.argmin(finite.ravel()))
        row, col = divmod(flat, k)
        raise _fail(src, f"logits row {row}, column {col} is {float(z[row, col])!r} "
                    "(every value must be finite)")
    return z


def _validate_labels(
    raw, src: str, *, n_samples: int, n_classes: int, logits_src: str
) -> np.ndarray:
    y = np.asarray(raw)
    problem = _dtype_problem(y.dtype)
    if problem is not None:
        raise _refuse_dtype(src, "labels", y.dtype, problem)
    if y.ndim != 1:
        raise _fail(src, f"labels must be 1-D (n_samples,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        where = "" if src == logits_src else f" in {logits_src}"
        raise _fail(src, f"labels have {y.shape[0]} entries but the logits{where} "
                    f"have {n_samples} rows")
    if y.dtype.kind == "f":
        ok = np.isfinite(y)
        ok[ok] = y[ok] == np.floor(y[ok])
        if not ok.all():
            i = int(np.argmin(ok))
            raise _fail(src, f"labels index {i} is {float(y[i])!r} (labels must be integers)")
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        i = int(np.argmax(bad))
        value = int(y[i])
        raise _fail(src, f"labels index {i} is {value}, outside [0, {n_classes}) "
                    f"for K={n_classes} classes")
    return np.array(y, dtype=np.int64, order="C")


def _check_margin_scale(logits: np.ndarray, src: str) -> None:
    """The margin scale S = median top-two margin must be positive (Eq. normalized-noise)."""
    margins = top_two_margins(logits)
    median = float(np.median(margins))
    if not median > 0:
        tied = float(np.mean(margins == 0))
        raise _fail(
            src,
            f"logits are degenerate: the median top-two margin is {median:g} because "
            f"{tied:.0%} of rows tie at the top logit (the margin scale must be > 0)",
        )
