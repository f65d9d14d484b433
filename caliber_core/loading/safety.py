"""The safety layer every format reader shares.

* :class:`LogitsFileError`, the one error type, built only by :func:`fail` so
  that every message is one bounded line ``"<file>: <rule and value>"``;
* :func:`one_line`, the one sanitizer for text that comes from a file (names,
  keys, library messages) or from the user (file names);
* the budgets: :func:`check_count` refuses a declared shape whose element count
  exceeds ``max_elements`` *before* anything is allocated for it, and
  :func:`max_unpacked_bytes` / :func:`max_file_bytes` bound raw byte counts;
* the dtype rules: real numbers only, object arrays never (nothing is unpickled);
* :func:`library_errors`, which turns whatever a parsing library raises on a
  malformed file into a :class:`LogitsFileError`, and :func:`open_zip`, the
  zip container that .npz and .pt files share.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

#: Peak bytes per logit element that ``calibrate`` and ``check`` hold above the interpreter
#: (benchmarks/bench_memory.py; docs/explanation/limits.md): the default limit is sized with it.
BYTES_PER_ELEMENT = 40
#: The share of the memory available when the process starts that one file may take by default.
MEMORY_SHARE = 0.5
#: The default limit never exceeds this, and is this where the available memory cannot be read.
MAX_DEFAULT_ELEMENTS = 200_000_000
#: ... and never falls below this (a starved machine still opens a small file).
MIN_DEFAULT_ELEMENTS = 1_000_000
#: Most dimensions a declared shape may have (numpy's own limit is 64; logits have 2, labels 1).
MAX_DIMENSIONS = 32
MAX_ITEMSIZE = 16  # largest real numeric itemsize (longdouble); bounds unpacked bytes
MESSAGE_MAX_CHARS = 400
FILENAME_MAX_CHARS = 120
NAME_MAX_CHARS = 200

# control characters other than the whitespace that `str.split` folds into one space
# a quoted string or bytes literal in a library's message (it may quote a file's bytes)
_QUOTED = re.compile(r"[bB]?'(?:[^'\\]|\\.)*'|[bB]?\"(?:[^\"\\]|\\.)*\"")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")


class LogitsFileError(ValueError):
    """The one error type for a bad logits or labels file.

    ``str(err)`` is a single short line naming the file, the field and the
    offending value or index, e.g.
    ``"bad.npz: logits row 12, column 3 is nan (every value must be finite)"``.
    """


@dataclass
class Unvalidated:
    """What a format reader found in a file, before the contents are validated.

    Attributes
    ----------
    logits : ndarray
        Whatever array the file holds under ``logits`` (any shape, real dtype).
    labels : ndarray or None
        The labels array, if the file has one.
    name : str or None
        A display name stored in the file, already passed through :func:`clean_name`.
    warnings : tuple of str
        Non-fatal remarks about how the file was read.
    """

    logits: np.ndarray
    labels: np.ndarray | None = None
    name: str | None = None
    warnings: tuple[str, ...] = ()


# ------------------------------------------------------------------------- text


def one_line(text, *, max_chars: int, keep: str = "head") -> str:
    """``text`` as one printable line of at most ``max_chars`` characters.

    Runs of whitespace (line breaks included) become one space, other control
    characters become ``?``; an over-long line keeps its ``"head"`` or its
    ``"tail"`` (``keep``; file names: the end is the informative part) and marks
    the cut with ``…``.

    Returns
    -------
    str
    """
    line = " ".join(_CONTROL.sub("?", str(text)).split())
    if len(line) <= max_chars:
        return line
    if keep == "tail":
        return "…" + line[-(max_chars - 1) :]
    return line[: max_chars - 1] + "…"


def display_name(filename) -> str:
    """A file name as messages show it (:func:`one_line`, keeping the tail)."""
    return one_line(filename, max_chars=FILENAME_MAX_CHARS, keep="tail")


def clean_name(text) -> str:
    """A model name read from a file, as one short printable line (may be empty)."""
    return one_line(text, max_chars=NAME_MAX_CHARS)


def fail(src: str, message: str) -> LogitsFileError:
    """The error for file ``src``; ``message`` states the rule and shows the value.

    Returns
    -------
    LogitsFileError
        ``"<src>: <message>"`` as one line; the caller raises it.
    """
    return LogitsFileError(one_line(f"{src}: {message}", max_chars=MESSAGE_MAX_CHARS))


def describe_exception(err: BaseException) -> str:
    """A library exception as a short clause: its type and first line, quoted text removed.

    Libraries quote what they found (``got b'root:$'``): a quoted literal is
    replaced by ``<...>`` so that no message repeats a file's contents.

    Returns
    -------
    str
        At most 120 characters.
    """
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    first = _QUOTED.sub("<...>", lines[0]) if lines else ""
    text = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return one_line(text, max_chars=120)


def optional_library(name: str, *, extra: str, src: str):
    """Import an optional library a format needs, or fail naming the extra that installs it.

    Parameters
    ----------
    name : str
        The module ("pandas", "pyarrow.parquet", "torch").
    extra : str
        The package extra that installs it ("tables", "torch").
    src : str
        The file being read, for the message.

    Returns
    -------
    module

    Raises
    ------
    LogitsFileError
        The library is not installed.
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        top = name.split(".")[0]
        raise fail(src, f"reading this format needs {top}, which is not installed: "
                   f'pip install "caliber[{extra}]"') from None


