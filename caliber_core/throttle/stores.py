"""Choosing a ledger store by URL (the errors it and every store raise: :mod:`.ledger_store`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from .ledger_store import LedgerStore, StoreUnavailable, StoreURLError

__all__ = ["StoreURLError", "StoreUnavailable", "open_store"]


def open_store(url: str) -> LedgerStore:
    """``sqlite:///PATH`` (relative) or ``sqlite:////abs/path`` -> SqliteStore; ``redis://HOST:PORT/DB`` -> RedisStore.

    Redis URLs are read as redis-py's ``Redis.from_url`` reads them:
    ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` with percent-encoded user
    and password (an ACL user, or only a password), ``rediss://`` for TLS and
    ``unix://PATH?db=N`` for a socket. Messages never show the user or password.

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
    if url.startswith(("redis://", "rediss://", "unix://")):
        parts = urlsplit(url)
        try:
            port = parts.port or 6379
        except ValueError:
            raise StoreURLError(f"store URL {_safe(url)} has a bad port") from None
        db = (parts.path.lstrip("/") if parts.scheme != "unix" else "") or "0"
        if not db.isdigit() or int(db) > 10000:
            raise StoreURLError(f"store URL {_safe(url)}: the database must be a number, got {db!r}")
        del port  # checked; redis-py reads the URL itself
        from .redis_store import RedisStore

        try:
            return RedisStore.from_url(url, url_for_messages=_safe(url))
        except ValueError as exc:
            raise StoreURLError(f"store URL {_safe(url)}: {exc}") from None
    raise StoreURLError(f"store URL must start with sqlite:///, redis://, rediss:// or unix://, got {_safe(url)!r}")


def _safe(url: str) -> str:
    """The URL without its user or password, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=host).geturl()
