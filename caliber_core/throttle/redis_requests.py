"""A request's counting scripts in flight on Redis: an account's, and one per group it belongs to.

:class:`RedisRequests` is the part of :class:`~.redis_store.RedisStore` that
sends a counting script and reads its reply later (:meth:`_begin_write`, so
the caller draws the noise meanwhile), and counts a request for an account
and its campaign groups (:mod:`.groups`).

What is atomic with groups. A group is a ledger of its own, in its own hash
slot (:func:`.redis_keys.group_keys`); on a cluster it is usually on another
node than the account. A request with groups therefore runs one script per
account and per group, under one token, sent per node: the scripts whose
slots one primary holds are pipelined on one connection to it (one server
or Sentinel: all of them; a cluster: one batch per node involved), every
batch before any reply is read, so the request costs one round trip on
every topology. Each script is atomic and runs at most once per token (a
lost reply is retried with the token, ``wait=N`` is checked after each);
together they are *not* one transaction:
another process may see a group counted a moment before the account, and a
failover may lose one script's write and not another's. A script that fails
for good leaves the whole request in doubt (``in_doubt``: the token), and
the Throttle settles the account and every group with
:meth:`~.redis_store.RedisStore.resolve`, so a request is never counted
twice nor half-voided once settled.

Rows a group served above the account's own level are added to the
account's record by a second script in the account's slot (``LIFT_SCRIPT``,
once per token), only when a group raised the level.
"""

from __future__ import annotations

import logging

from .ledger import highest_segments, lifts
from .ledger_store import StoreUnavailable
from .redis_keys import GROUP_FLAGGED_PATTERN, GROUP_PATTERN, TOKEN_SECONDS, account_keys, members_key, tag_of
from .redis_scripts import SHAS, decision_of

log = logging.getLogger("caliber_core.throttle")


class NotReplicated(Exception):
    """WAIT saw fewer replicas than asked for within its timeout (the write is on the primary only)."""


