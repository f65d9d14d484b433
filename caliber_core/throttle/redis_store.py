"""The shared ledger store on Redis: one server, a Sentinel set or a cluster, for several serving replicas.

Each request is one Lua script (``RECORD_SCRIPT``) run by the server as a
single atomic step: the expiry check, the increment and any escalation
happen together, so concurrent replicas never lose an increment or escalate
an account twice. The script is the rule of
:func:`caliber_core.throttle.ledger.advance`, rewritten for Redis. Every key
a request touches carries the account's fingerprint as a hash tag
(:mod:`.redis_keys`), so on a Redis Cluster the script runs in one slot.

Exactly once, across restarts and failovers. Every request carries a random
token, and the script keeps its reply under ``{<fp>}:r:<token>`` for ten minutes
(``TOKEN_SECONDS``): run again with the same token, it returns that reply
without counting again. The retry rule:

* a connection that cannot be made (Redis down, a primary not yet promoted,
  a wrong URL) fails at once, with
  :class:`~caliber_core.throttle.stores.StoreUnavailable`; nothing was sent,
  so nothing was counted;
* a cluster redirection (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``)
  ran nothing: the slot map is read again and the request retried;
* a request whose script was sent but whose reply was lost (Redis stopped or
  restarted mid-request, a timeout) is *in doubt*: it is retried with the
  same token on a new connection after 0.05, 0.1, 0.2, 0.4 and 0.8 s, so a
  retry never counts twice. If every retry fails, ``StoreUnavailable``
  carries the token (``in_doubt``), and the Throttle settles it once the
  store answers again with :meth:`RedisStore.resolve`: a request that was
  counted but whose caller was told it failed is moved from ``queries`` to
  ``failed``; a token that never ran is voided, so it can never run later;
* with ``wait=N`` in the URL, each counted write (record, flag, resolve) is
  followed by ``WAIT N T`` on the same connection; fewer than N replicas
  within T ms is a store error and the request is in doubt, settled as above.

A failover needs no restart: a Sentinel-managed connection asks the
sentinels for the primary at each new connection, and a cluster store reads
the slot map again after a redirection or a lost node.

What ``respond`` serves while the store is unreachable is the policy's
``on_store_error``. Durability across a Redis restart is Redis's own: run it
with ``appendonly yes`` (the tests use ``appendfsync always``); without
persistence a restart empties the ledger and every account starts again
unflagged. Across a failover it is the replicas': replication is
asynchronous, so without ``wait`` a count acknowledged just before the
primary died can be missing on the promoted replica.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time

from .ledger import AccountState, Decision, Event
from .ledger_store import StoreUnavailable
from .redis_keys import (ACCOUNT_PATTERN, FLAGGED_PATTERN, LAYOUT, LAYOUT_KEY, LEGACY_ACCOUNT_PATTERN,
                         LEGACY_FLAGGED, PREFIX, account_keys, reply_key, scoped_key, tag_of, uncounted_key)

__all__ = ["PREFIX", "RETRY_DELAYS", "TOKEN_SECONDS", "RedisStore"]

#: Waits before each retry of a request whose reply was lost (same token, so never counted twice).
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)
#: How long a request's reply is kept under its token: the window in which a retry or a resolve
#: finds it. One key per request lives this long (about 100 bytes each), so it is kept short; a
#: request still in doubt when it has expired is settled as not counted.
TOKEN_SECONDS = 600
#: Shortest time between two reads of a cluster's slot map (a failover sends every request to it).
REFRESH_SECONDS = 0.2

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
  redis.call('DEL', KEYS[3])
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
if flagged then redis.call('SET', KEYS[3], '1') else redis.call('DEL', KEYS[3]) end
return 1
"""



SCRIPTS = {"record": RECORD_SCRIPT, "resolve": RESOLVE_SCRIPT, "flag": FLAG_SCRIPT}
SHAS = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in SCRIPTS.items()}


class _NotReplicated(Exception):
    """WAIT saw fewer replicas than asked for within its timeout (the write is on the primary only)."""


def _event(text) -> Event:
    text = text.decode() if isinstance(text, bytes) else text
    at, event, level, reason = text.split("|", 3)
    return Event(float(at), event, int(level), reason)


def _uncounted(entry: dict) -> dict:
    return {"process": entry["process"], "first": entry["first"], "last": entry["last"],
            "queries": {int(k): int(v) for k, v in entry["queries"].items()}}


