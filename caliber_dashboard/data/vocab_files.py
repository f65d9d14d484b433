"""Large-vocabulary files from the data root: streamed once, calibrated from the reduction.

A next-token dump (2,000 x 32,000 float32 is 256 MB) read whole into the dense
engine costs the server four times the file and a minute of Monte Carlo. A file
under the data root (:mod:`.data_root`) whose matrix declares at least
``full_vocab.STREAM_MIN_CLASSES`` classes goes through the engine the command
line uses for it instead (``caliber calibrate`` on such a file):

* :func:`open_streamed` streams it once through a memory map
  (``vocab_stream.reduce_file``: the pages of each block are let go once read)
  into its reduction, a few dozen numbers a row, and checks its labels;
* :func:`calibrate` solves the targets on that reduction
  (``full_vocab.config_for_full_vocab``): each sigma with its certified bounds,
  and the bound curves the Calibrate page draws;
* the workspace keeps a :data:`KIND` record per file: its relative paths, its
  digest, the targets and side last chosen and their config, so Export and Policy
  read the config after a reload or a restart without touching the file again.
  The reduction is kept per process (:data:`_CACHE`); a new target on a record
  whose reduction is gone reopens the file through the same root checks.

Paths in messages are the relative ones: the root's own location never reaches a page.
This module holds no drawing; :mod:`.vocab_panel` draws the pages' parts.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import streamlit as st

from caliber_core.calibration.full_vocab import (STREAM_MIN_CLASSES, check_kept_size, config_for_full_vocab,
                                                 reduce_file, stream_labels)
from caliber_core.calibration.gap_histogram import ReducedRows
from caliber_core.calibration.pipeline import DEFAULT_TARGETS
from caliber_core.config import SIDES
from caliber_core.loading import LABELS_EXTENSIONS, LogitsFileError
from caliber_core.loading.row_stream import STREAM_EXTENSIONS, open_rows
from caliber_core.loading.safety import clean_name, display_name

from caliber_dashboard.common import names, state
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

from . import data_root, server_files
from .data_root import NotInRoot

#: Workspace result kind of a streamed file's record (a stored upload's names its blobs: :mod:`.vocab_uploads`).
KIND = workspace.STREAMED_KIND
#: Session key: (workspace token, {sha256: record}) in the order the files were opened.
MEMBERS = "caliber_vocab_files"
#: The targets a file opens with: the command line's defaults (agreement ones without labels).
DEFAULT_AGREEMENT = (("agreement", 0.9), ("agreement", 0.8))
_CACHE_ENTRIES = 6  # reductions kept per process (tens of MB each at 4,000 rows)


@dataclass(frozen=True)
class Streamed:
    """One file read through the streamed engine.

    Attributes
    ----------
    name : str
        The model's name (the file's stem).
    path, labels : str or None
        Paths relative to the root (``labels`` None when the file carries its own or none).
    sha256 : str
        The logits file's digest (as ``caliber calibrate`` records it).
    reduced : ReducedRows
        The whole file, reduced.
    blobs : tuple of (str, str or None), optional
        A stored upload's digests in the workspace (its logits, its labels file); None for a file under the root.
    """

    name: str
    path: str
    labels: str | None
    sha256: str
    reduced: ReducedRows
    blobs: tuple[str, str | None] | None = None

    @property
    def has_labels(self) -> bool:
        return self.reduced.has_labels


def streams(root: Path, relative: str) -> bool:
    """Whether ``relative`` names a matrix of at least ``STREAM_MIN_CLASSES`` classes (header only).

    Raises
    ------
    NotInRoot
        The path cannot be opened from the root (the one refusal).
    """
    if PurePosixPath(relative).suffix.lower() not in STREAM_EXTENSIONS:
        return False
    real = data_root.resolve(root, relative)
    try:
        return open_rows(real).n_classes >= STREAM_MIN_CLASSES
    except LogitsFileError:
        return False  # the ordinary reader gives its message


class _Cache:
    """Reductions by the files' identity on disk (real path, size, mtime, inode), least recently used out."""

    def __init__(self, entries: int) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, Streamed] = OrderedDict()
        self._entries = entries

    def get(self, key: tuple) -> Streamed | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple, value: Streamed) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._entries:
                self._items.popitem(last=False)


