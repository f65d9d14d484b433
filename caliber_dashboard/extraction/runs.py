"""Finished extraction runs kept in the session and its workspace, so a reload loses none.

A run took minutes of training; once it exists it is kept twice:

* in this session (plain key ``RUNS``: run key -> (time saved, result)), so
  the Extraction and Export pages read it without touching the store again;
* in the workspace (:func:`~caliber_dashboard.workspace.session.save_result`,
  JSON through :mod:`.extraction_codec`, never pickle) under kind
  ``"extraction-run:<file sha256>"`` and the run key of
  :func:`~caliber_dashboard.extraction.codec.run_key` (file, sigma grid,
  recipes, seeds, settings). A reload or a server restart reads the runs of a
  file back the first time the session asks for that file; an entry that
  cannot be read is skipped with a warning and the others stay.

The Extraction page's last run (file and settings, kind ``"extraction-last"``)
seeds its widgets when the page is drawn afresh, so the page opens on the
results rather than on a Run button. Archives uploaded on the Extraction page
are kept in the workspace too (kind ``"extraction-upload"``, the file's bytes),
re-read through the same safe loader as a fresh upload.
"""

from __future__ import annotations

import math
import time

import streamlit as st

from caliber_core.extraction.archive import ExtractionArchive
from caliber_core.extraction.experiment import Condition, ExtractionResult, ExtractionSettings

from caliber_dashboard.common import upload_boundary
from caliber_dashboard.extraction import codec
from caliber_dashboard.extraction import view
from caliber_dashboard.workspace import session as workspace

RUNS = "caliber_extraction_runs"  # run key -> (saved_at, ExtractionResult)
READ = "caliber_extraction_read"  # file digests whose stored runs were read this session
SAVED = "caliber_extraction_saved"  # run keys written to the workspace by this session
UPLOADS = "caliber_extraction_uploads"  # sha256 -> archive uploaded on the Extraction page
UPLOADS_READ = "caliber_extraction_uploads_read"
WARNINGS = "caliber_extraction_warnings"
SURROGATE_TARGET = "caliber_surrogate_target"  # sha256 -> the Extraction slider's percent

RUN_KIND = "extraction-run:"
LAST_KIND, LAST_KEY = "extraction-last", "last"
UPLOAD_KIND = "extraction-upload"
UPLOAD_NAME_KIND = "extraction-upload-name"  # the file name it was uploaded under, by sha256
# The Extraction page's choices (its widgets offer these; a stored choice outside them is not restored).
RETENTION_CHOICES = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)
ATTACKS = ("all", "fixed", "tuned")
MAX_SEEDS = 6
WIDGETS = ("extraction_model", "extraction_retention", "extraction_seeds", "extraction_attack",
           "extraction_retune")
_SAME = 1e-9  # surrogate targets are percents with at most a few decimals


def _state(key: str, empty):
    return st.session_state.setdefault(key, empty())


def _warn(text: str) -> None:
    messages = _state(WARNINGS, list)
    if text not in messages:
        messages.append(text)


def warnings() -> list[str]:
    """What reading or writing stored runs skipped since the last call (shown once)."""
    return st.session_state.pop(WARNINGS, [])


# ------------------------------------------------------------------------------ archives


def archives() -> dict[str, ExtractionArchive]:
    """The files that carry inputs: the demo set, then this workspace's uploads, by sha256."""
    out = dict(view.demo_archives())
    uploads = _state(UPLOADS, dict)
    if not st.session_state.get(UPLOADS_READ):
        st.session_state[UPLOADS_READ] = True
        stored, bad = workspace.load_results(UPLOAD_KIND)
        names, _ = workspace.load_results(UPLOAD_NAME_KIND)
        for sha, content in stored.items():
            # The name it was uploaded under (a reload keeps it); an archive stored without one gets its digest.
            name = names.get(sha)
            name = name if isinstance(name, str) and name else f"upload-{sha[:8]}.npz"
            try:
                archive = view.archive_from_upload(content, name)
            except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
                _warn(f"Skipped a stored extraction archive ({sha[:8]}…): {upload_boundary.message(exc)}")
                continue
            if archive.sha256 != sha:
                _warn(f"Skipped a stored extraction archive ({sha[:8]}…): its bytes do not match their digest.")
                continue
            uploads.setdefault(sha, archive)
        for sha in bad:
            _warn(f"Skipped an unreadable stored extraction archive ({sha[:8]}…).")
    out.update(uploads)
    return out


def keep_upload(archive: ExtractionArchive, content: bytes) -> None:
    """Add an uploaded archive to the session and, once, to the workspace (a cap refusal warns)."""
    uploads = _state(UPLOADS, dict)
    if archive.sha256 in uploads:
        return
    uploads[archive.sha256] = archive
    try:
        workspace.save_result(UPLOAD_KIND, archive.sha256, bytes(content))
        workspace.save_result(UPLOAD_NAME_KIND, archive.sha256, str(archive.source))
    except (*workspace.STORE_ERRORS, ValueError) as exc:
        _warn(f"{archive.name} is kept for this browser session only: {exc}")


# ------------------------------------------------------------------------------ runs


