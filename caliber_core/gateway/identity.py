"""Who is calling: the gateway's account comes from a key it knows or a proxy it trusts, never from the client's say.

Two ways, one of which a gateway must be given (it does not start otherwise):

* :class:`KeyAccounts` -- ``Authorization: Bearer <API key>``, looked up by the
  key's SHA-256 in an accounts file (one line per key: 64 hex digits, a space,
  the account id; ``#`` starts a comment). Several keys may name one account,
  which then shares one level and one counter. An unknown key is a 401.
  :meth:`AccountsFile.reload` re-reads the file (the command does it on SIGHUP).
* :class:`HeaderAccounts` -- an authenticating proxy in front of the gateway sets
  the account in a header (``--account-header NAME``); the header is believed
  only on connections from the proxy's addresses (``--trusted-proxy``). Any
  other peer, or a request without exactly one such header, is a 401.

Either gives an :class:`Identity`: the account and the campaign descriptors
(``groups``, kind -> value) that came with it. Descriptors are read only from
headers a trusted proxy set (``HeaderAccounts(group_headers=...)``): a client
cannot name its own groups, as it cannot name its own account.

Nothing here logs or echoes a key, a header's value or an account id.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import threading
from dataclasses import dataclass, field
from types import MappingProxyType

from .request_rules import MAX_ACCOUNT_CHARS, GatewayRefusal, bearer_credential

__all__ = ["Identity", "AccountsFile", "KeyAccounts", "HeaderAccounts", "parse_trusted_proxies",
           "MAX_ACCOUNTS_FILE_BYTES"]

log = logging.getLogger(__name__)

#: The largest accounts file read (64 MiB: about 700,000 keys).
MAX_ACCOUNTS_FILE_BYTES = 64 << 20
_HEX = frozenset("0123456789abcdef")
_UNKNOWN_KEY = "invalid API key"


@dataclass(frozen=True)
class Identity:
    """The authenticated caller of one request.

    Attributes
    ----------
    account : str
        The account id the throttle counts under (from the accounts file or the trusted header).
    groups : Mapping of str to str
        Campaign descriptors (kind -> value) set by a trusted proxy; empty otherwise.
    """

    account: str
    groups: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))


def _account_id(text: str, where: str) -> str:
    if not text or len(text) > MAX_ACCOUNT_CHARS or not text.isprintable():
        raise ValueError(f"{where}: the account id must be 1..{MAX_ACCOUNT_CHARS} printable characters")
    return text


def parse_accounts(text: str, *, source: str = "accounts file") -> dict:
    """The key table of an accounts file's text.

    Parameters
    ----------
    text : str
        One entry a line: the API key's SHA-256 as 64 hex digits, whitespace,
        the account id (the rest of the line). ``#`` starts a comment; blank
        lines are skipped.
    source : str
        Named in messages (the file's path).

    Returns
    -------
    dict
        ``{sha256 hex (lowercase): account id}``; several hashes may map to one account.

    Raises
    ------
    ValueError
        A malformed line (named by its number, never by its content), one hash
        given to two accounts, or no entry at all.
    """
    table = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        digest, _, account = line.partition(" ") if " " in line else line.partition("\t")
        digest, account = digest.strip().lower(), account.strip()
        where = f"{source} line {number}"
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise ValueError(f"{where}: expected the key's SHA-256 as 64 hex digits, then a space and the account id")
        account = _account_id(account, where)
        if table.get(digest, account) != account:
            raise ValueError(f"{where}: this key's hash is already given to another account")
        table[digest] = account
    if not table:
        raise ValueError(f"{source}: no accounts (one line per key: SHA-256 hex, a space, the account id)")
    return table


class AccountsFile:
    """An accounts file, read at start and again on :meth:`reload`.

    Parameters
    ----------
    path : str or os.PathLike
        The file (see :func:`parse_accounts`). It holds hashes of keys, never keys.

    Raises
    ------
    ValueError
        The file cannot be read, is larger than :data:`MAX_ACCOUNTS_FILE_BYTES`, or is malformed.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._table = self._read()

    def _read(self) -> dict:
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read(MAX_ACCOUNTS_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"{self.path}: cannot read the accounts file ({exc.strerror})") from None
        if len(raw) > MAX_ACCOUNTS_FILE_BYTES:
            raise ValueError(f"{self.path}: the accounts file is larger than {MAX_ACCOUNTS_FILE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: the accounts file is not UTF-8") from None
        return parse_accounts(text, source=self.path)

    def __len__(self) -> int:
        return len(self._table)

    def reload(self) -> bool:
        """Read the file again; on any error keep the table in force and log one warning.

        Returns
        -------
        bool
            True when the new table replaced the old one.
        """
        with self._lock:
            try:
                table = self._read()
            except ValueError as exc:
                log.warning("accounts file not reloaded, the previous one stays in force: %s", exc)
                return False
            self._table = table  # one reference swap: a request sees the old table or the new one
        log.info("accounts file reloaded: %d keys", len(table))
        return True

    def account_of(self, key: str) -> str | None:
        """The account of an API key, or None for a key the file does not hold.

        Parameters
        ----------
        key : str
            The key as the client sent it (hashed as UTF-8, exactly).

        Returns
        -------
        str or None
        """
        return self._table.get(hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest())


class KeyAccounts:
    """Authenticate by API key: ``Authorization: Bearer <key>``, looked up in an :class:`AccountsFile`.

    Parameters
    ----------
    accounts : AccountsFile
        The key table.
    """

    scheme = "bearer"

    def __init__(self, accounts: AccountsFile):
        self.accounts = accounts

    def __call__(self, headers, peer: str | None) -> Identity:
        """The caller of a request.

        Parameters
        ----------
        headers : starlette.datastructures.Headers
            The request's headers.
        peer : str or None
            The connection's remote address (unused here).

        Returns
        -------
        Identity

        Raises
        ------
        GatewayRefusal
            401 for a missing or malformed credential or a key the file does not hold.
        """
        account = self.accounts.account_of(bearer_credential(headers.get("authorization")))
        if account is None:
            raise GatewayRefusal(401, _UNKNOWN_KEY)
        return Identity(account)


def parse_trusted_proxies(text: str) -> tuple:
    """The networks of ``--trusted-proxy ADDR[,ADDR...]`` (an address or a CIDR network each).

    Parameters
    ----------
    text : str
        Comma-separated IPv4/IPv6 addresses or networks, e.g. ``10.0.0.5,10.1.0.0/16,::1``.

    Returns
    -------
    tuple of ipaddress.IPv4Network or IPv6Network

    Raises
    ------
    ValueError
        An empty list or an entry that is not an address or network (named).
    """
    networks = []
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"--trusted-proxy: {item[:60]!r} is not an IP address or network") from None
    if not networks:
        raise ValueError("--trusted-proxy needs at least one address")
    return tuple(networks)


