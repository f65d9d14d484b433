"""A request's counting scripts in flight on Redis: an account's, and one per group it belongs to.

:class:`RedisRequests` is the part of :class:`~.redis_store.RedisStore` that
sends a counting script and reads its reply later (:meth:`_begin_write`, so
the caller draws the noise meanwhile), and counts a request for an account
and its campaign groups (:mod:`.groups`).

What is atomic with groups. A group is a ledger of its own, in its own hash
slot (:func:`.redis_keys.group_keys`); on a cluster it is usually on another
node than the account. A request with groups therefore runs one script per
account and per group, under one token, each sent on a connection to its
own slot's primary (one server or Sentinel: the same primary; a cluster:
whichever node holds the slot), all of them before any reply is read, so
the request costs one round trip on every topology. Each script is atomic
and runs at most once per token (a lost reply is retried with the token,
``wait=N`` is checked after each); together they are *not* one transaction:
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
from .redis_keys import GROUP_FLAGGED_PATTERN, GROUP_PATTERN, account_keys, members_key, tag_of
from .redis_scripts import SHAS, decision_of

log = logging.getLogger("caliber_core.throttle")


class NotReplicated(Exception):
    """WAIT saw fewer replicas than asked for within its timeout (the write is on the primary only)."""


class RedisRequests:
    """Sending counting scripts, and a request with groups (mixed into :class:`~.redis_store.RedisStore`)."""

    def _begin_write(self, script: str, keys, args, token: str):
        """Send a counting script (then WAIT, with ``wait``) to the primary of ``keys[0]``; ``finish()``
        reads its reply, running it again through :meth:`_counted_write` when it ran nothing or was lost."""
        try:
            pool = self._routes.node(keys[0]).connection_pool
            conn = pool.get_connection()
        except self._errors as exc:
            self._routes.refresh()
            raise self._fail(exc) from None
        commands = [("EVALSHA", SHAS[script], len(keys), *keys, *args)]
        if self.wait:
            commands.append(("WAIT", self.wait, self.wait_timeout_ms))

        def again(sent: bool):
            return self._counted_write(keys[0], script, keys, args, token, sent=sent)

        try:
            conn.send_packed_command(conn.pack_commands(commands))
        except self._errors:
            pool.release(conn)
            conn.disconnect()
            return lambda: again(True)

        def finish():
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
                return again(True)
            pool.release(conn)
            reply = replies[0]
            if isinstance(reply, (exceptions.NoScriptError, *self._redirected)):
                if not isinstance(reply, exceptions.NoScriptError):
                    self._routes.refresh(now=True)
                return again(False)  # it ran nothing: run it again
            if isinstance(reply, Exception):
                raise self._fail(reply, in_doubt=None) from None
            if self.wait and (isinstance(replies[1], Exception) or int(replies[1]) < self.wait):
                raise self._fail(NotReplicated(), in_doubt=token)
            return reply

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
        finishes = [self._begin_write(*calls[0], token)]  # the account's: nothing sent if it cannot connect
        for script, keys, args in calls[1:]:
            try:
                finishes.append(self._begin_write(script, keys, args, token))
            except StoreUnavailable:  # the account's is in flight: run this one (and retry it) when reading
                finishes.append(lambda s=script, k=keys, a=args: self._counted_write(k[0], s, k, a, token,
                                                                                     sent=False))

        def finish() -> list:
            replies, error = _read_all(finishes)
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
        from .redis_store import TOKEN_SECONDS

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


def _read_all(finishes) -> tuple:
    """Every reply (None where it failed) and the first error: each connection is read, none left out of step."""
    replies, error = [], None
    for finish in finishes:
        try:
            replies.append(finish())
        except StoreUnavailable as exc:
            replies.append(None)
            error = error or exc
    return replies, error
