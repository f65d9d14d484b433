"""A request counted for an account and its campaign groups in the SQLite ledger, and the groups read back.

:class:`SqliteGroups` is the part of :class:`~.sqlite_store.SqliteStore` that
serves groups (:mod:`.groups`). A group is a ledger of its own, a row of the
same tables as an account (ledger name ``g:<kind>:<hex>``), plus the accounts
seen in it (``members``). A request with groups is one transaction: the
account, every group and the rows a group served above the account's own
level (``lifts``) are counted together, or none of them is.
"""

from __future__ import annotations

import sqlite3

from .ledger import AccountState, advance, highest_segments, lifts
from .ledger_store import StoreUnavailable
from .sqlite_schema import ADD_COUNT, ADD_EVENT, ADD_LIFT, ADD_MEMBER, UPSERT_ACCOUNT


class SqliteGroups:
    """Counting a request with groups, and reading groups (mixed into :class:`~.sqlite_store.SqliteStore`)."""

    def record_request(self, entries, *, rows: int, now: float, top: int, shadow: bool, token=None) -> list:
        """Count one request for an account and its groups in one transaction: all of them, or none.

        Parameters
        ----------
        entries : sequence of (str, int, float or None, str or None)
            ``(ledger name, escalate_after, expire_after, member)``: the account
            first (member None), then each group with the account as its member.
        rows, now, top, shadow :
            As :meth:`~.sqlite_store.SqliteStore.record` takes them.
        token : str, optional
            Unused: a SQLite transaction commits or does not, so nothing is left in doubt.

        Returns
        -------
        list of Decision
            One per entry, in order.
        """

        def run(conn):
            names = [entry[0] for entry in entries]
            # One read for every row of the request, then the writes batched: fewer calls into SQLite.
            found = {r[0]: r[1:] for r in conn.execute(
                f"SELECT account, flagged, level, reason, flagged_at, at_level, first_seen, last_seen FROM accounts "
                f"WHERE account IN ({','.join('?' * len(names))})", names)}
            out, counts, events, members = [], [], [], []
            for name, escalate_after, expire_after, member in entries:
                row = found.get(name)
                state = AccountState() if row is None else AccountState(
                    flagged=bool(row[0]), level=row[1], reason=row[2], flagged_at=row[3], at_level=row[4],
                    first_seen=row[5], last_seen=row[6])
                decision = advance(state, rows=rows, now=now, escalate_after=escalate_after, top=top,
                                   expire_after=expire_after, shadow=shadow)
                new = decision.state
                conn.execute(UPSERT_ACCOUNT, (name, int(new.flagged), new.level, new.reason, new.flagged_at,
                                               new.at_level, new.first_seen, new.last_seen))
                counts += [(name, level, n, n if shadow and level > 0 else 0) for level, n in decision.segments]
                events += [(name, e.at, e.event, e.level, e.reason) for e in decision.events]
                if member is not None:
                    members.append((name, member, rows, now, now))
                out.append(decision)
            conn.executemany(ADD_COUNT, counts)
            conn.executemany(ADD_MEMBER, members)
            if events:
                conn.executemany(ADD_EVENT, events)
            if len(out) > 1 and not shadow:  # what the account received above its own level, same transaction
                raised = lifts(out[0].segments, highest_segments(*(d.segments for d in out)))
                conn.executemany(ADD_LIFT, [(names[0], a, b, n) for (a, b), n in raised.items()])
            return out

        return self._transaction(run)

    def lift(self, account: str, raised: dict, *, token=None, sign: int = 1) -> None:
        """Add (``sign`` -1: take back, for a voided request) rows a group served above the account's own level."""

        def change(state):
            return None, (), [(ADD_LIFT, (account, a, b, sign * n)) for (a, b), n in raised.items()], None

        self._write(account, full=False, change=change)

    def groups(self, *, flagged_only: bool = True) -> list[str]:
        """The groups' ledger names (``g:<kind>:<hex>``), sorted; the flagged ones only by default."""
        return self._names(flagged_only, groups=True)

    def members(self, group: str) -> dict:
        """The accounts seen in a group: ``{fingerprint: {"queries", "first_seen", "last_seen"}}``."""
        try:
            return {a: {"queries": n, "first_seen": first, "last_seen": last}
                    for a, n, first, last in self._connect().execute(
                        "SELECT account, queries, first_seen, last_seen FROM members WHERE grp=? ORDER BY account",
                        (group,))}
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None
