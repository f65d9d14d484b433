"""A Throttle request with campaign groups (a card, an organisation): counted per account and per group.

:class:`GroupRequests` is the part of :class:`~caliber_core.throttle.throttle.Throttle`
that serves a request carrying group descriptors (:mod:`.groups`): the
descriptors are checked against the policy's group kinds, the store counts
one record per account and per group (one SQLite transaction, one pipelined
Redis round trip: :mod:`.sqlite_groups`, :mod:`.redis_requests`), and each
row is served the highest level of its account and its groups. It relies on
what ``Throttle`` sets up: ``policy``, ``store``, ``_now()``,
``_is_pipelined()`` and ``_remember()``.
"""

from __future__ import annotations

from .ledger import Decision, highest_segments, lifts
from .ledger_store import StoreUnavailable
from .outages import log


class GroupRequests:
    """Counting, merging and voiding a request with groups (mixed into ``Throttle``)."""

    def _begin_with_groups(self, fp: str, rows: int, kinds: tuple):
        """Send the count of the account and of each group now; ``finish()`` reads their Decisions, in order."""
        policy = self.policy
        store = self.store
        entries = [(fp, policy.escalate_after, policy.expire_after, None)]
        entries += [(name, kind.escalate_after, kind.expire_after, fp) for kind, name in kinds]
        request = dict(rows=rows, now=self._now(), top=policy.top, shadow=policy.shadow)
        if self._is_pipelined():
            return store.begin_record_request(entries, **request)
        counted = store.record_request(entries, **request)
        return lambda: counted

    def _merge(self, fp: str, kinds: tuple, decisions: list):
        """One Decision for a request with groups: each row at the highest level of its account and groups."""
        own, rest = decisions[0], decisions[1:]
        for (_, name), counted in zip((("", fp),) + kinds, decisions):
            self._remember(name, counted.state.level if counted.state.flagged else 0)
        return Decision(highest_segments(*(d.segments for d in decisions)),
                        own.events + tuple(e for d in rest for e in d.events), own.state, own.token,
                        groups=tuple((name, d) for (_, name), d in zip(kinds, rest)), own=own)

    def _kinds(self, groups) -> tuple:
        from .groups import check_groups

        return check_groups(self.policy, groups)

    def _take_back_raised(self, fp: str, own: Decision, decision: Decision) -> None:
        """A voided request: take back the rows a group served above the account's own level."""
        raised = lifts(own.segments, decision.segments)
        if raised:
            try:
                self.store.lift(fp, raised, token=own.token, sign=-1)
            except StoreUnavailable as exc:
                log.warning("ledger store unreachable (%s): a failed request's raised rows stay recorded", exc)
