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
* One ledger: every transaction checks, while it holds the write lock, that
  the path still names the file the connection opened (device and inode).
  A file replaced under a live server (log rotation, a restore, a remount,
  or ``rm ledger.db*`` followed by ``throttle flag``) is reopened, so the
  server and the CLI count in the same file; a deleted one raises
  :class:`~caliber_core.throttle.stores.StoreUnavailable` (the policy's
  outage rule then applies) -- the store never writes to a deleted file and
  never creates an empty ledger in place of a lost one while it runs.
* The ``-shm`` file (SQLite's shared index, mapped in memory) is checked
  too: unwritable raises ``StoreUnavailable``; truncated under a live
  connection (which would kill the process with SIGBUS at its next access)
  is grown back with zeros, which SQLite rebuilds from the WAL, and the
  connection is reopened.

A request with campaign groups is counted in one transaction by
:mod:`.sqlite_groups`; the tables are in :mod:`.sqlite_schema`.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading

from .ledger import AccountState, Event, advance, expired
from .ledger_store import StoreUnavailable
from .sqlite_groups import SqliteGroups
from .sqlite_schema import ADD_COUNT, ADD_EVENT, GET_ROW, SCHEMA, UPSERT_ACCOUNT

#: The smallest -shm SQLite maps (one 32 KiB region): a live one is never shorter.
_SHM_REGION = 32768


class _Replaced(Exception):
    """The path names another file than the connection's: reopen and run the transaction again."""


def in_transaction(conn: sqlite3.Connection, run, *, begin: str = "BEGIN"):
    """``run(conn)`` between ``begin`` and COMMIT; rolled back, and the error raised again, if it raises."""
    conn.execute(begin)
    try:
        result = run(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class SqliteStore(SqliteGroups):
    """The ledger in one SQLite file (see the module docstring for the guarantees).

    Implements :class:`~caliber_core.throttle.ledger_store.LedgerStore`; its
    methods are documented there.

    Parameters
    ----------
    path : str
        The database file, created when missing (later a missing file is an error,
        not a new empty ledger).
    timeout : float, optional
        Seconds to wait for another process's write lock.

    Raises
    ------
    StoreUnavailable
        The path holds a NUL character, or the file cannot be opened or created.
    """

    def __init__(self, path: str, *, timeout: float = 30.0):
        if "\x00" in path:
            raise StoreUnavailable("sqlite store path holds a NUL character")
        self.path = path
        self.timeout = timeout
        self._local = threading.local()
        self._connect(create=True)  # fail now on a bad path, not at the first request

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _connect(self, *, create: bool = False) -> sqlite3.Connection:
        """This process's and thread's connection, reopened if the path now names another file.

        ``create`` (at construction only) lets SQLite create a missing file;
        later a missing file raises StoreUnavailable rather than starting an empty ledger.
        """
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and local.pid == os.getpid():
            if self._same_file(local):
                return conn
            self._drop(local)
        try:
            ident = self._identity()
        except FileNotFoundError:
            if not create:
                raise StoreUnavailable(f"sqlite store {self.path}: the ledger file was deleted") from None
            ident = None
        except OSError as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc.strerror}") from None
        self._check_shm()
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None
        local.conn, local.pid = conn, os.getpid()
        local.ident = self._identity() if ident is None else ident
        local.shm = self._shm_size() or 0
        return conn

    def _identity(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_dev, st.st_ino

    def _shm_size(self) -> int | None:
        st = self._shm_stat()
        return None if st is None else st.st_size

    def _shm_stat(self):
        try:
            return os.stat(self.path + "-shm")
        except FileNotFoundError:
            return None

    def _check_shm(self, st=None) -> None:
        """StoreUnavailable when the -shm file exists and this process may not write it.

        ``access`` is asked again only when the file's inode, mode, owner or
        change time moved (chmod, chown and chattr all change the change time).
        """
        st = self._shm_stat() if st is None else st
        if st is None:
            return
        stamp = (st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_ctime_ns)
        if stamp == getattr(self._local, "shm_ok", None):
            return
        if not os.access(self.path + "-shm", os.R_OK | os.W_OK):
            raise StoreUnavailable(f"sqlite store {self.path}: its -shm file is not writable")
        self._local.shm_ok = stamp

    def _same_file(self, local) -> bool:
        """True when the open connection may be used: same file at the path, -shm intact and writable."""
        try:
            same = self._identity() == local.ident
        except FileNotFoundError:
            self._drop(local)
            raise StoreUnavailable(f"sqlite store {self.path}: the ledger file was deleted") from None
        except OSError as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc.strerror}") from None
        st = self._shm_stat()
        if st is None:  # deleted: our mapping is of the unlinked file; reopen to share the new one
            return False
        if st.st_size < min(local.shm, _SHM_REGION):
            # Truncated under our mapping: grow it back (zeros; SQLite rebuilds the index from the
            # WAL) before anything touches the mapped pages, then reopen.
            try:
                with open(self.path + "-shm", "r+b") as fh:
                    os.ftruncate(fh.fileno(), local.shm)
            except OSError as exc:
                local.conn = None  # never touch that mapping again, not even to close it
                raise StoreUnavailable(f"sqlite store {self.path}: its -shm file was truncated ({exc.strerror})") \
                    from None
            return False
        self._check_shm(st)
        local.shm = max(local.shm, st.st_size)
        return same

    def _drop(self, local) -> None:
        """Close this thread's connection and lock file (before a reopen)."""
        try:
            local.conn.close()
        except sqlite3.Error:
            pass
        local.conn = None
        if getattr(local, "lock_fd", None) is not None and local.lock_pid == os.getpid():
            os.close(local.lock_fd)
        local.lock_fd = None

    def close(self) -> None:
        """See :meth:`LedgerStore.close <caliber_core.throttle.ledger_store.LedgerStore.close>`."""
        local = self._local
        if getattr(local, "conn", None) is not None and local.pid == os.getpid():
            local.conn.close()
        if getattr(local, "lock_fd", None) is not None and local.lock_pid == os.getpid():
            os.close(local.lock_fd)
        local.conn = local.lock_fd = None

    def ping(self) -> bool:
        """Reach the ledger (the same file checks as a transaction); StoreUnavailable if it cannot be."""
        try:
            self._connect().execute("SELECT count(*) FROM accounts").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None
        return True

    # ------------------------------------------------------------------ reads
    def _read(self, conn, account: str, *, with_history: bool) -> AccountState | None:
        row = conn.execute(GET_ROW, (account,)).fetchone()
        if row is None:
            if not with_history or conn.execute("SELECT 1 FROM uncounted WHERE account=? LIMIT 1",
                                                (account,)).fetchone() is None:
                return None
            row = (0, 0, "", None, 0, None, None)  # known only from rows served during an outage
        queries, shadow = {}, {}
        for level, n, s in conn.execute("SELECT level, queries, shadow FROM counts WHERE account=?", (account,)):
            queries[level] = n
            if s:
                shadow[level] = s
        history, failed, uncounted, lifted = (), {}, (), {}
        if with_history:
            lifted = {(a, b): n for a, b, n in conn.execute(
                "SELECT own, served, queries FROM lifts WHERE account=? AND queries > 0", (account,))}
            history = tuple(Event(at, event, level, reason) for at, event, level, reason in conn.execute(
                "SELECT at, event, level, reason FROM history WHERE account=? ORDER BY id", (account,)))
            failed = {level: n for level, n in conn.execute(
                "SELECT level, queries FROM failed WHERE account=? AND queries > 0", (account,))}
            uncounted = tuple(
                {"process": p, "first": first, "last": last,
                 "queries": {int(k): int(v) for k, v in json.loads(q).items()}}
                for p, first, last, q in conn.execute(
                    "SELECT process, first, last, queries FROM uncounted WHERE account=? ORDER BY id", (account,)))
        return AccountState(flagged=bool(row[0]), level=row[1], reason=row[2], flagged_at=row[3],
                            at_level=row[4], queries=queries, shadow=shadow, first_seen=row[5],
                            last_seen=row[6], history=history, failed=failed, uncounted=uncounted, lifted=lifted)

    def get(self, account: str) -> AccountState | None:
        """See :meth:`LedgerStore.get <caliber_core.throttle.ledger_store.LedgerStore.get>`."""
        try:
            return self._read(self._connect(), account, with_history=True)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """See :meth:`LedgerStore.accounts <caliber_core.throttle.ledger_store.LedgerStore.accounts>`."""
        return self._names(flagged_only, groups=False)

    def _names(self, flagged_only: bool, *, groups: bool) -> list[str]:
        where = ("account LIKE 'g:%'" if groups else "account NOT LIKE 'g:%'") + (" AND flagged=1" if flagged_only else "")
        try:
            return [r[0] for r in self._connect().execute(f"SELECT account FROM accounts WHERE {where} ORDER BY account")]
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None

    # ------------------------------------------------------------------ writes
    def _write(self, account: str, *, full: bool, change):
        """Run ``change(state) -> (new_state, events, counts, result)`` in one BEGIN IMMEDIATE transaction.

        ``full`` reads the account's counts and history too; the request path
        reads only its row (counts are added in SQL, so the state it sees has none).
        """

        def run(conn):
            if full:
                state = self._read(conn, account, with_history=True) or AccountState()
            else:
                state = self._row(conn, account)
            new, events, counts, result = change(state)
            if new is None:  # a change that writes its own rows (void, uncounted)
                for sql, params in counts:
                    conn.execute(sql, params)
                return result
            self._put(conn, account, new, events, counts)
            return result

        return self._transaction(run)

    @staticmethod
    def _put(conn, account: str, new: AccountState, events, counts) -> None:
        conn.execute(UPSERT_ACCOUNT, (account, int(new.flagged), new.level, new.reason,
                                       new.flagged_at, new.at_level, new.first_seen, new.last_seen))
        for level, n, s in counts:
            conn.execute(ADD_COUNT, (account, level, n, s))
        for e in events:
            conn.execute(ADD_EVENT, (account, e.at, e.event, e.level, e.reason))

    def _transaction(self, run):
        """``run(conn)`` inside one BEGIN IMMEDIATE transaction (committed, or rolled back if it raises)."""
        try:
            conn = self._connect()
            # Writers queue on an advisory file lock first: a blocked flock wakes
            # the moment it is released, where SQLite's own busy handler sleeps
            # for up to 100 ms between retries (seconds of tail latency with
            # four writers). BEGIN IMMEDIATE stays the guarantee for any writer
            # that does not take the lock.
            fcntl.flock(self._lock_fd(), fcntl.LOCK_EX)

            def checked(conn):
                if self._identity() != self._local.ident:  # replaced while we waited for the lock
                    raise _Replaced
                return run(conn)

            try:
                result = in_transaction(conn, checked, begin="BEGIN IMMEDIATE")
            finally:
                fcntl.flock(self._lock_fd(), fcntl.LOCK_UN)
        except _Replaced:
            return self._transaction(run)  # _connect reopens (or raises)
        except FileNotFoundError:
            raise StoreUnavailable(f"sqlite store {self.path}: the ledger file was deleted") from None
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
        row = conn.execute(GET_ROW, (account,)).fetchone()
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

    def void(self, account: str, decision) -> None:
        """A counted request whose answer was not produced: its rows move from ``queries`` to ``failed``."""

        def change(state):
            writes = []
            for level, n in decision.segments:
                writes.append(("UPDATE counts SET queries = queries - ? WHERE account=? AND level=?", (n, account, level)))
                writes.append(("INSERT INTO failed VALUES (?, ?, ?) ON CONFLICT (account, level) DO UPDATE SET "
                               "queries=queries+excluded.queries", (account, level, n)))
            return None, (), writes, None

        self._write(account, full=False, change=change)

    def resolve(self, account: str, token: str, *, served: bool) -> bool:
        """False: a SQLite transaction commits or does not, so no request is ever left in doubt."""
        return False

    def add_uncounted(self, account: str, *, process: str, first: float, last: float, queries: dict) -> None:
        """Record rows this process served while the store was unreachable (kept apart from ``queries``)."""
        text = json.dumps({str(k): int(v) for k, v in sorted(queries.items())})

        def change(state):
            return None, (), [("INSERT INTO uncounted (account, process, first, last, queries) VALUES (?, ?, ?, ?, ?)",
                               (account, process, float(first), float(last), text))], None

        self._write(account, full=False, change=change)

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
