"""Choosing a ledger store by URL (the errors it and every store raise: :mod:`.ledger_store`)."""

from __future__ import annotations

from .ledger_store import LedgerStore, StoreUnavailable, StoreURLError
from .redis_urls import is_redis_url, parse_redis_url, safe_url

__all__ = ["StoreURLError", "StoreUnavailable", "open_store"]


def open_store(url: str) -> LedgerStore:
    """``sqlite:///PATH`` (relative) or ``sqlite:////abs/path`` -> SqliteStore; a Redis URL -> RedisStore.

    One Redis server's URL is read as redis-py's ``Redis.from_url`` reads it:
    ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` with percent-encoded user
    and password (an ACL user, or only a password), ``rediss://`` for TLS and
    ``unix://PATH?db=N`` for a socket. A Sentinel set is
    ``redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``
    (``sentinel_password=`` when the sentinels' differs), a cluster
    ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`` (``rediss+`` for
    TLS). Every Redis form takes ``wait=N`` and ``wait_timeout_ms=T``
    (:mod:`.redis_urls`). Messages never show the user or a password.

    Raises
    ------
    StoreURLError
        Another scheme, an empty path, a bad port or database number.
    StoreUnavailable
        The store cannot be opened (SQLite) -- Redis is reached lazily, at the first use.
    """
    if not isinstance(url, str):
        raise StoreURLError(f"store must be a URL string, got {type(url).__name__}")
    if "\x00" in url:
        raise StoreURLError("store URL holds a NUL character")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise StoreURLError("store URL sqlite:/// needs a file path, e.g. sqlite:///ledger.db")
        from .sqlite_store import SqliteStore

        return SqliteStore(path)
    if is_redis_url(url):
        target = parse_redis_url(url)
        from .redis_store import RedisStore

        try:
            return RedisStore.from_target(target)
        except ValueError as exc:
            raise StoreURLError(f"store URL {target.safe_url}: {exc}") from None
    raise StoreURLError("store URL must start with sqlite:///, redis://, rediss://, unix://, redis+sentinel://, "
                        f"rediss+sentinel://, redis+cluster:// or rediss+cluster://, got {_safe(url)!r}")


def _safe(url: str) -> str:
    """The URL without its user or password, for messages."""
    return safe_url(url)
