"""The secret key of per-input seeding: making, storing, reading and naming one.

Anyone holding the key can recompute and subtract the noise, so it lives
outside configs (which are shared with dashboards and auditors) in a file
readable only by the serving process. A config may carry the key's
:func:`key_fingerprint`, which names the key without revealing it.

Only the standard library is imported.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ..validation import MIN_KEY_BYTES, check_key

__all__ = ["MIN_KEY_BYTES", "KEY_BYTES", "new_key", "write_key_file", "read_key_file", "key_fingerprint"]

#: Length of a key made by :func:`new_key`: 256 bits, beyond any offline search.
KEY_BYTES = 32
_FINGERPRINT_LABEL = b"caliber.key-fingerprint/v1"


def new_key() -> bytes:
    """A fresh secret key: 32 bytes from :func:`secrets.token_bytes` (the OS's CSPRNG)."""
    return secrets.token_bytes(KEY_BYTES)


def write_key_file(path) -> bytes:
    """Write a new key to ``path`` as 64 hex characters and a newline, mode 0600.

    Returns the key. Refuses to overwrite an existing file (``FileExistsError``):
    replacing a key changes every served row's noise (see README, "Keys").
    """
    key = new_key()
    # O_EXCL: never clobber a deployed key; 0600 at creation, so the key is never world-readable.
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key.hex() + "\n")
    return key


def read_key_file(path) -> bytes:
    """Read a key written by :func:`write_key_file` (one line of hex).

    Raises
    ------
    ValueError
        The file is not one line of an even number of hex digits, or the key
        is shorter than :data:`MIN_KEY_BYTES`.
    OSError
        The file cannot be read.
    """
    with open(path, "rb") as fh:
        raw = fh.read(4096)
    text = raw.decode("ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{os.fspath(path)}: a key file holds one line of hex digits "
                         f"(as written by 'caliber keygen'), got {len(raw)} bytes that are not") from None
    if not key:
        raise ValueError(f"{os.fspath(path)}: the key file is empty")
    return check_key(key)


def key_fingerprint(key) -> str:
    """16 hex characters naming ``key`` (HMAC-SHA256 of a fixed label): safe to store or log."""
    key = check_key(key)
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]
