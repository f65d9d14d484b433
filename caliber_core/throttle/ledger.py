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
from dataclasses import dataclass, field

_ACCOUNT_DOMAIN = b"caliber.throttle.account/v1\x00"
MAX_ACCOUNT_BYTES = 4096
MAX_REASON_CHARS = 500
EVENTS = ("flagged", "unflagged", "escalated", "expired")


def account_fingerprint(account) -> str:
    """The ledger's name for an account: 32 hex chars of a domain-separated sha256 of its id.

    Parameters
    ----------
    account : str or bytes
        The account id. A str is NFC-normalized and UTF-8 encoded first; bytes
        are taken as they are.

    Returns
    -------
    str
        32 lowercase hex characters.

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
    """A flag reason: one line of at most 500 characters.

    Parameters
    ----------
    reason : str
        The reason a provider gives for a flag or an unflag.

    Returns
    -------
    str
        ``reason`` unchanged.

    Raises
    ------
    TypeError
        Not a string.
    ValueError
        Longer than 500 characters or more than one line (the message gives its length).
    """
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, got {type(reason).__name__}")
    if len(reason) > MAX_REASON_CHARS or "\n" in reason or "\r" in reason:
        raise ValueError(f"reason must be one line of at most {MAX_REASON_CHARS} characters, "
                         f"got {len(reason)} characters")
    return reason


def check_rows(rows) -> int:
    """The rows of one request.

    Parameters
    ----------
    rows : int
        Rows (queries) the request asks for.

    Returns
    -------
    int
        ``rows``, an integer in [1, 10**9].

    Raises
    ------
    ValueError
        Not an integer (a bool is refused), or out of range (the message shows it).
    """
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or not 1 <= rows <= 10**9:
        raise ValueError(f"rows must be an integer in [1, 1e9], got {rows!r}")
    return int(rows)


@dataclass(frozen=True)
class Event:
    """One history entry of an account's flag.

    Attributes
    ----------
    at : float
        Unix time of the event.
    event : str
        One of :data:`EVENTS`.
    level : int
        The account's level after the event.
    reason : str
        The provider's reason (empty when none was given).
    """

    at: float
    event: str
    level: int
    reason: str = ""

    def to_dict(self) -> dict:
        """The event as a JSON-able dict (the audit report's ``history`` entries)."""
        return {"at": self.at, "event": self.event, "level": self.level, "reason": self.reason}


@dataclass(frozen=True)
class AccountState:
    """An account's aggregates, as the ledger stores them.

    Attributes
    ----------
    flagged : bool
        Whether the provider flagged the account (and the flag has not lapsed).
    level : int
        The level its rows are served at (0 when not flagged).
    reason : str
        The flag's reason.
    flagged_at : float or None
        Unix time the flag was set.
    at_level : int
        Rows counted at the current level (escalation compares it with the policy's threshold).
    queries : dict of int to int
        Rows decided at each level.
    shadow : dict of int to int
        Of those, rows served clean in shadow mode.
    first_seen, last_seen : float or None
        Unix times of the first and the latest request.
    history : tuple of Event
        The flag events, oldest first.
    failed : dict of int to int
        Rows counted, then rolled back because no answer was produced.
    uncounted : tuple of dict
        Rows served while the store was unreachable: process, first, last, queries per level.
    lifted : dict of (int, int) to int
        Rows counted at the account's own level ``from`` but served at a group's higher
        level ``to`` (``{(from, to): rows}``; not kept in shadow mode, where rows are served clean).
    """

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
    lifted: dict = field(default_factory=dict)  # (own level, served level) -> rows raised by a group

    def to_dict(self, *, expire_after: float | None = None) -> dict:
        """The state as a JSON-able dict (what ``throttle status`` prints).

        Parameters
        ----------
        expire_after : float or None, optional
            The policy's flag lifetime in seconds, to give the flag's ``expires_at``.

        Returns
        -------
        dict
            Every field, levels as string keys, plus ``expires_at``.
        """
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
            "raised_by_groups": {f"{a}->{b}": n for (a, b), n in sorted(self.lifted.items()) if n},
        }


@dataclass(frozen=True)
class Decision:
    """What one request gets.

    Attributes
    ----------
    segments : tuple of (int, int)
        ((level, rows), ...) in row order: a request that crosses the escalation
        threshold is split between two levels.
    events : tuple of Event
        What changed (a lapsed flag, an escalation).
    state : AccountState
        The account after the request.
    token : str or None
        The Redis store's request token (what a void or a resolve names); None for SQLite.
    groups : tuple of (str, Decision)
        For a request with group descriptors: each group's ledger name and its own decision.
        ``segments`` is then the highest level per row over the account and its groups,
        ``events`` the account's then each group's, ``state`` the account's.
    own : Decision or None
        With groups: the account's own decision (its rows at its own levels).
    """

    segments: tuple
    events: tuple
    state: AccountState
    token: str | None = None  # the Redis store's request token (what a void or a resolve names)
    groups: tuple = ()
    own: "Decision | None" = None  # with groups: the account's own decision (what a void un-counts)

    @property
    def level(self) -> int:
        """The highest level any row of the request was decided at."""
        return max(level for level, _ in self.segments)


