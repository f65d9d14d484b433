"""The SQLite ledger's tables and the statements its writes share (:mod:`.sqlite_store`, :mod:`.sqlite_groups`).

An account and a group (:mod:`.groups`, ledger name ``g:<kind>:<hex>``) are
rows of the same tables; ``members`` and ``lifts`` exist for groups only.
"""

from __future__ import annotations

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS failed (
    account TEXT NOT NULL, level INTEGER NOT NULL, queries INTEGER NOT NULL,
    PRIMARY KEY (account, level)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uncounted (
    id INTEGER PRIMARY KEY, account TEXT NOT NULL, process TEXT NOT NULL, first REAL NOT NULL,
    last REAL NOT NULL, queries TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS uncounted_account ON uncounted (account, id);
CREATE TABLE IF NOT EXISTS lifts (
    account TEXT NOT NULL, own INTEGER NOT NULL, served INTEGER NOT NULL, queries INTEGER NOT NULL,
    PRIMARY KEY (account, own, served)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS members (
    grp TEXT NOT NULL, account TEXT NOT NULL, queries INTEGER NOT NULL, first_seen REAL NOT NULL,
    last_seen REAL NOT NULL, PRIMARY KEY (grp, account)) WITHOUT ROWID;
"""

UPSERT_ACCOUNT = (
    "INSERT INTO accounts VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (account) DO UPDATE SET "
    "flagged=excluded.flagged, level=excluded.level, reason=excluded.reason, flagged_at=excluded.flagged_at, "
    "at_level=excluded.at_level, first_seen=excluded.first_seen, last_seen=excluded.last_seen")
ADD_COUNT = ("INSERT INTO counts VALUES (?, ?, ?, ?) ON CONFLICT (account, level) DO UPDATE SET "
            "queries=queries+excluded.queries, shadow=shadow+excluded.shadow")
ADD_EVENT = "INSERT INTO history (account, at, event, level, reason) VALUES (?, ?, ?, ?, ?)"
ADD_MEMBER = ("INSERT INTO members VALUES (?, ?, ?, ?, ?) ON CONFLICT (grp, account) DO UPDATE SET "
              "queries=queries+excluded.queries, last_seen=excluded.last_seen")
ADD_LIFT = ("INSERT INTO lifts VALUES (?, ?, ?, ?) ON CONFLICT (account, own, served) DO UPDATE SET "
            "queries=queries+excluded.queries")
GET_ROW = "SELECT flagged, level, reason, flagged_at, at_level, first_seen, last_seen FROM accounts WHERE account=?"
