"""The embedded workspace store: SQLite metadata plus content-addressed blob files.

Layout under the data directory (created ``0700``, files ``0600``)::

    workspaces.sqlite3       workspaces, blobs, uploads, results (WAL journal)
    blobs/ab/abcdef...       one file per distinct upload, named by its sha256

Why blob files and not SQLite BLOBs: an upload can be ~200 MB. In SQLite it
would be written twice (WAL, then checkpoint), read back as one more full
copy, and its pages would stay in the database file after a delete until a
``VACUUM`` rewrote everything. A file is written once, read once, and deleted
for real. Content addressing makes each file immutable: a file only ever
appears under its final name complete (written to a temporary name, fsynced,
then ``os.replace``-d), and every read checks the bytes against the name, so a
damaged or missing file is reported (:class:`CorruptEntry`) and skipped by the
caller, never served. The files themselves are handled by :mod:`.blob_files`.

Atomicity: an upload takes SQLite's write lock (``BEGIN IMMEDIATE``), checks
the caps, writes the blob files, inserts the rows and commits. A crash before
the commit leaves the previous rows untouched; the only trace is a temporary or
unreferenced file, removed by :meth:`SQLiteStore.recover` once older than
``stale_s``. Deleting blobs renames them to ``*.del`` before the commit and
unlinks them after it; a crash in between is undone by ``recover`` (a ``.del``
file whose row survived is renamed back). Every method opens its own
connection, so one store object serves every session thread, and several
processes may share a data directory.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .blob_files import BlobFiles
from .store import (CapExceeded, Limits, UnknownWorkspace, UploadRecord, Usage,
                    blob_digest, new_token, workspace_id)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY, created REAL NOT NULL, last_used REAL NOT NULL);
CREATE INDEX IF NOT EXISTS workspaces_lru ON workspaces(last_used);
CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS uploads (
    workspace TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    model TEXT NOT NULL, seq INTEGER NOT NULL, filename TEXT NOT NULL,
    blob TEXT NOT NULL REFERENCES blobs(digest),
    labels_filename TEXT, labels_blob TEXT REFERENCES blobs(digest),
    added REAL NOT NULL, PRIMARY KEY (workspace, model));
CREATE INDEX IF NOT EXISTS uploads_blob ON uploads(blob);
CREATE INDEX IF NOT EXISTS uploads_labels_blob ON uploads(labels_blob);
CREATE TABLE IF NOT EXISTS results (
    workspace TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    kind TEXT NOT NULL, key TEXT NOT NULL, payload BLOB NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (workspace, kind, key));
"""
_NAME_LIMIT = 200  # characters in a result kind or key


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class SQLiteStore:
    """A :class:`~caliber_dashboard.workspace.store.WorkspaceStore` in one data directory.

    Parameters
    ----------
    root : str or os.PathLike
        The data directory (created if missing).
    limits : Limits, default Limits()
        Size caps and ages.
    clock : callable, default time.time
        Seconds since the epoch; tests pass a fake one.
    stale_s : float, default 3600
        Age after which a temporary or unreferenced blob file is garbage (an
        upload in progress in another process is younger than this).
    """

    def __init__(self, root, *, limits: Limits = Limits(), clock: Callable[[], float] = time.time,
                 stale_s: float = 3600.0) -> None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        if not stale_s >= 0:
            raise ValueError(f"stale_s must be >= 0 seconds, got {stale_s!r}")
        self.root = Path(root)
        self.limits = limits
        self._clock = clock
        self._stale_s = float(stale_s)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.blobs = BlobFiles(self.root / "blobs")
        self._db = self.root / "workspaces.sqlite3"
        with contextlib.closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        self.recover()

    # ---------------------------------------------------------------- plumbing

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._db, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, list[str]]]:
        """A write transaction; yields (connection, blobs that may have become unreferenced)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            candidates: list[str] = []
            try:
                yield conn, candidates
                trashed = self._trash_unreferenced(conn, candidates)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                for path in trashed:  # the rows survive: so must their files
                    self.blobs.untrash(path)
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            for path in trashed:
                self.blobs.discard(path)
        finally:
            conn.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with contextlib.closing(self._connect()) as conn:
            yield conn

    def _workspace(self, conn: sqlite3.Connection, token: str) -> str:
        wid = workspace_id(token)
        if conn.execute("SELECT 1 FROM workspaces WHERE id=?", (wid,)).fetchone() is None:
            raise UnknownWorkspace("no such workspace")
        return wid

    def _touch(self, conn: sqlite3.Connection, wid: str) -> None:
        conn.execute("UPDATE workspaces SET last_used=? WHERE id=?", (self._clock(), wid))

    def _trash_unreferenced(self, conn: sqlite3.Connection, candidates: list[str]) -> list[Path]:
        """Delete blob rows nothing references; rename their files to ``*.del``."""
        trashed: list[Path] = []
        try:
            for digest in dict.fromkeys(d for d in candidates if d):
                used = conn.execute("SELECT 1 FROM uploads WHERE blob=? OR labels_blob=? LIMIT 1",
                                    (digest, digest)).fetchone()
                if used is not None:
                    continue
                conn.execute("DELETE FROM blobs WHERE digest=?", (digest,))
                trash = self.blobs.trash(digest)
                if trash is not None:
                    trashed.append(trash)
        except BaseException:
            for trash in trashed:
                self.blobs.untrash(trash)
            raise
        return trashed

    def _blobs_of(self, conn: sqlite3.Connection, wid: str) -> list[str]:
        rows = conn.execute("SELECT blob, labels_blob FROM uploads WHERE workspace=?", (wid,))
        return [d for row in rows for d in row if d]

    def _delete_workspace(self, conn: sqlite3.Connection, wid: str, candidates: list[str]) -> None:
        candidates.extend(self._blobs_of(conn, wid))
        conn.execute("DELETE FROM workspaces WHERE id=?", (wid,))  # cascades to its rows

    def _workspace_bytes(self, conn: sqlite3.Connection, wid: str) -> int:
        blobs = conn.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blobs WHERE digest IN "
            "(SELECT blob FROM uploads WHERE workspace=?1 "
            " UNION SELECT labels_blob FROM uploads WHERE workspace=?1)", (wid,)).fetchone()[0]
        results = conn.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM results "
                               "WHERE workspace=?", (wid,)).fetchone()[0]
        return int(blobs) + int(results)

    def _total_bytes(self, conn: sqlite3.Connection) -> int:
        blobs = conn.execute("SELECT COALESCE(SUM(size), 0) FROM blobs").fetchone()[0]
        results = conn.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM results").fetchone()[0]
        return int(blobs) + int(results)

    def _make_room(self, conn, wid: str, extra: int, candidates: list[str], *,
                   keep: frozenset[str] = frozenset()) -> None:
        """Evict idle workspaces (least recently used first) until ``extra`` bytes fit.

        ``keep``: digests the caller is about to reference (not freed by an eviction).
        """
        cap = self.limits.total_bytes
        if self._total_bytes(conn) + extra <= cap:
            return
        cutoff = self._clock() - self.limits.evictable_idle_s
        idle = [r[0] for r in conn.execute(
            "SELECT id FROM workspaces WHERE last_used<=? AND id<>? ORDER BY last_used, id",
            (cutoff, wid))]
        for victim in idle:
            self._delete_workspace(conn, victim, candidates)
            # Bytes still held once the blobs only the evicted workspaces held are gone.
            held = self._total_bytes(conn) - self._unreferenced_bytes(conn, candidates, keep)
            if held + extra <= cap:
                return
        held = self._total_bytes(conn) - self._unreferenced_bytes(conn, candidates, keep)
        raise CapExceeded(
            f"Refused: the server's storage would hold {_mb(held + extra)}, over its overall "
            f"cap of {_mb(cap)}, and no idle workspace is left to evict. Try again later.")

    @staticmethod
    def _unreferenced_bytes(conn, candidates: list[str], keep: frozenset[str]) -> int:
        total = 0
        for digest in dict.fromkeys(d for d in candidates if d and d not in keep):
            row = conn.execute(
                "SELECT size FROM blobs WHERE digest=? AND NOT EXISTS "
                "(SELECT 1 FROM uploads WHERE blob=?1 OR labels_blob=?1)", (digest,)).fetchone()
            total += int(row[0]) if row else 0
        return total

    # ------------------------------------------------------------- workspaces

    def create(self, token: str | None = None) -> str:
        token = new_token() if token is None else token
        if not isinstance(token, str) or len(token) < 32:
            raise ValueError("a workspace token must be a string drawn by new_token()")
        now = self._clock()
        with self._write() as (conn, _):
            conn.execute("INSERT OR IGNORE INTO workspaces(id, created, last_used) VALUES (?, ?, ?)",
                         (workspace_id(token), now, now))
        return token

    def exists(self, token: str) -> bool:
        if not isinstance(token, str) or not token:
            return False
        with self._write() as (conn, _):
            try:
                wid = self._workspace(conn, token)
            except UnknownWorkspace:
                return False
            self._touch(conn, wid)
        return True

    def delete(self, token: str) -> None:
        with self._write() as (conn, candidates):
            self._delete_workspace(conn, workspace_id(token), candidates)

    def evict_expired(self, *, now: float | None = None) -> int:
        cutoff = (self._clock() if now is None else now) - self.limits.max_idle_s
        with self._write() as (conn, candidates):
            old = [r[0] for r in conn.execute(
                "SELECT id FROM workspaces WHERE last_used<? ORDER BY last_used, id", (cutoff,))]
            for wid in old:
                self._delete_workspace(conn, wid, candidates)
        return len(old)

    def usage(self, token: str) -> Usage:
        with self._read() as conn:
            wid = self._workspace(conn, token)
            return Usage(self._workspace_bytes(conn, wid), self._total_bytes(conn), self.limits)

    # ----------------------------------------------------------------- uploads

    def put_upload(self, token: str, *, filename: str, content: bytes,
                   labels_filename: str | None = None, labels_content: bytes | None = None) -> str:
        if not isinstance(content, (bytes, bytearray, memoryview)) or len(content) == 0:
            raise ValueError("content must be non-empty bytes")
        if (labels_content is None) != (labels_filename is None):
            raise ValueError("labels_content and labels_filename must be given together")
        if not isinstance(filename, str) or not filename:
            raise ValueError(f"filename must be a non-empty string, got {filename!r}")
        files = {blob_digest(content): bytes(content)}
        model = next(iter(files))
        labels = None
        if labels_content is not None:
            labels = blob_digest(labels_content)
            files.setdefault(labels, bytes(labels_content))
        with self._write() as (conn, candidates):
            wid = self._workspace(conn, token)
            held = set(self._blobs_of(conn, wid))
            extra_ws = sum(len(b) for d, b in files.items() if d not in held)
            ws_bytes = self._workspace_bytes(conn, wid)
            if ws_bytes + extra_ws > self.limits.workspace_bytes:
                raise CapExceeded(
                    f"Refused {filename}: this workspace would hold {_mb(ws_bytes + extra_ws)}, "
                    f"over its cap of {_mb(self.limits.workspace_bytes)}. Remove models to make room.")
            known = {d for d in files if conn.execute(
                "SELECT 1 FROM blobs WHERE digest=?", (d,)).fetchone()}
            self._make_room(conn, wid, sum(len(b) for d, b in files.items() if d not in known),
                            candidates, keep=frozenset(files))
            for digest, data in files.items():
                if not self.blobs.has(digest, len(data)):  # new, or a damaged copy to repair
                    self.blobs.write(digest, data)
                conn.execute("INSERT OR IGNORE INTO blobs(digest, size) VALUES (?, ?)",
                             (digest, len(data)))
            old = conn.execute("SELECT seq, labels_blob FROM uploads WHERE workspace=? AND model=?",
                               (wid, model)).fetchone()
            if old is not None:
                seq = old[0]
                candidates.append(old[1])
            else:
                seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM uploads WHERE workspace=?",
                                   (wid,)).fetchone()[0]
            conn.execute(
                "INSERT OR REPLACE INTO uploads(workspace, model, seq, filename, blob, "
                "labels_filename, labels_blob, added) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (wid, model, seq, filename, model, labels_filename, labels, self._clock()))
            self._touch(conn, wid)
        return model

    def uploads(self, token: str) -> list[UploadRecord]:
        with self._read() as conn:
            wid = self._workspace(conn, token)
            rows = conn.execute(
                "SELECT u.model, u.filename, u.blob, b.size, u.labels_filename, u.labels_blob, "
                "l.size, u.added, u.seq FROM uploads u JOIN blobs b ON b.digest=u.blob "
                "LEFT JOIN blobs l ON l.digest=u.labels_blob WHERE u.workspace=? ORDER BY u.seq",
                (wid,)).fetchall()
        return [UploadRecord(*row) for row in rows]

    def remove_upload(self, token: str, model: str) -> None:
        with self._write() as (conn, candidates):
            wid = self._workspace(conn, token)
            row = conn.execute("SELECT blob, labels_blob FROM uploads WHERE workspace=? AND model=?",
                               (wid, model)).fetchone()
            if row is not None:
                candidates.extend(row)
                conn.execute("DELETE FROM uploads WHERE workspace=? AND model=?", (wid, model))
                self._touch(conn, wid)

    def read_blob(self, digest: str) -> bytes:
        return self.blobs.read(digest)

    # ----------------------------------------------------------------- results

    @staticmethod
    def _check_names(kind: str, key: str) -> None:
        for what, value in (("kind", kind), ("key", key)):
            if not isinstance(value, str) or not 0 < len(value) <= _NAME_LIMIT:
                raise ValueError(f"a result {what} must be a string of 1 to {_NAME_LIMIT} "
                                 f"characters, got {value!r}")

    def save_result(self, token: str, kind: str, key: str, payload: bytes) -> None:
        self._check_names(kind, key)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        with self._write() as (conn, candidates):
            wid = self._workspace(conn, token)
            old = conn.execute("SELECT LENGTH(payload) FROM results WHERE workspace=? AND kind=? "
                               "AND key=?", (wid, kind, key)).fetchone()
            extra = len(payload) - (int(old[0]) if old else 0)
            ws_bytes = self._workspace_bytes(conn, wid)
            if extra > 0 and ws_bytes + extra > self.limits.workspace_bytes:
                raise CapExceeded(
                    f"Not saved: this workspace would hold {_mb(ws_bytes + extra)}, over its cap "
                    f"of {_mb(self.limits.workspace_bytes)}. Remove models to make room.")
            if extra > 0:
                self._make_room(conn, wid, extra, candidates)
            conn.execute("INSERT OR REPLACE INTO results(workspace, kind, key, payload, updated) "
                         "VALUES (?, ?, ?, ?, ?)", (wid, kind, key, payload, self._clock()))
            self._touch(conn, wid)

    def load_result(self, token: str, kind: str, key: str) -> bytes | None:
        self._check_names(kind, key)
        with self._read() as conn:
            wid = self._workspace(conn, token)
            row = conn.execute("SELECT payload FROM results WHERE workspace=? AND kind=? AND key=?",
                               (wid, kind, key)).fetchone()
        return None if row is None else bytes(row[0])

    def results(self, token: str, kind: str) -> dict[str, bytes]:
        self._check_names(kind, "-")
        with self._read() as conn:
            wid = self._workspace(conn, token)
            rows = conn.execute("SELECT key, payload FROM results WHERE workspace=? AND kind=? "
                                "ORDER BY updated", (wid, kind)).fetchall()
        return {key: bytes(payload) for key, payload in rows}

    def delete_result(self, token: str, kind: str, key: str) -> None:
        self._check_names(kind, key)
        with self._write() as (conn, _):
            wid = self._workspace(conn, token)
            conn.execute("DELETE FROM results WHERE workspace=? AND kind=? AND key=?",
                         (wid, kind, key))

    # ---------------------------------------------------------------- recovery

    def recover(self) -> dict[str, int]:
        """Undo what a crash left: restore trashed blobs still referenced, remove garbage.

        Returns counts: ``restored`` (.del files renamed back), ``removed``
        (stale temporary, trashed or unreferenced files deleted).
        """
        with self._write() as (conn, _):  # holds the write lock: no upload commits meanwhile
            known = {r[0] for r in conn.execute("SELECT digest FROM blobs")}
            return self.blobs.sweep(known, stale_s=self._stale_s)
