"""The Streamlit side of the workspace: the ``?ws=`` token, restore, and a small API.

A session's first run reads ``?ws=`` from the URL. A token that names a stored
workspace opens it; none, or one the store does not know, opens a fresh
workspace with a new token (never an existing one, and nothing tells the two
cases apart). The token is then written back into the URL on every run (a page
switch drops query parameters), so a reload returns to the same workspace.
The token lives only in the URL and in this session's state: it is never
logged, and the store keeps only its hash.

Uploads are re-read through the same safe loader as a fresh upload
(:func:`caliber_core.loading.load_logits_bytes`); parsed models are cached per
process by content digest *and* file name (a name is part of what a workspace
owns, so two workspaces with the same bytes never see each other's names).

Pages persist their own long results with :func:`save_result` and
:func:`load_result` (JSON-able values or bytes, keyed by a kind and a key).
When the data directory cannot be used the dashboard still works, for the
browser session only, and says so (:func:`unavailable_reason`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass

import streamlit as st

from caliber_core.loading import LogitsData
from caliber_dashboard.common import upload_boundary as boundary

from . import settings
from .sqlite_store import SQLiteStore
from .store import CorruptEntry, Limits, UnknownWorkspace, UploadRecord, Usage, WorkspaceError

QUERY_PARAM = "ws"
TOKEN = "caliber_ws_token"
OPENED = "caliber_ws_opened"
UNAVAILABLE = "caliber_ws_unavailable"
PENDING = "caliber_ws_pending"  # the token is drawn but its workspace not stored yet (nothing kept so far)

# Errors a store may raise besides its own; all are caught and reported, never shown raw.
STORE_ERRORS = (WorkspaceError, OSError, sqlite3.Error)

_JSON, _BYTES = b"J", b"B"
_PARSED_CACHE_BYTES = 1 << 30  # parsed logits kept per process (float64 arrays)
_MAX_TOKEN_CHARS = 128


@st.cache_resource(max_entries=4, show_spinner=False)
def _store_for(data_dir: str, limits: Limits) -> SQLiteStore:
    store = SQLiteStore(data_dir, limits=limits)
    store.evict_expired()
    return store


def store() -> SQLiteStore:
    """The process's store for the configured data directory (raises on a bad setting)."""
    cfg = settings.from_environment()
    return _store_for(str(cfg.data_dir), cfg.limits)


def token() -> str | None:
    """This session's workspace token, or None when storage is unavailable."""
    return st.session_state.get(TOKEN)


def unavailable_reason() -> str | None:
    return st.session_state.get(UNAVAILABLE)


def open_session() -> bool:
    """Attach this session to its workspace; True on the run that opened it (restore then).

    Keeps ``?ws=`` in the URL on every run.
    """
    ss = st.session_state
    opened = False
    if not ss.get(OPENED):
        ss[OPENED] = opened = True
        try:
            st_store = store()
            asked = st.query_params.get(QUERY_PARAM)
            if not (_plausible(asked) and st_store.exists(asked)):
                asked = _pending_token()
            ss[TOKEN] = asked
        except (*STORE_ERRORS, ValueError) as exc:
            ss[UNAVAILABLE] = _one_line(exc)
    current = ss.get(TOKEN)
    if current is not None and st.query_params.get(QUERY_PARAM) != current:
        st.query_params[QUERY_PARAM] = current
    return opened


def start_new() -> None:
    """Point this session at a fresh, empty workspace (the old one stays, reachable by its URL)."""
    try:
        store()  # the setting must hold before a token is handed out
        st.session_state[TOKEN] = _pending_token()
    except (*STORE_ERRORS, ValueError) as exc:
        st.session_state.pop(TOKEN, None)
        st.session_state[UNAVAILABLE] = _one_line(exc)
        st.query_params.pop(QUERY_PARAM, None)
        return
    st.query_params[QUERY_PARAM] = st.session_state[TOKEN]


def delete_current() -> None:
    """Delete this session's workspace for good, then start a fresh one."""
    current = token()
    if current is not None and not _pending():
        store().delete(current)
    start_new()


def _pending_token() -> str:
    """A fresh token for this session, not stored yet: the workspace is created by its first write,
    so a visit that keeps nothing leaves nothing behind."""
    from .store import new_token

    st.session_state[PENDING] = True
    return new_token()


def _pending() -> bool:
    return bool(st.session_state.get(PENDING))


def _stored_token() -> str | None:
    """This session's token, its workspace created first if this is its first write."""
    current = token()
    if current is not None and _pending():
        store().create(current)
        st.session_state[PENDING] = False
    return current


def usage() -> Usage | None:
    current = token()
    if current is None:
        return None
    if _pending():
        return Usage(0, 0, store().limits)
    try:
        return store().usage(current)
    except STORE_ERRORS:
        return None


# -------------------------------------------------------------------- uploads


#: Result kind of the files read through the streamed engine (``caliber_dashboard.data.vocab_files``);
#: a stored upload among them is never parsed whole (see :func:`restore_uploads`).
STREAMED_KIND = "server_vocab_file"


def persist_upload(content: bytes, filename: str, *, labels_content: bytes | None = None,
                   labels_filename: str | None = None) -> bool:
    """Store an upload in the workspace; False when storage is unavailable.

    Raises CapExceeded (one line for the user) when a cap refuses it.
    """
    current = _stored_token()
    if current is None:
        return False
    store().put_upload(current, filename=filename, content=content,
                       labels_filename=labels_filename, labels_content=labels_content)
    return True


