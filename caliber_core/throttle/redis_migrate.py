"""Moving a Redis ledger from the single-server key layout of earlier versions to the hash-tagged one.

Earlier versions kept an account under ``caliber:throttle:a:<fp>``,
``h:<fp>`` and ``u:<fp>`` and the flagged accounts in one set,
``caliber:throttle:flagged``; a cluster would refuse that layout's scripts
(CROSSSLOT). :func:`migrate_layout` renames each account's keys to
:mod:`.redis_keys`' names (``RENAME`` keeps the value and any expiry), sets
the flagged marker of each member of the old set, deletes the set and
records the layout. Groups (:mod:`.groups`) were hash-tagged already
(``{g:<kind>:<hex>}:…``, never matched by the old patterns); only a group's
flagged marker, then a set ``{g:…}:f``, becomes ``{g:…}:flagged``. Run it
once, with every serving process stopped (a process of an earlier version
would keep writing the old keys): ``caliber
throttle migrate-store --store URL``. It can be run again after an
interruption and then moves what is left. Replies kept under ``r:<token>``
are left to expire (ten minutes): they settle requests in doubt of
processes that are stopped.
"""

from __future__ import annotations

from .ledger_store import StoreUnavailable
from .redis_keys import (LAYOUT, LAYOUT_KEY, LEGACY_ACCOUNT_PATTERN, LEGACY_FIELDS, LEGACY_FLAGGED,
                         LEGACY_GROUP_FLAGGED, PREFIX, legacy_key, scoped_key, tag_of)


def check_layout(store) -> None:
    """Refuse a ledger that still holds keys of the single-server layout (read as empty, it would serve
    flagged accounts clean); record the layout in an empty one.

    Raises
    ------
    StoreUnavailable
        Old keys are present (the message names the command that moves them), or another layout is recorded.
    """
    def recorded(client):
        found = client.get(LAYOUT_KEY)
        if found is not None and found.decode() != LAYOUT:
            raise StoreUnavailable(f"redis store {store.url}: the ledger's key layout is {found.decode()!r}, "
                                   f"this version reads {LAYOUT!r}")
        return found is not None

    if store._reading(LAYOUT_KEY, recorded):
        return
    routes = store._routes
    try:
        old = [next(client.scan_iter(LEGACY_ACCOUNT_PATTERN, count=1000), 0) for client in routes.primaries()]
        if not routes.is_cluster:  # a cluster would answer MOVED: no slot holds this key's name
            old.append(routes.client.exists(LEGACY_FLAGGED))
    except store._errors as exc:
        raise store._fail(exc) from None
    if any(old):
        raise StoreUnavailable(
            f"redis store {store.url}: the ledger is in the single-server key layout of an earlier version; "
            "stop the servers that use it and run `caliber throttle migrate-store --store URL` once")
    store._reading(LAYOUT_KEY, lambda client: client.set(LAYOUT_KEY, LAYOUT, nx=True))


def migrate_layout(store) -> dict:
    """Move every account of the old single-server layout in ``store`` to the hash-tagged layout.

    Parameters
    ----------
    store : RedisStore
        A one-server or Sentinel store (a cluster never held the old layout).

    Returns
    -------
    dict
        ``{"accounts": n, "keys": n, "flagged": n}`` moved this time.

    Raises
    ------
    StoreUnavailable
        The store cannot be reached, or an account has keys in both layouts.
    """
    errors = store._errors
    if store._routes.is_cluster:
        raise StoreUnavailable(f"redis store {store.url}: a cluster never held the single-server layout; "
                               "migrate the server it came from, then copy the keys")
    client = store._routes.client
    moved = {"accounts": 0, "keys": 0, "flagged": 0}
    try:
        accounts = set()
        for field in LEGACY_FIELDS:
            start = len(f"{PREFIX}{field}:")
            accounts.update(k.decode()[start:] for k in client.scan_iter(legacy_key(field, "*"), count=1000))
        for fp in sorted(accounts):
            pairs = [(legacy_key(field, fp), scoped_key(fp, field)) for field in LEGACY_FIELDS]
            pairs = [(old, new) for old, new in pairs if client.exists(old)]
            clash = [new for _, new in pairs if client.exists(new)]
            if clash:
                raise StoreUnavailable(f"redis store {store.url}: an account has keys in both layouts "
                                       f"({clash[0].split('}')[-1]} exists); nothing more was moved")
            pipe = client.pipeline(transaction=True)
            for old, new in pairs:
                pipe.rename(old, new)
            pipe.execute()
            moved["accounts"] += 1
            moved["keys"] += len(pairs)
        for member in client.smembers(LEGACY_FLAGGED):
            client.set(scoped_key(member.decode(), "flagged"), "1")
            moved["flagged"] += 1
        client.delete(LEGACY_FLAGGED)
        # Groups were already hash-tagged; only their flagged marker was a set of the group's name (``:f``).
        for key in client.scan_iter(LEGACY_GROUP_FLAGGED, count=1000):
            if client.type(key) == b"set":
                if client.scard(key):
                    client.set(scoped_key(tag_of(key), "flagged"), "1")
                    moved["flagged"] += 1
                client.delete(key)
        client.set(LAYOUT_KEY, LAYOUT)
    except errors as exc:
        raise store._fail(exc) from None
    store._layout_ok = False  # checked again at the next use
    return moved
