"""Adding calibrated Gaussian noise to served logits (numpy and torch).

A :class:`Perturber` applies Eq. ``logits-noise`` of the paper,
z' = z + eps with eps_k ~ N(0, sigma^2) i.i.d., to a batch of logits.

Two seedings are offered (Proposition 2):

* ``"per-input"`` -- the noise of a row is a pure function of
  (secret key, input id, number of classes K). Repeating a query returns the
  identical response, so averaging M repeats yields no variance reduction
  (Proposition 2(ii)).
* ``"fresh"`` -- independent noise on every call. Averaging M repeats cuts
  the noise variance to sigma^2 / M (Proposition 2(i)); offered for
  comparison and for accounts where repeats are not a concern.

torch is never imported at module import time (it costs seconds); tensors are
detected by their type's module and handled lazily.
"""

from __future__ import annotations

import hashlib
import hmac
import numbers
import struct
from collections.abc import Sequence

import numpy as np

from ..config import sigma_to_serve
from ..validation import check_key, check_sigma, is_torch

SEEDINGS = ("per-input", "fresh")

# Domain separation for the per-row HMAC: a later change to the noise
# derivation bumps the version so old and new noise never coincide by accident.
_NOISE_DOMAIN = b"caliber.runtime.noise/v1\x00"


def _encode_id(one_id, position: int) -> bytes:
    # str and bytes share one id space: "abc" and b"abc" give the same noise.
    if isinstance(one_id, str):
        return one_id.encode("utf-8")
    if isinstance(one_id, (bytes, bytearray, memoryview)):
        return bytes(one_id)
    raise TypeError(
        f"ids must be str or bytes, got {type(one_id).__name__} {one_id!r} at position {position}"
    )


def _encode_ids(ids, n_rows: int, *, single_row: bool) -> list[bytes]:
    """One encoded id per row; ``single_row`` means the input was 1-D (K,)."""
    if single_row and isinstance(ids, (str, bytes, bytearray, memoryview)):
        return [_encode_id(ids, 0)]
    if isinstance(ids, (str, bytes, bytearray, memoryview)):
        # A bare string for a batch would otherwise be split into characters.
        raise TypeError(
            f"ids for a batch of {n_rows} rows must be a sequence of str/bytes, "
            f"got a single {type(ids).__name__} {ids!r}"
        )
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"ids must be one-dimensional, got an array of shape {ids.shape}")
        ids = ids.tolist()
    elif not isinstance(ids, Sequence):
        if not (hasattr(ids, "__len__") and hasattr(ids, "__iter__")):  # e.g. a pandas Series passes
            raise TypeError(f"ids must be a sequence of str/bytes, got {type(ids).__name__}")
        ids = list(ids)
    if len(ids) != n_rows:
        raise ValueError(f"need one id per row: got {len(ids)} ids for {n_rows} rows")
    return [_encode_id(one_id, i) for i, one_id in enumerate(ids)]


def _as_rows(logits):
    """Validate logits; return (2-D float ndarray, restore, single_row).

    The ndarray keeps the input's float dtype (torch bfloat16 becomes float32,
    which holds it exactly) and may share memory with a numpy input: never
    write into it. ``restore(values)`` turns a float64 (N, K) result back into
    the input's type, shape, dtype and (torch) device.
    """
    if is_torch(logits):
        import torch

        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a numpy array or torch tensor, got {type(logits).__name__}")
        if not logits.is_floating_point():
            raise TypeError(f"logits must have a floating dtype, got {logits.dtype}")
        shape, dtype, device = tuple(logits.shape), logits.dtype, logits.device
        # Via the CPU: the noise is generated there anyway, and some devices
        # (MPS) lack float64.
        cpu = logits.detach().cpu()
        arr = (cpu.float() if dtype == torch.bfloat16 else cpu).numpy()

        # float16/32/64 are cast by numpy (torch's own cast of a CPU tensor was
        # ~15 us a row slower at K = 1000 on the 2-core reference machine);
        # bfloat16 has no numpy dtype and is rounded once, from float64, by torch.
        np_dtype = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}.get(dtype)

        def restore(values):
            values = values.reshape(shape)
            if np_dtype is not None:
                out = torch.from_numpy(values.astype(np_dtype, copy=False))
            else:
                out = torch.from_numpy(values).to(dtype=dtype)
            return out.to(device=device)

    else:
        arr = np.asarray(logits)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"logits must have a floating dtype, got {arr.dtype}")
        shape, dtype = arr.shape, arr.dtype

        def restore(values):
            return values.reshape(shape).astype(dtype, copy=False)

    if arr.ndim not in (1, 2):
        raise ValueError(
            f"logits must be (n_samples, n_classes) or a single row (n_classes,), got shape {shape}"
        )
    arr2 = arr.reshape(1, -1) if arr.ndim == 1 else arr
    if arr2.shape[1] < 2:
        raise ValueError(f"logits need at least 2 classes, got n_classes={arr2.shape[1]}")
    # +-inf is legitimate (masked tokens in LLM serving) and stays +-inf under
    # finite noise; NaN is not a logit.
    if np.isnan(arr2).any():
        bad = np.argwhere(np.isnan(arr2))[0]
        raise ValueError(f"logits contain NaN (first at row {bad[0]}, class {bad[1]})")
    return arr2, restore, arr.ndim == 1


