"""Input checks shared by every module: logits, labels, sigma, keys, seeds.

Each function states the rule and shows the offending value in its message,
and returns the validated value in the form the numerics use, so callers
validate once at their entry and pass the result down.

* :func:`as_logits`  2-D real logits as float64 (optionally finite)
* :func:`as_labels`  integer class indices in [0, K), one per row, as int64
* :func:`check_sigma` one noise scale: a finite real >= 0
* :func:`as_sigmas`  a scalar or 1-D array of finite sigmas >= 0
* :func:`check_key`  a secret of at least :data:`MIN_KEY_BYTES` bytes, as bytes
* :func:`check_seed` a seed (int >= 0 or None) or a numpy Generator
* :func:`is_torch`   whether an object is a torch tensor (without importing torch)

Only numpy and the standard library are imported.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def is_torch(x) -> bool:
    """True for objects whose type lives in torch (checked without importing torch).

    Parameters
    ----------
    x : object
        Any value.

    Returns
    -------
    bool
        Whether ``type(x)`` is defined in a ``torch`` module.
    """
    return type(x).__module__.startswith("torch")


def as_logits(logits, *, finite: bool = False) -> np.ndarray:
    """Logits as a float64 array of shape (n_samples, n_classes).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
        At least one row and two classes, a real dtype.
    finite : bool, default False
        Also require every value to be finite.

    Raises
    ------
    ValueError
        Wrong dimensionality, no rows, fewer than 2 classes, a non-real dtype,
        or (``finite``) a NaN/inf entry, which is named by row and class.
    """
    arr = np.asarray(logits)
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D (n_samples, n_classes), got shape {arr.shape}")
    if arr.shape[1] < 2:
        raise ValueError(f"logits need at least 2 classes, got n_classes={arr.shape[1]}")
    if arr.shape[0] < 1:
        raise ValueError("logits have no rows (n_samples=0)")
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise ValueError(f"logits must be real numbers, got dtype {arr.dtype}")
    z = arr.astype(np.float64, copy=False)
    if finite and not np.isfinite(z).all():
        bad = np.argwhere(~np.isfinite(z))[0]
        raise ValueError(f"logits must be finite, got {z[bad[0], bad[1]]} at row {bad[0]}, class {bad[1]}")
    return z


def as_labels(labels, *, n_samples: int, n_classes: int) -> np.ndarray:
    """Labels as an int64 array of shape (n_samples,) with values in [0, n_classes).

    Parameters
    ----------
    labels : array_like of shape (n_samples,)
        Class indices.
    n_samples : int
        The number of logit rows the labels belong to.
    n_classes : int
        The number of classes K.

    Returns
    -------
    ndarray of shape (n_samples,), int64

    Raises
    ------
    ValueError
        A length that does not match the logits, a non-integer dtype, or a
        value outside [0, n_classes) (the range found is shown).
    """
    y = np.asarray(labels)
    if y.shape != (n_samples,):
        raise ValueError(f"inconsistent numbers of samples: logits {n_samples}, labels {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers in [0, {n_classes}) (class indices), got dtype {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must be integers in [0, {n_classes}), got range [{y.min()}, {y.max()}]")
    return y.astype(np.int64, copy=False)


def check_sigma(sigma) -> float:
    """One noise standard deviation: a real number, finite and >= 0, as float.

    Parameters
    ----------
    sigma : float
        The standard deviation of Eq. logits-noise.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        Not a real number (bool included).
    ValueError
        NaN, infinite or negative.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real):
        raise TypeError(f"sigma must be a real number, got {sigma!r} of type {type(sigma).__name__}")
    value = float(sigma)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    return value


def as_sigmas(sigma) -> np.ndarray:
    """A scalar or 1-D array of noise scales as a 1-D float64 array, each finite and >= 0.

    Parameters
    ----------
    sigma : float or array_like of shape (n_sigmas,)
        Noise standard deviations.

    Returns
    -------
    ndarray of shape (n_sigmas,), float64
        A scalar becomes a one-element array.

    Raises
    ------
    ValueError
        More than one dimension, or a value that is NaN, infinite or negative
        (the first such value is shown). A non-numeric input raises numpy's own
        error on conversion.
    """
    s = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    if s.ndim != 1:
        raise ValueError(f"sigma must be a scalar or 1-D, got shape {s.shape}")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        bad = s[~(np.isfinite(s) & (s >= 0))][0]
        raise ValueError(f"sigma must be finite and >= 0, got {bad}")
    return s


#: Shortest key accepted for per-input seeding: 128 bits, so that one clean/noisy
#: pair does not let a thief search the key space offline.
MIN_KEY_BYTES = 16
#: Longest key accepted: HMAC-SHA256 hashes a longer key down to 32 bytes, so more adds nothing.
MAX_KEY_BYTES = 64


def check_key(key) -> bytes:
    """A per-input seeding secret: bytes-like of at least :data:`MIN_KEY_BYTES` bytes, returned as bytes.

    Parameters
    ----------
    key : bytes, bytearray or memoryview
        The secret.

    Returns
    -------
    bytes

    Raises
    ------
    TypeError
        Not bytes-like (a str must be encoded, or better, made by ``caliber keygen``).
    ValueError
        Shorter than 16 bytes, or one byte repeated (all zeros, say): the
        message gives the length, never the key.
    """
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes (e.g. from caliber_core.serving.keys.new_key()), "
                        f"got {type(key).__name__}")
    key = bytes(key)
    if len(key) < MIN_KEY_BYTES:
        unit = "byte" if len(key) == 1 else "bytes"
        raise ValueError(f"key is {len(key)} {unit}; need at least {MIN_KEY_BYTES} random bytes "
                         f"(make one with 'python -m caliber_core keygen --out KEYFILE')")
    if len(set(key)) == 1:
        raise ValueError(f"key is {len(key)} copies of one byte, not a secret "
                         f"(make one with 'python -m caliber_core keygen --out KEYFILE')")
    return key


def check_seed(seed) -> np.random.Generator:
    """A numpy Generator from a seed (int >= 0 or None) or a Generator passed through.

    Parameters
    ----------
    seed : int, None or numpy.random.Generator
        None draws fresh entropy.

    Returns
    -------
    numpy.random.Generator
        ``seed`` itself when it is one, else ``numpy.random.default_rng(seed)``.

    Raises
    ------
    ValueError
        A negative or non-integer seed (bools refused).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer, None or a numpy Generator, got {seed!r}")
    return np.random.default_rng(seed)
