"""Choosing a ledger store by URL (the errors it and every store raise: :mod:`.store_errors`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from .store_errors import StoreUnavailable, StoreURLError

__all__ = ["StoreURLError", "StoreUnavailable", "open_store"]


def open_store(url: str):
    """``sqlite:///PATH`` (relative) or ``sqlite:////abs/path`` -> SqliteStore; ``redis://HOST:PORT/DB`` -> RedisStore.

    Raises
    ------
    StoreURLError
        Another scheme, an empty path, a bad port or database number.
    StoreUnavailable
        The store cannot be opened (SQLite) -- Redis is reached lazily, at the first use.
    """
    if not isinstance(url, str):
        raise StoreURLError(f"store must be a URL string, got {type(url).__name__}")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise StoreURLError("store URL sqlite:/// needs a file path, e.g. sqlite:///ledger.db")
        from .sqlite_store import SqliteStore

        return SqliteStore(path)
    if url.startswith("redis://"):
        parts = urlsplit(url)
        try:
            port = parts.port or 6379
        except ValueError:
            raise StoreURLError(f"store URL {_safe(url)} has a bad port") from None
        db = parts.path.lstrip("/") or "0"
        if not db.isdigit() or int(db) > 10000:
            raise StoreURLError(f"store URL {_safe(url)}: the database must be a number, got {db!r}")
        from .redis_store import RedisStore

        return RedisStore(host=parts.hostname or "127.0.0.1", port=port, db=int(db),
                          password=parts.password, url_for_messages=_safe(url))
    raise StoreURLError(f"store URL must start with sqlite:/// or redis://, got {_safe(url)!r}")


def _safe(url: str) -> str:
    """The URL without any password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    return parts._replace(netloc=netloc).geturl()
