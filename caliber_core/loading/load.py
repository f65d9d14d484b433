"""The entry points: a file (or uploaded bytes) in, a validated :class:`LogitsData` out."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import csv_file, lm_eval_samples, npy, npz, parquet_file, pt, safetensors_file
from .checks import check_margin_scale, validate_labels, validate_logits
from .labels_file import EXTENSIONS as LABELS_EXTENSIONS
from .labels_file import read_labels_file
from .safety import (
    DEFAULT_MAX_ELEMENTS,
    RAISE_LIMIT,
    LogitsFileError,
    check_max_elements,
    clean_name,
    describe_exception,
    display_name,
    fail,
    library_errors,
    max_file_bytes,
)

READERS = {
    ".npz": npz.read,
    ".npy": npy.read,
    ".pt": pt.read,
    ".pth": pt.read,
    ".safetensors": safetensors_file.read,
    ".csv": csv_file.read,
    ".parquet": parquet_file.read,
    ".jsonl": lm_eval_samples.read,  # lm-eval --log_samples files (multiple choice)
    ".json": lm_eval_samples.read,
}
SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(READERS)
_SHA256 = re.compile(r"[0-9a-f]{64}")
MIN_ROWS_FOR_PRECISION = 200  # below this, warn: accuracy estimates are too noisy


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
    margins : ndarray of shape (n_samples,), read-only, or None
        The top-two margins of ``logits``, taken by the loader's margin check
        (None when the object was built elsewhere). They describe the logits as
        loaded: an array modified in place afterwards needs its margins taken anew.
    """

    name: str
    logits: np.ndarray
    labels: np.ndarray | None
    sha256: str
    source: str
    labels_source: str | None = None
    warnings: tuple[str, ...] = ()
    margins: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_samples(self) -> int:
        """N, the number of rows."""
        return int(self.logits.shape[0])

    @property
    def n_classes(self) -> int:
        """K, the number of classes."""
        return int(self.logits.shape[1])

    @property
    def has_labels(self) -> bool:
        """Whether the file carried labels."""
        return self.labels is not None


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
    check_max_elements(max_elements)
    content = read_file(path, max_elements=max_elements, allowed=SUPPORTED_EXTENSIONS,
                         what="logits")
    labels_content = labels_filename = None
    if labels_path is not None:
        labels_filename = str(labels_path)
        labels_content = read_file(labels_path, max_elements=max_elements,
                                    allowed=LABELS_EXTENSIONS, what="labels")
    return load_logits_bytes(
        content, str(path), labels_content=labels_content, labels_filename=labels_filename,
        max_elements=max_elements,
    )


