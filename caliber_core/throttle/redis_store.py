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

When Redis cannot be reached the store raises
:class:`~caliber_core.throttle.stores.StoreUnavailable` at once: no retry
(a retried script whose reply was lost would count twice), short socket
timeouts. A request that failed is not counted. What ``respond`` then serves
is the policy's ``on_store_error``. Durability across a Redis restart is
Redis's own: run it with ``appendonly yes`` (the tests use ``appendfsync
always``); without persistence a restart empties the ledger and every
account starts again unflagged.
"""

from __future__ import annotations

from .ledger import AccountState, Decision, Event
from .store_errors import StoreUnavailable

PREFIX = "caliber:throttle:"

RECORD_SCRIPT = """
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
return out
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


def _event(text) -> Event:
    text = text.decode() if isinstance(text, bytes) else text
    at, event, level, reason = text.split("|", 3)
    return Event(float(at), event, int(level), reason)


class RedisStore:
    """The ledger on a Redis server (see the module docstring for the guarantees and failure behaviour)."""

    def __init__(self, *, host: str, port: int, db: int = 0, password=None, url_for_messages: str = "",
                 connect_timeout: float = 0.5, timeout: float = 2.0):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors = redis.exceptions.RedisError
        self.url = url_for_messages or f"redis://{host}:{port}/{db}"
        self._client = redis.Redis(host=host, port=port, db=db, password=password,
                                   socket_connect_timeout=connect_timeout, socket_timeout=timeout,
                                   retry=Retry(NoBackoff(), 0), decode_responses=False)
        self._record = self._client.register_script(RECORD_SCRIPT)
        self._flag = self._client.register_script(FLAG_SCRIPT)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _fail(self, exc) -> StoreUnavailable:
        return StoreUnavailable(f"redis store {self.url}: {type(exc).__name__}: {' '.join(str(exc).split())}")

    @staticmethod
    def _keys(account: str) -> list[str]:
        return [f"{PREFIX}a:{account}", f"{PREFIX}h:{account}", f"{PREFIX}flagged"]

    def close(self) -> None:
        self._client.close()

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except self._errors as exc:
            raise self._fail(exc) from None

    @staticmethod
    def _record_args(account, now, rows, escalate_after, top, expire_after, shadow) -> list:
        return [repr(float(now)), int(rows), int(escalate_after), int(top),
                -1 if expire_after is None else repr(float(expire_after)), "1" if shadow else "0", account]

    def record(self, account: str, *, rows: int, now: float, escalate_after: int, top: int,
               expire_after: float | None, shadow: bool) -> Decision:
        """Count one request atomically (one Lua script) and return its Decision (state: flag and level only)."""
        args = self._record_args(account, now, rows, escalate_after, top, expire_after, shadow)
        try:
            reply = self._record(keys=self._keys(account), args=args)
        except self._errors as exc:
            raise self._fail(exc) from None
        return self._decision(reply)

    def begin_record(self, account: str, **request):
        """Send the request's script now and return ``finish() -> Decision``, which reads the reply.

        The caller draws the noise while Redis runs the script, so the round
        trip overlaps the work it would otherwise add to. A script the server
        does not hold (after a restart) is loaded and run again inside ``finish``.
        """
        keys, args = self._keys(account), self._record_args(account, **request)
        pool = self._client.connection_pool
        try:
            conn = pool.get_connection()
        except self._errors as exc:
            raise self._fail(exc) from None
        try:
            conn.send_command("EVALSHA", self._record.sha, len(keys), *keys, *args)
        except self._errors as exc:
            pool.release(conn)
            raise self._fail(exc) from None

        def finish() -> Decision:
            import redis

            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                pool.release(conn)
                return self.record(account, **request)  # loads the script, then runs it once
            except self._errors as exc:
                pool.release(conn)
                raise self._fail(exc) from None
            pool.release(conn)
            return self._decision(reply)

        return finish

    @staticmethod
    def _decision(reply) -> Decision:
        flagged, level = bool(reply[0]), int(reply[1])
        rest = reply[2:]
        n_seg = sum(1 for x in rest if isinstance(x, int))
        segments = tuple((int(rest[i]), int(rest[i + 1])) for i in range(0, n_seg, 2))
        events = tuple(_event(e) for e in rest[n_seg:])
        return Decision(segments, events, AccountState(flagged=flagged, level=level))

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
        key, hist, _ = self._keys(account)
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.hgetall(key)
            pipe.lrange(hist, 0, -1)
            fields, history = pipe.execute()
        except self._errors as exc:
            raise self._fail(exc) from None
        if not fields:
            return None
        f = {k.decode(): v.decode() for k, v in fields.items()}
        queries = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("q:")}
        shadow = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("s:") and int(v)}
        flagged_at = f.get("flagged_at") or None
        return AccountState(
            flagged=f.get("flagged") == "1", level=int(f.get("level", 0)), reason=f.get("reason", ""),
            flagged_at=None if flagged_at is None else float(flagged_at), at_level=int(f.get("at_level", 0)),
            queries=queries, shadow=shadow,
            first_seen=float(f["first_seen"]) if f.get("first_seen") else None,
            last_seen=float(f["last_seen"]) if f.get("last_seen") else None,
            history=tuple(_event(e) for e in history))

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        try:
            if flagged_only:
                return sorted(m.decode() for m in self._client.smembers(f"{PREFIX}flagged"))
            return sorted(k.decode()[len(PREFIX) + 2:] for k in self._client.scan_iter(f"{PREFIX}a:*", count=1000))
        except self._errors as exc:
            raise self._fail(exc) from None
