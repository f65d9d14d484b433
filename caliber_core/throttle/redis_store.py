"""The shared ledger store, ``redis://HOST:PORT/DB``: one Redis server for several serving replicas.

Each request is one Lua script (``RECORD_SCRIPT``) run by the server as a
single atomic step: the expiry check, the increment and any escalation
happen together, so concurrent replicas never lose an increment or escalate
an account twice. The script is the rule of
:func:`caliber_core.throttle.ledger.advance`, rewritten for Redis.

Keys (``caliber:throttle:`` prefix): ``a:<fingerprint>`` a hash of the
account's fields and per-level counts (``q:<level>``, ``s:<level>`` for
shadow), ``h:<fingerprint>`` its history (a list), ``flagged`` the set of
flagged fingerprints.

Groups (:mod:`.groups`) are kept apart, each in its own hash slot (a Redis
Cluster keeps a group's keys on one node): ``{g:<kind>:<fingerprint>}:a``,
``:h``, ``:u``, ``:r:<token>`` as for an account, ``:m`` the accounts seen in
it (rows, first and last time) and ``:f`` its own flagged marker. All of them
come from :func:`group_keys`. A request with groups runs one script per
account and per group, pipelined on one connection (one round trip) and
under one token: each is atomic and exactly once on its own; together they
are not one transaction (see :meth:`RedisStore.record_request`).

Exactly once, across restarts. Every request carries a random token, and
the script keeps its reply under ``r:<token>`` for ten minutes (``TOKEN_SECONDS``): run again with the
same token, it returns that reply without counting again. The retry rule:

* a connection that cannot be made (Redis down, a wrong URL) fails at once,
  with :class:`~caliber_core.throttle.stores.StoreUnavailable`; nothing was
  sent, so nothing was counted;
* a request whose script was sent but whose reply was lost (Redis stopped or
  restarted mid-request, a timeout) is *in doubt*: it is retried with the
  same token on a new connection after 0.05, 0.1, 0.2, 0.4 and 0.8 s, so a
  retry never counts twice. If every retry fails, ``StoreUnavailable``
  carries the token (``in_doubt``), and the Throttle settles it once the
  store answers again with :meth:`RedisStore.resolve`: a request that was
  counted but whose caller was told it failed is moved from ``queries`` to
  ``failed``; a token that never ran is voided, so it can never run later.

What ``respond`` serves while the store is unreachable is the policy's
``on_store_error``. Durability across a Redis restart is Redis's own: run it
with ``appendonly yes`` (the tests use ``appendfsync always``); without
persistence a restart empties the ledger and every account starts again
unflagged.
"""

from __future__ import annotations

import json
import secrets
import time

from .ledger import AccountState, Decision, Event, highest_segments, lifts
from .groups import is_group_id
from .ledger_store import StoreUnavailable

PREFIX = "caliber:throttle:"
#: Waits before each retry of a request whose reply was lost (same token, so never counted twice).
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)
#: How long a request's reply is kept under its token: the window in which a retry or a resolve
#: finds it. One key per request lives this long (about 100 bytes each), so it is kept short; a
#: request still in doubt when it has expired is settled as not counted.
TOKEN_SECONDS = 600