def _refused(exc) -> bool:
    """True when the connection was never made (nothing sent), from redis-py's error."""
    from redis.sentinel import MasterNotFoundError

    if isinstance(exc, MasterNotFoundError):
        return True
    text = str(exc)
    return "connecting to" in text or "Connection refused" in text or "Name or service not known" in text


class RedisStore:
    """The ledger on Redis (see the module docstring for the guarantees and failure behaviour).

    Implements :class:`~caliber_core.throttle.ledger_store.PipelinedLedgerStore`;
    its methods are documented there. Nothing is sent until the first call.
    :meth:`from_target` opens a Sentinel or cluster store.

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
    wait : int, optional
        Replicas each counted write waits for (``WAIT``); 0 (the default) waits for none.
    wait_timeout_ms : int, optional
        How long ``WAIT`` waits; fewer replicas by then is a store error.

    Raises
    ------
    ImportError
        redis-py is not installed (the ``redis`` extra).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 6379, db: int = 0, password=None,
                 username=None, url_for_messages: str = "", connect_timeout: float = 0.5, timeout: float = 2.0,
                 wait: int = 0, wait_timeout_ms: int = 100, _url: str | None = None, _client=None,
                 _cluster_options: dict | None = None):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis = redis
        self._errors = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
        self._lost = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        # Replies that ran nothing: the cluster sent the request elsewhere, or has no owner for the slot yet.
        self._redirected = (redis.exceptions.AskError, redis.exceptions.TryAgainError,
                            redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError)
        self.url = url_for_messages or f"redis://{host}:{port}/{db}"
        self.wait, self.wait_timeout_ms = int(wait), int(wait_timeout_ms)
        self._options = dict(socket_connect_timeout=connect_timeout, socket_timeout=timeout,
                             retry=Retry(NoBackoff(), 0), decode_responses=False)
        self._cluster, self._cluster_options, self._refreshed = None, _cluster_options, 0.0
        if _client is not None:
            self._client = _client
        elif _cluster_options is not None:
            self._client = None  # the cluster client is built at first use (building it contacts a node)
        elif _url is not None:  # redis-py's own URL parsing: percent-encoded user and password, TLS, sockets
            self._client = redis.Redis.from_url(_url, **self._options)
        else:
            self._client = redis.Redis(host=host, port=port, db=db, password=password, username=username,
                                       **self._options)
        self._layout_ok = False
        self._service = None

    @classmethod
    def from_url(cls, url: str, *, url_for_messages: str = "", **options) -> "RedisStore":
        """A store for one server's ``url``, read by redis-py's ``Redis.from_url`` (see :func:`.stores.open_store`).

        Parameters
        ----------
        url : str
            A ``redis://``, ``rediss://`` or ``unix://`` URL (percent-encoded user and password).
        url_for_messages : str, optional
            How messages name the store; default ``"redis store"`` (the URL may hold a password).
        **options
            ``connect_timeout``, ``timeout``, ``wait``, ``wait_timeout_ms``, as the class takes them.

        Returns
        -------
        RedisStore
        """
        return cls(url_for_messages=url_for_messages or "redis store", _url=url, **options)

    @classmethod
    def from_target(cls, target, **options) -> "RedisStore":
        """A store for a parsed URL of any topology (:func:`.redis_urls.parse_redis_url`).

        Parameters
        ----------
        target : RedisTarget
            One server, a Sentinel set (``redis.sentinel.Sentinel``) or a
            cluster (``redis.cluster.RedisCluster``).
        **options
            ``connect_timeout`` and ``timeout``, as the class takes them.

        Returns
        -------
        RedisStore
        """
        durability = dict(wait=target.wait, wait_timeout_ms=target.wait_timeout_ms)
        if target.topology == "server":
            return cls.from_url(target.server_url, url_for_messages=target.safe_url, **durability, **options)
        if target.topology == "cluster":
            from redis.cluster import ClusterNode

            cluster = dict(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes], username=target.username,
                           password=target.password, ssl=target.tls)
            return cls(url_for_messages=target.safe_url, _cluster_options=cluster, **durability, **options)
        from redis.sentinel import Sentinel

        store = cls(url_for_messages=target.safe_url, _client=False, **durability, **options)
        timeouts = {k: store._options[k] for k in ("socket_connect_timeout", "socket_timeout")}
        sentinel_auth = ({"password": target.sentinel_password} if target.sentinel_password is not None
                         else {"username": target.username, "password": target.password})
        sentinel = Sentinel(list(target.nodes), sentinel_kwargs=dict(ssl=target.tls, **sentinel_auth, **timeouts),
                            **timeouts)
        store._service = target.service
        store._client = sentinel.master_for(target.service, db=target.db, username=target.username,
                                            password=target.password, ssl=target.tls, **store._options)
        return store

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _fail(self, exc, *, in_doubt: str | None = None) -> StoreUnavailable:
        from redis.sentinel import MasterNotFoundError

        if isinstance(exc, _NotReplicated):
            text = f"fewer than {self.wait} replica(s) acknowledged the write within {self.wait_timeout_ms} ms"
        elif isinstance(exc, MasterNotFoundError):  # its own text holds the client's whole repr
            text = (f"MasterNotFoundError: no reachable sentinel names a primary for service {self._service!r} "
                    "(the sentinels are down, or do not know the service)")
        else:
            text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        error = StoreUnavailable(f"redis store {self.url}: {text}")
        error.in_doubt = in_doubt
        return error

    @staticmethod
    def _keys(account: str, token: str | None = None) -> list[str]:
        return account_keys(account, token)

    # ------------------------------------------------------------------ topology
    def _cluster_client(self):
        if self._cluster is None:
            from redis.cluster import RedisCluster

            # redis-py retries nothing itself: a redirection or a lost reply is this store's to retry (same token).
            self._cluster = RedisCluster(**self._cluster_options, **self._options)
            self._refreshed = time.monotonic()
        return self._cluster

    def _node(self, key: str):
        """The client of the primary that holds ``key`` (the one server, the Sentinel's primary, a cluster node)."""
        if self._cluster_options is None:
            return self._client
        cluster = self._cluster_client()
        return cluster.get_redis_connection(cluster.get_node_from_key(key))

    def _primaries(self) -> list:
        """A client per primary: one, or each of the cluster's."""
        if self._cluster_options is None:
            return [self._client]
        cluster = self._cluster_client()
        return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]

    def _refresh(self, *, now: bool = False) -> None:
        """Read a cluster's slot map again (at most every REFRESH_SECONDS unless ``now``): after a
        redirection or a lost node, so the next request goes to the slot's new primary."""
        if self._cluster is None or (not now and time.monotonic() - self._refreshed < REFRESH_SECONDS):
            return
        self._refreshed = time.monotonic()
        try:
            self._cluster.nodes_manager.initialize()
        except self._errors:
            pass  # no node answers yet: the next failure tries again

    def close(self) -> None:
        """See :meth:`LedgerStore.close <caliber_core.throttle.ledger_store.LedgerStore.close>`."""
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        elif self._client:
            self._client.close()

    def _ask(self, exc):
        """The client of the node an ``ASK`` redirection names (the slot is being moved there)."""
        cluster = self._cluster_client()
        node = cluster.get_node(host=exc.host, port=exc.port)
        if node is None:
            from redis.cluster import ClusterNode

            node = ClusterNode(exc.host, exc.port)
            cluster.nodes_manager.nodes_cache[node.name] = node
        return cluster.get_redis_connection(node)

    def _reading(self, key: str, read):
        """Run ``read(client)`` on ``key``'s primary; a redirection reads the slot map and tries again."""
        delays = iter(RETRY_DELAYS)
        while True:
            try:
                return read(self._node(key))
            except self._redirected as exc:
                self._refresh(now=True)
                delay = next(delays, None)
                if delay is None:
                    raise self._fail(exc) from None
                time.sleep(delay)
            except self._errors as exc:
                if isinstance(exc, self._lost):
                    self._refresh()
                raise self._fail(exc) from None

    def _check_layout(self) -> None:
        """Refuse a ledger still in the single-server layout of earlier versions (it would read as empty)."""
        def check(client):
            found = client.get(LAYOUT_KEY)
            if found is not None and found.decode() != LAYOUT:
                raise StoreUnavailable(f"redis store {self.url}: the ledger's key layout is {found.decode()!r}, "
                                       f"this version reads {LAYOUT!r}")
            return found is not None

        if not self._reading(LAYOUT_KEY, check):
            try:
                old = [next(client.scan_iter(LEGACY_ACCOUNT_PATTERN, count=1000), 0) for client in self._primaries()]
                if self._cluster_options is None:  # a cluster would answer MOVED: no slot holds this key's name
                    old.append(self._client.exists(LEGACY_FLAGGED))
            except self._errors as exc:
                raise self._fail(exc) from None
            if any(old):
                raise StoreUnavailable(
                    f"redis store {self.url}: the ledger is in the single-server key layout of an earlier version; "
                    "stop the servers that use it and run `caliber throttle migrate-store --store URL` once")
            self._reading(LAYOUT_KEY, lambda client: client.set(LAYOUT_KEY, LAYOUT, nx=True))
        self._layout_ok = True

    def ping(self) -> bool:
        """See :meth:`LedgerStore.ping <caliber_core.throttle.ledger_store.LedgerStore.ping>`.

        On a cluster every primary must answer. The first ping also checks the ledger's key layout.
        """
        try:
            answered = all(client.ping() for client in self._primaries())
        except self._errors as exc:
            raise self._fail(exc) from None
        if not self._layout_ok:
            self._check_layout()
        return answered

    # ------------------------------------------------------------------ writes
    def _write(self, client, script: str, keys, args, *, asking: bool = False):
        """EVALSHA (then WAIT, with ``wait``) on one connection: WAIT counts that connection's writes."""
        commands = [("EVALSHA", SHAS[script], len(keys), *keys, *args)]
        if asking:
            commands.insert(0, ("ASKING",))
        if self.wait:
            commands.append(("WAIT", self.wait, self.wait_timeout_ms))
        for _ in range(2):
            try:
                if len(commands) == 1:
                    return client.execute_command(*commands[0])
                pipe = client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                replies = pipe.execute()
            except self._redis.exceptions.NoScriptError:
                client.script_load(SCRIPTS[script])  # a restarted or newly promoted server: load it, run again
                continue
            reply = replies[1] if asking else replies[0]
            if self.wait and int(replies[-1]) < self.wait:
                raise _NotReplicated()
            return reply
        raise self._redis.exceptions.NoScriptError("the script could not be loaded")

    def _counted_write(self, key: str, script: str, keys, args, token: str | None, *, sent: bool):
        """Run a counting script; once it may have run (``sent``), retry lost replies with the same token."""
        delays = iter(RETRY_DELAYS)
        asking = None
        while True:
            try:
                client = self._node(key) if asking is None else asking
                return self._write(client, script, keys, args, asking=asking is not None)
            except _NotReplicated as exc:
                raise self._fail(exc, in_doubt=token) from None  # counted on the primary, maybe lost with it
            except self._redis.exceptions.MovedError as exc:
                self._refresh(now=True)
                asking, failure = None, exc
            except self._redis.exceptions.AskError as exc:
                asking, failure = self._ask(exc), exc
            except self._redirected as exc:
                self._refresh(now=True)
                asking, failure = None, exc
            except self._lost as exc:
                # A refused connection sent nothing; a lost reply leaves the request in doubt.
                sent = sent or not _refused(exc)
                self._refresh()
                asking, failure = None, exc
                if not sent:
                    raise self._fail(exc) from None
            except self._errors as exc:
                raise self._fail(exc, in_doubt=token if sent else None) from None
            delay = next(delays, None)
            if delay is None:
                raise self._fail(failure, in_doubt=token if sent else None) from None
            time.sleep(delay)

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
        if not self._layout_ok:
            self._check_layout()
        token = self.new_token() if token is None else token
        args = self._record_args(account, now, rows, escalate_after, top, expire_after, shadow)
        return self._run_record(self._keys(account, token), args, token, sent=False)

    def _run_record(self, keys, args, token: str, *, sent: bool) -> Decision:
        return self._decision(self._counted_write(keys[0], "record", keys, args, token, sent=sent), token)

    def begin_record(self, account: str, *, token: str | None = None, **request):
        """Send the request's script now and return ``finish() -> Decision``, which reads the reply.

        The caller draws the noise while Redis runs the script, so the round
        trip overlaps the work it would otherwise add to. A script the server
        does not hold (after a restart or a failover) and a cluster
        redirection are handled inside ``finish`` by running the request
        again; a lost reply is retried there with the same token.
        """
        if not self._layout_ok:
            self._check_layout()
        token = self.new_token() if token is None else token
        keys, args = self._keys(account, token), self._record_args(account, **request)
        try:
            pool = self._node(keys[0]).connection_pool
            conn = pool.get_connection()
        except self._errors as exc:
            self._refresh()
            raise self._fail(exc) from None
        commands = [("EVALSHA", SHAS["record"], len(keys), *keys, *args)]
        if self.wait:
            commands.append(("WAIT", self.wait, self.wait_timeout_ms))
        try:
            conn.send_packed_command(conn.pack_commands(commands))
        except self._errors:
            pool.release(conn)
            conn.disconnect()
            return lambda: self._run_record(keys, args, token, sent=True)

        def finish() -> Decision:
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
                return self._run_record(keys, args, token, sent=True)
            pool.release(conn)
            reply = replies[0]
            if isinstance(reply, (exceptions.NoScriptError, *self._redirected)):
                if not isinstance(reply, exceptions.NoScriptError):
                    self._refresh(now=True)
                return self._run_record(keys, args, token, sent=False)  # it ran nothing: run it again
            if isinstance(reply, Exception):
                raise self._fail(reply, in_doubt=None) from None
            if self.wait and (isinstance(replies[1], Exception) or int(replies[1]) < self.wait):
                raise self._fail(_NotReplicated(), in_doubt=token)
            return self._decision(reply, token)

        return finish

    def resolve(self, account: str, token: str, *, served: bool) -> bool:
        """Settle a request in doubt: True if it had been counted. One the caller was told failed
        (``served=False``) is moved from ``queries`` to ``failed``; one that never ran can no longer run."""
        if not self._layout_ok:
            self._check_layout()
        keys = [scoped_key(account, "a"), reply_key(account, token)]
        # Resolving twice gives the same answer, so a lost reply is retried as a record is.
        return bool(self._counted_write(keys[0], "resolve", keys, ["1" if served else "0", TOKEN_SECONDS], None,
                                        sent=False))

    def void(self, account: str, decision: Decision) -> None:
        """A counted request whose answer was not produced: its rows move from ``queries`` to ``failed``."""
        self.resolve(account, decision.token, served=False)

    def add_uncounted(self, account: str, *, process: str, first: float, last: float, queries: dict) -> None:
        """Record rows this process served while the store was unreachable (kept apart from ``queries``).

        Not followed by WAIT: a retry after a lost acknowledgement would write the entry twice.
        """
        if not self._layout_ok:
            self._check_layout()
        entry = json.dumps({"process": process, "first": first, "last": last,
                            "queries": {str(k): int(v) for k, v in sorted(queries.items())}})
        key = uncounted_key(account)
        self._reading(key, lambda client: client.rpush(key, entry))

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
        if not self._layout_ok:
            self._check_layout()
        keys = self._keys(account)
        args = ["1" if flagged else "0", int(level if flagged else 0), reason, repr(float(now)), account,
                -1 if expire_after is None else repr(float(expire_after))]
        # Setting a flag twice leaves the same state (one more history line at most): a lost reply is retried.
        self._counted_write(keys[0], "flag", keys, args, None, sent=False)
        return self.get(account)

    def get(self, account: str) -> AccountState | None:
        """See :meth:`LedgerStore.get <caliber_core.throttle.ledger_store.LedgerStore.get>`."""
        if not self._layout_ok:
            self._check_layout()
        key, hist, _ = self._keys(account)

        def read(client):
            pipe = client.pipeline(transaction=True)
            pipe.hgetall(key)
            pipe.lrange(hist, 0, -1)
            pipe.lrange(uncounted_key(account), 0, -1)
            return pipe.execute()

        fields, history, uncounted = self._reading(key, read)
        if not fields and not uncounted:
            return None
        f = {k.decode(): v.decode() for k, v in fields.items()}
        queries = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("q:")}
        shadow = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("s:") and int(v)}
        failed = {int(k[2:]): int(v) for k, v in f.items() if k.startswith("f:") and int(v)}
        flagged_at = f.get("flagged_at") or None
        return AccountState(
            flagged=f.get("flagged") == "1", level=int(f.get("level", 0)), reason=f.get("reason", ""),
            flagged_at=None if flagged_at is None else float(flagged_at), at_level=int(f.get("at_level", 0)),
            queries=queries, shadow=shadow, failed=failed,
            uncounted=tuple(_uncounted(json.loads(u)) for u in uncounted),
            first_seen=float(f["first_seen"]) if f.get("first_seen") else None,
            last_seen=float(f["last_seen"]) if f.get("last_seen") else None,
            history=tuple(_event(e) for e in history))

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """See :meth:`LedgerStore.accounts <caliber_core.throttle.ledger_store.LedgerStore.accounts>`.

        Scans every primary for the accounts' keys (``SCAN``, never a cross-slot command).
        """
        if not self._layout_ok:
            self._check_layout()
        pattern = FLAGGED_PATTERN if flagged_only else ACCOUNT_PATTERN
        try:
            found = {tag_of(k) for client in self._primaries() for k in client.scan_iter(pattern, count=1000)}
        except self._errors as exc:
            raise self._fail(exc) from None
        return sorted(found)
