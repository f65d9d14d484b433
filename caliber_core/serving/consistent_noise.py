"""Consistent noise: a keyed, smooth random function of the clean logits (numpy and torch).

Per-input noise gives every request id its own draw, so a thief who asks
near-duplicates, or who distills over thousands of inputs, averages the
draws away. Consistent noise is instead eps = sigma * g(z), where g is a
fixed random function of the clean logits z, drawn once from the provider's
key:

    u   = (z - mean_k z) / (length_scale * S)         centred logits, in units of S
    u_p = u @ P                                      (K > PROJECTION_DIM only) P_kj ~ N(0, 1/d)
    phi = sqrt(2 / F) * cos(u_p @ W + b)             W ~ N(0, I), b ~ U[0, 2 pi)
    g   = (phi - phi_bar) @ A / gain                 A ~ N(0, I)

For F -> infinity each class of g is an independent Gaussian process in z with
the squared-exponential kernel exp(-|u - u'|^2 / 2) (random Fourier features,
Rahimi and Recht 2007): inputs whose logits lie within ~ length_scale * S of
each other get nearly the same noise, so repeats and near-duplicates gain the
thief nothing, and no request id is needed. ``phi_bar`` and ``gain`` are
measured on the calibration rows (:meth:`ConsistentNoise.centred_on`): with a
fixed key, the mean of g over the data would otherwise act as a class bias,
which a thief removes by matching class frequencies; after centring, every
class has mean 0 and the noise has unit variance on the calibration rows.

Why a projection: the cost per row is K*d + d*F + F*K multiply-adds. Without
P the first term is K*F; at LLM vocabularies (K = 50,000) the projection
keeps the input side at K*d, and distances are kept up to a few percent
(Johnson-Lindenstrauss), so the kernel is too. The output side, F per class,
is of the order of drawing one normal per class, as per-input seeding does.

Keyed draws (P, W, b, A) come from the project's one keyed generator
(:mod:`.keyed_noise`), with the binding, the level and a fixed label per
matrix row: a different binding (the noise's identity), level or key gives
unrelated functions.

Version 2 (``caliber.consistent-noise/v2``, design ``class-cycle``, written by
``consistent_config(..., design="class-cycle")``; :mod:`.class_cycle_noise`) serves a different function,
a keyed class confusion along one cycle c -> pi(c) through all K classes,

    g(z)_{pi(c)} = a_c * max(z_c - mean_k z_k, 0) / gain      (:class:`ClassCycleNoise`)

so that class pi(c) gains in proportion to how far class c stands above the
row's mean. The served logits are a fixed linear-by-parts map of the clean
ones, which a student learns as easily as the clean teacher: its errors bind
soft-label students. The per-class amplitudes a_c are fitted on the
calibration rows so that every class keeps its frequency (what it loses along
the cycle it gains from its predecessor), which leaves prior correction
nothing to correct. It binds distilling thieves better than the field, but a
thief who knows the design estimates the cycle from its answers and subtracts
it (:mod:`caliber_core.extraction.cycle_unmixing`), which the field resists;
``calibrate --seeding consistent`` therefore still serves the field: version
3, the same field with every key label length-prefixed and versioned
(:func:`keyed_normals`); configs with no version are version 1 and keep its
labels, so they serve the noise they were calibrated for. A config's levels
are served by :mod:`.consistent_levels`.

Only numpy is imported; torch is used lazily when a tensor is given.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..validation import check_key
from . import keyed_noise

DEFAULT_FEATURES = 128
PROJECTION_DIM = 32
DEFAULT_LENGTH_SCALE = 4.0
_DOMAIN = b"caliber.consistent-noise/v1\x00"
VERSION_FIELD = "version"
FIELD_VERSION = "caliber.consistent-noise/v1"  # the smooth field, first key labels (records without a version)
CYCLE_VERSION = "caliber.consistent-noise/v2"  # the balanced class cycle
FIELD_V3 = "caliber.consistent-noise/v3"  # the smooth field, length-prefixed key labels: what calibrate writes
VERSIONS = (FIELD_VERSION, CYCLE_VERSION, FIELD_V3)
DESIGNS = {FIELD_VERSION: "field", CYCLE_VERSION: "class-cycle", FIELD_V3: "field"}


def keyed_normals(key: bytes, binding: bytes, level: int, name: str, shape: tuple[int, ...], *,
                  version: str = FIELD_VERSION) -> np.ndarray:
    """Standard normals of ``shape`` (1-D or 2-D) as a pure function of (key, binding, level, name, shape).

    Parameters
    ----------
    key : bytes
        The serving key (:func:`caliber_core.validation.check_key`).
    binding : bytes
        The noise's identity.
    level : int
        The noise level, 1-based.
    name : str
        What the matrix is for (``"first"``, ``"mix"``, ``"cycle"``, ...): another name, another matrix.
    shape : tuple of int
        (n,) or (rows, cols).
    version : str, default ``FIELD_VERSION``
        The record's noise version; selects the row labels.

    Returns
    -------
    ndarray of ``shape``, float64

    Raises
    ------
    TypeError
        ``key`` or ``binding`` is not bytes.
    ValueError
        A key that is too short or one repeated byte, or an unknown version.

    Notes
    -----
    The project's one keyed generator (:func:`.keyed_noise.unit_normals`, whose key derivation
    length-prefixes the binding and the level), each matrix row a fixed label in place of a request
    id: for version 2 every part length-prefixed, ``u64 len || version || u64 len || name || u64 len
    || shape || u64 row``; version 1 labels (``domain || name || shape || row``) are kept so that
    configs written before serve the same noise.
    """
    key = check_key(key)
    if not isinstance(binding, (bytes, bytearray)):
        raise TypeError(f"binding must be bytes, got {type(binding).__name__}")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    dims = ",".join(str(int(s)) for s in shape).encode()
    if version == FIELD_VERSION:
        tag = _DOMAIN + name.encode() + b"\x00" + dims + b"\x00"
        labels = [tag + str(r).encode() for r in range(rows)]
    elif version in VERSIONS:
        tag = b"".join(len(part).to_bytes(8, "big") + part for part in (version.encode(), name.encode(), dims))
        labels = [tag + r.to_bytes(8, "big") for r in range(rows)]
    else:
        raise ValueError(f"unknown consistent noise version {version!r}")
    out = keyed_noise.unit_normals(key, bytes(binding), int(level), keyed_noise.row_digests(labels), int(cols))
    return out.reshape(shape)


@dataclass(frozen=True)
class Centring:
    """What the calibration rows measured: the mean feature vector and the RMS of the centred noise.

    Attributes
    ----------
    phi_mean : ndarray of shape (features,)
        The mean of phi(z) over the calibration rows, subtracted before mixing.
    gain : float
        The RMS of the centred noise there; g is divided by it so its variance per class is 1.
    """

    phi_mean: np.ndarray  # (F,)
    gain: float

    def to_dict(self) -> dict:
        """The centring as plain JSON values: ``{"phi_mean": [...], "gain": float}``.

        Returns
        -------
        dict
        """
        return {"phi_mean": [float(x) for x in self.phi_mean], "gain": float(self.gain)}

    @classmethod
    def from_dict(cls, record, *, features: int) -> "Centring":
        """A centring read back from a config's level record (:meth:`to_dict`).

        Parameters
        ----------
        record : Mapping
            With ``phi_mean`` and ``gain``.
        features : int
            F, the length ``phi_mean`` must have.

        Returns
        -------
        Centring

        Raises
        ------
        ValueError
            ``phi_mean`` not F finite numbers, or a gain that is not positive and finite.
        KeyError
            A field is missing.
        """
        phi = np.asarray(record["phi_mean"], dtype=np.float64)
        gain = float(record["gain"])
        if phi.shape != (features,) or not np.isfinite(phi).all():
            raise ValueError(f"centring phi_mean must hold {features} finite numbers, got shape {phi.shape}")
        if not (math.isfinite(gain) and gain > 0):
            raise ValueError(f"centring gain must be a positive number, got {gain!r}")
        return cls(phi, gain)


class ConsistentNoise:
    """The keyed function g of one noise level (see the module docstring).

    Parameters
    ----------
    key : bytes
        The provider's secret.
    binding : bytes
        The noise's identity (e.g. a calibration's noise id): another binding
        gives an unrelated g.
    n_classes : int
        K.
    scale : float
        S, the margin scale of the calibration rows (logit units).
    length_scale : float, default DEFAULT_LENGTH_SCALE
        Correlation length of g in units of S.
    level : int, default 1
        Nested levels use independent functions.
    features : int, default DEFAULT_FEATURES
        F, random Fourier features.
    centring : Centring, optional
        Measured on calibration rows; without it g is the raw random function
        (unit variance only on average over keys).
    version : str, default FIELD_VERSION
        The key labels of the draws: version 1's (configs written before noise
        versions) or version 3's, length-prefixed (what ``calibrate`` writes now).
    """

    def __init__(self, key: bytes, *, binding: bytes, n_classes: int, scale: float,
                 length_scale: float = DEFAULT_LENGTH_SCALE, level: int = 1, features: int = DEFAULT_FEATURES,
                 centring: Centring | None = None, version: str = FIELD_VERSION):
        if version not in (FIELD_VERSION, FIELD_V3):
            raise ValueError(f"a field is consistent noise version {FIELD_VERSION} or {FIELD_V3}, got {version!r}")
        self.version = version
        for name, value in (("n_classes", n_classes), ("features", features), ("level", level)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        for name, value in (("scale", scale), ("length_scale", length_scale)):
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.n_classes, self.features, self.level = int(n_classes), int(features), int(level)
        self.scale, self.length_scale = float(scale), float(length_scale)
        self.binding = bytes(binding)
        self.centring = centring
        self._key = check_key(key)
        k, f = self.n_classes, self.features
        d = PROJECTION_DIM if k > PROJECTION_DIM else k
        freq = keyed_normals(self._key, self.binding, level, "frequencies", (d, f), version=version)
        if d < k:
            # Logits -> d dims -> frequencies, folded into one (K, F) matrix only when that is cheaper.
            projection = keyed_normals(self._key, self.binding, level, "projection", (k, d), version=version)
            self._projection = projection / math.sqrt(d)
        else:
            self._projection = None
        # Row centring and the 1/(l S) unit are folded into the first matrix (u = z C / (l S)).
        first = self._projection if self._projection is not None else freq
        first = (first - first.mean(axis=0, keepdims=True)) / (self.length_scale * self.scale)
        self._first, self._freq = first, (freq if self._projection is not None else None)
        unit = keyed_normals(self._key, self.binding, level, "phases", (f,), version=version)
        self._phase = 2.0 * math.pi * _normal_cdf(unit)
        self._mix = keyed_normals(self._key, self.binding, level, "mixing", (f, k), version=version)
        self._torch_cache: dict = {}

    def __repr__(self) -> str:
        return (f"ConsistentNoise(n_classes={self.n_classes}, scale={self.scale!r}, "
                f"length_scale={self.length_scale!r}, level={self.level}, centred={self.centring is not None})")

    # ------------------------------------------------------------------ numpy

    def features_of(self, logits: np.ndarray) -> np.ndarray:
        """phi(z): the random Fourier features of each row.

        Parameters
        ----------
        logits : ndarray of shape (N, K)
            The clean logits; non-finite values (masked classes) count as the row's finite minimum.

        Returns
        -------
        ndarray of shape (N, F), float64

        Raises
        ------
        ValueError
            ``logits`` is not 2-D.
        """
        z = finite_rows(np.asarray(logits, dtype=np.float64))
        t = z @ self._first
        if self._freq is not None:
            t = t @ self._freq
        t += self._phase
        np.cos(t, out=t)
        t *= math.sqrt(2.0 / self.features)
        return t

    def centred_on(self, logits) -> "ConsistentNoise":
        """This function with its centring measured on ``logits`` (the calibration rows).

        Parameters
        ----------
        logits : ndarray of shape (N, K)
            The calibration rows.

        Returns
        -------
        ConsistentNoise
            A copy whose ``centring`` holds the rows' mean features and RMS; ``self`` is unchanged.

        Raises
        ------
        ValueError
            The rows give noise of zero variance (all rows equal, say).
        """
        phi = self.features_of(logits)
        phi_mean = phi.mean(axis=0)
        g = (phi - phi_mean) @ self._mix
        gain = float(np.sqrt(np.mean(g * g)))
        if not gain > 0:
            raise ValueError("the calibration rows give consistent noise of zero variance (all rows equal?)")
        out = object.__new__(ConsistentNoise)
        out.__dict__.update(self.__dict__)
        out.centring = Centring(phi_mean, gain)
        out._torch_cache = {}
        return out

    def __call__(self, logits) -> np.ndarray:
        """g(z), shape (N, K), float64 (numpy in, numpy out)."""
        phi = self.features_of(logits)
        if self.centring is not None:
            phi -= self.centring.phi_mean
        g = phi @ self._mix
        if self.centring is not None:
            g /= self.centring.gain
        # Bounded like every keyed draw (|x| <= MAX_ABS_NORMAL, ~8.3 sd): the runtime's overflow check relies on it.
        return np.clip(g, -keyed_noise.MAX_ABS_NORMAL, keyed_noise.MAX_ABS_NORMAL, out=g)

    # ------------------------------------------------------------------ torch

    def torch_noise(self, logits):
        """g(z) for a torch tensor (N, K), float64, on the tensor's own device (no host copy).

        Parameters
        ----------
        logits : torch.Tensor of shape (N, K)
            The clean logits; non-finite values count as the row's smallest finite one.

        Returns
        -------
        torch.Tensor of shape (N, K), float64
            The values :meth:`__call__` gives for the same logits, bounded by ``MAX_ABS_NORMAL``.
        """
        import torch

        dev = logits.device
        cached = self._torch_cache.get(dev)
        if cached is None:
            def put(a):
                return None if a is None else torch.as_tensor(np.asarray(a), dtype=torch.float64, device=dev)

            c = self.centring
            cached = (put(self._first), put(self._freq), put(self._phase), put(self._mix),
                      None if c is None else put(c.phi_mean), None if c is None else c.gain)
            self._torch_cache[dev] = cached
        first, freq, phase, mix, phi_mean, gain = cached
        z = logits.detach().to(torch.float64)
        finite = torch.isfinite(z)
        if not bool(finite.all()):
            low = torch.where(finite, z, torch.full_like(z, math.inf)).amin(dim=1, keepdim=True)
            z = torch.where(finite, z, low)
        t = z @ first
        if freq is not None:
            t = t @ freq
        phi = torch.cos(t + phase) * math.sqrt(2.0 / self.features)
        if phi_mean is not None:
            phi = phi - phi_mean
        g = phi @ mix
        g = g / gain if gain is not None else g
        return g.clamp_(-keyed_noise.MAX_ABS_NORMAL, keyed_noise.MAX_ABS_NORMAL)


def finite_rows(z: np.ndarray) -> np.ndarray:
    """(N, K) logits with each non-finite value replaced by its row's smallest finite one.

    Parameters
    ----------
    z : ndarray of shape (N, K), float64
        Logits; a masked class is -inf.

    Returns
    -------
    ndarray of shape (N, K)
        ``z`` itself when every value is finite, else a copy.

    Raises
    ------
    ValueError
        ``z`` is not 2-D.
    """
    if z.ndim != 2:
        raise ValueError(f"logits must be (n_samples, n_classes), got shape {z.shape}")
    if np.isfinite(z).all():
        return z
    low = np.where(np.isfinite(z), z, np.inf).min(axis=1, keepdims=True)
    return np.where(np.isfinite(z), z, low)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    # Phi via erf, without scipy (the serving path imports numpy only).
    from math import erf, sqrt

    return np.array([0.5 * (1.0 + erf(v / sqrt(2.0))) for v in np.ravel(x)]).reshape(np.shape(x))