RECORD_SCRIPT = """
local done = redis.call('GET', KEYS[4])
if done == 'void' or done == 'voided' then return {-1} end
if done then return cjson.decode(done) end
local now = tonumber(ARGV[1]); local rows = tonumber(ARGV[2]); local after = tonumber(ARGV[3])
local top = tonumber(ARGV[4]); local expire = tonumber(ARGV[5]); local shadow = ARGV[6] == '1'
local s = redis.call('HMGET', KEYS[1], 'flagged', 'level', 'at_level', 'flagged_at', 'reason', 'first_seen')
local flagged = s[1] == '1'
local level = tonumber(s[2] or '0'); local at_level = tonumber(s[3] or '0')
local flagged_at = s[4] or ''; local reason = s[5] or ''
local events = {}
if flagged and expire >= 0 and flagged_at ~= '' and now >= tonumber(flagged_at) + expire then
  flagged = false; level = 0; at_level = 0; flagged_at = ''
  table.insert(events, ARGV[1] .. '|expired|0|' .. reason)
  redis.call('SREM', KEYS[3], ARGV[7])
end
local out = {}
local remaining = rows
while remaining > 0 do
  if flagged and level < top and at_level >= after then
    level = level + 1; at_level = 0
    table.insert(events, ARGV[1] .. '|escalated|' .. level .. '|' .. reason)
  else
    local take = remaining
    if flagged and level < top then take = math.min(remaining, after - at_level) end
    table.insert(out, level); table.insert(out, take)
    redis.call('HINCRBY', KEYS[1], 'q:' .. level, take)
    if shadow and level > 0 then redis.call('HINCRBY', KEYS[1], 's:' .. level, take) end
    if flagged then at_level = at_level + take end
    remaining = remaining - take
  end
end
if flagged and level < top and at_level >= after then
  level = level + 1; at_level = 0
  table.insert(events, ARGV[1] .. '|escalated|' .. level .. '|' .. reason)
end
if not flagged then reason = '' end
redis.call('HSET', KEYS[1], 'flagged', flagged and '1' or '0', 'level', level, 'at_level', at_level,
           'flagged_at', flagged_at, 'reason', reason, 'last_seen', ARGV[1])
if not s[6] then redis.call('HSET', KEYS[1], 'first_seen', ARGV[1]) end
for _, e in ipairs(events) do redis.call('RPUSH', KEYS[2], e) end
table.insert(out, 1, flagged and 1 or 0)
table.insert(out, 2, level)
for _, e in ipairs(events) do table.insert(out, e) end
redis.call('SET', KEYS[4], cjson.encode(out), 'EX', tonumber(ARGV[8]))
return out
"""

# Settle a request in doubt (or void a counted one whose answer failed). ARGV[1]: '1' the caller
# was served, '0' it was told the request failed. Returns 1 if the request had been counted.
# The record script for a group: the same rule, and the member's rows under the same token (KEYS[5], ARGV[9]).
_MEMBER_LINES = """
redis.call('HINCRBY', KEYS[5], ARGV[9], rows)
redis.call('HSETNX', KEYS[5], 'first:' .. ARGV[9], ARGV[1])
redis.call('HSET', KEYS[5], 'last:' .. ARGV[9], ARGV[1])
"""
_REPLY_LINE = "redis.call('SET', KEYS[4], cjson.encode(out), 'EX', tonumber(ARGV[8]))"
GROUP_RECORD_SCRIPT = RECORD_SCRIPT.replace(_REPLY_LINE, _MEMBER_LINES.strip() + "\n" + _REPLY_LINE)
assert GROUP_RECORD_SCRIPT != RECORD_SCRIPT

# Rows a request's groups served above its account's own level, once per token (KEYS[2] marks it done).
# ARGV: seconds to keep the mark, then (field, rows) pairs 'l:<own>:<served>'.
LIFT_SCRIPT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], tonumber(ARGV[i + 1])) end
return 1
"""

RESOLVE_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if not done then redis.call('SET', KEYS[2], 'void', 'EX', tonumber(ARGV[2])) return 0 end
if done == 'void' then return 0 end
if done == 'voided' then return 1 end
if ARGV[1] == '0' then
  local out = cjson.decode(done)
  local i = 3
  while i < #out and type(out[i]) == 'number' and type(out[i + 1]) == 'number' do
    redis.call('HINCRBY', KEYS[1], 'q:' .. out[i], -out[i + 1])
    redis.call('HINCRBY', KEYS[1], 'f:' .. out[i], out[i + 1])
    i = i + 2
  end
  redis.call('SET', KEYS[2], 'voided', 'EX', tonumber(ARGV[2]))
end
return 1
"""

FLAG_SCRIPT = """
local flagged = ARGV[1] == '1'
local s = redis.call('HMGET', KEYS[1], 'flagged', 'flagged_at', 'reason')
local expire = tonumber(ARGV[6])
if s[1] == '1' and expire >= 0 and s[2] and s[2] ~= '' and tonumber(ARGV[4]) >= tonumber(s[2]) + expire then
  redis.call('RPUSH', KEYS[2], ARGV[4] .. '|expired|0|' .. (s[3] or ''))
end
redis.call('HSET', KEYS[1], 'flagged', ARGV[1], 'level', ARGV[2], 'at_level', 0,
           'flagged_at', flagged and ARGV[4] or '', 'reason', flagged and ARGV[3] or '')
redis.call('RPUSH', KEYS[2], ARGV[4] .. '|' .. (flagged and 'flagged' or 'unflagged') .. '|' .. ARGV[2] .. '|' .. ARGV[3])
if flagged then redis.call('SADD', KEYS[3], ARGV[5]) else redis.call('SREM', KEYS[3], ARGV[5]) end
return 1
"""


