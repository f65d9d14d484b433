"""What a serving process does while its ledger store cannot be reached, and what it owes the ledger after.

:class:`Outages` applies the policy's outage rule (``on_store_error``) to a
request the store could not count, logs one warning per decision (the
store's error and the level, never the account or the key), tallies the rows
it served uncounted, and keeps the Redis requests that are in doubt (sent,
reply lost). Once the store answers again, :meth:`Outages.settle` resolves
the requests in doubt and writes the tally back to the ledger's
``uncounted`` record, per process with its first and last time.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict

from .ledger_store import StoreUnavailable

#: Accounts whose outage tally a process keeps (the oldest is dropped, with a warning, beyond it).
TALLY_CAPACITY = 100_000
#: Pending tallies written back per request once the store answers again (the rest wait).
FLUSH_PER_REQUEST = 32

log = logging.getLogger("caliber_core.throttle")


def process_name() -> str:
    """This serving process, as the ledger's outage records name it.

    Returns
    -------
    str
        ``host:pid``.
    """
    return f"{socket.gethostname()}:{os.getpid()}"


class Outages:
    """One process's outage state: the rows served uncounted per account, and the requests in doubt.

    Parameters
    ----------
    policy : Policy
        Its ``on_store_error``, ``unseen_level`` decide.
    now : callable
        The Throttle's clock.
    """

    def __init__(self, policy, *, now):
        self.policy = policy
        self._now = now
        self.uncounted = OrderedDict()  # fingerprint -> [first, last, {level: rows}]
        self.in_doubt = []  # (fingerprint, token, served, segments) the store may or may not have counted

    def decide(self, fp: str, rows: int, error: StoreUnavailable, last_known, *, groups: tuple = ()) -> tuple:
        """The segments of a request the store could not count, by the policy's outage rule.

        Parameters
        ----------
        fp : str
            The account's fingerprint.
        rows : int
            Rows in the request.
        error : StoreUnavailable
            The store's error (its ``in_doubt`` token, when set, marks a Redis
            request that may have been counted).
        last_known : Mapping of str to int
            The level this process last saw for each fingerprint.
        groups : tuple of str, optional
            The request's groups' ledger names: a group this process saw flagged
            raises the level; each is tallied and settled like the account.

        Returns
        -------
        tuple of (int, int)
            ``((level, rows),)``: the whole request at one level, tallied as uncounted.

        Raises
        ------
        StoreUnavailable
            ``error`` itself, when the policy refuses: ``on_store_error.serve`` is
            ``"refuse"``, or the account is unseen and ``unseen`` is ``"refuse"``.
        """
        policy = self.policy
        token = getattr(error, "in_doubt", None)
        if token is not None:
            served = policy.on_store_error != "refuse" and (fp in last_known or policy.unseen_level is not None)
            self.in_doubt.extend((name, token, served, None) for name in groups)  # settled before the account's
            self.in_doubt.append((fp, token, served, None))
        if policy.on_store_error == "refuse":
            log.warning("ledger store unreachable (%s): request refused (on_store_error.serve is \"refuse\")", error)
            raise error
        level = last_known.get(fp)
        source = "the level this process last saw"
        if level is None:
            if policy.unseen_level is None:
                log.warning("ledger store unreachable (%s): request from an account this process has not seen "
                            "refused (on_store_error.unseen is \"refuse\")", error)
                raise error
            level, source = policy.unseen_level, "on_store_error.unseen"
        linked = max((last_known.get(name, 0) for name in groups), default=0)
        if linked > level:
            level, source = linked, "the level this process last saw for one of its groups"
        log.warning("ledger store unreachable (%s): %d row(s) served at level %d (%s), not counted",
                    error, rows, level, source)
        segments = ((level, rows),)
        if token is not None:
            for j, name in enumerate(groups + (fp,)):
                self.in_doubt[len(self.in_doubt) - 1 - len(groups) + j] = (name, token, True, segments)
        for name in groups + (fp,):
            self.tally(name, segments)
        return segments

    def tally(self, fp: str, segments, *, sign: int = 1) -> None:
        """Add (or, with ``sign=-1``, take back) rows served uncounted.

        Parameters
        ----------
        fp : str
            The account's fingerprint.
        segments : iterable of (int, int)
            (level, rows) pairs.
        sign : int, optional
            1 adds, -1 takes back (a request in doubt that was counted after all).

        Notes
        -----
        At most ``TALLY_CAPACITY`` accounts are kept; beyond it the oldest tally
        is dropped, with a warning.
        """
        now = self._now()
        entry = self.uncounted.get(fp)
        if entry is None:
            if sign < 0:
                return
            entry = self.uncounted[fp] = [now, now, {}]
            if len(self.uncounted) > TALLY_CAPACITY:
                self.uncounted.popitem(last=False)
                log.warning("more than %d accounts served uncounted: the oldest tally is dropped", TALLY_CAPACITY)
        entry[1] = max(entry[1], now)
        for level, n in segments:
            entry[2][level] = entry[2].get(level, 0) + sign * n

    def settle(self, store) -> None:
        """Once the store answers: settle the requests in doubt, then write back what was served uncounted.

        Raises
        ------
        StoreUnavailable
            The store failed again; what is left waits for the next request.
        """
        while self.in_doubt:
            fp, token, served, segments = self.in_doubt[0]
            counted = store.resolve(fp, token, served=served)
            if counted and served and segments is not None:
                self.tally(fp, segments, sign=-1)  # it was counted after all: not an uncounted row
            self.in_doubt.pop(0)
        for _ in range(min(FLUSH_PER_REQUEST, len(self.uncounted))):
            fp, (first, last, queries) = next(iter(self.uncounted.items()))
            queries = {level: n for level, n in queries.items() if n > 0}
            if queries:
                store.add_uncounted(fp, process=process_name(), first=first, last=last, queries=queries)
            del self.uncounted[fp]

    def pending(self) -> bool:
        """Whether anything waits for :meth:`settle`: a request in doubt or a tally not yet written."""
        return bool(self.in_doubt or self.uncounted)
