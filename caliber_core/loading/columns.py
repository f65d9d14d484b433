"""Tables (CSV, parquet): one numeric column per class plus an optional label column."""

from __future__ import annotations

import numpy as np

from .safety import fail

LABEL_COLUMNS = ("label", "labels")  # the names of the column that holds the labels


def split_columns(names: list[str], src: str) -> tuple[list[int], int | None]:
    """Positions of the class columns and of the label column (None when absent).

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
    """The class columns side by side, shape ``(n_rows, len(columns))``."""
    return np.column_stack(columns) if columns else np.empty((n_rows, 0))
