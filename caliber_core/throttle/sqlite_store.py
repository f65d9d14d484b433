"""The embedded ledger store, ``sqlite:///PATH``: safe for several processes on one machine.

* WAL journal, so readers never block the writer and a killed process leaves
  a readable file (SQLite rolls an unfinished transaction back on next open).
* Every request is one ``BEGIN IMMEDIATE`` transaction: it takes the write
  lock *before* reading the account, so two processes never both read the
  same count and both escalate (no lost increment, no double escalation).
* ``synchronous=NORMAL``: a committed request survives a killed process;
  only an operating-system crash or power cut can lose the last few commits.
* Writers also queue on an advisory ``flock`` of ``PATH.lock`` (see ``_write``).
* A connection per process (opened lazily after a fork) and per thread.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading

from .ledger import AccountState, Event, advance, expired
from .store_errors import StoreUnavailable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    account TEXT PRIMARY KEY, flagged INTEGER NOT NULL, level INTEGER NOT NULL, reason TEXT NOT NULL,
    flagged_at REAL, at_level INTEGER NOT NULL, first_seen REAL, last_seen REAL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counts (
    account TEXT NOT NULL, level INTEGER NOT NULL, queries INTEGER NOT NULL, shadow INTEGER NOT NULL,
    PRIMARY KEY (account, level)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY, account TEXT NOT NULL, at REAL NOT NULL, event TEXT NOT NULL,
    level INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS history_account ON history (account, id);
"""

_UPSERT_ACCOUNT = (
    "INSERT INTO accounts VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (account) DO UPDATE SET "
    "flagged=excluded.flagged, level=excluded.level, reason=excluded.reason, flagged_at=excluded.flagged_at, "
    "at_level=excluded.at_level, first_seen=excluded.first_seen, last_seen=excluded.last_seen")
_ADD_COUNT = ("INSERT INTO counts VALUES (?, ?, ?, ?) ON CONFLICT (account, level) DO UPDATE SET "
              "queries=queries+excluded.queries, shadow=shadow+excluded.shadow")
_ADD_EVENT = "INSERT INTO history (account, at, event, level, reason) VALUES (?, ?, ?, ?, ?)"
_GET = "SELECT flagged, level, reason, flagged_at, at_level, first_seen, last_seen FROM accounts WHERE account=?"


class SqliteStore:
    """The ledger in one SQLite file (see the module docstring for the guarantees)."""

    def __init__(self, path: str, *, timeout: float = 30.0):
        self.path = path
        self.timeout = timeout
        self._local = threading.local()
        self._connect()  # fail now on a bad path, not at the first request

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "conn", None) is not None and local.pid == os.getpid():
            return local.conn
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None
        local.conn, local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        local = self._local
        if getattr(local, "conn", None) is not None and local.pid == os.getpid():
            local.conn.close()
        if getattr(local, "lock_fd", None) is not None and local.lock_pid == os.getpid():
            os.close(local.lock_fd)
        local.conn = local.lock_fd = None

    # ------------------------------------------------------------------ reads
    def _read(self, conn, account: str, *, with_history: bool) -> AccountState | None:
        row = conn.execute(_GET, (account,)).fetchone()
        if row is None:
            return None
        queries, shadow = {}, {}
        for level, n, s in conn.execute("SELECT level, queries, shadow FROM counts WHERE account=?", (account,)):
            queries[level] = n
            if s:
                shadow[level] = s
        history = ()
        if with_history:
            history = tuple(Event(at, event, level, reason) for at, event, level, reason in conn.execute(
                "SELECT at, event, level, reason FROM history WHERE account=? ORDER BY id", (account,)))
        return AccountState(flagged=bool(row[0]), level=row[1], reason=row[2], flagged_at=row[3],
                            at_level=row[4], queries=queries, shadow=shadow, first_seen=row[5],
                            last_seen=row[6], history=history)

    def get(self, account: str) -> AccountState | None:
        try:
            return self._read(self._connect(), account, with_history=True)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        where = " WHERE flagged=1" if flagged_only else ""
        try:
            return [r[0] for r in self._connect().execute(f"SELECT account FROM accounts{where} ORDER BY account")]
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None

    # ------------------------------------------------------------------ writes
    def _write(self, account: str, *, full: bool, change):
        """Run ``change(state) -> (new_state, events, counts, result)`` in one BEGIN IMMEDIATE transaction.

        ``full`` reads the account's counts and history too; the request path
        reads only its row (counts are added in SQL, so the state it sees has none).
        """
        try:
            conn = self._connect()
            # Writers queue on an advisory file lock first: a blocked flock wakes
            # the moment it is released, where SQLite's own busy handler sleeps
            # for up to 100 ms between retries (seconds of tail latency with
            # four writers). BEGIN IMMEDIATE stays the guarantee for any writer
            # that does not take the lock.
            fcntl.flock(self._lock_fd(), fcntl.LOCK_EX)
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if full:
                        state = self._read(conn, account, with_history=True) or AccountState()
                    else:
                        state = self._row(conn, account)
                    new, events, counts, result = change(state)
                    conn.execute(_UPSERT_ACCOUNT, (account, int(new.flagged), new.level, new.reason,
                                                   new.flagged_at, new.at_level, new.first_seen, new.last_seen))
                    for level, n, s in counts:
                        conn.execute(_ADD_COUNT, (account, level, n, s))
                    for e in events:
                        conn.execute(_ADD_EVENT, (account, e.at, e.event, e.level, e.reason))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                fcntl.flock(self._lock_fd(), fcntl.LOCK_UN)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None
        return result

    def _lock_fd(self) -> int:
        local = self._local
        if getattr(local, "lock_fd", None) is None or local.lock_pid != os.getpid():
            local.lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            local.lock_pid = os.getpid()
        return local.lock_fd

    @staticmethod
    def _row(conn, account: str) -> AccountState:
        row = conn.execute(_GET, (account,)).fetchone()
        if row is None:
            return AccountState()
        return AccountState(flagged=bool(row[0]), level=row[1], reason=row[2], flagged_at=row[3],
                            at_level=row[4], first_seen=row[5], last_seen=row[6])

    def record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
               expire_after: float | None, shadow: bool):
        """Count one request atomically and return its :class:`~caliber_core.throttle.ledger.Decision`."""

        def change(state):
            decision = advance(state, rows=rows, now=now, escalate_after=escalate_after, top=top,
                               expire_after=expire_after, shadow=shadow)
            counts = [(level, n, n if shadow and level > 0 else 0) for level, n in decision.segments]
            return decision.state, decision.events, counts, decision

        return self._write(account, full=False, change=change)

    def begin_record(self, account: str, **request):
        """``record`` now; returns ``finish() -> Decision`` (the same call shape as the Redis store's)."""
        decision = self.record(account, **request)
        return lambda: decision

    def set_flag(self, account: str, *, flagged: bool, level: int, reason: str, now: float,
                 expire_after: float | None = None) -> AccountState:
        """Flag at ``level`` (its counter restarts) or unflag; records the event (after an ``expired``
        one when the flag it replaces had lapsed)."""

        def change(state):
            events = (Event(now, "expired", 0, state.reason),) if expired(state, now, expire_after) else ()
            events += (Event(now, "flagged" if flagged else "unflagged", level if flagged else 0, reason),)
            new = AccountState(flagged=flagged, level=level if flagged else 0, reason=reason if flagged else "",
                               flagged_at=now if flagged else None, at_level=0, queries=state.queries,
                               shadow=state.shadow, first_seen=state.first_seen, last_seen=state.last_seen,
                               history=state.history + events)
            return new, events, (), new

        return self._write(account, full=True, change=change)