# --------------------------------------------------------------------------
# per-input noise
# --------------------------------------------------------------------------


def per_input_noise(ids, n_classes: int, *, key: bytes) -> np.ndarray:
    """Standard-normal noise, one row per id, as a pure function of (key, id, K).

    Parameters
    ----------
    ids : sequence of str or bytes, length n_rows
        str ids are UTF-8 encoded, so ``"a"`` and ``b"a"`` are the same id.
    n_classes : int
        K, the row length; part of the derivation, so the same id under a
        different K gets unrelated noise.
    key : bytes
        The provider's secret.

    Returns
    -------
    noise : ndarray of shape (n_rows, n_classes), float64, unit variance.

    Notes
    -----
    Row seed: d = HMAC-SHA256(key, domain || K as 8 bytes big-endian || id),
    so ids differing by one byte give unrelated seeds and the key cannot be
    recovered from outputs. The digest, read as four little-endian uint64
    words, *is* the 256-bit state (a, b, c, counter) of an SFC64 bit
    generator, and the row is ``Generator(SFC64 in that state)
    .standard_normal(K)``.

    Why this generator (measured on the 2-core reference machine, K = 1000):
    constructing a numpy Generator per row costs 10-40 us (it reads OS
    entropy for a SeedSequence), and a Box-Muller or inverse-CDF transform of
    raw bits written in numpy costs ~45 us a row; overwriting the state of
    one bit generator costs 1-3 us, leaving numpy's ziggurat to dominate.
    SFC64 is numpy's fastest bit generator for it (~11 us per 1000 normals,
    against ~17 us for Philox, which saves ~5 us a row end to end). Its
    state is filled with 256 uniformly random bits, so every row starts at an
    independent random point of the state space: what ``SeedSequence``
    seeding provides, minus the 12 warm-up draws that exist only to mix
    low-entropy seeds. Caveat: numpy does not promise that
    ``Generator.standard_normal`` keeps its stream across releases
    (NEP 19); a numpy upgrade that changed it would change every row's noise
    once (one fresh draw per input for an attacker who straddles the
    upgrade). ``tests/test_runtime.py`` pins the stream with a known-answer
    test so such a change cannot pass unnoticed.
    """
    if isinstance(n_classes, bool) or not isinstance(n_classes, numbers.Integral) or n_classes < 1:
        raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
    key = check_key(key)
    if not hasattr(ids, "__len__") or isinstance(ids, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"ids must be a sequence of str/bytes, got {type(ids).__name__}")
    encoded = _encode_ids(ids, len(ids), single_row=False)
    return _per_input_noise(hmac.new(key, digestmod=hashlib.sha256), encoded, int(n_classes))


_DIGEST_WORDS = struct.Struct("<4Q").unpack  # SHA-256 digest -> four little-endian uint64


def _per_input_noise(hmac_base, encoded_ids: list[bytes], n_classes: int) -> np.ndarray:
    prefix = _NOISE_DOMAIN + n_classes.to_bytes(8, "big")
    out = np.empty((len(encoded_ids), n_classes), dtype=np.float64)
    # One bit generator per call (not per Perturber) keeps perturb
    # thread-safe; its state is then overwritten row by row.
    bitgen = np.random.SFC64(0)
    gen = np.random.Generator(bitgen)
    for row, id_bytes in enumerate(encoded_ids):
        mac = hmac_base.copy()
        mac.update(prefix + id_bytes)
        bitgen.state = {
            "bit_generator": "SFC64",
            "state": {"state": _DIGEST_WORDS(mac.digest())},
            "has_uint32": 0,
            "uinteger": 0,
        }
        gen.standard_normal(out=out[row])
    return out


# --------------------------------------------------------------------------
# the runtime
# --------------------------------------------------------------------------