def group_keys(group: str, token: str | None = None) -> list[str]:
    """A group's keys, all in the group's own hash slot: record, history, flagged marker[, reply], members, uncounted.

    Parameters
    ----------
    group : str
        The group's ledger name (``g:<kind>:<hex>``, :func:`.groups.group_fingerprint`).
    token : str, optional
        A request's token: its reply key is added fourth.

    Returns
    -------
    list of str
        ``[a, h, f]`` (+ ``[r:<token>]``) + ``[m, u]``.
    """
    tag = f"{PREFIX}{{{group}}}:"
    keys = [f"{tag}a", f"{tag}h", f"{tag}f"]
    if token is not None:
        keys.append(f"{tag}r:{token}")
    return keys + [f"{tag}m", f"{tag}u"]


def _event(text) -> Event:
    text = text.decode() if isinstance(text, bytes) else text
    at, event, level, reason = text.split("|", 3)
    return Event(float(at), event, int(level), reason)


def _uncounted(entry: dict) -> dict:
    return {"process": entry["process"], "first": entry["first"], "last": entry["last"],
            "queries": {int(k): int(v) for k, v in entry["queries"].items()}}


def _refused(exc) -> bool:
    """True when the connection was never made (nothing sent), from redis-py's message."""
    text = str(exc)
    return "connecting to" in text or "Connection refused" in text or "Name or service not known" in text


