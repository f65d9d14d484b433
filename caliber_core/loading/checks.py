"""What a file holds, checked before any numerics.

2-D real logits with at least one row and two classes, every value finite;
integer labels in ``[0, K)``, one per row; and a positive median top-two
margin (the margin scale S of ``margins.margin_scale``; v = sigma^2 / S^2 is
undefined otherwise). Every message names the file and the first offender.

The rules are those of :mod:`caliber_core.validation` (``as_logits`` with
``finite=True``, ``as_labels``), which the numerics apply to in-memory arrays;
a test holds the two to the same verdicts. They are applied here rather than
delegated because a file needs a different message (the file, the row and
column or index of the first offender, where ``validation`` reports a range)
and one wider rule: labels stored as integral floats (``3.0``, as CSV, text and
some array writers produce) are accepted and converted to int64.
"""

from __future__ import annotations

import numpy as np

from ..top_two import top_two_margins
from .safety import check_count, check_dtype, fail


def validate_logits(raw, src: str, *, max_elements: int) -> np.ndarray:
    """Logits as a float64, C-contiguous array of our own.

    Parameters
    ----------
    raw : array_like
        What a format reader found.
    src : str
        The file's display name, for messages.
    max_elements : int
        The largest element count accepted.

    Returns
    -------
    ndarray of shape (n_samples, n_classes), float64
        A copy whenever ``raw`` is a read-only view of the caller's bytes.

    Raises
    ------
    LogitsFileError
        Wrong dtype, not 2-D, no rows, fewer than 2 classes, too many elements,
        a short and wide (likely transposed) file, or a non-finite value (named
        by row and column).
    """
    arr = np.asarray(raw)
    check_dtype(src, "logits", arr.dtype)
    if arr.ndim != 2:
        raise fail(src, f"logits must be 2-D (n_samples, n_classes), got shape {arr.shape}")
    n, k = arr.shape
    if n < 1:
        raise fail(src, f"logits have no rows (shape {arr.shape}); need at least 1")
    if k < 2:
        raise fail(
            src, f"logits have {k} class column(s) (shape {arr.shape}); need at least 2 classes"
        )
    check_count(src, "logits", arr.shape, max_elements)
    check_rows_and_classes(src, n, k)
    z = np.asarray(arr, dtype=np.float64, order="C")
    if not z.flags.writeable:  # a view of the caller's bytes: hand back our own copy
        z = z.copy()
    # min and max propagate NaN and expose +-inf: two passes that allocate nothing
    # (a full isfinite mask is 45 MB at 45,000 x 1,000); only a file that fails
    # them is searched for its first bad value.
    if not (np.isfinite(z.min()) and np.isfinite(z.max())):
        finite = np.isfinite(z)
        row, col = divmod(int(np.argmin(finite.ravel())), k)
        raise fail(src, f"logits row {row}, column {col} is {float(z[row, col])!r} "
                   "(every value must be finite)")
    return z


#: Below this many rows a file may not have more classes than rows (see check_rows_and_classes).
WIDE_MIN_ROWS = 200


def check_rows_and_classes(src: str, n_rows: int, n_classes: int, *, note: str | None = None) -> None:
    """Refuse a short, wide file: fewer than :data:`WIDE_MIN_ROWS` rows and more classes than rows.

    Such a file is most often transposed (one row per class); as logits it
    gives an accuracy that cannot be told from chance (1/K) and a margin scale
    from a handful of rows, and its sweep would cost K-wide work per row for
    nothing. Checked from the shape alone, before any conversion.

    Parameters
    ----------
    src : str
        The file's display name.
    n_rows, n_classes : int
        The declared shape.
    note : str, optional
        What the reader saw that explains the shape (a table with no ``label`` column).

    Raises
    ------
    LogitsFileError
        ``"<file>: 100 rows and 100,000 class columns: ..."``.
    """
    if n_rows < WIDE_MIN_ROWS and n_classes > n_rows:
        raise fail(src, f"{n_rows:,} rows and {n_classes:,} class columns: more classes than rows in a file "
                   f"of fewer than {WIDE_MIN_ROWS} rows (one row per input, one column per class; is it "
                   f"transposed?){f'; {note}' if note else ''}; nothing was computed")


def validate_labels(
    raw, src: str, *, n_samples: int, n_classes: int, logits_src: str
) -> np.ndarray:
    """Labels as int64 in ``[0, n_classes)``, one per logits row.

    Parameters
    ----------
    raw : array_like
        What the reader found.
    src : str
        Where the labels came from (display name).
    n_samples, n_classes : int
        The validated logits' shape.
    logits_src : str
        The logits' file, named in the length message when the labels came from a separate file.

    Returns
    -------
    ndarray of shape (n_samples,), int64

    Raises
    ------
    LogitsFileError
        A non-numeric dtype, not 1-D, a length that differs from the logits,
        a non-integer float, or a value outside [0, n_classes) (the first such
        index is named).
    """
    y = np.asarray(raw)
    check_dtype(src, "labels", y.dtype)
    if y.ndim != 1:
        raise fail(src, f"labels must be 1-D (n_samples,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        where = "" if src == logits_src else f" in {logits_src}"
        raise fail(src, f"labels have {y.shape[0]} entries but the logits{where} "
                   f"have {n_samples} rows")
    if y.dtype.kind == "f":
        ok = np.isfinite(y)
        ok[ok] = y[ok] == np.floor(y[ok])
        if not ok.all():
            i = int(np.argmin(ok))
            raise fail(src, f"labels index {i} is {float(y[i])!r} (labels must be integers)")
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        i = int(np.argmax(bad))
        raise fail(src, f"labels index {i} is {int(y[i])}, outside [0, {n_classes}) "
                   f"for K={n_classes} classes")
    return np.array(y, dtype=np.int64, order="C")


# Rows per top-two pass: about 8 MB of float64 at a time. One pass over a large
# file would partition a full copy of it (360 MB at 45,000 x 1,000): 0.4 s of
# fresh memory in a new process against 0.1 s in cache-sized chunks.
_MARGIN_CHUNK_ELEMENTS = 1 << 20


def margins_in_chunks(logits: np.ndarray) -> np.ndarray:
    """``top_two_margins`` of a float64 (n, K) array, computed a block of rows at a time.

    The same values as one pass (each row's margin depends on that row only).

    Parameters
    ----------
    logits : ndarray of shape (n_samples, n_classes), float64
        Validated logits.

    Returns
    -------
    ndarray of shape (n_samples,), float64
        Top-1 minus top-2 logit of each row.

    Notes
    -----
    The margins m_i whose median is the scale S of Eq. normalized-noise.
    """
    n, k = logits.shape
    rows = max(1, _MARGIN_CHUNK_ELEMENTS // k)
    if n <= rows:
        return top_two_margins(logits)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, rows):
        out[start:start + rows] = top_two_margins(logits[start:start + rows])
    return out


def check_margin_scale(logits: np.ndarray, src: str) -> np.ndarray:
    """The margin scale S = median top-two margin must be positive (Eq. normalized-noise).

    Returns
    -------
    ndarray of shape (n_samples,)
        The top-two margins it checked (kept by the loader, so that the pages
        need not take them again).
    """
    margins = margins_in_chunks(logits)
    median = float(np.median(margins))
    if not median > 0:
        tied = float(np.mean(margins == 0))
        raise fail(
            src,
            f"logits are degenerate: the median top-two margin is {median:g} because "
            f"{tied:.0%} of rows tie at the top logit (the margin scale must be > 0)",
        )
    return margins