class Perturber:
    """Adds N(0, sigma^2) noise to served logits (Eq. ``logits-noise``).

    Parameters
    ----------
    sigma : float
        Noise standard deviation, >= 0, in logit units (sigma* of
        Eq. ``inverse-v``). ``sigma == 0`` is the identity: ``perturb``
        returns an equal *copy* of the input (never the input object itself).
    seeding : {"per-input", "fresh"}, default "per-input"
        "per-input": the noise of a row is a pure function of (key, id, K),
        so repeated queries get identical responses (Proposition 2(ii)).
        "fresh": independent noise on every call (Proposition 2(i)).
    key : bytes
        Secret for per-input seeding; required there (no default: anyone who
        knows the key can subtract the noise). Ignored for "fresh".
    generator : numpy.random.Generator, optional
        Source of fresh noise. Default: an OS-seeded SFC64 generator.
        Pass a seeded generator only for reproducible simulations and tests.

    Examples
    --------
    >>> p = Perturber(0.8, key=b"provider secret")
    >>> noisy = p.perturb(logits, ids=["req-17", "req-18"])  # doctest: +SKIP

    Notes
    -----
    Noise is drawn in float64, added to the logits in float64 and cast back to
    the input dtype. Torch tensors round-trip through the CPU; the result has
    the input's dtype and device and does not track gradients.
    """

    def __init__(self, sigma, *, seeding: str = "per-input", key: bytes | None = None, generator=None):
        self._sigma = check_sigma(sigma)
        if seeding not in SEEDINGS:
            raise ValueError(f"seeding must be one of {SEEDINGS}, got {seeding!r}")
        self._seeding = seeding
        self._key = self._hmac = None
        if seeding == "per-input":
            if key is None:
                raise ValueError("per-input seeding needs key=<secret bytes>, got key=None")
            self._key = check_key(key)
            # Keyed once; each row then copies this state (cheaper than re-keying).
            self._hmac = hmac.new(self._key, digestmod=hashlib.sha256)
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
        # OS-seeded; SFC64 because it is numpy's fastest bit generator here.
        self._generator = generator if generator is not None else np.random.Generator(np.random.SFC64())

    @classmethod
    def from_config(cls, config, *, target: int = 0, seeding: str = "per-input", key: bytes | None = None,
                    generator=None) -> "Perturber":
        """A Perturber serving ``config["targets"][target]`` (see :func:`caliber_core.config.sigma_to_serve`).

        Parameters
        ----------
        config : dict or str or os.PathLike
            A config dict, its JSON text, or the path of its JSON file
            (``caliber.config/v2``, or v1, upgraded on load).
        target : int, default 0
            Index into ``config["targets"]``.
        seeding, key, generator
            As for :class:`Perturber`.

        Raises
        ------
        caliber_core.config.ConfigError
            An invalid or unreadable config, no targets, target out of range.
        TypeError
            ``target`` is not an integer.

        Warns
        -----
        caliber_core.config.SaturatedTargetWarning
            The target is saturated: it serves the largest sigma the sweep measured.
        """
        return cls(sigma_to_serve(config, target=target), seeding=seeding, key=key, generator=generator)

    @property
    def sigma(self) -> float:
        return self._sigma

    @property
    def seeding(self) -> str:
        return self._seeding

    def __repr__(self) -> str:
        # Never show the key.
        return f"Perturber(sigma={self._sigma!r}, seeding={self._seeding!r})"

    def __getstate__(self):
        # hmac objects do not pickle; and a pickled generator would replay the
        # same "fresh" noise in every process it is sent to, so the copy gets
        # its own OS-seeded one.
        state = self.__dict__.copy()
        state["_hmac"] = None
        state["_generator"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self._key is not None:
            self._hmac = hmac.new(self._key, digestmod=hashlib.sha256)
        self._generator = np.random.Generator(np.random.SFC64())

    def perturb(self, logits, ids=None):
        """Return ``logits + noise`` with the input's type, shape and dtype.

        Parameters
        ----------
        logits : ndarray or torch.Tensor of shape (n_samples, n_classes) or (n_classes,)
            Floating dtype (float16, bfloat16 (torch), float32, float64).
            +-inf entries (masked classes) stay +-inf; NaN is rejected.
        ids : sequence of str or bytes, length n_samples; or one str/bytes for a single row
            Required for per-input seeding. For fresh seeding it may be omitted;
            if given its length is still checked.

        Returns
        -------
        noisy : same type, shape, dtype (and device) as ``logits``
            A new array/tensor; for sigma == 0 an equal copy.

        Raises
        ------
        TypeError
            Non-floating logits, unsupported type, ids of the wrong type.
        ValueError
            Wrong shape, fewer than 2 classes, NaN, missing ids or wrong count.
        """
        arr, restore, single_row = _as_rows(logits)
        n_rows, n_classes = arr.shape
        if ids is None:
            if self._seeding == "per-input":
                raise ValueError("per-input seeding needs ids (one str/bytes per row), got ids=None")
            encoded = None
        else:
            encoded = _encode_ids(ids, n_rows, single_row=single_row)
        if self._sigma == 0.0:
            return logits.detach().clone() if is_torch(logits) else np.array(logits, copy=True)
        if self._seeding == "per-input":
            noise = _per_input_noise(self._hmac, encoded, n_classes)
        else:
            noise = self._generator.standard_normal((n_rows, n_classes))
        noise *= self._sigma
        noise += arr  # in float64: the mixed-dtype add upcasts arr exactly
        return restore(noise)