class RedisStore:
    """The ledger on a Redis server (see the module docstring for the guarantees and failure behaviour).

    Implements :class:`~caliber_core.throttle.ledger_store.PipelinedLedgerStore`;
    its methods are documented there. Nothing is sent until the first call.

    Parameters
    ----------
    host, port, db : optional
        The server and database.
    password, username : str, optional
        Credentials (never shown in messages).
    url_for_messages : str, optional
        How messages name the store (default: ``redis://host:port/db``).
    connect_timeout, timeout : float, optional
        Seconds to connect, and to wait for a reply; a request is not retried by redis-py.

    Raises
    ------
    ImportError
        redis-py is not installed (the ``redis`` extra).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 6379, db: int = 0, password=None,
                 username=None, url_for_messages: str = "", connect_timeout: float = 0.5, timeout: float = 2.0,
                 _url: str | None = None):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors = redis.exceptions.RedisError
        self.url = url_for_messages or f"redis://{host}:{port}/{db}"
        options = dict(socket_connect_timeout=connect_timeout, socket_timeout=timeout,
                       retry=Retry(NoBackoff(), 0), decode_responses=False)
        if _url is not None:  # redis-py's own URL parsing: percent-encoded user and password, TLS, sockets
            self._client = redis.Redis.from_url(_url, **options)
        else:
            self._client = redis.Redis(host=host, port=port, db=db, password=password, username=username,
                                       **options)
        self._record = self._client.register_script(RECORD_SCRIPT)
        self._group_record = self._client.register_script(GROUP_RECORD_SCRIPT)
        self._flag = self._client.register_script(FLAG_SCRIPT)
        self._resolve = self._client.register_script(RESOLVE_SCRIPT)
        self._lift = self._client.register_script(LIFT_SCRIPT)
        self._lost = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    @classmethod
    def from_url(cls, url: str, *, url_for_messages: str = "", **options) -> "RedisStore":
        """A store for ``url``, read by redis-py's ``Redis.from_url`` (see :func:`.stores.open_store`).

        Parameters
        ----------
        url : str
            A ``redis://``, ``rediss://`` or ``unix://`` URL (percent-encoded user and password).
        url_for_messages : str, optional
            How messages name the store; default ``"redis store"`` (the URL may hold a password).
        **options
            ``connect_timeout`` and ``timeout``, as the class takes them.

        Returns
        -------
        RedisStore
        """
        return cls(url_for_messages=url_for_messages or "redis store", _url=url, **options)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _fail(self, exc, *, in_doubt: str | None = None) -> StoreUnavailable:
        error = StoreUnavailable(f"redis store {self.url}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        error.in_doubt = in_doubt
        return error

    @staticmethod
    def _keys(account: str, token: str | None = None) -> list[str]:
        if is_group_id(account):
            return group_keys(account, token)[:4 if token is not None else 3]
        keys = [f"{PREFIX}a:{account}", f"{PREFIX}h:{account}", f"{PREFIX}flagged"]
        return keys if token is None else keys + [f"{PREFIX}r:{token}"]

    @staticmethod
    def _uncounted_key(name: str) -> str:
        return group_keys(name)[-1] if is_group_id(name) else f"{PREFIX}u:{name}"

    def close(self) -> None:
        """See :meth:`LedgerStore.close <caliber_core.throttle.ledger_store.LedgerStore.close>`."""
        self._client.close()

    def ping(self) -> bool:
        """See :meth:`LedgerStore.ping <caliber_core.throttle.ledger_store.LedgerStore.ping>`."""
        try:
            return bool(self._client.ping())
        except self._errors as exc:
            raise self._fail(exc) from None

    @staticmethod
    def _record_args(account, now, rows, escalate_after, top, expire_after, shadow) -> list:
        return [repr(float(now)), int(rows), int(escalate_after), int(top),
                -1 if expire_after is None else repr(float(expire_after)), "1" if shadow else "0", account,
                TOKEN_SECONDS]

    @staticmethod
    def new_token() -> str:
        """A request's token: 128 random bits, so two requests never share one."""
        return secrets.token_hex(16)

    def record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
               expire_after: float | None, shadow: bool, token: str | None = None) -> Decision:
        """Count one request atomically (one Lua script) and return its Decision (state: flag and level only).

        A lost reply is retried with the same token (see the module docstring).
        """
        token = self.new_token() if token is None else token
        args = self._record_args(account, now, rows, escalate_after, top, expire_after, shadow)
        return self._run_record(self._keys(account, token), args, token, sent=False)

    def _run_record(self, keys, args, token: str, *, sent: bool, script=None) -> Decision:
        """Run the script; once it may have run (``sent``), retry lost replies with the same token."""
        script = self._record if script is None else script
        delays = iter(RETRY_DELAYS)
        while True:
            try:
                return self._decision(script(keys=keys, args=args), token)
            except self._lost as exc:
                # A refused connection sent nothing; a lost reply leaves the request in doubt.
                sent = sent or not _refused(exc)
                delay = next(delays, None) if sent else None
                if delay is None:
                    raise self._fail(exc, in_doubt=token if sent else None) from None
                time.sleep(delay)
            except self._errors as exc:
                raise self._fail(exc, in_doubt=token if sent else None) from None

    def begin_record(self, account: str, *, token: str | None = None, **request):
        """Send the request's script now and return ``finish() -> Decision``, which reads the reply.

        The caller draws the noise while Redis runs the script, so the round
        trip overlaps the work it would otherwise add to. A script the server
        does not hold (after a restart) is loaded and run again inside
        ``finish``; a lost reply is retried there with the same token.
        """
        token = self.new_token() if token is None else token
        keys, args = self._keys(account, token), self._record_args(account, **request)
        pool = self._client.connection_pool
        try:
            conn = pool.get_connection()
        except self._errors as exc:
            raise self._fail(exc) from None
        try:
            conn.send_command("EVALSHA", self._record.sha, len(keys), *keys, *args)
        except self._errors:
            pool.release(conn)
            conn.disconnect()
            return lambda: self._run_record(keys, args, token, sent=True)

        def finish() -> Decision:
            import redis

            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                pool.release(conn)
                return self._run_record(keys, args, token, sent=False)  # loads the script, then runs it
            except self._errors:
                conn.disconnect()
                pool.release(conn)
                return self._run_record(keys, args, token, sent=True)
            pool.release(conn)
            return self._decision(reply, token)

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
            As :meth:`record` takes them.
        token : str, optional
            The request's token, shared by every entry (each keeps it in its own slot).

        Returns
        -------
        callable
            ``finish() -> list of Decision``.

        Notes
        -----
        Each entry's script is atomic and runs at most once per token; the
        scripts of one request are pipelined, not one transaction. A reply
        lost for any of them is retried with the same token (never counted
        twice); if one still fails, :class:`StoreUnavailable` carries the token
        (``in_doubt``) and the caller settles every entry with :meth:`resolve`
        (those counted are voided unless the request was served). Another
        process may therefore see a group counted a moment before the account,
        never a request counted twice or half-voided once settled.
        """
        token = self.new_token() if token is None else token
        calls = []
        for name, escalate_after, expire_after, member in entries:
            args = self._record_args(name, now, rows, escalate_after, top, expire_after, shadow)
            if member is None:
                calls.append((self._record, self._keys(name, token), args))
            else:
                calls.append((self._group_record, group_keys(name, token)[:5], args + [member]))
        pool = self._client.connection_pool
        try:
            conn = pool.get_connection()
        except self._errors as exc:
            raise self._fail(exc) from None

        def one_by_one(sent: bool) -> list:
            return with_lifts([self._run_record(keys, args, token, sent=sent, script=script)
                               for script, keys, args in calls])

        def with_lifts(decisions: list) -> list:
            # What the account received above its own level: a second round trip, only when a group raised it.
            raised = {} if shadow else lifts(decisions[0].segments, highest_segments(*(d.segments for d in decisions)))
            if raised:
                try:
                    self.lift(entries[0][0], raised, token=token)
                except StoreUnavailable as exc:
                    import logging

                    logging.getLogger("caliber_core.throttle").warning(
                        "ledger store (%s): rows a group raised above an account's level were served but not "
                        "added to its record (the group's record has them)", exc)
            return decisions

        try:
            conn.send_packed_command(conn.pack_commands(
                [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]))
        except self._errors:
            pool.release(conn)
            conn.disconnect()
            return lambda: one_by_one(True)

        def finish() -> list:
            replies = []
            try:
                for _ in calls:
                    replies.append(conn.read_response())
            except self._errors:
                # A script the server lost (NoScriptError after a restart) or a lost reply: run each
                # again with the same token; the ones that ran return their kept reply.
                conn.disconnect()
                pool.release(conn)
                return one_by_one(True)
            pool.release(conn)
            return with_lifts([self._decision(reply, token) for reply in replies])

        return finish

    def lift(self, account: str, raised: dict, *, token: str, sign: int = 1) -> None:
        """Add (``sign`` -1: take back) rows a group served above the account's own level, once per token.

        A lost reply is retried with the same token (the script marks it done in the account's slot).
        """
        keys = self._keys(account, token)
        mark = f"{keys[3]}:{'lift' if sign > 0 else 'unlift'}"
        args = [TOKEN_SECONDS]
        for (a, b), n in raised.items():
            args += [f"l:{a}:{b}", sign * int(n)]
        delays = iter(RETRY_DELAYS)
        while True:
            try:
                self._lift(keys=[keys[0], mark], args=args)
                return
            except self._lost as exc:
                delay = next(delays, None)
                if delay is None:
                    raise self._fail(exc) from None
                time.sleep(delay)
            except self._errors as exc:
                raise self._fail(exc) from None

    def resolve(self, account: str, token: str, *, served: bool) -> bool:
        """Settle a request in doubt: True if it had been counted. One the caller was told failed
        (``served=False``) is moved from ``queries`` to ``failed``; one that never ran can no longer run."""
        try:
            keys = self._keys(account, token)
            return bool(self._resolve(keys=[keys[0], keys[3]],
                                      args=["1" if served else "0", TOKEN_SECONDS]))
        except self._errors as exc:
            raise self._fail(exc) from None

    def void(self, account: str, decision: Decision) -> None:
        """A counted request whose answer was not produced: its rows move from ``queries`` to ``failed``."""
        self.resolve(account, decision.token, served=False)

    def add_uncounted(self, account: str, *, process: str, first: float, last: float, queries: dict) -> None:
        """Record rows this process served while the store was unreachable (kept apart from ``queries``)."""
        entry = json.dumps({"process": process, "first": first, "last": last,
                            "queries": {str(k): int(v) for k, v in sorted(queries.items())}})
        try:
            self._client.rpush(self._uncounted_key(account), entry)
        except self._errors as exc:
            raise self._fail(exc) from None

    @staticmethod
    def _decision(reply, token: str | None = None) -> Decision:
        if int(reply[0]) == -1:
            raise StoreUnavailable("redis store: this request's token was voided while it was in doubt")
        flagged, level = bool(reply[0]), int(reply[1])
        rest = reply[2:]
        n_seg = sum(1 for x in rest if isinstance(x, int))
        segments = tuple((int(rest[i]), int(rest[i + 1])) for i in range(0, n_seg, 2))
        events = tuple(_event(e) for e in rest[n_seg:])
        return Decision(segments, events, AccountState(flagged=flagged, level=level), token=token)

    def set_flag(self, account: str, *, flagged: bool, level: int, reason: str, now: float,
                 expire_after: float | None = None) -> AccountState:
        """Flag at ``level`` or unflag, atomically; an ``expired`` event first when the old flag had lapsed."""
        try:
            self._flag(keys=self._keys(account),
                       args=["1" if flagged else "0", int(level if flagged else 0), reason, repr(float(now)), account,
                             -1 if expire_after is None else repr(float(expire_after))])
        except self._errors as exc:
            raise self._fail(exc) from None
        return self.get(account)

    def get(self, account: str) -> AccountState | None:
        """See :meth:`LedgerStore.get <caliber_core.throttle.ledger_store.LedgerStore.get>`."""
        key, hist, _ = self._keys(account)
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.hgetall(key)
            pipe.lrange(hist, 0, -1)
            pipe.lrange(self._uncounted_key(account), 0, -1)
            fields, history, uncounted = pipe.execute()
        except self._errors as exc:
            raise self._fail(exc) from None
        if not fields and not uncounted:
            return None
        f = {k.decode(): v.decode() for k, v in fields.items()}
        queries = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("q:")}
        shadow = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("s:") and int(v)}
        failed = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("f:") and int(v)}
        lifted = {(int(k.split(":")[1]), int(k.split(":")[2])): int(v) for k, v in f.items()
                  if k.startswith("l:") and int(v)}
        flagged_at = f.get("flagged_at") or None
        return AccountState(
            flagged=f.get("flagged") == "1", level=int(f.get("level", 0)), reason=f.get("reason", ""),
            flagged_at=None if flagged_at is None else float(flagged_at), at_level=int(f.get("at_level", 0)),
            queries=queries, shadow=shadow, failed=failed, lifted=lifted,
            uncounted=tuple(_uncounted(json.loads(u)) for u in uncounted),
            first_seen=float(f["first_seen"]) if f.get("first_seen") else None,
            last_seen=float(f["last_seen"]) if f.get("last_seen") else None,
            history=tuple(_event(e) for e in history))

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """See :meth:`LedgerStore.accounts <caliber_core.throttle.ledger_store.LedgerStore.accounts>`."""
        try:
            if flagged_only:
                return sorted(m.decode() for m in self._client.smembers(f"{PREFIX}flagged"))
            return sorted(k.decode()[len(PREFIX) + 2:] for k in self._client.scan_iter(f"{PREFIX}a:*", count=1000))
        except self._errors as exc:
            raise self._fail(exc) from None

    def groups(self, *, flagged_only: bool = True) -> list[str]:
        """The groups' ledger names (``g:<kind>:<hex>``), sorted; the flagged ones only by default."""
        try:
            names = sorted(k.decode()[len(PREFIX) + 1:-3]
                           for k in self._client.scan_iter(f"{PREFIX}{{g:*}}:a", count=1000))
            if not flagged_only or not names:
                return names
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.hget(group_keys(name)[0], "flagged")
            return [n for n, f in zip(names, pipe.execute()) if f == b"1"]
        except self._errors as exc:
            raise self._fail(exc) from None

    def members(self, group: str) -> dict:
        """The accounts seen in a group: ``{fingerprint: {"queries", "first_seen", "last_seen"}}``."""
        try:
            raw = self._client.hgetall(group_keys(group)[3])
        except self._errors as exc:
            raise self._fail(exc) from None
        f = {k.decode(): v.decode() for k, v in raw.items()}
        return {a: {"queries": int(n), "first_seen": float(f.get(f"first:{a}", "nan")),
                    "last_seen": float(f.get(f"last:{a}", "nan"))}
                for a, n in sorted(f.items()) if ":" not in a}
