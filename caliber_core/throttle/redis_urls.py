"""Reading a Redis store URL: one server, a Sentinel set or a cluster, and the durability asked of it.

* ``redis://``, ``rediss://``, ``unix://``: one server, read by redis-py's ``Redis.from_url``.
* ``redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``
  (``rediss+sentinel://`` for TLS): the sentinels, and the service whose
  primary they name. The password is the primary's and, unless
  ``sentinel_password`` says otherwise, the sentinels'.
* ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]``
  (``rediss+cluster://`` for TLS): any reachable nodes of a Redis Cluster.

On every form, ``wait=N`` asks for ``WAIT N T`` after each counted write
(``wait_timeout_ms=T``, default 100). A malformed URL is one
:class:`~caliber_core.throttle.ledger_store.StoreURLError` line that never
shows the user or a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from .ledger_store import StoreURLError

SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SERVER_SCHEMES = ("redis://", "rediss://", "unix://")
#: ``wait_timeout_ms`` when the URL asks for ``wait`` without one.
DEFAULT_WAIT_TIMEOUT_MS = 100
MAX_WAIT = 64
MAX_WAIT_TIMEOUT_MS = 60_000
_DURABILITY = ("wait", "wait_timeout_ms")


@dataclass(frozen=True)
class RedisTarget:
    """What a Redis store URL names.

    Attributes
    ----------
    topology : {"server", "sentinel", "cluster"}
    safe_url : str
        The URL for messages: no user, no password.
    server_url : str or None
        For ``server``: the URL redis-py reads (durability parameters removed).
    nodes : tuple of (str, int)
        Sentinels (``sentinel``) or startup nodes (``cluster``).
    service : str or None
        The Sentinel service name.
    db : int
    username, password, sentinel_password : str or None
    tls : bool
    wait : int
        Replicas each counted write waits for (0: none).
    wait_timeout_ms : int
    """

    topology: str
    safe_url: str
    server_url: str | None = None
    nodes: tuple = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    tls: bool = False
    wait: int = 0
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    def __repr__(self) -> str:
        return f"RedisTarget({self.safe_url!r})"  # never a password


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis store of any topology."""
    return url.startswith(SERVER_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES)


