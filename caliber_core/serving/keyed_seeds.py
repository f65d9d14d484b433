"""Steps 1 and 2 of the keyed noise's derivation (:mod:`.keyed_noise`): row ids to 64-bit row seeds.

A row's id is hashed (SHA-256) on the host; the seed of each (row, level) is a
keyed BLAKE2b of that digest under a stream key, the HMAC of everything that
must separate two streams (:data:`DOMAIN`, the binding, the level, K).
:class:`RowSeeder` makes each stream key once for a server's lifetime.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from ..validation import check_key

__all__ = ["DOMAIN", "RowSeeder", "checked_digests", "encode_ids", "joined_digests", "row_digests", "row_seeds"]

#: Domain separation and version of the whole derivation (v1 was the SFC64 stream of earlier releases).
DOMAIN = b"caliber.keyed-noise/v2\x00"


def encode_ids(ids) -> list[bytes]:
    """Ids as bytes: str is UTF-8 encoded, so ``"a"`` and ``b"a"`` are one id (the one encoding of row ids).

    Returns
    -------
    list of bytes

    Raises
    ------
    TypeError
        An id that is neither str nor bytes (the message names its position).
    """
    out = []
    for position, one_id in enumerate(ids):
        if type(one_id) is bytes:  # already encoded (the serving path passes these): no copy
            out.append(one_id)
        elif isinstance(one_id, str):
            out.append(one_id.encode("utf-8"))
        elif isinstance(one_id, (bytes, bytearray, memoryview)):
            out.append(bytes(one_id))
        else:
            raise TypeError(f"ids must be str or bytes, got {type(one_id).__name__} {one_id!r} "
                            f"at position {position}")
    return out


def row_digests(ids) -> np.ndarray:
    """SHA-256 of each id (str or bytes), shape (n_rows, 32) uint8: what the device side never needs.

    Returns
    -------
    ndarray of shape (n_rows, 32), uint8
    """
    encoded = encode_ids(ids)
    return np.frombuffer(joined_digests(encoded), dtype=np.uint8).reshape(len(encoded), 32)


def joined_digests(ids) -> bytes:
    """:func:`row_digests` as the rows' 32-byte digests joined (what :meth:`RowSeeder.seeds` hashes).

    Returns
    -------
    bytes
        32 bytes a row.
    """
    sha256 = hashlib.sha256
    return b"".join([sha256(one).digest() for one in encode_ids(ids)])


def checked_digests(digests, n_rows: int) -> np.ndarray:
    """Precomputed :func:`row_digests`, checked: shape (n_rows, 32) uint8.

    Returns
    -------
    ndarray of shape (n_rows, 32), uint8

    Raises
    ------
    ValueError
        Not 32 bytes a row, or not ``n_rows`` rows.
    """
    digests = np.asarray(digests)
    if digests.dtype != np.uint8 or digests.ndim != 2 or digests.shape != (n_rows, 32):
        raise ValueError(f"row digests must be {n_rows} rows of 32 bytes (uint8), got shape {digests.shape} "
                         f"{digests.dtype}")
    return digests


def _check_args(binding, level, digests, n_classes) -> np.ndarray:
    if not isinstance(binding, (bytes, bytearray)):
        raise TypeError(f"binding must be bytes, got {type(binding).__name__}")
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or level < 0:
        raise ValueError(f"level must be an integer >= 0, got {level!r}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
    digests = np.asarray(digests, dtype=np.uint8)
    if digests.ndim != 2 or digests.shape[1] != 32:
        raise ValueError(f"row_digests must have shape (n_rows, 32), got {digests.shape}")
    return digests


def _stream_hasher(key: bytes, binding: bytes, level: int, n_classes: int):
    """The keyed BLAKE2b of one (binding, level, K) stream, to be copied per row (step 2's stream key)."""
    message = (DOMAIN + len(binding).to_bytes(8, "big") + bytes(binding)
               + int(level).to_bytes(8, "big") + int(n_classes).to_bytes(8, "big"))
    stream_key = hmac.new(key, message, hashlib.sha256).digest()
    return hashlib.blake2b(key=stream_key, digest_size=8)


def _seeds_of(hashers, raw: bytes) -> np.ndarray:
    """Every stream's seed of every row, shape (len(hashers), n_rows) uint64, from the rows' joined digests."""
    seeds = []
    for keyed in hashers:
        for start in range(0, len(raw), 32):
            row = keyed.copy()  # no key setup per row
            row.update(raw[start:start + 32])
            seeds.append(row.digest())
    return np.frombuffer(b"".join(seeds), dtype="<u8").astype(np.uint64).reshape(len(hashers), len(raw) // 32)


def row_seeds(key: bytes, binding: bytes, level: int, digests, n_classes: int) -> np.ndarray:
    """The 64-bit seed of each row (step 2 of the module's derivation), shape (n_rows,) uint64.

    ``digests`` are :func:`row_digests` of the ids; ``binding`` is length-prefixed,
    ``level`` (>= 0) and ``n_classes`` (>= 1) are folded in as 8-byte integers.

    Returns
    -------
    ndarray of shape (n_rows,), uint64

    Raises
    ------
    TypeError, ValueError
        A bad key or binding, a negative level, a bad K, or digests not (n_rows, 32).
    """
    key = check_key(key)
    digests = _check_args(binding, level, digests, n_classes)
    return _seeds_of((_stream_hasher(key, binding, level, n_classes),), digests.tobytes())[0]


class RowSeeder:
    """:func:`row_seeds` of several levels at once, with each stream's key derived once, not per call.

    A server draws the same levels of the same binding at every request: the
    HMAC of each stream key is made here, and a request costs one keyed
    BLAKE2b per row and level.

    Parameters
    ----------
    key : bytes
        The serving key.
    binding : bytes
        What the streams are bound to.
    levels : sequence of int
        The levels drawn, in the order their seeds are returned.
    """

    def __init__(self, key: bytes, binding: bytes, levels):
        self._key = check_key(key)
        self._binding, self._levels = binding, tuple(levels)
        for level in self._levels:
            _check_args(binding, level, np.zeros((0, 32), dtype=np.uint8), 1)
        self._hashers: dict = {}

    def seeds(self, digests, n_classes: int) -> np.ndarray:
        """Row seeds of every level, shape (n_levels, n_rows) uint64: row i of level j is
        ``row_seeds(key, binding, levels[j], digests, n_classes)[i]``.

        Parameters
        ----------
        digests : array_like of shape (n_rows, 32), uint8
            :func:`row_digests` of the ids.
        n_classes : int
            K.

        Returns
        -------
        ndarray of shape (n_levels, n_rows), uint64

        Raises
        ------
        ValueError
            A bad K, or digests not (n_rows, 32).
        """
        hashers = self._hashers.get(n_classes)
        if hashers is None:
            _check_args(self._binding, 0, np.zeros((0, 32), dtype=np.uint8), n_classes)
            if len(self._hashers) >= 8:
                self._hashers.clear()
            hashers = self._hashers[n_classes] = tuple(
                _stream_hasher(self._key, self._binding, level, n_classes) for level in self._levels)
        raw = digests if isinstance(digests, bytes) else _check_args(self._binding, 0, digests, n_classes).tobytes()
        if len(raw) % 32:
            raise ValueError(f"row digests must be 32 bytes each, got {len(raw)} bytes")
        return _seeds_of(hashers, raw)