def _one_header(headers, name: str, what: str) -> str | None:
    """The one value of header ``name`` as UTF-8 text; None when absent; 401 when sent twice or malformed."""
    values = headers.getlist(name)
    if not values:
        return None
    text = None
    if len(values) == 1:  # sent twice: which one would the proxy have meant?
        try:
            text = values[0].encode("latin-1").decode("utf-8").strip(" \t")  # servers hand headers over as latin-1
        except (UnicodeEncodeError, UnicodeDecodeError):
            text = None
    if not text or len(text) > MAX_ACCOUNT_CHARS or not text.isprintable():
        raise GatewayRefusal(401, f"the request's {what} header is malformed (the authenticating proxy sets it once, "
                                  f"as 1..{MAX_ACCOUNT_CHARS} printable characters)")
    return text


class HeaderAccounts:
    """Authenticate by a trusted proxy's header: the proxy in front authenticated the client and names it.

    Parameters
    ----------
    header : str
        The header holding the account id (e.g. ``X-Account-Id``).
    trusted : iterable of ipaddress networks
        The proxy's addresses (:func:`parse_trusted_proxies`); requests from any other peer are refused.
    group_headers : Mapping of str to str, optional
        Campaign descriptor kind -> header name, read from the same trusted
        requests into :attr:`Identity.groups` (a header absent from a request
        leaves its kind out).

    Raises
    ------
    ValueError
        An empty header name or no trusted address.
    """

    def __init__(self, header: str, trusted, *, group_headers=None):
        header = str(header).strip()
        if not header or not header.isascii() or any(c.isspace() or c in ':"(),/;<=>?@[\\]{}' for c in header):
            raise ValueError(f"--account-header must be an HTTP header name, got {header[:60]!r}")
        self.header = header.lower()
        self.trusted = tuple(trusted)
        if not self.trusted:
            raise ValueError("--account-header needs --trusted-proxy: the header is believed from those addresses only")
        self.group_headers = dict(group_headers or {})

    def _is_trusted(self, peer: str | None) -> bool:
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if getattr(address, "ipv4_mapped", None) is not None:
            address = address.ipv4_mapped  # ::ffff:10.0.0.5 on a dual-stack socket is 10.0.0.5
        return any(address in network for network in self.trusted)

    def __call__(self, headers, peer: str | None) -> Identity:
        """The caller of a request.

        Parameters
        ----------
        headers : starlette.datastructures.Headers
            The request's headers.
        peer : str or None
            The connection's remote address (the socket's, not ``X-Forwarded-For``).

        Returns
        -------
        Identity

        Raises
        ------
        GatewayRefusal
            401 for a peer outside the trusted addresses, or a request without
            exactly one well-formed account header.
        """
        if not self._is_trusted(peer):
            raise GatewayRefusal(401, "this gateway serves requests from its authenticating proxy only")
        account = _one_header(headers, self.header, "account")
        if account is None:
            raise GatewayRefusal(401, "the request carries no account (the authenticating proxy must set it)")
        groups = {}
        for kind, name in self.group_headers.items():
            value = _one_header(headers, name, "campaign descriptor")
            if value is not None:
                groups[kind] = value
        return Identity(account, MappingProxyType(groups))