def load_logits_bytes(
    content: bytes,
    filename: str,
    *,
    labels_content: bytes | None = None,
    labels_filename: str | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    sha256: str | None = None,
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
    sha256 : str, optional
        The hex SHA-256 of ``content`` when the caller has already checked the
        bytes against it (a content-addressed store verifies a blob on read).
        It becomes ``LogitsData.sha256`` as given, so a 180 MB file is not hashed
        a second time; it is not recomputed here. Without it the digest is
        computed from ``content``.

    Returns
    -------
    LogitsData

    Raises
    ------
    LogitsFileError
        Unsupported extension or invalid contents (see the package docstring).
    """
    check_max_elements(max_elements)
    if (labels_content is None) != (labels_filename is None):
        raise TypeError("labels_content and labels_filename must be given together")
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise ValueError(f"sha256 must be 64 lowercase hex characters, got {sha256!r}")
    content = _as_bytes(content, "content")
    src = display_name(filename)
    ext = _extension(filename, SUPPORTED_EXTENSIONS, src, what="logits")
    if labels_content is not None:
        labels_content = _as_bytes(labels_content, "labels_content")
        labels_src = display_name(labels_filename)
        labels_ext = _extension(labels_filename, LABELS_EXTENSIONS, labels_src, what="labels")
    if len(content) == 0:
        raise fail(src, "the file is empty (0 bytes)")

    # One error boundary: whatever a reader or a library raises on a crafted file (a plain
    # ValueError or OverflowError from a header's numbers) leaves as one LogitsFileError line.
    with library_errors(src, "not a valid logits file"):
        return _validated(content, filename, src, ext, max_elements=max_elements, sha256=sha256,
                          labels=None if labels_content is None else (labels_content, labels_src, labels_ext,
                                                                        labels_filename))


def with_labels_bytes(data: LogitsData, labels_content: bytes, labels_filename: str, *,
                      max_elements: int = DEFAULT_MAX_ELEMENTS) -> LogitsData:
    """``data`` with a separate labels file attached, as :func:`load_logits_bytes` would give with both files.

    The logits are not read again: an upload already validated without labels
    gets its labels file in one more (small) read, where loading both files anew
    would parse, validate and take the margins of the logits a second time.

    Parameters
    ----------
    data : LogitsData
        Logits validated by this module (any labels they carry are replaced, with a warning).
    labels_content : bytes
        The labels file's bytes (``LABELS_EXTENSIONS``).
    labels_filename : str
        Its name; the extension picks the format and messages name it.
    max_elements : int, default DEFAULT_MAX_ELEMENTS

    Returns
    -------
    LogitsData
        The same logits, margins, digest, name and warnings; the labels and their source as
        :func:`load_logits_bytes` gives them (and a first warning when they replace the file's own).

    Raises
    ------
    LogitsFileError
        An unsupported extension, an empty file, or labels that do not fit the logits.
    """
    check_max_elements(max_elements)
    labels_content = _as_bytes(labels_content, "labels_content")
    src, labels_src = display_name(data.source), display_name(labels_filename)
    labels_ext = _extension(labels_filename, LABELS_EXTENSIONS, labels_src, what="labels")
    if len(labels_content) == 0:
        raise fail(labels_src, "the file is empty (0 bytes)")
    warnings = list(data.warnings)
    if data.labels is not None:
        warnings.insert(0, f"labels from {labels_src} replace the labels stored in {src}")
    with library_errors(src, "not a valid logits file"):  # the boundary load_logits_bytes puts around both
        labels = read_labels_file(labels_content, labels_ext, labels_src, max_elements=max_elements)
        labels = validate_labels(labels, labels_src, n_samples=data.n_samples, n_classes=data.n_classes,
                                 logits_src=src)
    return replace(data, labels=labels, labels_source=str(labels_filename), warnings=tuple(warnings))


def _validated(content: bytes, filename, src: str, ext: str, *, max_elements: int, sha256: str | None,
               labels: tuple | None) -> LogitsData:
    """The body of :func:`load_logits_bytes`, once its arguments are checked."""
    labels_content = labels_src = labels_ext = labels_filename = None
    if labels is not None:
        labels_content, labels_src, labels_ext, labels_filename = labels
    raw = READERS[ext](content, src, max_elements=max_elements)
    logits = validate_logits(raw.logits, src, max_elements=max_elements)
    warnings = list(raw.warnings)
    labels, labels_from, labels_origin = raw.labels, src, str(filename)
    if labels_content is not None:
        if len(labels_content) == 0:
            raise fail(labels_src, "the file is empty (0 bytes)")
        if labels is not None:
            warnings.append(f"labels from {labels_src} replace the labels stored in {src}")
        labels = read_labels_file(labels_content, labels_ext, labels_src,
                                  max_elements=max_elements)
        labels_from, labels_origin = labels_src, str(labels_filename)
    if labels is not None:
        labels = validate_labels(labels, labels_from, n_samples=logits.shape[0],
                                 n_classes=logits.shape[1], logits_src=src)
    margins = check_margin_scale(logits, src)
    margins.flags.writeable = False
    if logits.shape[0] < MIN_ROWS_FOR_PRECISION:
        warnings.append(f"N={logits.shape[0]} rows: calibration precision will be poor")

    return LogitsData(
        name=raw.name or _stem(filename),
        logits=logits,
        labels=labels,
        sha256=sha256 if sha256 is not None else hashlib.sha256(content).hexdigest(),
        source=str(filename),
        labels_source=labels_origin if labels is not None else None,
        warnings=tuple(warnings),
        margins=margins,
    )


def require_labels(data: LogitsData, purpose: str, *, instead: str | None = None) -> np.ndarray:
    """Return ``data.labels``, or raise when the file had none.

    Parameters
    ----------
    data : LogitsData
        A loaded file.
    purpose : str
        What needs the labels, for the message ("an accuracy target").
    instead : str, optional
        What the caller could do without labels, appended to the message
        (the CLI: agreement targets).

    Returns
    -------
    ndarray of shape (n_samples,), int64

    Raises
    ------
    LogitsFileError
        ``"<file>: no labels in the file; <purpose> needs labels (<how to add them>)"``,
        where a table is told that no column is named ``label``.
    """
    if data.labels is None:
        suffix = Path(str(data.source)).suffix.lower()
        if suffix in (".csv", ".parquet"):
            how = "no column is named `label`: add one holding each row's class index"
        elif suffix == ".npz":
            how = "add a `labels` array or pass a labels file"
        else:
            how = "pass a labels file: --labels FILE on the command line"
        raise fail(
            display_name(data.source),
            f"no labels in the file; {purpose} needs labels ({how}{f'; or {instead}' if instead else ''})",
        )
    return data.labels


def describe(data: LogitsData) -> str:
    """One display line: ``"name: N=…, K=…, labels yes/no"``.

    Parameters
    ----------
    data : LogitsData
        A loaded file.

    Returns
    -------
    str
    """
    return (
        f"{data.name}: N={data.n_samples}, K={data.n_classes}, "
        f"labels {'yes' if data.has_labels else 'no'}"
    )


# ------------------------------------------------------------------------ plumbing


def _as_bytes(content, argname: str) -> bytes:
    if isinstance(content, (bytearray, memoryview)):
        return bytes(content)
    if not isinstance(content, bytes):
        raise TypeError(f"{argname} must be bytes, got {type(content).__name__}")
    return content


def _basename(filename) -> str:
    return re.split(r"[\\/]", str(filename))[-1]


def _stem(filename) -> str:
    base = _basename(filename)
    stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
    return clean_name(stem) or "logits"


def _extension(filename, allowed: tuple[str, ...], src: str, *, what: str) -> str:
    base = _basename(filename)
    ext = "." + base.rsplit(".", 1)[1].lower() if "." in base[1:] else ""
    if ext not in allowed:
        shown = repr(ext) if ext else "no extension"
        raise fail(src, f"unsupported {what} file type ({shown}); supported: {', '.join(allowed)}")
    return ext


def read_file(path, *, max_elements: int, allowed: tuple[str, ...], what: str) -> bytes:
    """The file's bytes, after its extension and its size on disk are checked."""
    src = display_name(path)
    try:
        p = Path(path)
    except TypeError as err:
        raise TypeError(f"path must be str or os.PathLike, got {type(path).__name__}") from err
    _extension(p.name, allowed, src, what=what)
    try:
        if not p.exists():
            raise fail(src, "no such file")
        if not p.is_file():
            raise fail(src, "not a regular file")
        size, limit = p.stat().st_size, max_file_bytes(max_elements)
        if size > limit:
            raise fail(src, f"the file is {size:,} bytes, more than the {limit:,} allowed "
                       f"for max_elements={max_elements:,} ({RAISE_LIMIT})")
        return p.read_bytes()
    except LogitsFileError:
        raise
    except (OSError, ValueError) as err:  # ValueError: e.g. an embedded NUL in the path
        raise fail(src, f"cannot read the file ({describe_exception(err)})") from None
