"""Canonical request ids: one id per input the model cannot tell apart, so ids cannot be multiplied.

Per-input seeding gives every id its own draw. An id taken from the raw
bytes of a request hands a thief as many draws as it can write the same
input: one ulp moved, ``-0.0`` for ``0.0``, the fields of a JSON object in
another order. Averaging those answers cancels the noise as if there were no
seeding. :func:`canonical_features` maps such variants to one value before
the model reads it, and :func:`canonical_id` hashes that value.

What it covers
--------------
* ``-0.0`` and ``0.0`` (and every value that rounds to zero) are one value;
* jitter below the precision the model reads: features are rounded to
  ``decimals`` places (an integer grid, so no decimal formatting is
  involved), and ints and floats of equal value are one value;
* the order of named fields: a mapping is read in sorted name order, and
  its names are part of the id;
* NaN and infinities are refused (``ValueError``), never hashed.

What it does not cover
----------------------
* changes above the precision: moving a feature by more than half a step
  of ``10**-decimals`` gives another input, and so a fresh draw;
* a feature that sits within the jitter of a half-step boundary can round
  either way: two variants then give two ids (for one-ulp jitter of float64
  features and 6 decimals, about one chance in 10^9 per feature);
* inputs that differ but give (nearly) the same logits -- another crop, a
  paraphrase, a re-scaled input. Only consistent seeding, whose noise is a
  function of the logits themselves, covers those.

Serve the canonical features, not the raw ones, so that the id names
exactly what the model read.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping

import numpy as np

_DOMAIN = b"caliber.canonical-id/v1\x00"
#: Grid integers must stay exact in float64 and int64.
_MAX_GRID = 2.0**53


def _check_decimals(decimals) -> int:
    if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral) or not 0 <= decimals <= 15:
        raise ValueError(f"decimals must be an integer in [0, 15], got {decimals!r}")
    return int(decimals)


def _as_matrix(features) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """(rows as float64 (N, D), field names or None) from a row, a matrix, a mapping or a list of mappings."""
    names = None
    if isinstance(features, Mapping):
        features = [features]
    if isinstance(features, (list, tuple)) and features and all(isinstance(r, Mapping) for r in features):
        names = tuple(sorted(str(k) for k in features[0]))
        for i, row in enumerate(features):
            keys = tuple(sorted(str(k) for k in row))
            if keys != names:
                raise ValueError(f"row {i} has fields {list(keys)[:5]}, row 0 has {list(names)[:5]}")
        features = [[row[k] if k in row else row[_key(row, k)] for k in names] for row in features]
    try:
        values = np.asarray(features, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("features must be numbers (a row, rows of equal length, or mappings of numbers)") from None
    if values.ndim == 1:
        values = values[None, :]
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"features must be a row or a matrix of rows, got shape {values.shape}")
    return values, names


def _key(row, name):
    return next(k for k in row if str(k) == name)


def canonical_features(features, *, decimals: int) -> np.ndarray:
    """Features rounded to ``decimals`` places, with -0.0 as 0.0; what the model should read.

    Parameters
    ----------
    features : array-like (D,) or (N, D), a mapping name -> number, or a list of mappings
        One input or a batch. A mapping's fields are taken in sorted name order.
    decimals : int in [0, 15]
        The precision the model reads: values are rounded half to even onto the grid ``10**-decimals``.

    Returns
    -------
    ndarray of float64, shape (N, D)
        Equal for every variant :func:`canonical_id` gives one id.

    Raises
    ------
    ValueError
        NaN or an infinity (naming the row and feature), a value too large for the grid, a bad shape.
    """
    grid, _ = _grid(features, decimals=_check_decimals(decimals))
    return grid / 10.0**decimals + 0.0  # + 0.0 turns any -0.0 into 0.0


def _grid(features, *, decimals: int) -> tuple[np.ndarray, tuple[str, ...] | None]:
    values, names = _as_matrix(features)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(f"features hold {float(values[row, col])!r} at row {row}, feature {col}: "
                         "only finite numbers have an id")
    scale = 10.0**decimals
    grid = np.rint(values * scale)
    if np.abs(grid).max() >= _MAX_GRID:
        row, col = np.unravel_index(int(np.argmax(np.abs(grid))), grid.shape)
        raise ValueError(f"feature {col} of row {row} is {float(values[row, col])!r}: beyond what {decimals} decimals "
                         f"hold exactly (|x| < {_MAX_GRID / scale:.3g})")
    return grid + 0.0, names


def canonical_ids(features, *, decimals: int, namespace: bytes = b"") -> list[bytes]:
    """One canonical id per row (see :func:`canonical_id`).

    Parameters
    ----------
    features : array-like (N, D), or a mapping name -> column
        The inputs; a mapping is read in sorted name order and its names are hashed too.
    decimals : int in [0, 15]
        The precision the model reads (see :func:`canonical_features`).
    namespace : bytes, default b""
        Separates id spaces (an endpoint, a model), so two never share an id.

    Returns
    -------
    list of bytes
        32 bytes per row, as :func:`canonical_id` computes them.

    Raises
    ------
    TypeError
        ``namespace`` is not bytes.
    ValueError
        Bad ``decimals``, NaN or an infinity, or a value beyond the grid.

    Notes
    -----
    Widens the repeats that per-input seeding answers identically, Proposition cost (ii).
    """
    decimals = _check_decimals(decimals)
    if not isinstance(namespace, (bytes, bytearray)):
        raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
    grid, names = _grid(features, decimals=decimals)
    head = hashlib.sha256(_DOMAIN + bytes(namespace) + b"\x00" + str(decimals).encode() + b"\x00")
    if names is not None:
        head.update(b"\x00".join(n.encode("utf-8", "surrogatepass") for n in names) + b"\x01")
    ints = grid.astype(np.int64)
    out = []
    for row in ints:
        h = head.copy()
        h.update(row.astype(">i8").tobytes())
        out.append(h.digest())
    return out


def canonical_id(features, *, decimals: int, namespace: bytes = b"") -> bytes:
    """The per-input seeding id of one input, the same for every variant the model cannot tell apart.

    Parameters
    ----------
    features : array-like (D,), or a mapping name -> number
        One input. A mapping is read in sorted name order and its names are hashed too.
    decimals : int in [0, 15]
        The precision the model reads (see :func:`canonical_features`).
    namespace : bytes, default b""
        Separates id spaces (an endpoint, a model), so two never share an id.

    Returns
    -------
    bytes
        32 bytes: sha256 over a versioned domain, the namespace, ``decimals``,
        the field names and the rounded features as integers of the grid.

    Raises
    ------
    ValueError
        NaN or an infinity, a value beyond the grid, more than one row.

    Notes
    -----
    Per-input seeding (Proposition 2(ii)) holds against repeats only when a
    repeat has the same id; this function widens "the same" from equal bytes
    to equal canonical features. See the module docstring for what it does not cover.
    """
    ids = canonical_ids(features, decimals=decimals, namespace=namespace)
    if len(ids) != 1:
        raise ValueError(f"canonical_id takes one input, got {len(ids)} rows: use canonical_ids")
    return ids[0]
