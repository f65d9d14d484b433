"""Names a visitor chose (file names, model names, account names) as plain text in every output.

One helper per place a name lands:

* :func:`markdown_text` -- in Markdown (``st.caption``, ``st.success``, ...): every
  character Markdown or its HTML could read as syntax is escaped, so a name like
  ``![x](http://host/p.png)`` shows as typed, fetches nothing and links nowhere;
* :func:`plotly_text` -- in a Plotly label (legend, trace name, hover, title),
  which Plotly reads as a small subset of HTML: ``<``, ``>`` and ``&`` become
  entities, so ``<a href>`` and ``<b>`` show as text;
* :func:`csv_cell` / :func:`csv_safe` / :func:`csv_text` -- in a CSV download: a cell that a
  spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``,
  a tab or a carriage return) gets a leading ``'``;
* :func:`file_stem` -- in a download's file name: letters, digits, ``.``, ``_``
  and ``-`` only, never a path.
"""

from __future__ import annotations

import csv
import html
import re

import pandas as pd

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:&])")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_FILE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def markdown_text(text) -> str:
    """Escape Markdown so an untrusted string shows verbatim (newlines fold to spaces).

    Parameters
    ----------
    text : object
        Anything; its ``str``.

    Returns
    -------
    str
    """
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def plotly_text(text) -> str:
    """A name for a Plotly label: HTML special characters as entities, shown as typed.

    Returns
    -------
    str
    """
    return html.escape(str(text), quote=False)


def csv_cell(value):
    """A CSV cell that no spreadsheet runs: a string starting like a formula gets a leading ``'``.

    Returns
    -------
    object
        ``value`` unchanged unless it is such a string.
    """
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose text cells and column names pass through :func:`csv_cell`.

    Returns
    -------
    pandas.DataFrame
    """
    out = df.copy()
    for column in out.columns:
        if out[column].dtype == object or pd.api.types.is_string_dtype(out[column].dtype):
            out[column] = out[column].map(csv_cell)
    out.columns = [csv_cell(str(c)) for c in out.columns]
    return out


def csv_text(df: pd.DataFrame) -> str:
    """``df`` as CSV text for a download: :func:`csv_safe` cells, every text field quoted.

    Quoting every text field keeps a carriage return or a comma inside a name in its cell.

    Returns
    -------
    str
    """
    return csv_safe(df).to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC)


def file_stem(name, *, default: str = "model") -> str:
    """A name as the stem of a download's file name: ``[A-Za-z0-9._-]`` only, no leading dot.

    Parameters
    ----------
    name : object
        The model name (anything a visitor typed or a file stored).
    default : str
        What an empty result becomes.

    Returns
    -------
    str
        At most 100 characters; never a path, never hidden.
    """
    stem = _FILE_UNSAFE.sub("_", str(name)).strip("._-")[:100].strip("._-")
    return stem or default
