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
import stat
import warnings

from ..validation import MAX_KEY_BYTES, MIN_KEY_BYTES, check_key

__all__ = ["MIN_KEY_BYTES", "MAX_KEY_BYTES", "KEY_BYTES", "KeyFileExposedWarning", "new_key", "write_key_file",
           "read_key_file", "key_fingerprint"]


class KeyFileExposedWarning(UserWarning):
    """A key file that group or others may read or write: anyone who reads it can remove the noise."""

#: Length of a key made by :func:`new_key`: 256 bits, beyond any offline search.
KEY_BYTES = 32
_FINGERPRINT_LABEL = b"caliber.key-fingerprint/v1"
# The longest key file read: the longest key in hex (2 * MAX_KEY_BYTES) with room for spaces.
_KEY_FILE_MAX_BYTES = 4 * MAX_KEY_BYTES


def new_key() -> bytes:
    """A fresh secret key: 32 bytes from :func:`secrets.token_bytes` (the OS's CSPRNG)."""
    return secrets.token_bytes(KEY_BYTES)


def write_key_file(path) -> bytes:
    """Write a new key to ``path`` as 64 hex characters and a newline, mode 0600.

    Parameters
    ----------
    path : str or os.PathLike
        Where to write it; created with mode 0600 from the start.

    Returns
    -------
    bytes
        The new 32-byte key (:func:`new_key`).

    Raises
    ------
    FileExistsError
        ``path`` exists: replacing a key changes every served row's noise, so
        a key file is never overwritten.
    OSError
        The file cannot be created.
    """
    key = new_key()
    # O_EXCL: never clobber a deployed key; 0600 at creation, so the key is never world-readable.
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key.hex() + "\n")
    return key


def read_key_file(path) -> bytes:
    """Read a key written by :func:`write_key_file`: one line of hex, readable by its owner only.

    A key file that group or others may read or write is read, with a
    :class:`KeyFileExposedWarning` naming its mode and the ``chmod`` that fixes
    it: anyone who can read the key can subtract the noise. It is a warning
    and not a refusal (as ssh refuses a private key) because the common
    deployments mount secrets group- or world-readable by default (a
    Kubernetes Secret volume is 0644), and a throttle that refuses to start
    serves nobody noisy. Turn it into an error with
    ``warnings.simplefilter("error", KeyFileExposedWarning)``.

    Parameters
    ----------
    path : str or os.PathLike
        The key file.

    Returns
    -------
    bytes
        The key.

    Raises
    ------
    ValueError
        The file is not a regular file, is empty, holds more than one line,
        is not an even number of hex digits, or holds a key shorter than
        :data:`MIN_KEY_BYTES`, longer than :data:`MAX_KEY_BYTES` or of one
        repeated byte (all zeros, say). Messages give lengths and modes,
        never the file's contents.
    OSError
        The file cannot be opened.
    """
    name = os.fspath(path)
    with open(path, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{name}: a key file must be a regular file")
        if os.name == "posix" and info.st_mode & 0o077:
            warnings.warn(f"{name}: the key file is readable or writable by group or others "
                          f"(mode {stat.S_IMODE(info.st_mode):04o}); anyone who reads it can remove "
                          f"the noise: run 'chmod 600 {name}'", KeyFileExposedWarning, stacklevel=2)
        raw = fh.read(_KEY_FILE_MAX_BYTES + 1)
    if len(raw) > _KEY_FILE_MAX_BYTES:
        raise ValueError(f"{name}: the key file is longer than {_KEY_FILE_MAX_BYTES} bytes; a key is at most "
                         f"{MAX_KEY_BYTES} bytes ({2 * MAX_KEY_BYTES} hex digits) and is never cut short")
    if not raw.strip():
        raise ValueError(f"{name}: the key file is empty")
    lines = raw.strip().splitlines()
    if len(lines) > 1:
        raise ValueError(f"{name}: a key file holds one line of hex digits, this one has {len(lines)} lines")
    try:
        key = bytes.fromhex(lines[0].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{name}: a key file holds one line of hex digits (as written by "
                         f"'caliber keygen'), got {len(lines[0])} bytes that are not") from None
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"{name}: the key is {len(key)} bytes, more than the {MAX_KEY_BYTES} allowed "
                         f"(a longer key adds nothing to HMAC-SHA256 and is never cut short)")
    try:
        return check_key(key)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def key_fingerprint(key) -> str:
    """16 hex characters naming ``key`` (HMAC-SHA256 of a fixed label): safe to store or log.

    Parameters
    ----------
    key : bytes
        The serving key.

    Returns
    -------
    str
        16 lowercase hex characters.

    Raises
    ------
    TypeError, ValueError
        Not a valid key (:func:`caliber_core.validation.check_key`).
    """
    key = check_key(key)
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]
