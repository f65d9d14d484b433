"""The shared ledger store on Redis: one server, a Sentinel set or a cluster, for several serving replicas.

Each request is one Lua script (``RECORD_SCRIPT``) run by the server as a
single atomic step: the expiry check, the increment and any escalation
happen together, so concurrent replicas never lose an increment or escalate
an account twice. The script is the rule of
:func:`caliber_core.throttle.ledger.advance`, rewritten for Redis. Every key
a request touches carries the account's fingerprint as a hash tag
(:mod:`.redis_keys`), so on a Redis Cluster the script runs in one slot.
A group (:mod:`.groups`) is a ledger of its own in its own slot; a request
with groups runs one script per account and group (:mod:`.redis_requests`:
each atomic and exactly once, together not one transaction).

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

import json
import secrets
import time

from .groups import is_group_id
from .ledger import AccountState, Decision
from .ledger_store import StoreUnavailable
from .redis_keys import (ACCOUNT_PATTERN, FLAGGED_PATTERN, PREFIX, TOKEN_SECONDS, account_keys, reply_key,
                         scoped_key, tag_of, uncounted_key)
from .redis_requests import RedisRequests, NotReplicated
from .redis_routes import Routes
from .redis_scripts import SCRIPTS, SHAS, decision_of, event_of

__all__ = ["PREFIX", "RETRY_DELAYS", "TOKEN_SECONDS", "RedisStore"]

#: Waits before each retry of a request whose reply was lost (same token, so never counted twice).
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)


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


class RedisStore(RedisRequests):
    """The ledger on Redis (see the module docstring for the guarantees and failure behaviour).

    Implements :class:`~caliber_core.throttle.ledger_store.PipelinedLedgerStore`;
    its methods are documented there. Nothing is sent until the first call.
    :meth:`from_url` opens a store of any topology.

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
                 wait: int = 0, wait_timeout_ms: int = 100, _target=None):
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
        options = dict(socket_connect_timeout=connect_timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0),
                       decode_responses=False)
        if _target is not None:
            self._routes = Routes.for_target(_target, options)
        else:
            self._routes = Routes(options, client=redis.Redis(host=host, port=port, db=db, password=password,
                                                              username=username, **options))
        self._service = None if _target is None else _target.service
        self._layout_ok = False

    @classmethod
    def from_url(cls, url: str, **options) -> "RedisStore":
        """A store for any Redis URL (:mod:`.redis_urls`: one server, Sentinel or a cluster, ``wait=N``).

        Raises
        ------
        StoreURLError
            A malformed URL (one line, no password).
        """
        from .redis_urls import parse_redis_url

        return cls.from_target(parse_redis_url(url), **options)

    @classmethod
    def from_target(cls, target, **options) -> "RedisStore":
        """A store for a parsed URL (:func:`.redis_urls.parse_redis_url`); ``options`` as the class takes them."""
        return cls(url_for_messages=target.safe_url, wait=target.wait, wait_timeout_ms=target.wait_timeout_ms,
                   _target=target, **options)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _fail(self, exc, *, in_doubt: str | None = None) -> StoreUnavailable:
        from redis.sentinel import MasterNotFoundError

        if isinstance(exc, NotReplicated):
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

    def close(self) -> None:
        """See :meth:`LedgerStore.close <caliber_core.throttle.ledger_store.LedgerStore.close>`."""
        self._routes.close()

    def _reading(self, key: str, read):
        """Run ``read(client)`` on ``key``'s primary; a redirection reads the slot map and tries again."""
        delays = iter(RETRY_DELAYS)
        while True:
            try:
                return read(self._routes.node(key))
            except self._redirected as exc:
                self._routes.refresh(now=True)
                delay = next(delays, None)
                if delay is None:
                    raise self._fail(exc) from None
                time.sleep(delay)
            except self._errors as exc:
                if isinstance(exc, self._lost):
                    self._routes.refresh()
                raise self._fail(exc) from None

    def _check_layout(self) -> None:
        """Refuse a ledger still in the single-server layout of earlier versions (it would read as empty)."""
        from .redis_migrate import check_layout

        check_layout(self)
        self._layout_ok = True

    def ping(self) -> bool:
        """See :meth:`LedgerStore.ping <caliber_core.throttle.ledger_store.LedgerStore.ping>`.

        On a cluster every primary must answer. The first ping also checks the ledger's key layout.
        """
        try:
            answered = all(client.ping() for client in self._routes.primaries())
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
                raise NotReplicated()
            return reply
        raise self._redis.exceptions.NoScriptError("the script could not be loaded")

    def _counted_write(self, key: str, script: str, keys, args, token: str | None, *, sent: bool):
        """Run a counting script; once it may have run (``sent``), retry lost replies with the same token."""
        delays = iter(RETRY_DELAYS)
        asking = None
        while True:
            try:
                client = self._routes.node(key) if asking is None else asking
                return self._write(client, script, keys, args, asking=asking is not None)
            except NotReplicated as exc:
                raise self._fail(exc, in_doubt=token) from None  # counted on the primary, maybe lost with it
            except self._redis.exceptions.MovedError as exc:
                self._routes.refresh(now=True)
                asking, failure = None, exc
            except self._redis.exceptions.AskError as exc:
                asking, failure = self._routes.asked(exc), exc
            except self._redirected as exc:
                self._routes.refresh(now=True)
                asking, failure = None, exc
            except self._lost as exc:
                # A refused connection sent nothing; a lost reply leaves the request in doubt.
                sent = sent or not _refused(exc)
                self._routes.refresh()
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
        return decision_of(self._counted_write(keys[0], "record", keys, args, token, sent=sent), token)

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
        finish = self._begin_write([("record", self._keys(account, token), self._record_args(account, **request))],
                                   token)

        def finished() -> Decision:
            reply = finish()[0]
            if isinstance(reply, StoreUnavailable):
                raise reply
            return decision_of(reply, token)

        return finished

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
            history=tuple(event_of(e) for e in history))

    def accounts(self, *, flagged_only: bool = True) -> list[str]:
        """See :meth:`LedgerStore.accounts <caliber_core.throttle.ledger_store.LedgerStore.accounts>`.

        Scans every primary for the accounts' keys (``SCAN``, never a cross-slot command); groups are left out.
        """
        if not self._layout_ok:
            self._check_layout()
        pattern = FLAGGED_PATTERN if flagged_only else ACCOUNT_PATTERN
        try:
            found = {tag_of(k) for client in self._routes.primaries() for k in client.scan_iter(pattern, count=1000)}
        except self._errors as exc:
            raise self._fail(exc) from None
        return sorted(name for name in found if not is_group_id(name))