_CACHE = _Cache(_CACHE_ENTRIES)


def _relative_message(exc: BaseException, real: Path, relative: str) -> str:
    """The core's one line with the file's real location replaced by its path relative to the root."""
    return server_files.one_line(exc).replace(display_name(str(real)), display_name(relative))


def open_streamed(root: Path, path: str, labels_path: str | None = None, *,
                  max_elements: int | None = None,
                  progress: Callable[[float], None] | None = None) -> Streamed:
    """Stream a file under the root once and reduce it (with its labels), or take the process's reduction.

    Parameters
    ----------
    root : Path
        The resolved data root.
    path, labels_path : str
        Paths relative to the root.
    max_elements : int, optional
        The most numbers the reduction may hold (the dashboard's budget by default).
    progress : callable, optional
        Called with the fraction of rows read.

    Returns
    -------
    Streamed

    Raises
    ------
    NotInRoot
        A path that cannot be opened from the root (one message for every reason).
    LogitsFileError
        The file opened but is not a valid matrix or its labels do not fit (paths relative).
    """
    limit = _limit(max_elements)
    key = server_files.cache_key(root, path, labels_path) + (limit,)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    labels_real = None
    if labels_path is not None:
        labels_real = data_root.resolve(root, labels_path, extensions=LABELS_EXTENSIONS)
    # Opened (and checked after the read) through the root's rules; the core reads the real path.
    with server_files.checked(root, path, STREAM_EXTENSIONS) as (_, real):
        return reduce_once(real, path, labels_real, labels_path, key=key, max_elements=limit, progress=progress)


def _limit(max_elements: int | None) -> int:
    from caliber_dashboard.common import upload_boundary

    return upload_boundary.max_elements() if max_elements is None else max_elements


def reduce_once(real: Path, shown: str, labels_real: Path | None, labels_shown: str | None, *, key: tuple,
                max_elements: int | None = None, progress: Callable[[float], None] | None = None,
                labels_blob: str | None = None, stored: bool = False) -> Streamed:
    """The streamed engine on one file the server may read: reduce it with its labels, keep it under ``key``.

    The one engine for files from the data root (:func:`open_streamed`) and stored uploads
    (:mod:`.vocab_uploads`). ``shown`` and ``labels_shown`` are the names messages and records
    carry instead of the real paths; ``stored`` marks an upload kept in the workspace (its
    blobs: the file's digest and ``labels_blob``).

    Raises
    ------
    LogitsFileError
        Not a valid matrix, a reduction over ``max_elements``, or labels that do not fit.
    """
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    limit = _limit(max_elements)
    try:
        source = open_rows(real)
        check_kept_size(source, max_elements=limit)  # from the header, before anything is read
        labels = stream_labels(source, labels_real, max_elements=limit)
        reduced, _, sha = reduce_file(real, max_elements=limit, progress=progress, labels=labels, source=source)
    except LogitsFileError as exc:
        message = _relative_message(exc, real, shown)
        if labels_real is not None:
            message = message.replace(display_name(str(labels_real)), display_name(labels_shown))
        raise LogitsFileError(message) from None
    stem = PurePosixPath(shown).name.rsplit(".", 1)[0]
    found = Streamed(clean_name(stem) or "logits", shown, labels_shown, sha, reduced,
                     (sha, labels_blob) if stored else None)
    _CACHE.put(key, found)
    return found


def default_targets(has_labels: bool) -> list[tuple[str, float]]:
    """The targets a file opens with (``caliber calibrate``'s defaults; agreement ones without labels)."""
    return [tuple(t) for t in (DEFAULT_TARGETS if has_labels else DEFAULT_AGREEMENT)]