def remember_parsed(data: LogitsData, *, filename: str, labels_blob: str | None,
                    labels_filename: str | None) -> None:
    """Put a freshly uploaded model in the parse cache, so a reload need not re-read it."""
    _parsed().put((data.sha256, labels_blob, filename, labels_filename), data)


def forget_upload(model: str) -> None:
    current = token()
    if current is not None and not _pending():
        store().remove_upload(current, model)


@dataclass
class Restored:
    models: list[LogitsData]
    warnings: list[str]


def restore_uploads() -> Restored:
    """The workspace's models, in upload order; unreadable entries become warnings."""
    out = Restored([], [])
    current = token()
    if current is None:
        return out
    try:
        records = store().uploads(current)
    except UnknownWorkspace:  # deleted from elsewhere since this session opened it
        return out
    except STORE_ERRORS as exc:
        out.warnings.append(f"The workspace's file list could not be read ({_one_line(exc)}).")
        return out
    streamed = _streamed_uploads()
    for record in records:
        if record.model in streamed:  # a large vocabulary: the streamed engine reads its blob when asked
            continue
        try:
            out.models.append(_load_record(record))
        except Exception as exc:  # noqa: BLE001  (one line per stored file, never a traceback)
            out.warnings.append(f"Skipped stored file {record.filename}: {boundary.message(exc)}")
    return out


def _streamed_uploads() -> set[str]:
    stored, _ = load_results(STREAMED_KIND)
    return {key for key, entry in stored.items() if isinstance(entry, dict) and entry.get("blob")}


def _load_record(record: UploadRecord) -> LogitsData:
    key = (record.model, record.labels_blob, record.filename, record.labels_filename)
    cached = _parsed().get(key)
    if cached is not None:
        return cached
    if record.blob != record.model:  # an upload is keyed by its logits file's digest
        raise CorruptEntry("stored entry does not match its digest")
    st_store = store()
    content = st_store.read_blob(record.blob)
    labels = st_store.read_blob(record.labels_blob) if record.labels_blob else None
    # read_blob refused the bytes unless their sha256 is record.blob: hashed once, not twice
    data = boundary.load_logits(content, record.filename, labels_content=labels,
                                labels_filename=record.labels_filename if labels else None,
                                sha256=record.blob)
    _parsed().put(key, data)
    return data


class ModelCache:
    """Parsed models by a key, bounded by their arrays' bytes (least recently used out first).

    Shared by the workspace's parsed uploads and the data root's opened files.
    """

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, LogitsData] = OrderedDict()
        self._max = max_bytes

    @staticmethod
    def _size(data: LogitsData) -> int:
        return data.logits.nbytes + (data.labels.nbytes if data.labels is not None else 0)

    def get(self, key: tuple) -> LogitsData | None:
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: tuple, data: LogitsData) -> None:
        with self._lock:
            self._items[key] = data
            self._items.move_to_end(key)
            total = sum(self._size(d) for d in self._items.values())
            while total > self._max and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                total -= self._size(dropped)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@st.cache_resource(max_entries=1, show_spinner=False)
def _parsed() -> ModelCache:
    return ModelCache(_PARSED_CACHE_BYTES)


# -------------------------------------------------------------------- results


def save_result(kind: str, key: str, payload) -> bool:
    """Persist a result in this workspace; False when storage is unavailable.

    Parameters
    ----------
    kind, key : str
        What it is (e.g. ``"extraction"``) and which one (e.g. a digest of its inputs);
        1 to 200 characters each. Saving under an existing (kind, key) replaces it.
    payload : bytes or JSON-serializable
        Bytes are stored as they are; anything else as JSON (``allow_nan=False``).

    Raises
    ------
    CapExceeded
        The workspace or the store is full (one line to show the user).
    """
    current = _stored_token()
    if current is None:
        return False
    if isinstance(payload, (bytes, bytearray, memoryview)):
        encoded = _BYTES + bytes(payload)
    else:
        encoded = _JSON + json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    store().save_result(current, kind, key, encoded)
    return True


def load_result(kind: str, key: str, default=None):
    """A result saved with :func:`save_result`, or ``default`` (absent or unreadable)."""
    current = token()
    if current is None:
        return default
    try:
        raw = store().load_result(current, kind, key)
    except STORE_ERRORS:
        return default
    return default if raw is None else _decode(raw, default)


def load_results(kind: str) -> tuple[dict, list[str]]:
    """Every result of one kind by key, plus the keys whose payload was unreadable."""
    current = token()
    if current is None:
        return {}, []
    try:
        raw = store().results(current, kind)
    except STORE_ERRORS:
        return {}, []
    out, bad = {}, []
    for key, payload in raw.items():
        value = _decode(payload, _BAD)
        if value is _BAD:
            bad.append(key)
        else:
            out[key] = value
    return out, bad


def delete_result(kind: str, key: str) -> None:
    current = token()
    if current is not None and not _pending():
        store().delete_result(current, kind, key)


_BAD = object()


def _decode(raw: bytes, default):
    tag, body = raw[:1], raw[1:]
    if tag == _BYTES:
        return body
    if tag == _JSON:
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return default
    return default


# --------------------------------------------------------------------- helpers


def _plausible(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_TOKEN_CHARS


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
