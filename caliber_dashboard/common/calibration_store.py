"""Finished calibrations kept in the workspace, so a server restart does not sweep again.

A calibration is the dashboard's slowest step (about 9 s for a 45,000 x 1,000
file here). ``cache.calibration`` keeps it in the process; this module keeps
it in the session's workspace too, and :func:`stored_or_computed` is the order
``cache`` follows on a miss in the process: the workspace, else compute (then
store).

* Stored as bytes through :mod:`caliber_core.calibration.calibration_arrays`
  (an ``.npz`` of float64 arrays and a JSON header, no pickle), under kind
  ``"calibration:<file sha256>"`` and the key of :func:`store_key`: the file
  and labels digest, the margin statistic, the seed, the number of draws
  (resolved, never "default") and the stored format and code version. The
  logits and labels are not stored again: they come from the workspace's copy
  of the file, read by digest.
* Only uploads are kept: the demo set is never copied into a workspace, and
  the server computes its calibrations at start-up.
* An entry that cannot be read back (damaged, or written by other code) is
  skipped with a warning and recomputed, and the new result replaces it.
* A cap (or any store error) that refuses the write leaves the result shown
  and says it was not kept.

Warnings go to the page where the calibration is drawn and to the
workspace's sidebar list (``state.WARNINGS``). Outside a script run (the
warm-up thread) the workspace is not touched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from caliber_core.version import __version__
from caliber_core.calibration.calibrate import Calibration
from caliber_core.calibration.calibration_arrays import (FORMAT, CalibrationArraysError,
                                                         calibration_from_bytes, calibration_to_bytes)
from caliber_core.calibration.calibrate import draws_per_input
from caliber_core.loading import LogitsData

from caliber_dashboard.common import state, ui
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

KIND = "calibration:"
_ABSENT = object()


def store_key(data: LogitsData, *, statistic: str, seed: int | None,
              realizations: int | None) -> tuple[str, str]:
    """(kind, key) of the calibration of ``data`` with these options in a workspace.

    ``realizations`` is resolved to the draws the core makes for the file's
    shape (the default for None, an odd count rounded up, 0 at K = 2 where the
    curves are closed form), so the key names the draws actually made.
    """
    r = draws_per_input(data.n_samples, data.n_classes,
                        realizations=None if realizations is None else int(realizations))
    labels = (hashlib.sha256(data.labels.astype("<i8", copy=False).tobytes()).hexdigest()
              if data.labels is not None else None)
    described = {"format": FORMAT, "version": __version__, "sha256": data.sha256, "labels": labels,
                 "statistic": statistic, "seed": seed, "realizations": r}
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return KIND + data.sha256, hashlib.sha256(text.encode()).hexdigest()[:40]


def _eligible(data: LogitsData) -> bool:
    """In a script run, with a workspace, for an uploaded file (not the demo set)."""
    if get_script_run_ctx() is None or workspace.token() is None:
        return False
    return data.sha256 not in {d.sha256 for d in state.demo_models()}


def load(data: LogitsData, *, statistic: str, seed: int | None,
         realizations: int | None) -> Calibration | None:
    """The stored calibration, or None (absent, unreadable: a warning then says it is recomputed)."""
    if not _eligible(data):
        return None
    kind, key = store_key(data, statistic=statistic, seed=seed, realizations=realizations)
    payload = workspace.load_result(kind, key, _ABSENT)
    if payload is _ABSENT:
        return None
    try:
        if not isinstance(payload, bytes):
            raise CalibrationArraysError("not a stored calibration")
        cal = calibration_from_bytes(payload, logits=data.logits, labels=data.labels)
        if (cal.statistic, cal.seed) != (statistic, seed) or cal.intervals.realizations != draws_per_input(
                data.n_samples, data.n_classes, realizations=realizations):
            raise CalibrationArraysError("its options do not match its key")
    except CalibrationArraysError as exc:
        _warn(f"The stored calibration of {data.name} was skipped ({exc}); it is computed again.")
        return None
    cal.name = data.name  # the name this workspace knows the file by
    return cal


def save(data: LogitsData, cal: Calibration, *, statistic: str, seed: int | None,
         realizations: int | None) -> bool:
    """Keep ``cal`` in the workspace; False (with a warning when it was refused) if not kept."""
    if not _eligible(data):
        return False
    kind, key = store_key(data, statistic=statistic, seed=seed, realizations=realizations)
    try:
        return workspace.save_result(kind, key, calibration_to_bytes(cal))
    except (CapExceeded, *workspace.STORE_ERRORS, ValueError) as exc:
        _warn(f"The calibration of {data.name} is shown but was not kept in the workspace ({exc}); "
              "after a server restart it is computed again.")
        return False


def stored_or_computed(data: LogitsData, *, statistic: str, seed: int | None, realizations: int | None,
                       compute: Callable[[], Calibration], save_later: list | None = None) -> Calibration:
    """The workspace's calibration, else ``compute()``, which is then stored.

    With ``save_later`` (a list), a computed result is not stored here: a call that stores it is
    appended, for a caller with more urgent work first (the background calibration draws the
    Calibrate page's first view before it writes the result: 0.1-0.3 s of encoding and a disk sync).
    """
    options = {"statistic": statistic, "seed": seed, "realizations": realizations}
    cal = load(data, **options)
    if cal is None:
        cal = compute()
        if save_later is None:
            save(data, cal, **options)
        else:
            save_later.append(lambda: save(data, cal, **options))
    return cal


def _warn(message: str) -> None:
    st.warning(ui.plain(message), icon=":material/warning:")
    warnings = st.session_state.setdefault(state.WARNINGS, [])
    if message not in warnings:
        warnings.append(message)