def highest_segments(*segment_lists) -> tuple:
    """Row by row, the highest level over several decisions of the same rows.

    Parameters
    ----------
    *segment_lists : sequence of (int, int)
        Each a ((level, rows), ...) covering the same rows in order.

    Returns
    -------
    tuple of (int, int)
        ((level, rows), ...), adjacent runs at one level merged.

    Examples
    --------
    >>> highest_segments(((0, 5),), ((1, 2), (2, 3)))
    ((1, 2), (2, 3))
    """
    if all(len(s) == 1 for s in segment_lists):  # the usual request: one level each
        return ((max(s[0][0] for s in segment_lists), segment_lists[0][0][1]),)
    lists = [list(s) for s in segment_lists]
    index, used = [0] * len(lists), [0] * len(lists)
    out = []
    while index[0] < len(lists[0]):
        take = min(lst[i][1] - u for lst, i, u in zip(lists, index, used))
        level = max(lst[i][0] for lst, i in zip(lists, index))
        if out and out[-1][0] == level:
            out[-1] = (level, out[-1][1] + take)
        else:
            out.append((level, take))
        for j, lst in enumerate(lists):
            used[j] += take
            if used[j] == lst[index[j]][1]:
                index[j], used[j] = index[j] + 1, 0
    return tuple(out)


def lifts(own, served) -> dict:
    """Rows a request's groups raised above its account's own level: ``{(own level, served level): rows}``.

    Parameters
    ----------
    own, served : sequence of (int, int)
        The account's own segments and the request's served ones (:func:`highest_segments`), same rows.

    Returns
    -------
    dict
        Only the pairs where the served level is higher.
    """
    if len(own) == 1 and len(served) == 1:  # the usual request: one level each
        (a, n), (b, _) = own[0], served[0]
        return {(a, b): n} if b > a else {}
    out = {}
    for (a, b), n in _paired_rows(own, served).items():
        if b > a:
            out[(a, b)] = out.get((a, b), 0) + n
    return out


def _paired_rows(own, served) -> dict:
    pairs, i, j, used_i, used_j = {}, 0, 0, 0, 0
    own, served = list(own), list(served)
    while i < len(own) and j < len(served):
        take = min(own[i][1] - used_i, served[j][1] - used_j)
        key = (own[i][0], served[j][0])
        pairs[key] = pairs.get(key, 0) + take
        used_i += take
        used_j += take
        if used_i == own[i][1]:
            i, used_i = i + 1, 0
        if used_j == served[j][1]:
            j, used_j = j + 1, 0
    return pairs


def expired(state: AccountState, now: float, expire_after: float | None) -> bool:
    """Whether an account's flag has lapsed at ``now``.

    Parameters
    ----------
    state : AccountState
        The account.
    now : float
        Unix time.
    expire_after : float or None
        The policy's flag lifetime in seconds; None: flags never lapse.

    Returns
    -------
    bool
        True for a flagged account whose flag is at least ``expire_after`` old.
    """
    return (state.flagged and expire_after is not None and state.flagged_at is not None
            and now >= state.flagged_at + expire_after)


def advance(state: AccountState, *, rows: int, now: float, escalate_after: int, top: int,
            expire_after: float | None, shadow: bool) -> Decision:
    """Apply one request of ``rows`` queries to ``state``.

    Parameters
    ----------
    state : AccountState
        The account before the request.
    rows : int
        Rows in the request (checked by the caller: :func:`check_rows`).
    now : float
        Unix time of the request.
    escalate_after : int
        Rows at a level after which a flagged account moves up one level.
    top : int
        The policy's highest level (final).
    expire_after : float or None
        The flag lifetime in seconds; None: never.
    shadow : bool
        Count the flagged rows in ``state.shadow`` too (decided, but served clean).

    Returns
    -------
    Decision
        The rows' levels in order, the events, and the new state.

    Notes
    -----
    An expired flag lapses first. An unflagged account's rows count at level
    0. A flagged account's rows count at its level; after the
    ``escalate_after``-th row at a level below ``top`` it moves up one level,
    so a batch that crosses the threshold is split: its first rows at the
    old level, the rest at the next.
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
    # Built field by field (dataclasses.replace introspects the class on every call: this runs per request).
    new = AccountState(flagged=flagged, level=level, reason=state.reason if flagged else "", flagged_at=flagged_at,
                       at_level=at_level, queries=queries, shadow=shadowed,
                       first_seen=state.first_seen if state.first_seen is not None else now, last_seen=now,
                       history=state.history + tuple(events), failed=state.failed, uncounted=state.uncounted,
                       lifted=state.lifted)
    return Decision(tuple(segments), tuple(events), new)


def check_time(now) -> float:
    """A time given to the ledger.

    Parameters
    ----------
    now : float
        Unix time in seconds.

    Returns
    -------
    float
        ``now`` as a float.

    Raises
    ------
    ValueError
        Not a finite real number >= 0 (the message shows it).
    """
    if isinstance(now, bool) or not isinstance(now, numbers.Real) or not math.isfinite(now) or now < 0:
        raise ValueError(f"time must be a finite number of seconds >= 0, got {now!r}")
    return float(now)
