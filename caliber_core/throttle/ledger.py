"""The ledger's model: one account's aggregates and the rule that moves them on each request.

The ledger holds, per account, its flag, level, reason, flagged-at time,
queries per level (and how many of those shadow mode served clean), the
queries at its current level, and first/last-seen times, plus a short history
of flag events. It never holds requests, and never the account's own name:
rows are keyed by :func:`account_fingerprint`, so a copied ledger does not
hand out API keys used as account names.

:func:`advance` is the one decision rule. The SQLite store runs it inside a
write transaction; the Redis store runs the same rule as a Lua script
(``redis_store.RECORD_SCRIPT``), and the tests hold the two to each other.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import unicodedata
from dataclasses import dataclass, field, replace

_ACCOUNT_DOMAIN = b"caliber.throttle.account/v1\x00"
MAX_ACCOUNT_BYTES = 4096
MAX_REASON_CHARS = 500
EVENTS = ("flagged", "unflagged", "escalated", "expired")


def account_fingerprint(account) -> str:
    """The ledger's name for an account: 32 hex chars of a domain-separated sha256 of its id.

    A str id is NFC-normalized and UTF-8 encoded first; bytes are taken as they are.

    Raises
    ------
    TypeError, ValueError
        Not a str/bytes, empty, or longer than 4096 bytes (the value itself is never echoed).
    """
    if isinstance(account, str):
        # NFC: one account however its characters were composed (the CLI and HTTP headers agree).
        raw = unicodedata.normalize("NFC", account).encode("utf-8", "surrogateescape")
    elif isinstance(account, (bytes, bytearray)):
        raw = bytes(account)
    else:
        raise TypeError(f"account must be str or bytes, got {type(account).__name__}")
    if not raw or len(raw) > MAX_ACCOUNT_BYTES:
        raise ValueError(f"account id must be 1..{MAX_ACCOUNT_BYTES} bytes, got {len(raw)} bytes")
    return hashlib.sha256(_ACCOUNT_DOMAIN + raw).hexdigest()[:32]


def check_reason(reason) -> str:
    """A flag reason: one line of at most 500 characters."""
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, got {type(reason).__name__}")
    if len(reason) > MAX_REASON_CHARS or "\n" in reason or "\r" in reason:
        raise ValueError(f"reason must be one line of at most {MAX_REASON_CHARS} characters, "
                         f"got {len(reason)} characters")
    return reason


def check_rows(rows) -> int:
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or not 1 <= rows <= 10**9:
        raise ValueError(f"rows must be an integer in [1, 1e9], got {rows!r}")
    return int(rows)


@dataclass(frozen=True)
class Event:
    """One history entry: ``event`` in :data:`EVENTS`, the level after it, when, and why."""

    at: float
    event: str
    level: int
    reason: str = ""

    def to_dict(self) -> dict:
        return {"at": self.at, "event": self.event, "level": self.level, "reason": self.reason}


@dataclass(frozen=True)
class AccountState:
    """An account's aggregates. ``queries[j]`` counts rows decided at level j; ``shadow[j]`` those served clean."""

    flagged: bool = False
    level: int = 0
    reason: str = ""
    flagged_at: float | None = None
    at_level: int = 0
    queries: dict = field(default_factory=dict)
    shadow: dict = field(default_factory=dict)
    first_seen: float | None = None
    last_seen: float | None = None
    history: tuple = ()
    failed: dict = field(default_factory=dict)  # rows counted, then rolled back: no answer was produced
    uncounted: tuple = ()  # served while the store was unreachable: dicts of process, first, last, queries

    def to_dict(self, *, expire_after: float | None = None) -> dict:
        expires = (None if not self.flagged or expire_after is None or self.flagged_at is None
                   else self.flagged_at + expire_after)
        return {
            "flagged": self.flagged, "level": self.level, "reason": self.reason,
            "flagged_at": self.flagged_at, "expires_at": expires, "queries_at_level": self.at_level,
            "queries": {str(k): v for k, v in sorted(self.queries.items())},
            "served_clean_in_shadow": {str(k): v for k, v in sorted(self.shadow.items())},
            "first_seen": self.first_seen, "last_seen": self.last_seen,
            "history": [e.to_dict() for e in self.history],
            "failed": {str(k): v for k, v in sorted(self.failed.items())},
            "served_uncounted": [dict(u, queries={str(k): v for k, v in sorted(u["queries"].items())})
                                 for u in self.uncounted],
        }


@dataclass(frozen=True)
class Decision:
    """What one request gets: ``segments`` is ((level, rows), ...) in row order; ``events`` what changed."""

    segments: tuple
    events: tuple
    state: AccountState
    token: str | None = None  # the Redis store's request token (what a void or a resolve names)

    @property
    def level(self) -> int:
        """The highest level any row of the request was decided at."""
        return max(level for level, _ in self.segments)


def expired(state: AccountState, now: float, expire_after: float | None) -> bool:
    return (state.flagged and expire_after is not None and state.flagged_at is not None
            and now >= state.flagged_at + expire_after)


def advance(state: AccountState, *, rows: int, now: float, escalate_after: int, top: int,
            expire_after: float | None, shadow: bool) -> Decision:
    """Apply one request of ``rows`` queries to ``state``.

    An expired flag lapses first. An unflagged account's rows count at level
    0. A flagged account's rows count at its level; after the
    ``escalate_after``-th row at a level below ``top`` it moves up one level,
    so a batch that crosses the threshold is split: its first rows at the
    old level, the rest at the next. ``shadow`` also counts the flagged rows
    in ``state.shadow`` (decided, but served clean).
    """
    events = []
    flagged, level, at_level, flagged_at = state.flagged, state.level, state.at_level, state.flagged_at
    if expired(state, now, expire_after):
        flagged, level, at_level, flagged_at = False, 0, 0, None
        events.append(Event(now, "expired", 0, state.reason))
    queries, shadowed = dict(state.queries), dict(state.shadow)
    segments = []
    remaining = rows
    while remaining:
        if flagged and level < top and at_level >= escalate_after:
            level, at_level = level + 1, 0
            events.append(Event(now, "escalated", level, state.reason))
            continue
        take = remaining if not flagged or level >= top else min(remaining, escalate_after - at_level)
        segments.append((level, take))
        queries[level] = queries.get(level, 0) + take
        if shadow and level > 0:
            shadowed[level] = shadowed.get(level, 0) + take
        if flagged:
            at_level += take
        remaining -= take
    if flagged and level < top and at_level >= escalate_after:
        level, at_level = level + 1, 0
        events.append(Event(now, "escalated", level, state.reason))
    new = replace(state, flagged=flagged, level=level, at_level=at_level, flagged_at=flagged_at,
                  reason=state.reason if flagged else "", queries=queries, shadow=shadowed,
                  first_seen=state.first_seen if state.first_seen is not None else now, last_seen=now,
                  history=state.history + tuple(events))
    return Decision(tuple(segments), tuple(events), new)


def check_time(now) -> float:
    if isinstance(now, bool) or not isinstance(now, numbers.Real) or not math.isfinite(now) or now < 0:
        raise ValueError(f"time must be a finite number of seconds >= 0, got {now!r}")
    return float(now)
