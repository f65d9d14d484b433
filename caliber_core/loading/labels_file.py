"""A separate labels file: ``.npy``, ``.npz`` (a ``labels`` array), or text.

Text (``.csv``/``.txt``) holds one integer per line; blank lines are skipped
and a first line that is not a number (a header such as ``label``) is dropped.
"""

from __future__ import annotations

import numpy as np

from . import npy, npz
from .safety import decode_text, fail, is_number, library_errors

EXTENSIONS: tuple[str, ...] = (".npy", ".npz", ".csv", ".txt")


def read_labels_file(content: bytes, ext: str, src: str, *, max_elements: int) -> np.ndarray:
    """The labels array of a labels file (validated later, against the logits).

    Parameters
    ----------
    content : bytes
        The file's bytes.
    ext : str
        Its lowercase extension: ``.npy``, ``.npz``, or anything else for text
        (one integer a line, or comma-separated).
    src : str
        The file's display name.
    max_elements : int
        The element budget.

    Returns
    -------
    ndarray
        The labels as read (dtype and range checked by :func:`.checks.validate_labels`).

    Raises
    ------
    LogitsFileError
        A file that does not parse, or more values than ``max_elements``.
    """
    with library_errors(src, "not a valid labels file"):  # one line, whatever a library raises
        if ext == ".npy":
            return npy.read_npy(content, src=src, field="labels", max_elements=max_elements)
        if ext == ".npz":
            return npz.read_labels(content, src, max_elements=max_elements)
        return _read_text(content, src, max_elements=max_elements)


def _read_text(content: bytes, src: str, *, max_elements: int) -> np.ndarray:
    lines = decode_text(content, src).splitlines()
    if len(lines) > max_elements + 1:
        raise fail(src, f"{len(lines):,} lines, more than max_elements={max_elements:,}")
    numbered = [(i + 1, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    if numbered and not is_number(numbered[0][1]):
        numbered = numbered[1:]  # a header such as "label"
    tokens = [tok for _, tok in numbered]
    try:
        return np.array(tokens, dtype=np.str_).astype(np.int64) if tokens else np.empty(0, np.int64)
    except (ValueError, OverflowError):
        pass
    values = np.empty(len(tokens), dtype=np.float64)
    for j, (lineno, tok) in enumerate(numbered):
        if "," in tok:
            raise fail(src, f"line {lineno} has {tok.count(',') + 1} comma-separated fields "
                       "(expected one integer per line)")
        try:
            values[j] = float(tok)
        except ValueError:
            raise fail(src, f"line {lineno} is not an integer label (text of {len(tok)} characters)") from None
    return values  # integrality and range are checked with the logits' K
