"""A finished extraction run as JSON, and back: what the workspace stores (no pickle).

:func:`encode_result` turns an :class:`~caliber_core.extraction.experiment.ExtractionResult`
into plain JSON values; :func:`decode_result` rebuilds it. Only the dataclasses
listed in ``_TYPES`` can come back out of a stored document, each through its
own constructor, so a stored entry can describe data but never name code to run.
Tuples, numpy arrays and non-finite floats (a ``Spread`` of no values has a NaN
mean) are tagged, so the round trip gives back equal objects.

Two fields are not stored: the archive (its arrays are the file the run was
made from, found again by its sha256) and the pool calibration (recomputed
where a config needs one). :func:`run_key` names a run by everything its
numbers depend on: the file, the settings, the sigma grid of the frontier, the
recipes and the code's version, so a stored run is found only by a run that
would reproduce it.

Plain functions, no Streamlit.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import fields, is_dataclass

import numpy as np

from caliber_core.version import __version__
from caliber_core.extraction.archive import ExtractionArchive
from caliber_core.extraction.averaging import AveragingRow
from caliber_core.extraction.experiment import (FRONTIER_LEVELS, Condition, ExtractionResult,
                                                ExtractionSettings, FrontierPoint, RecipeStats)
from caliber_core.extraction.frontier import RetentionRoot
from caliber_core.extraction.recipes import LIGHT, STRONG, TUNED_CANDIDATES, Recipe
from caliber_core.extraction.schedule import Schedule
from caliber_core.extraction.spread import Spread

FORMAT = "caliber.dashboard.extraction-run/1"
_NOT_STORED = ("archive", "calibration")
_TYPES = {cls.__name__: cls for cls in (Spread, RecipeStats, Condition, FrontierPoint, AveragingRow, Recipe,
                                        RetentionRoot, ExtractionSettings, Schedule)}
_TAGS = ("__type__", "__tuple__", "__array__", "__float__")


class StoredRunError(ValueError):
    """A stored run that cannot be read back (damaged, or written by other code)."""


# ------------------------------------------------------------------------------ keys


def run_key(archive_sha256: str, settings: ExtractionSettings) -> str:
    """The store key of the run of ``settings`` on the file with this digest.

    ``"<sha256>.<40 hex digits>"``: the file's digest (so the runs of one file
    share a prefix), then a digest of the settings (every field but
    ``processes``, which changes no number), the frontier's retention levels,
    the recipes and the code's version.
    """
    if not (isinstance(archive_sha256, str) and len(archive_sha256) == 64):
        raise ValueError(f"archive_sha256 must be 64 hex digits, got {archive_sha256!r}")
    described = {
        "format": FORMAT,
        "version": __version__,
        "settings": {k: v for k, v in _encode(settings).items() if k != "processes"},
        "frontier_levels": list(FRONTIER_LEVELS),
        "recipes": [LIGHT.to_dict(), STRONG.to_dict(), *(c.to_dict() for c in TUNED_CANDIDATES)],
    }
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return f"{archive_sha256}.{hashlib.sha256(text.encode()).hexdigest()[:40]}"


# ------------------------------------------------------------------------------ encode


def encode_result(result: ExtractionResult) -> dict:
    """The run as plain JSON values (no NaN or inf: they are tagged)."""
    body = {f.name: _encode(getattr(result, f.name)) for f in fields(result) if f.name not in _NOT_STORED}
    return {"format": FORMAT, "sha256": result.archive.sha256, "result": body}


def _encode(x):
    if is_dataclass(x) and not isinstance(x, type):
        name = type(x).__name__
        if name not in _TYPES:
            raise TypeError(f"cannot store a {name} in an extraction run")
        return {"__type__": name, **{f.name: _encode(getattr(x, f.name)) for f in fields(x)}}
    if isinstance(x, np.ndarray):
        return {"__array__": [_encode(v) for v in x.tolist()], "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return _encode(x.item())
    if isinstance(x, float):
        return x if math.isfinite(x) else {"__float__": repr(x)}
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v) for v in x]}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) and k not in _TAGS for k in x):
            raise TypeError(f"cannot store a mapping with keys {list(x)!r}")
        return {k: _encode(v) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, str)):
        return x
    raise TypeError(f"cannot store a {type(x).__name__} in an extraction run")


def encode_settings(settings: ExtractionSettings) -> dict:
    """The settings alone, as plain JSON values (for remembering a page's last run)."""
    if not isinstance(settings, ExtractionSettings):
        raise TypeError(f"settings must be ExtractionSettings, got {type(settings).__name__}")
    return _encode(settings)


def decode_settings(document) -> ExtractionSettings:
    """Settings stored by :func:`encode_settings` (StoredRunError when they do not fit)."""
    try:
        settings = _decode(document)
    except (TypeError, ValueError, KeyError) as exc:
        raise StoredRunError(f"stored extraction settings do not fit this version ({exc})") from None
    if not isinstance(settings, ExtractionSettings):
        raise StoredRunError("stored extraction settings are not settings")
    return settings


# ------------------------------------------------------------------------------ decode


def decode_result(document, archive: ExtractionArchive) -> ExtractionResult:
    """Rebuild a run stored by :func:`encode_result` for ``archive`` (``calibration`` is None).

    Raises
    ------
    StoredRunError
        The document is not a stored run, is for another file, or does not fit
        the current result classes.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        got = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise StoredRunError(f"not a stored extraction run (format {got!r}, expected {FORMAT!r})")
    if document.get("sha256") != archive.sha256:
        raise StoredRunError(f"the stored run is for file {str(document.get('sha256'))[:12]}…, "
                             f"not {archive.sha256[:12]}…")
    body = document.get("result")
    if not isinstance(body, dict):
        raise StoredRunError("the stored run has no result object")
    try:
        values = {k: _decode(v) for k, v in body.items()}
        result = ExtractionResult(archive=archive, calibration=None, **values)
    except (TypeError, ValueError, KeyError) as exc:
        raise StoredRunError(f"the stored run does not fit this version ({exc})") from None
    if not isinstance(result.settings, ExtractionSettings) or not isinstance(result.clean, Condition):
        raise StoredRunError("the stored run's settings or clean row have the wrong type")
    return result


def _decode(x):
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "__type__" in x:
        cls = _TYPES.get(x["__type__"])
        if cls is None:
            raise ValueError(f"unknown stored type {x['__type__']!r}")
        return cls(**{k: _decode(v) for k, v in x.items() if k != "__type__"})
    if "__tuple__" in x:
        return tuple(_decode(v) for v in x["__tuple__"])
    if "__array__" in x:
        dtype = np.dtype(x["dtype"])
        if dtype.kind not in "biuf":
            raise ValueError(f"stored arrays must be numeric, got dtype {dtype}")
        return np.asarray([_decode(v) for v in x["__array__"]], dtype=dtype)
    if "__float__" in x:
        text = x["__float__"]
        if text not in ("nan", "inf", "-inf"):
            raise ValueError(f"bad stored float {text!r}")
        return float(text)
    return {k: _decode(v) for k, v in x.items()}