@contextmanager
def library_errors(src: str, what: str, *, where: str | None = None):
    """Re-raise a parsing library's error as ``"<src>: <what> (<where>: <error>)"``.

    Our own :class:`LogitsFileError` and ``MemoryError`` pass through unchanged.

    Raises
    ------
    LogitsFileError
        For any other exception raised inside the ``with`` block.
    """
    try:
        yield
    except (LogitsFileError, MemoryError):
        raise
    except Exception as err:
        detail = describe_exception(err)
        raise fail(src, f"{what} ({where + ': ' if where else ''}{detail})") from None


def decode_text(content: bytes, src: str) -> str:
    """UTF-8 text (a BOM is dropped); NUL bytes mean binary data and are refused.

    Raises
    ------
    LogitsFileError
        Not UTF-8 (the offset is named), or a NUL byte.
    """
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise fail(src, f"not UTF-8 text (invalid byte at offset {err.start})") from None
    if "\x00" in text:
        raise fail(
            src, f"contains a NUL byte at character {text.index(chr(0))} (binary data, not text)"
        )
    return text


def is_number(text: str) -> bool:
    """Whether ``float(text)`` succeeds."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def list_keys(keys) -> str:
    """Up to eight sorted keys for a message, as one str (``"none"`` when empty)."""
    keys = sorted(one_line(k, max_chars=40) for k in keys)
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    return shown or "none"


# ---------------------------------------------------------------------- budgets


def available_memory() -> int | None:
    """Bytes this process may still take: ``MemAvailable``, less under a cgroup v2 memory limit.

    None where neither can be read (not Linux).
    """
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as fh:
            used = int(fh.read().strip())
        if limit.isdigit():
            room = max(0, int(limit) - used)
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


def default_max_elements(available: int | None = None) -> int:
    """The default element limit: what :data:`MEMORY_SHARE` of the available memory affords.

    ``MEMORY_SHARE x available / BYTES_PER_ELEMENT``, within
    [:data:`MIN_DEFAULT_ELEMENTS`, :data:`MAX_DEFAULT_ELEMENTS`].

    Parameters
    ----------
    available : int, optional
        Bytes available; default :func:`available_memory` now.
    """
    if available is None:
        available = available_memory()
    if available is None:
        return MAX_DEFAULT_ELEMENTS
    affordable = int(MEMORY_SHARE * available) // BYTES_PER_ELEMENT
    return int(min(MAX_DEFAULT_ELEMENTS, max(MIN_DEFAULT_ELEMENTS, affordable)))


#: The element limit every reader applies unless told otherwise, fixed when the package is imported:
#: half of the memory then available at BYTES_PER_ELEMENT each, at most 200,000,000.
DEFAULT_MAX_ELEMENTS = default_max_elements()
#: How messages name the option that raises the limit.
RAISE_LIMIT = "--max-elements raises the limit"


def check_max_elements(max_elements) -> None:
    """The ``max_elements`` argument must be an int >= 1.

    Raises
    ------
    TypeError
        Not an int (bools refused).
    ValueError
        Below 1.
    """
    if isinstance(max_elements, bool) or not isinstance(max_elements, (int, np.integer)):
        raise TypeError(f"max_elements must be an int, got {type(max_elements).__name__}")
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")


def check_count(src: str, field: str, shape, max_elements: int) -> int:
    """The element count of a declared ``shape`` of ``field``, refused above ``max_elements``.

    Every reader calls this on the shape a file *declares*, before allocating
    or converting anything of that size.

    Returns
    -------
    int

    Raises
    ------
    LogitsFileError
        More than ``max_elements`` elements (the message gives the memory it would take).
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_DIMENSIONS:
        raise fail(src, f"{field} has {len(shape)} dimensions, more than the {MAX_DIMENSIONS} an array may have")
    count = math.prod(shape)
    if count > max_elements:
        raise fail(
            src,
            f"{field} shape {shape} has {count:,} elements, more than "
            f"max_elements={max_elements:,} (about {_gb(count * BYTES_PER_ELEMENT)} to process; "
            f"{RAISE_LIMIT})",
        )
    if any(d < 0 or d > max_elements for d in shape):  # a zero-size shape may still name a huge dimension
        raise fail(src, f"{field} has a dimension outside [0, max_elements={max_elements:,}] "
                        f"({RAISE_LIMIT})")
    return count


