"""What a ledger store is: the :class:`LedgerStore` protocol both stores implement, and their errors.

The throttle talks to its store through these methods only; ``sqlite:///``
(:mod:`.sqlite_store`) and ``redis://`` (:mod:`.redis_store`) implement them,
and :func:`.stores.open_store` picks one by URL. A store that can send a
request's count and read the answer later (Redis: the round trip overlaps the
noise being drawn) is also a :class:`PipelinedLedgerStore`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .ledger import AccountState, Decision


class StoreUnavailable(RuntimeError):
    """The ledger store cannot be reached or written (the message names the store, never an account)."""


class StoreURLError(ValueError):
    """A store URL that names no supported store."""


@runtime_checkable
class LedgerStore(Protocol):
    """An account ledger shared by every serving process: counts, flags, history.

    Every method raises :class:`StoreUnavailable` when the store cannot be
    reached or written. Accounts are named by fingerprint only.
    """

    def ping(self) -> bool:
        """True when the store answers."""

    def close(self) -> None:
        """Release connections (the store may be used again: it reconnects)."""

    def get(self, account: str) -> AccountState | None:
        """The account's state and history, or None for an account never seen."""

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """Fingerprints of the (flagged) accounts."""

    def record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
               expire_after: float | None, shadow: bool) -> Decision:
        """Count one request atomically and return its :class:`~caliber_core.throttle.ledger.Decision`."""

    def void(self, account: str, decision: Decision) -> None:
        """A counted request whose answer was not produced: its rows move from ``queries`` to ``failed``."""

    def resolve(self, account: str, token: str, *, served: bool) -> bool:
        """Settle a request left in doubt by a lost reply; True if it had been counted."""

    def add_uncounted(self, account: str, *, process: str, first: float, last: float, queries: dict) -> None:
        """Record rows a process served while the store was unreachable (kept apart from ``queries``)."""

    def set_flag(self, account: str, *, flagged: bool, level: int, reason: str, now: float,
                 expire_after: float | None = None) -> AccountState:
        """Flag an account at ``level`` (its counter restarts) or unflag it; the event is recorded."""


@runtime_checkable
class PipelinedLedgerStore(LedgerStore, Protocol):
    """A store that sends a request's count now and reads its answer later."""

    def begin_record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
                     expire_after: float | None, shadow: bool) -> Callable[[], Decision]:
        """Send :meth:`record`'s request; the returned ``finish()`` reads its Decision."""