def calibrate(streamed: Streamed, targets: Sequence[tuple[str, float]], *, side: str = "point") -> dict:
    """The config of ``targets`` on the reduction (``config_for_full_vocab``), as ``caliber calibrate`` writes it.

    Raises
    ------
    ValueError
        No target, an unknown side, an accuracy or retention target without labels, an unreachable one.
    """
    if not targets:
        raise ValueError("enter at least one target")
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    _, config = config_for_full_vocab(streamed.reduced, [(k, float(v)) for k, v in targets], name=streamed.name,
                                      side=side, sha256=streamed.sha256, source=streamed.path)
    return config


# ------------------------------------------------------------ workspace members


def _valid(entry) -> bool:
    config = entry.get("config") if isinstance(entry, dict) else None
    return (isinstance(config, dict) and isinstance(config.get("targets"), list) and bool(config["targets"])
            and isinstance(config.get("bounds"), dict) and isinstance(entry.get("path"), str)
            and (entry.get("labels") is None or isinstance(entry.get("labels"), str))
            and entry.get("side") in SIDES and isinstance(entry.get("targets"), list))


def members() -> dict[str, dict]:
    """The workspace's streamed files by digest, oldest first (read once per workspace)."""
    ss = st.session_state
    token = workspace.token()
    held = ss.get(MEMBERS)
    if isinstance(held, tuple) and held[0] == token:
        return held[1]
    stored, bad = workspace.load_results(KIND)
    found = {k: v for k, v in stored.items() if _valid(v)}
    for key in bad + [k for k in stored if k not in found]:
        state.add_warning(f"Skipped an unreadable record of a streamed server file ({key[:8]}).")
    ordered = dict(sorted(found.items(), key=lambda kv: (kv[1].get("saved", 0), kv[0])))
    ss[MEMBERS] = (token, ordered)
    return ordered


def entry_for(streamed: Streamed, targets, side: str, config: dict) -> dict:
    """The record of a streamed file: paths, digest, shape, the choice and its config."""
    return {"path": streamed.path, "labels": streamed.labels, "sha256": streamed.sha256, "name": streamed.name,
            "n_rows": streamed.reduced.n_rows, "n_classes": streamed.reduced.n_classes,
            "has_labels": streamed.has_labels, "targets": [[k, float(v)] for k, v in targets], "side": side,
            "config": config, "saved": time.time()} | (
                {} if streamed.blobs is None else {"blob": streamed.blobs[0], "labels_blob": streamed.blobs[1]})


def keep(entry: dict) -> str | None:
    """Record a streamed file (or its new choice) in the session and the workspace; a warning line or None."""
    held = members()
    key = entry["sha256"]
    held.pop(key, None)
    held[key] = entry
    try:
        kept = workspace.save_result(KIND, key, entry)
    except (CapExceeded, *workspace.STORE_ERRORS, ValueError) as exc:
        return f"{entry['path']} is kept for this browser session only: the workspace refused its record ({exc})."
    return None if kept else f"{entry['path']} is kept for this browser session only: storage is unavailable."


def remove(key: str) -> None:
    """Forget one streamed file (session and workspace); a file under the data root is untouched, an
    upload's stored bytes go."""
    entry = members().pop(key, None)
    try:
        workspace.delete_result(KIND, key)
        if entry is not None and entry.get("blob"):
            workspace.forget_upload(key)
    except workspace.STORE_ERRORS as exc:
        state.add_warning(f"Could not remove the streamed file's record from the workspace: {exc}")


def upload_key(blob: str, labels_blob: str | None) -> tuple:
    """The reduction cache's key of a stored upload: its bytes' digests (the content is the identity)."""
    return ("upload", blob, labels_blob, _limit(None))


