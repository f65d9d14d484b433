"""A throwaway ledger for replays: the SQLite store's own SQL on an in-memory database.

A simulation needs the decisions a production ledger would make, not its
durability: this store runs the same statements as
:class:`~caliber_core.throttle.sqlite_store.SqliteStore` (so every decision and
every state read back is the same), but on one in-memory connection, without
the file checks, the advisory file lock and the fsyncs that make the file
store safe for several processes. Single-threaded and private to one
process; gone when closed.
"""

from __future__ import annotations

import sqlite3

from .ledger_store import StoreUnavailable
from .sqlite_schema import SCHEMA
from .sqlite_store import SqliteStore, in_transaction


class ScratchStore(SqliteStore):
    """The SQLite ledger in memory, for one process's replay (nothing survives :meth:`close`).

    Implements :class:`~caliber_core.throttle.ledger_store.LedgerStore`; its
    methods are documented there.
    """

    def __init__(self):
        self.path = ":memory:"
        self.timeout = 0.0
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True)
        self._conn.executescript(SCHEMA)

    def __repr__(self) -> str:
        return "ScratchStore()"

    def _connect(self, *, create: bool = False) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("scratch store: closed (its ledger is gone)")
        return self._conn

    def _transaction(self, run):
        """``run(conn)`` in one transaction, rolled back if it raises (no other writer to queue behind)."""
        conn = self._connect()
        try:
            return in_transaction(conn, run)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"scratch store: {exc}") from None

    def close(self) -> None:
        """Drop the ledger."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