def _gb(nbytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{nbytes / 1e3:,.1f} kB"


def max_unpacked_bytes(max_elements: int) -> int:
    """Upper bound on the unpacked bytes of the archive members or row groups read.

    Returns
    -------
    int
    """
    return MAX_ITEMSIZE * max_elements + 1024 * 1024


def max_file_bytes(max_elements: int) -> int:
    """A sane upper bound on a file's size for a given element budget.

    Text formats spend up to a few dozen bytes per value, and archives may carry
    arrays that are never read; the bound only stops absurd files before reading.

    Returns
    -------
    int
    """
    return 64 * max_elements + 256 * 1024 * 1024


def check_unpacked_size(
    src: str, total: int, max_elements: int, what: str, *, bomb: str = "zip bomb"
) -> None:
    """Refuse ``what`` when its declared unpacked size ``total`` exceeds the element budget.

    Raises
    ------
    LogitsFileError
        ``total`` beyond :func:`max_unpacked_bytes` (the message names a possible ``bomb``).
    """
    limit = max_unpacked_bytes(max_elements)
    if total > limit:
        raise fail(
            src,
            f"{what} unpack to {total:,} bytes, more than the {limit:,} allowed "
            f"for max_elements={max_elements:,} (refusing a possible {bomb}; {RAISE_LIMIT})",
        )


# ----------------------------------------------------------------------- dtypes

_KIND_NAMES = {
    "b": "bool",
    "c": "complex",
    "U": "string",
    "S": "bytes string",
    "V": "structured/void",
    "M": "datetime",
    "m": "timedelta",
}


def rule(field: str) -> str:
    """The dtype rule for ``field`` ("labels" or logits), as messages state it."""
    return "labels must be integers" if field == "labels" else "logits must be real numbers"


def dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` is not a real numeric dtype, or None when it is.

    Returns
    -------
    str or None
    """
    if dtype.kind in "iuf":
        return None
    if dtype.hasobject or dtype.kind == "O":
        return "an object array (pickled Python objects are never loaded)"
    return _KIND_NAMES.get(dtype.kind, f"unsupported kind {dtype.kind!r}")


def check_dtype(src: str, field: str, dtype: np.dtype, *, allow_text: bool = False) -> None:
    """Refuse a dtype that is not real numeric (or, with ``allow_text``, plain text).

    Raises
    ------
    LogitsFileError
        Any other dtype; an object dtype is named as such (it is never unpickled).
    """
    problem = dtype_problem(dtype)
    if problem is None or (allow_text and dtype.kind in "US" and not dtype.hasobject):
        return
    if problem.startswith("an object array"):
        raise fail(src, f"{field} is {problem}")
    raise fail(src, f"{field} has dtype {dtype} ({problem}); {rule(field)}")


# ------------------------------------------------------------------- archives


def open_zip(content: bytes, src: str, kind: str) -> zipfile.ZipFile:
    """A zip archive over ``content``; zipfile reads only its central directory here.

    Returns
    -------
    zipfile.ZipFile

    Raises
    ------
    LogitsFileError
        Not a zip archive zipfile can read (``kind`` names the format).
    """
    with library_errors(src, f"not a valid {kind} archive"):
        return zipfile.ZipFile(io.BytesIO(content))
