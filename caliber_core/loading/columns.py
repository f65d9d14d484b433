"""Tables (CSV, parquet): one numeric column per class plus an optional label column."""

from __future__ import annotations

import re

import numpy as np

from .safety import fail

LABEL_COLUMNS = ("label", "labels")  # the names of the column that holds the labels
# A header shown in messages: a short identifier. Anything else (a line of some other file read
# as a CSV, say) is named by its position only, so that no message repeats a file's contents.
_SHOWN_HEADER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,23}")


def column_name(index: int, header: str) -> str:
    """``"column 'c2'"`` for a short identifier header, else ``"column 3"`` (1-based position).

    Parameters
    ----------
    index : int
        0-based column position.
    header : str
        The column's header text.

    Returns
    -------
    str
    """
    if _SHOWN_HEADER.fullmatch(header):
        return f"column {header!r}"
    return f"column {index + 1}"


def split_columns(names: list[str], src: str) -> tuple[list[int], int | None]:
    """Positions of the class columns and of the label column (None when absent).

    Parameters
    ----------
    names : list of str
        The table's column names.
    src : str
        The file's display name.

    Returns
    -------
    classes : list of int
        Positions of every column that is not the label column.
    label : int or None
        Position of the column named like a label column.

    Raises
    ------
    LogitsFileError
        More than one column is named like a label column.
    """
    labels = [i for i, name in enumerate(names) if name.strip() in LABEL_COLUMNS]
    if len(labels) > 1:
        shown = ", ".join(repr(names[i]) for i in labels)
        raise fail(src, f"more than one label column ({shown})")
    classes = [i for i in range(len(names)) if i not in labels]
    return classes, (labels[0] if labels else None)


def stack_columns(columns: list[np.ndarray], n_rows: int) -> np.ndarray:
    """The class columns side by side.

    Parameters
    ----------
    columns : list of ndarray of shape (n_rows,)
        One array per class.
    n_rows : int
        Rows of the table (for an empty list).

    Returns
    -------
    ndarray of shape (n_rows, len(columns))
    """
    return np.column_stack(columns) if columns else np.empty((n_rows, 0))
