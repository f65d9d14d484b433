"""``.csv`` files: pandas parses the text once the row × column estimate fits the budget.

A header row names one numeric column per class plus an optional ``label``
column. A file whose first row is all numbers (``np.savetxt``) is read as
headerless logits without labels, except the header ``0,1,...,K-1`` that pandas
writes for a DataFrame with default column names. An unnamed first column that
holds 0..N-1 (a saved DataFrame index) is dropped with a warning.
"""

from __future__ import annotations

import io

import numpy as np

from .checks import check_rows_and_classes
from .columns import LABEL_COLUMNS, column_name, split_columns, stack_columns
from .safety import RAISE_LIMIT, Unvalidated, decode_text, fail, is_number, library_errors, optional_library, rule


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """A CSV of logits (and optionally labels).

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.
    max_elements : int
        The element budget, checked from the text before pandas parses it.

    Returns
    -------
    Unvalidated
        The class columns, the label column when present, and notes (a missing
        header, a saved index dropped).

    Raises
    ------
    LogitsFileError
        Not UTF-8 text, no rows, too many values, a short and wide table,
        pandas missing, or text pandas cannot parse.
    """
    text = decode_text(content, src)
    first = next((ln.strip() for ln in io.StringIO(text) if ln.strip()), None)
    if first is None:
        raise fail(src, "the CSV has no rows")
    n_lines = text.count("\n") + 1
    n_fields = first.count(",") + 1
    if n_lines * n_fields > max_elements + n_fields:  # checked before pandas allocates
        raise fail(
            src,
            f"about {n_lines:,} rows × {n_fields:,} columns, more than "
            f"max_elements={max_elements:,} ({RAISE_LIMIT})",
        )
    fields = [f.strip() for f in first.split(",")]
    # pandas writes integer column names 0..K-1 as the header: that row is not data
    class_index_header = fields == [str(i) for i in range(len(fields))]
    headerless = all(map(is_number, fields)) and not class_index_header
    # Before pandas parses anything: rows and classes counted from the text alone.
    not_classes = sum(f in LABEL_COLUMNS for f in fields) + (fields[0] == "")  # labels, a saved index
    no_label = None if headerless or any(f in LABEL_COLUMNS for f in fields) else (
        "no column is named `label`, so every column was counted as a class")
    check_rows_and_classes(src, _data_lines(text) + headerless, n_fields - not_classes, note=no_label)

    pd = optional_library("pandas", extra="tables", src=src)

    # exact float64 values as written; the default from pandas 3 on
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    with library_errors(src, "not a valid CSV file"):
        df = pd.read_csv(io.StringIO(text), header=None if headerless else 0, sep=",", **exact)

    warnings = []
    names = [str(c) for c in df.columns]
    if headerless:
        warnings.append("no header row: every column is read as a class logit, no labels")
    if names and names[0] == "Unnamed: 0" and _is_row_index(df.iloc[:, 0]):
        df, names = df.iloc[:, 1:], names[1:]
        warnings.append("dropped an unnamed first column holding the row numbers (an index)")
    if headerless:
        classes, label = list(range(len(names))), None
    else:
        for i, name in enumerate(names):
            if name.startswith("Unnamed: "):
                raise fail(src, f"column {i + 1} has an empty header; name every column")
        classes, label = split_columns(names, src)
    logits = stack_columns([_column(df.iloc[:, i], column_name(i, names[i]), src) for i in classes], len(df))
    labels = None
    if label is not None:
        labels = _column(df.iloc[:, label], column_name(label, names[label]), src, field="labels")
    return Unvalidated(logits=logits, labels=labels, warnings=tuple(warnings))


def _data_lines(text: str) -> int:
    """Lines that hold something, less one for a possible header (a count, no copies)."""
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    blank = text.count("\n\n") + text.count("\n\r\n")
    return max(0, lines - blank - 1)


def _is_row_index(column) -> bool:
    values = column.to_numpy()
    return values.dtype.kind in "iu" and np.array_equal(values, np.arange(len(values)))


def _column(column, shown: str, src: str, *, field: str = "logits") -> np.ndarray:
    import pandas as pd

    values = column.to_numpy()
    if values.dtype.kind in "iuf":
        return values
    if values.dtype.kind == "b":
        raise fail(src, f"{shown} is bool; {rule(field)}")
    converted = pd.to_numeric(column, errors="coerce")
    bad = converted.isna().to_numpy() & column.notna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        # The cell is described, not shown: an error never echoes a file's contents.
        raise fail(src, f"{shown} row {row} is not a number (text of {len(str(values[row]))} "
                   "characters)")
    return converted.to_numpy(dtype=np.float64)