class RedisRequests:
    """Sending counting scripts, and a request with groups (mixed into :class:`~.redis_store.RedisStore`)."""

    def _begin_write(self, calls, token: str):
        """Send counting scripts, ``[(script, keys, args)]`` whose slots one primary holds (each followed by
        WAIT, with ``wait``), on one connection to it; ``finish()`` reads a reply per script, in order.

        A reply is the script's, or the StoreUnavailable it met (returned, not raised). A script that ran
        nothing (a server without it, a redirection) or whose reply was lost is run again through
        :meth:`_counted_write`, with the same token.
        """
        try:
            pool = self._routes.node(calls[0][1][0]).connection_pool
            conn = pool.get_connection()
        except self._errors as exc:
            self._routes.refresh()
            raise self._fail(exc) from None
        step = 2 if self.wait else 1
        commands = []
        for script, keys, args in calls:
            commands.append(("EVALSHA", SHAS[script], len(keys), *keys, *args))
            if self.wait:
                commands.append(("WAIT", self.wait, self.wait_timeout_ms))

        def again(call, sent: bool):
            try:
                return self._counted_write(call[1][0], *call, token, sent=sent)
            except StoreUnavailable as exc:
                return exc

        try:
            conn.send_packed_command(conn.pack_commands(commands))
        except self._errors:
            pool.release(conn)
            conn.disconnect()
            return lambda: [again(call, True) for call in calls]

        def finish() -> list:
            exceptions = self._redis.exceptions
            replies = []
            try:
                for _ in commands:
                    try:
                        replies.append(conn.read_response())
                    except exceptions.ResponseError as exc:  # an error reply: the connection stays in step
                        replies.append(exc)
            except self._errors:
                conn.disconnect()
                pool.release(conn)
                return [again(call, True) for call in calls]
            pool.release(conn)
            out = []
            for i, call in enumerate(calls):
                reply = replies[i * step]
                if isinstance(reply, (exceptions.NoScriptError, *self._redirected)):
                    if not isinstance(reply, exceptions.NoScriptError):
                        self._routes.refresh(now=True)
                    out.append(again(call, False))  # it ran nothing: run it again
                elif isinstance(reply, Exception):
                    out.append(self._fail(reply, in_doubt=None))
                elif self.wait and (isinstance(replies[i * step + 1], Exception)
                                    or int(replies[i * step + 1]) < self.wait):
                    out.append(self._fail(NotReplicated(), in_doubt=token))
                else:
                    out.append(reply)
            return out

        return finish

    def record_request(self, entries, *, rows: int, now: float, top: int, shadow: bool,
                       token: str | None = None) -> list:
        """Count one request for an account and its groups; one Decision per entry, in order.

        See :meth:`begin_record_request`; this sends and reads at once.
        """
        return self.begin_record_request(entries, rows=rows, now=now, top=top, shadow=shadow, token=token)()

    def begin_record_request(self, entries, *, rows: int, now: float, top: int, shadow: bool,
                             token: str | None = None):
        """Send one script per entry (account first, then its groups) now; ``finish()`` reads the Decisions.

        Parameters
        ----------
        entries : sequence of (str, int, float or None, str or None)
            ``(ledger name, escalate_after, expire_after, member)``: the account
            (member None), then each group with the account as its member.
        rows, now, top, shadow :
            As :meth:`~.redis_store.RedisStore.record` takes them.
        token : str, optional
            The request's token, shared by every entry (each keeps it in its own slot).

        Returns
        -------
        callable
            ``finish() -> list of Decision``.

        Raises
        ------
        StoreUnavailable
            From ``finish()`` (or at once, when nothing could be sent): ``in_doubt``
            is the token whenever any entry's script may have run.

        Notes
        -----
        See the module docstring: each entry is atomic and exactly once; the
        entries together are not one transaction.
        """
        if not self._layout_ok:
            self._check_layout()
        token = self.new_token() if token is None else token
        calls = []
        for name, escalate_after, expire_after, member in entries:
            args = self._record_args(name, now, rows, escalate_after, top, expire_after, shadow)
            keys = account_keys(name, token)
            calls.append(("record", keys, args) if member is None
                         else ("group_record", keys + [members_key(name)], args + [member]))
        # One connection per primary, the account's first; all sent before any reply is read.
        batches = {}
        for i, call in enumerate(calls):
            try:
                node = id(self._routes.node(call[1][0]))
            except self._errors:
                node = None  # _begin_write meets the error again
            batches.setdefault(node, []).append((i, call))
        batches = list(batches.values())
        finishes = [self._begin_write([c for _, c in batches[0]], token)]  # nothing sent if it cannot connect
        for batch in batches[1:]:
            try:
                finishes.append(self._begin_write([c for _, c in batch], token))
            except StoreUnavailable:  # the account's is in flight: run these (and retry them) when reading
                finishes.append(lambda b=batch: [self._counted_write(c[1][0], *c, token, sent=False)
                                                 for _, c in b])

        def finish() -> list:
            replies, error = _read_all(finishes, batches, len(calls))
            if error is not None:
                error.in_doubt = token  # the others may have counted: settle every entry
                raise error
            decisions = [decision_of(reply, token) for reply in replies]
            # What the account received above its own level: a second round trip, only when a group raised it.
            raised = {} if shadow else lifts(decisions[0].segments, highest_segments(*(d.segments for d in decisions)))
            if raised:
                try:
                    self.lift(entries[0][0], raised, token=token)
                except StoreUnavailable as exc:
                    log.warning("ledger store (%s): rows a group raised above an account's level were served but "
                                "not added to its record (the group's record has them)", exc)
            return decisions

        return finish

    def lift(self, account: str, raised: dict, *, token: str, sign: int = 1) -> None:
        """Add (``sign`` -1: take back) rows a group served above the account's own level, once per token.

        A lost reply is retried with the same token (the script marks it done in the account's slot).
        """
        keys = account_keys(account, token)
        mark = f"{keys[3]}:{'lift' if sign > 0 else 'unlift'}"
        args = [TOKEN_SECONDS]
        for (a, b), n in raised.items():
            args += [f"l:{a}:{b}", sign * int(n)]
        self._counted_write(keys[0], "lift", [keys[0], mark], args, None, sent=False)

    def groups(self, *, flagged_only: bool = True) -> list[str]:
        """The groups' ledger names (``g:<kind>:<hex>``), sorted; the flagged ones only by default.

        Scans every primary for the groups' flagged markers (or hashes), never a cross-slot command.
        """
        if not self._layout_ok:
            self._check_layout()
        pattern = GROUP_FLAGGED_PATTERN if flagged_only else GROUP_PATTERN
        try:
            return sorted({tag_of(k) for client in self._routes.primaries()
                           for k in client.scan_iter(pattern, count=1000)})
        except self._errors as exc:
            raise self._fail(exc) from None

    def members(self, group: str) -> dict:
        """The accounts seen in a group: ``{fingerprint: {"queries", "first_seen", "last_seen"}}``."""
        key = members_key(group)
        raw = self._reading(key, lambda client: client.hgetall(key))
        f = {k.decode(): v.decode() for k, v in raw.items()}
        return {a: {"queries": int(n), "first_seen": float(f.get(f"first:{a}", "nan")),
                    "last_seen": float(f.get(f"last:{a}", "nan"))}
                for a, n in sorted(f.items()) if ":" not in a}


def _read_all(finishes, batches, n: int) -> tuple:
    """Every reply in the entries' order (None where it failed) and the first error: each connection is
    read, none left out of step."""
    replies, error = [None] * n, None
    for finish, batch in zip(finishes, batches):
        try:
            out = finish()
        except StoreUnavailable as exc:
            out = [exc] * len(batch)
        for (i, _), reply in zip(batch, out):
            if isinstance(reply, StoreUnavailable):
                error = error or reply
            else:
                replies[i] = reply
    return replies, error