@contextlib.contextmanager
def _named(blob: Path, filename: str):
    """A stored blob under a temporary name ending like ``filename`` (the readers go by the extension): a link."""
    with tempfile.TemporaryDirectory(prefix="caliber_blob_") as folder:
        link = Path(folder) / f"{blob.name}{PurePosixPath(filename).suffix.lower()}"
        os.symlink(blob, link)
        yield link


def _reopen_upload(entry: dict, progress) -> Streamed:
    key = upload_key(entry["blob"], entry.get("labels_blob"))
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    try:
        blobs = workspace.store().blobs
        with contextlib.ExitStack() as stack:
            real = stack.enter_context(_named(blobs.path(entry["blob"]), entry["path"]))
            labels_real = (None if not entry.get("labels_blob") else
                           stack.enter_context(_named(blobs.path(entry["labels_blob"]), entry.get("labels") or "")))
            return reduce_once(real, entry["path"], labels_real, entry.get("labels"), key=key, progress=progress,
                               labels_blob=entry.get("labels_blob"), stored=True)
    except workspace.STORE_ERRORS as exc:
        raise ValueError(f"{display_name(entry['path'])}: the workspace's stored copy cannot be read ({exc})") from None


def reopen(entry: dict, *, progress: Callable[[float], None] | None = None) -> Streamed:
    """The reduction behind a record (the process's, or the file streamed again: a stored upload from
    the workspace, a file under the data root through the root's checks).

    Raises
    ------
    NotInRoot, LogitsFileError
        As :func:`open_streamed`; ValueError when no data root is set now, or the file changed.
    """
    if entry.get("blob"):
        streamed = _reopen_upload(entry, progress)
        if streamed.sha256 != entry["blob"]:
            raise ValueError(f"{display_name(entry['path'])}: the workspace's stored copy is damaged")
        return streamed
    root = data_root.configured_root()
    if root is None:
        raise ValueError(f"{display_name(entry['path'])}: no data root is set on this server "
                         f"({data_root.DATA_ROOT_ENV})")
    streamed = open_streamed(root, entry["path"], entry.get("labels"), progress=progress)
    if streamed.sha256 != entry["sha256"]:
        raise ValueError(f"{display_name(entry['path'])} changed on disk since it was calibrated: "
                         "open it again on the Data page")
    return streamed


def progress_text(name: str) -> str:
    """The progress bar's line while a file goes through the streamed engine (its rows read once, then its
    default targets solved); the name shows verbatim (the bar's text is Markdown)."""
    return f"Streaming {names.markdown_text(name)}: reading its rows once, then solving its default targets…"


def open_member(path: str, labels: str | None, *,
                progress: Callable[[float], None] | None = None) -> list[tuple[str, str]]:
    """Open a large file from the root, calibrate its default targets and keep it; the Data page's messages."""
    try:
        root = data_root.configured_root()
        if root is None:
            return [("error", "No data root is set on this server.")]
        started = time.perf_counter()
        streamed = open_streamed(root, path, labels, progress=progress)
        targets = default_targets(streamed.has_labels)
        config = calibrate(streamed, targets)
    except (NotInRoot, LogitsFileError, ValueError, OSError) as exc:
        return [("error", server_files.one_line(exc))]
    seconds = time.perf_counter() - started
    note = keep(entry_for(streamed, targets, "point", config))
    r = streamed.reduced
    labels_from = "" if streamed.labels is None else f" (labels from {streamed.labels})"
    what = "with labels" if streamed.has_labels else "without labels: agreement targets only"
    out = [("success", f"Streamed {streamed.path}{labels_from}: N={r.n_rows:,} K={r.n_classes:,}, {what}; "
                       f"reduced once in place (top {r.top_gaps.shape[1]} gaps exact, the rest binned) and "
                       f"calibrated in {seconds:.1f} s. See it on Calibrate, Export and Policy.")]
    return out + ([("warning", note)] if note else [])


def shape_text(entry: dict) -> str:
    """A record's shape as the pages name it: "N x K"."""
    return f"{entry['n_rows']:,} x {entry['n_classes']:,}"