def safe_url(url: str) -> str:
    """``url`` without its user, password or any ``*password*`` parameter, for messages.

    Parameters
    ----------
    url : str

    Returns
    -------
    str
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, hash_sep, _ = rest.partition("#")
    rest, q_sep, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rsplit("@", 1)[-1]
    if q_sep:
        pairs = [(k, "***" if "password" in k.lower() else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        query = urlencode(pairs, safe="*")
    return f"{scheme}://{netloc}{slash}{path}{q_sep}{query}"


def _int_param(params: dict, name: str, low: int, high: int, default: int, safe: str) -> int:
    text = params.pop(name, None)
    if text is None:
        return default
    if not text.isdigit() or len(text) > 6 or not low <= int(text) <= high:
        raise StoreURLError(f"store URL {safe}: {name} must be an integer in [{low}, {high}], got {text[:20]!r}")
    return int(text)


def _durability(params: dict, safe: str) -> tuple[int, int]:
    wait = _int_param(params, "wait", 0, MAX_WAIT, 0, safe)
    timeout = _int_param(params, "wait_timeout_ms", 1, MAX_WAIT_TIMEOUT_MS, DEFAULT_WAIT_TIMEOUT_MS, safe)
    return wait, timeout


def _params(query: str, safe: str) -> dict:
    params = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in params:
            raise StoreURLError(f"store URL {safe}: parameter {name!r} is given twice")
        params[name] = value
    return params


def _nodes(netloc: str, default_port: int, safe: str) -> tuple:
    hosts = netloc.rsplit("@", 1)[-1]
    if not hosts:
        raise StoreURLError(f"store URL {safe} names no host: give HOST:PORT[,HOST:PORT...]")
    nodes = []
    for item in hosts.split(","):
        host, port = item, str(default_port)
        if item.startswith("["):  # [IPv6]:port
            host, _, tail = item[1:].partition("]")
            if tail:
                if not tail.startswith(":"):
                    raise StoreURLError(f"store URL {safe}: bad host {item!r}")
                port = tail[1:]
        elif ":" in item:
            host, port = item.rsplit(":", 1)
        if not host or any(c in host for c in " /?#@[]"):
            raise StoreURLError(f"store URL {safe}: bad host {item!r}")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise StoreURLError(f"store URL {safe}: bad port in {item!r} (1..65535)")
        nodes.append((host, int(port)))
    return tuple(nodes)


def _credentials(netloc: str) -> tuple:
    if "@" not in netloc:
        return None, None
    userinfo = netloc.rsplit("@", 1)[0]
    user, sep, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if sep else None)


def parse_redis_url(url: str) -> RedisTarget:
    """Read a Redis store URL of any topology.

    Parameters
    ----------
    url : str
        ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``,
        ``rediss+sentinel://``, ``redis+cluster://`` or ``rediss+cluster://``
        (see the module docstring).

    Returns
    -------
    RedisTarget

    Raises
    ------
    StoreURLError
        A malformed URL: one line, without the user or a password.
    """
    safe = safe_url(url)
    scheme, _, rest = url.partition("://")
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    params = _params(query, safe)
    if url.startswith(SERVER_SCHEMES):
        wait, timeout = _durability(params, safe)
        parts = urlsplit(url)
        try:
            parts.port
        except ValueError:
            raise StoreURLError(f"store URL {safe} has a bad port") from None
        db = (parts.path.lstrip("/") if parts.scheme != "unix" else params.get("db", "")) or "0"
        if not db.isdigit() or int(db) > 10000:
            raise StoreURLError(f"store URL {safe}: the database must be a number, got {db[:20]!r}")
        server_url = parts._replace(query=urlencode(list(params.items())), fragment="").geturl()
        return RedisTarget("server", safe, server_url=server_url, db=int(db), wait=wait, wait_timeout_ms=timeout)
    topology = "sentinel" if url.startswith(SENTINEL_SCHEMES) else "cluster"
    netloc, _, path = rest.partition("/")
    wait, timeout = _durability(params, safe)
    sentinel_password = params.pop("sentinel_password", None) if topology == "sentinel" else None
    if params:
        allowed = "wait, wait_timeout_ms" + (", sentinel_password" if topology == "sentinel" else "")
        raise StoreURLError(f"store URL {safe}: unknown parameter {sorted(params)[0][:40]!r} (accepted: {allowed})")
    nodes = _nodes(netloc, 26379 if topology == "sentinel" else 6379, safe)
    username, password = _credentials(netloc)
    tls = scheme.startswith("rediss")
    segments = [s for s in path.split("/")] if path else []
    if topology == "cluster":
        if any(segments) and segments != ["0"]:
            raise StoreURLError(f"store URL {safe}: a cluster has database 0 only; give no path")
        return RedisTarget("cluster", safe, nodes=nodes, username=username, password=password, tls=tls,
                           wait=wait, wait_timeout_ms=timeout)
    if not segments or not segments[0]:
        raise StoreURLError(f"store URL {safe} names no service: give HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    if len(segments) > 2:
        raise StoreURLError(f"store URL {safe}: expected /SERVICE[/DB] after the sentinels")
    service = unquote(segments[0])
    db = segments[1] if len(segments) == 2 and segments[1] else "0"
    if not db.isdigit() or int(db) > 10000:
        raise StoreURLError(f"store URL {safe}: the database must be a number, got {db[:20]!r}")
    return RedisTarget("sentinel", safe, nodes=nodes, service=service, db=int(db), username=username,
                       password=password, sentinel_password=sentinel_password, tls=tls, wait=wait,
                       wait_timeout_ms=timeout)
