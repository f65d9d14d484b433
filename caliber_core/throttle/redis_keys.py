"""Where the ledger lives in Redis: key names, laid out so one request touches one hash slot.

Every key of an account carries the account's fingerprint as a hash tag
(``caliber:throttle:{<fingerprint>}:<field>``), so a Redis Cluster keeps them
in one slot and the record, flag and resolve scripts run atomically on any
topology (one server, Sentinel, Cluster) without a cross-slot error:

========================  ==========================================================
``{fp}:a``                 the account's hash: flag, level, per-level counts
``{fp}:h``                 its history (a list of events)
``{fp}:u``                 rows served uncounted during outages (a list, per process)
``{fp}:flagged``           present while the account is flagged (what ``accounts`` scans for)
``{fp}:r:<token>``         a request's reply, kept ``TOKEN_SECONDS`` (exactly-once retries)
``{g:<kind>:<hex>}:m``     a group's members: rows, first and last time of each account seen in it
========================  ==========================================================

A group (:mod:`.groups`, ledger name ``g:<kind>:<hex>``) is a ledger of its
own in its own slot, with an account's fields plus ``m`` (:func:`group_keys`);
on a cluster it is usually on another node than its members. ``accounts``
and ``groups`` tell them apart by the ``g:`` of the tag.

``caliber:throttle:layout`` holds ``LAYOUT`` once a store has checked that no
key of the single-server layout of earlier versions is left
(``caliber:throttle:a:<fp>``, ``h:<fp>``, ``u:<fp>``, ``r:<token>`` and one
``flagged`` set); ``caliber throttle migrate-store`` moves such a ledger.

Other scopes (not only accounts) get their own tag through :func:`scoped_key`.
"""

from __future__ import annotations

PREFIX = "caliber:throttle:"
LAYOUT_KEY = PREFIX + "layout"
#: The value of ``LAYOUT_KEY`` for this layout.
LAYOUT = "hash-tagged/1"
FLAGGED_PATTERN = PREFIX + "{*}:flagged"
ACCOUNT_PATTERN = PREFIX + "{*}:a"
GROUP_FLAGGED_PATTERN = PREFIX + "{g:*}:flagged"
GROUP_PATTERN = PREFIX + "{g:*}:a"
#: How long a request's reply is kept under its token (``{fp}:r:<token>``): the window in which a
#: retry or a resolve finds it. One key per request lives this long (about 100 bytes each), so it is
#: kept short; a request still in doubt when it has expired is settled as not counted.
TOKEN_SECONDS = 600


def scoped_key(tag: str, field: str) -> str:
    """The key of ``field`` in the hash slot of ``tag``: ``caliber:throttle:{<tag>}:<field>``.

    Parameters
    ----------
    tag : str
        What decides the slot (an account's fingerprint); must not hold ``{`` or ``}``.
    field : str

    Returns
    -------
    str
    """
    if "{" in tag or "}" in tag:
        raise ValueError("a hash tag must not hold braces")
    return f"{PREFIX}{{{tag}}}:{field}"


def tag_of(key) -> str:
    """The tag of a key :func:`scoped_key` made (bytes or str)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text[len(PREFIX) + 1:text.index("}", len(PREFIX))]


def account_keys(account: str, token: str | None = None) -> list[str]:
    """KEYS of the record and flag scripts: hash, history, flagged marker[, the token's reply].

    Parameters
    ----------
    account : str
        The account's fingerprint.
    token : str, optional
        The request's token.

    Returns
    -------
    list of str
    """
    keys = [scoped_key(account, "a"), scoped_key(account, "h"), scoped_key(account, "flagged")]
    return keys if token is None else keys + [scoped_key(account, f"r:{token}")]


def reply_key(account: str, token: str) -> str:
    """Where a request's reply is kept (the slot of its account)."""
    return scoped_key(account, f"r:{token}")


def uncounted_key(account: str) -> str:
    """The list of an account's rows served uncounted."""
    return scoped_key(account, "u")


def members_key(group: str) -> str:
    """A group's hash of the accounts seen in it (the group's slot)."""
    return scoped_key(group, "m")


def group_keys(group: str, token: str | None = None) -> list[str]:
    """A group's keys, all in its own slot: hash, history, flagged marker[, reply], members, uncounted.

    Parameters
    ----------
    group : str
        The group's ledger name (``g:<kind>:<hex>``, :func:`.groups.group_fingerprint`).
    token : str, optional
        A request's token: its reply key is added fourth.

    Returns
    -------
    list of str
        :func:`account_keys` + ``[m, u]``.
    """
    return account_keys(group, token) + [members_key(group), uncounted_key(group)]


# The single-server layout of earlier versions (read only by the migration and the layout check).
LEGACY_FIELDS = ("a", "h", "u")
LEGACY_FLAGGED = PREFIX + "flagged"
LEGACY_ACCOUNT_PATTERN = PREFIX + "a:*"
LEGACY_GROUP_FLAGGED = PREFIX + "{g:*}:f"  # a group's flagged marker was a set holding its name


def legacy_key(field: str, account: str) -> str:
    """A key of the earlier single-server layout: ``caliber:throttle:<field>:<fp>``."""
    return f"{PREFIX}{field}:{account}"
