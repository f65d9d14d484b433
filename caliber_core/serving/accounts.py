"""The account named by an HTTP ``Authorization`` header, read as the CLI reads an account id.

RFC 9110 section 11: the auth scheme is case-insensitive and followed by
whitespace; the token follows. The header's bytes are decoded as UTF-8 (web
servers hand them over as latin-1), and the token is NFC-normalized, as
:func:`caliber_core.throttle.ledger.account_fingerprint` normalizes every
account id, so a token flagged with ``throttle flag`` matches whichever
way a client spelled the scheme or composed its characters.
"""

from __future__ import annotations

import re
import unicodedata

# RFC 9110 token characters for the scheme, then at least one space or tab.
_CREDENTIALS = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]+(.*)", re.DOTALL)


class AuthorizationError(ValueError):
    """A missing or malformed Authorization header (the message never holds the token).

    A ``ValueError``, so a caller's one-line error handling covers it.
    """


def account_from_authorization(header, *, scheme: str = "bearer") -> str:
    """The account id of an ``Authorization: <scheme> <token>`` header.

    Parameters
    ----------
    header : str or bytes
        The header's value: bytes as received, or str as a server decoded
        them (latin-1, which is undone here).
    scheme : str, default "bearer"
        The expected scheme, compared case-insensitively.

    Returns
    -------
    str
        The token, stripped of surrounding spaces and tabs once, decoded as UTF-8, NFC-normalized.

    Raises
    ------
    AuthorizationError
        No header, another scheme, no token, a token that is not UTF-8 or holds control characters.
    """
    if isinstance(header, str):
        try:
            header = header.encode("latin-1")
        except UnicodeEncodeError:
            pass  # already decoded as Unicode by the caller
        else:
            header = _utf8(header)
    elif isinstance(header, (bytes, bytearray)):
        header = _utf8(bytes(header))
    elif header is None:
        header = ""
    else:
        raise AuthorizationError(f"the Authorization header must be str or bytes, got {type(header).__name__}")
    match = _CREDENTIALS.fullmatch(header.strip(" \t"))
    if match is None:
        raise AuthorizationError(f"missing {scheme} token")
    if match.group(1).lower() != scheme.lower():
        raise AuthorizationError(f"the Authorization scheme must be {scheme.capitalize()}")
    token = match.group(2).strip(" \t")
    if not token:
        raise AuthorizationError(f"missing {scheme} token")
    if any(unicodedata.category(c) == "Cc" for c in token):
        raise AuthorizationError(f"the {scheme} token holds a control character")
    return unicodedata.normalize("NFC", token)


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthorizationError("the Authorization header is not UTF-8") from None