def _read_stored(archive: ExtractionArchive) -> None:
    """Load this workspace's runs of one file into the session, once per session."""
    read = _state(READ, set)
    if archive.sha256 in read:
        return
    read.add(archive.sha256)
    stored, bad = workspace.load_results(RUN_KIND + archive.sha256)
    runs = _state(RUNS, dict)
    for key, payload in stored.items():
        try:
            if not isinstance(payload, dict):
                raise codec.StoredRunError("not a stored run")
            saved_at = payload.get("saved_at")
            if not (isinstance(saved_at, (int, float)) and math.isfinite(saved_at)):
                raise codec.StoredRunError("it has no time of saving")
            result = codec.decode_result(payload.get("run"), archive)
            if codec.run_key(archive.sha256, result.settings) != key:
                raise codec.StoredRunError("its settings do not match its key")
        except codec.StoredRunError as exc:
            _warn(f"Skipped a stored extraction run of {archive.name}: {exc}")
            continue
        runs.setdefault(key, (float(saved_at), result))
    for _ in bad:
        _warn(f"Skipped an unreadable stored extraction run of {archive.name}.")


def find(archive: ExtractionArchive, settings: ExtractionSettings) -> ExtractionResult | None:
    """The finished run of ``settings`` on ``archive`` from this session or its workspace, else None."""
    _read_stored(archive)
    found = _state(RUNS, dict).get(codec.run_key(archive.sha256, settings))
    return None if found is None else found[1]


def keep(result: ExtractionResult, *, as_last: bool = True) -> None:
    """Keep a finished run in the session and, once, in the workspace.

    ``as_last`` also records it as the Extraction page's last run (file and
    settings). A cap refusal or a store error warns; the run stays in the session.
    """
    archive = result.archive
    key = codec.run_key(archive.sha256, result.settings)
    _read_stored(archive)
    runs = _state(RUNS, dict)
    known = key in runs  # read from the workspace, or kept before in this session
    saved_at = runs[key][0] if known else time.time()
    runs[key] = (saved_at, result)
    saved = _state(SAVED, set)
    if key in saved:
        return
    saved.add(key)
    try:
        if not known:
            workspace.save_result(RUN_KIND + archive.sha256, key,
                                  {"saved_at": saved_at, "run": codec.encode_result(result)})
        if as_last:
            workspace.save_result(LAST_KIND, LAST_KEY, {"sha256": archive.sha256, "saved_at": saved_at,
                                                        "settings": codec.encode_settings(result.settings)})
    except (*workspace.STORE_ERRORS, ValueError, TypeError) as exc:
        _warn(f"This extraction run is kept for this browser session only: {exc}")


def saved_at(result: ExtractionResult) -> float | None:
    """When the run was first kept (seconds since the epoch), or None."""
    found = _state(RUNS, dict).get(codec.run_key(result.archive.sha256, result.settings))
    return None if found is None else found[0]


def latest(archive: ExtractionArchive) -> ExtractionResult | None:
    """The most recent finished run of this file (session or workspace), or None."""
    _read_stored(archive)
    mine = [v for k, v in _state(RUNS, dict).items() if k.startswith(archive.sha256 + ".")]
    return max(mine, key=lambda v: v[0])[1] if mine else None


def with_surrogate(archive: ExtractionArchive, requested: float) -> tuple[ExtractionResult, Condition] | None:
    """The newest run of this file that searched the surrogate target ``requested``, with its row."""
    _read_stored(archive)
    mine = sorted((v for k, v in _state(RUNS, dict).items() if k.startswith(archive.sha256 + ".")),
                  key=lambda v: v[0], reverse=True)
    for _, result in mine:
        for c in result.targets:
            if c.kind == "surrogate-retention" and abs(c.requested - requested) < _SAME:
                return result, c
    return None


def search_settings(settings: ExtractionSettings, requested: float) -> ExtractionSettings:
    """``settings`` with the surrogate target ``requested`` added (what a search runs)."""
    from dataclasses import replace

    wanted = sorted(set(settings.surrogate_retention) | {float(requested)}, reverse=True)
    return replace(settings, surrogate_retention=tuple(wanted))


# ------------------------------------------------------------------------------ the page's choices


def seed_widgets(available: dict[str, ExtractionArchive]) -> None:
    """Set the Extraction page's widgets to its last run when they are drawn afresh.

    Only when none of them holds a value (a reload, a restart, a page switch),
    and only for a file that is still available.
    """
    ss = st.session_state
    if any(w in ss for w in WIDGETS):
        return
    last = workspace.load_result(LAST_KIND, LAST_KEY)
    if not isinstance(last, dict) or last.get("sha256") not in available:
        return
    try:
        s = codec.decode_settings(last.get("settings"))
    except codec.StoredRunError as exc:
        _warn(f"The Extraction page's last settings were skipped: {exc}")
        return
    if not (set(s.retention) <= set(RETENTION_CHOICES) and s.attack in ATTACKS and s.seeds <= MAX_SEEDS):
        return  # made with options the page does not offer
    ss["extraction_model"] = last["sha256"]
    ss["extraction_retention"] = list(s.retention)
    ss["extraction_seeds"] = int(s.seeds)
    ss["extraction_attack"] = s.attack
    ss["extraction_retune"] = s.averaging_attacker == "tuned"


def remember_surrogate_target(sha256: str, percent: float) -> None:
    _state(SURROGATE_TARGET, dict)[sha256] = float(percent)


def surrogate_target(sha256: str, default: float = 90.0) -> float:
    """The Extraction slider's last surrogate target for this file, in percent."""
    return float(_state(SURROGATE_TARGET, dict).get(sha256, default))
