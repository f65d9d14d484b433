"""What the dashboard reads from a stranger's bytes: its element limit, and one message for every refusal.

* :func:`max_elements` -- the largest array one upload may become, counted as it
  will be materialized (a ``.pt`` view's shape, an ``.npz`` member's npy header,
  a parquet footer's rows x columns, a CSV's lines x fields), checked by the
  core's readers before anything of that size is allocated.
  ``CALIBER_UPLOAD_MAX_ELEMENTS`` sets it (default 10,000,000: 80 MB as float64);
  it never exceeds the core's own default for this machine.
* :func:`visitor_max_elements` -- the most values one session's models hold together
  (``CALIBER_VISITOR_MAX_ELEMENTS``, default 40,000,000: 320 MB as float64); an upload
  or a restored file past it is refused by :func:`check_visitor_budget`.
* :func:`load_logits` / :func:`with_labels` / :func:`read_labels` -- the core's loaders on
  uploaded bytes, under that limit.
* :func:`message` -- the one line a page shows for any error raised while a
  file is read: the core's message as the command line prints it, and for
  anything unexpected the file's name and the error's type only (no traceback,
  no server path, nothing the file held).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from caliber_core.loading import (DEFAULT_MAX_ELEMENTS, LogitsData, LogitsFileError, load_logits_bytes,
                                  with_labels_bytes)
from caliber_core.loading.safety import RAISE_LIMIT

MAX_ELEMENTS_ENV = "CALIBER_UPLOAD_MAX_ELEMENTS"
DEFAULT_UPLOAD_MAX_ELEMENTS = 10_000_000
VISITOR_MAX_ELEMENTS_ENV = "CALIBER_VISITOR_MAX_ELEMENTS"
DEFAULT_VISITOR_MAX_ELEMENTS = 40_000_000
MESSAGE_MAX_CHARS = 400
_DASHBOARD_LIMIT = f"the server's {MAX_ELEMENTS_ENV} sets the limit"


def max_elements(environ: Mapping[str, str] = os.environ) -> int:
    """The element limit of one upload: ``CALIBER_UPLOAD_MAX_ELEMENTS`` or 10,000,000, at most the core's.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        The variable is set but not a positive integer.
    """
    text = environ.get(MAX_ELEMENTS_ENV, "").strip().replace("_", "")
    if not text:
        return min(DEFAULT_UPLOAD_MAX_ELEMENTS, DEFAULT_MAX_ELEMENTS)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{MAX_ELEMENTS_ENV} must be a positive integer, got {text[:40]!r}")
    return min(int(text), DEFAULT_MAX_ELEMENTS)


def visitor_max_elements(environ: Mapping[str, str] = os.environ) -> int:
    """The most values one session's models may hold together: ``CALIBER_VISITOR_MAX_ELEMENTS``
    or 40,000,000 (320 MB as float64), and never less than one upload's limit.

    Raises
    ------
    ValueError
        The variable is set but not a positive integer.
    """
    text = environ.get(VISITOR_MAX_ELEMENTS_ENV, "").strip().replace("_", "")
    if text and (not text.isdigit() or int(text) < 1):
        raise ValueError(f"{VISITOR_MAX_ELEMENTS_ENV} must be a positive integer, got {text[:40]!r}")
    return max(int(text) if text else DEFAULT_VISITOR_MAX_ELEMENTS, max_elements(environ))


def check_visitor_budget(held: int, data: LogitsData, filename: str) -> None:
    """Refuse ``data`` when the session already holds ``held`` values and it would pass the budget.

    Raises
    ------
    LogitsFileError
        One line naming the file, what it adds and the budget.
    """
    budget = visitor_max_elements()
    if held + data.logits.size > budget:
        raise LogitsFileError(
            f"{' '.join(str(filename).split())[:120]}: {data.logits.size:,} values would bring this workspace's "
            f"models to {held + data.logits.size:,}, more than the {budget:,} one visitor may hold; "
            "remove a model on the Data page first")


def load_logits(content: bytes, filename: str, **kwargs) -> LogitsData:
    """:func:`caliber_core.loading.load_logits_bytes` under :func:`max_elements`.

    Raises
    ------
    LogitsFileError
        One line: the file breaks a rule (its element count included).
    """
    return load_logits_bytes(content, filename, max_elements=max_elements(), **kwargs)


def with_labels(data: LogitsData, content: bytes, filename: str) -> LogitsData:
    """:func:`caliber_core.loading.with_labels_bytes` under :func:`max_elements`: ``data`` with a labels file.

    Raises
    ------
    LogitsFileError
        One line: the labels file breaks a rule or does not fit the logits.
    """
    return with_labels_bytes(data, content, filename, max_elements=max_elements())


def read_labels(content: bytes, filename: str):
    """A labels file's array (:func:`caliber_core.loading.labels_file.read_labels_file`) under the limit."""
    from pathlib import PurePath

    from caliber_core.loading.labels_file import read_labels_file

    return read_labels_file(content, PurePath(filename).suffix.lower(), filename, max_elements=max_elements())


def message(exc: BaseException, name: str | None = None) -> str:
    """One line for a page: the error's own line for a rule the input broke, the type only otherwise.

    Parameters
    ----------
    exc : BaseException
        What reading raised.
    name : str, optional
        The upload's name, put first when the message does not already start with it.

    Returns
    -------
    str
        At most :data:`MESSAGE_MAX_CHARS` characters, no line break.
    """
    from caliber_dashboard.workspace.store import CapExceeded, WorkspaceError

    if isinstance(exc, (ValueError, WorkspaceError)):  # LogitsFileError, ConfigError, a full or damaged store
        text = " ".join(str(exc).split()).replace(RAISE_LIMIT, _DASHBOARD_LIMIT) or type(exc).__name__
    else:  # unexpected: its text may hold a path or a file's bytes, so only its type is named
        text = f"could not be read ({type(exc).__name__})"
    named = isinstance(exc, (LogitsFileError, CapExceeded))  # their line already says which file
    if name and not named and not text.startswith(f"{name}:"):
        text = f"{' '.join(str(name).split())}: {text}"
    return text if len(text) <= MESSAGE_MAX_CHARS else text[: MESSAGE_MAX_CHARS - 1] + "…"
