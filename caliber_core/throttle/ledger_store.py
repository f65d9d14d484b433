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
    """A store URL that names no supported store (the message shows the scheme, never a password)."""


@runtime_checkable
class LedgerStore(Protocol):
    """An account ledger shared by every serving process: counts, flags, history.

    Every method but :meth:`close` raises :class:`StoreUnavailable` when the
    store cannot be reached or written.
    Accounts are named by fingerprint only
    (:func:`~caliber_core.throttle.ledger.account_fingerprint`).
    """

    def ping(self) -> bool:
        """Reach the store (one round trip).

        Returns
        -------
        bool
            True when the store answers.

        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """

    def close(self) -> None:
        """Release connections (the store may be used again: it reconnects)."""

    def get(self, account: str) -> AccountState | None:
        """The account's state and history.

        Parameters
        ----------
        account : str
            The account's fingerprint.

        Returns
        -------
        AccountState or None
            None for an account never seen.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """Fingerprints of the accounts the ledger holds.

        Parameters
        ----------
        flagged_only : bool, optional
            Only the flagged ones (the default).

        Returns
        -------
        list of str
            Fingerprints, sorted.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
               expire_after: float | None, shadow: bool) -> Decision:
        """Count one request atomically by :func:`~caliber_core.throttle.ledger.advance`.

        Parameters
        ----------
        account : str
            The account's fingerprint.
        rows, now, escalate_after, top, expire_after, shadow :
            As :func:`~caliber_core.throttle.ledger.advance` takes them.

        Returns
        -------
        Decision
            The levels of the request's rows, the events and the new state.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def record_request(self, entries, *, rows: int, now: float, top: int, shadow: bool,
                       token: str | None = None) -> list[Decision]:
        """Count one request for an account and its groups, each by its own rule, exactly once.

        Parameters
        ----------
        entries : sequence of (str, int, float or None, str or None)
            ``(ledger name, escalate_after, expire_after, member)``: the account
            first (member None), then each group (member: the account's fingerprint,
            recorded among the group's members).
        rows, now, top, shadow :
            As :meth:`record` takes them.
        token : str, optional
            The request's token (a store that can leave a request in doubt).

        Returns
        -------
        list of Decision
            One per entry, in order.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written (``in_doubt``: the token, when
            some entries may have been counted).
        """

    def lift(self, account: str, raised: dict, *, token: str | None = None, sign: int = 1) -> None:
        """Record rows a request's groups served above the account's own level (``sign`` -1 takes them back).

        Parameters
        ----------
        account : str
            The account's fingerprint.
        raised : dict of (int, int) to int
            ``{(own level, served level): rows}`` (:func:`~caliber_core.throttle.ledger.lifts`).
        token : str, optional
            The request's token: a store that can lose a reply applies it once per token.
        sign : int, optional
            1 adds, -1 takes back (a voided request).
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def groups(self, *, flagged_only: bool = True) -> list[str]:
        """The groups' ledger names, sorted (the flagged ones only by default).

        Returns
        -------
        list of str
        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """

    def members(self, group: str) -> dict:
        """The accounts a group has seen.

        Parameters
        ----------
        group : str
            The group's ledger name.

        Returns
        -------
        dict
            ``{fingerprint: {"queries", "first_seen", "last_seen"}}``.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """

    def void(self, account: str, decision: Decision) -> None:
        """A counted request whose answer was not produced: its rows move from ``queries`` to ``failed``.

        Parameters
        ----------
        account : str
            The account's fingerprint.
        decision : Decision
            What :meth:`record` returned for the request.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def resolve(self, account: str, token: str, *, served: bool) -> bool:
        """Settle a request left in doubt by a lost reply.

        Parameters
        ----------
        account : str
            The account's fingerprint.
        token : str
            The request's token (:attr:`Decision.token`, or the one the lost request carried).
        served : bool
            Whether the process served the request: if not, a count is voided.

        Returns
        -------
        bool
            True if the store had counted the request.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def add_uncounted(self, account: str, *, process: str, first: float, last: float, queries: dict) -> None:
        """Record rows a process served while the store was unreachable (kept apart from ``queries``).

        Parameters
        ----------
        account : str
            The account's fingerprint.
        process : str
            The serving process (``host:pid``).
        first, last : float
            Unix times of the first and the last row served uncounted.
        queries : dict of int to int
            Rows served per level.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def set_flag(self, account: str, *, flagged: bool, level: int, reason: str, now: float,
                 expire_after: float | None = None) -> AccountState:
        """Flag an account at ``level`` (its counter restarts) or unflag it; the event is recorded.

        Parameters
        ----------
        account : str
            The account's fingerprint.
        flagged : bool
            Flag (True) or unflag (False).
        level : int
            The level to serve a flagged account at (0 when unflagging).
        reason : str
            One line, kept in the history.
        now : float
            Unix time of the event.
        expire_after : float or None, optional
            The policy's flag lifetime, to lapse an old flag first.

        Returns
        -------
        AccountState
            The account after the event.
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """


@runtime_checkable
class PipelinedLedgerStore(LedgerStore, Protocol):
    """A store that sends a request's count now and reads its answer later."""

    def begin_record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
                     expire_after: float | None, shadow: bool) -> Callable[[], Decision]:
        """Send :meth:`record`'s request now; read its answer later.

        Parameters
        ----------
        account, rows, now, escalate_after, top, expire_after, shadow :
            As :meth:`record` takes them.

        Returns
        -------
        callable
            ``finish()``, which reads the request's :class:`Decision` (and
            raises :class:`StoreUnavailable` if the reply is lost).
        Raises
        ------
        StoreUnavailable
            The store cannot be reached or written.
        """

    def begin_record_request(self, entries, *, rows: int, now: float, top: int, shadow: bool,
                             token: str | None = None) -> Callable[[], list]:
        """Send :meth:`record_request`'s scripts now; ``finish()`` reads the list of Decisions.

        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """
