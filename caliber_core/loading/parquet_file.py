"""``.parquet`` files: pyarrow's footer metadata is checked against the budget, then read.

The footer declares the row and column counts and each row group's unpacked
size; both are checked before pyarrow reads a column. Like CSV: one numeric
column per class plus an optional ``label`` column; pandas index columns
(``__index_level_N__``) are ignored.
"""

from __future__ import annotations

import re

from .columns import column_name, split_columns, stack_columns
from .safety import RAISE_LIMIT, Unvalidated, check_unpacked_size, fail, library_errors, optional_library, rule

_INDEX_COLUMN = re.compile(r"__index_level_\d+__")


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """A parquet table of logits (and optionally labels).

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
        The class columns and the label column when present.

    Raises
    ------
    LogitsFileError
        pyarrow missing, too many values or unpacked bytes, duplicate column names, a non-numeric column, or a table pyarrow cannot read.
    """
    pa = optional_library("pyarrow", extra="tables", src=src)
    pq = optional_library("pyarrow.parquet", extra="tables", src=src)

    with library_errors(src, "not a valid parquet file"):
        pf = pq.ParquetFile(pa.BufferReader(content))
        metadata, schema = pf.metadata, pf.schema_arrow
        rows, cols = metadata.num_rows, metadata.num_columns
        declared = sum(
            metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)
        )
    if rows < 0 or cols < 0 or rows * cols > max_elements:
        raise fail(
            src, f"{rows:,} rows × {cols:,} columns, more than max_elements={max_elements:,} ({RAISE_LIMIT})"
        )
    check_unpacked_size(src, declared, max_elements, "the row groups", bomb="compression bomb")

    names = [f.name for f in schema if not _INDEX_COLUMN.fullmatch(f.name)]
    classes, label = split_columns(names, src)
    if len(set(names)) != len(names):
        raise fail(src, "duplicate column names")
    for i, name in enumerate(names):
        kind = schema.field(name).type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            continue
        shown = "bool" if pa.types.is_boolean(kind) else f"type {kind}"
        raise fail(src, f"{column_name(i, name)} is {shown}; {rule('labels' if i == label else 'logits')}")

    with library_errors(src, "not a valid parquet file"):
        table = pf.read(columns=names, use_threads=False)
        arrays = [table.column(name).to_numpy() for name in names]
    logits = stack_columns([arrays[i] for i in classes], table.num_rows)
    return Unvalidated(logits=logits, labels=None if label is None else arrays[label])
