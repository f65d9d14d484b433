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

Only numpy is imported; torch is used lazily when a tensor is given.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..validation import check_key
from . import keyed_noise
from .keys import key_fingerprint

DEFAULT_FEATURES = 128
PROJECTION_DIM = 32
DEFAULT_LENGTH_SCALE = 4.0
_DOMAIN = b"caliber.consistent-noise/v1\x00"


def keyed_normals(key: bytes, binding: bytes, level: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normals of ``shape`` (1-D or 2-D) as a pure function of (key, binding, level, name, shape).

    Notes
    -----
    The project's one keyed generator (:func:`.keyed_noise.unit_normals`),
    each matrix row a fixed label ``domain || name || shape || row`` in place of a request id.
    """
    key = check_key(key)
    if not isinstance(binding, (bytes, bytearray)):
        raise TypeError(f"binding must be bytes, got {type(binding).__name__}")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    tag = _DOMAIN + name.encode() + b"\x00" + ",".join(str(int(s)) for s in shape).encode() + b"\x00"
    labels = [tag + str(r).encode() for r in range(rows)]
    out = keyed_noise.unit_normals(key, bytes(binding), int(level), keyed_noise.row_digests(labels), int(cols))
    return out.reshape(shape)


@dataclass(frozen=True)
class Centring:
    """What the calibration rows measured: the mean feature vector and the RMS of the centred noise."""

    phi_mean: np.ndarray  # (F,)
    gain: float

    def to_dict(self) -> dict:
        return {"phi_mean": [float(x) for x in self.phi_mean], "gain": float(self.gain)}

    @classmethod
    def from_dict(cls, record, *, features: int) -> "Centring":
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
    """

    def __init__(self, key: bytes, *, binding: bytes, n_classes: int, scale: float,
                 length_scale: float = DEFAULT_LENGTH_SCALE, level: int = 1, features: int = DEFAULT_FEATURES,
                 centring: Centring | None = None):
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
        freq = keyed_normals(self._key, self.binding, level, "frequencies", (d, f))
        if d < k:
            # Logits -> d dims -> frequencies, folded into one (K, F) matrix only when that is cheaper.
            self._projection = keyed_normals(self._key, self.binding, level, "projection", (k, d)) / math.sqrt(d)
        else:
            self._projection = None
        # Row centring and the 1/(l S) unit are folded into the first matrix (u = z C / (l S)).
        first = self._projection if self._projection is not None else freq
        first = (first - first.mean(axis=0, keepdims=True)) / (self.length_scale * self.scale)
        self._first, self._freq = first, (freq if self._projection is not None else None)
        unit = keyed_normals(self._key, self.binding, level, "phases", (f,))
        self._phase = 2.0 * math.pi * _normal_cdf(unit)
        self._mix = keyed_normals(self._key, self.binding, level, "mixing", (f, k))
        self._torch_cache: dict = {}

    def __repr__(self) -> str:
        return (f"ConsistentNoise(n_classes={self.n_classes}, scale={self.scale!r}, "
                f"length_scale={self.length_scale!r}, level={self.level}, centred={self.centring is not None})")

    # ------------------------------------------------------------------ numpy

    def features_of(self, logits: np.ndarray) -> np.ndarray:
        """phi(z), shape (N, F), float64; non-finite logits (masked classes) count as the row's finite minimum."""
        z = _finite_rows(np.asarray(logits, dtype=np.float64))
        t = z @ self._first
        if self._freq is not None:
            t = t @ self._freq
        t += self._phase
        np.cos(t, out=t)
        t *= math.sqrt(2.0 / self.features)
        return t

    def centred_on(self, logits) -> "ConsistentNoise":
        """This function with its centring measured on ``logits`` (the calibration rows)."""
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
        """g(z) for a torch tensor (N, K), float64, on the tensor's own device (no host copy)."""
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


def level_noise(noises, sigmas, level: int, logits, *, torch_tensor: bool = False):
    """The nested noise of ``level`` (1-based): sum_{i<=level} sqrt(sigma_i^2 - sigma_{i-1}^2) g_i(z).

    ``noises[i]`` and ``sigmas[i]`` belong to level i + 1; sigmas ascend, so a
    lower level's noise is part of every higher level's and two accounts
    served different levels see consistent answers.
    """
    if not 1 <= level <= len(sigmas) or len(noises) != len(sigmas):
        raise ValueError(f"level must be in [1, {len(sigmas)}] with one noise per sigma, got level {level}")
    total, previous = None, 0.0
    for noise, sigma in zip(noises[:level], sigmas[:level]):
        step = math.sqrt(max(sigma * sigma - previous * previous, 0.0))
        previous = sigma
        if step == 0.0:
            continue
        part = (noise.torch_noise(logits) if torch_tensor else noise(logits)) * step
        total = part if total is None else total + part
    if total is None:
        total = (logits.detach().to(__import__("torch").float64) * 0.0) if torch_tensor else \
            np.zeros(np.shape(logits), dtype=np.float64)
    return total


def _finite_rows(z: np.ndarray) -> np.ndarray:
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


# --------------------------------------------------------------------------
# serving a calibrated consistent config
# --------------------------------------------------------------------------

def noise_binding(record) -> bytes:
    """The generator's binding for a consistent config: a digest of the noise's identity.

    The full config cannot be bound (its sigmas come from this noise), so the
    identity is what fixes g before calibration: the random ``noise_id`` minted
    by ``calibrate``, the data digest, the seeding, the length scale, the
    feature count, the scale S and the key's fingerprint.
    """
    fields = ("noise_id", "data_sha256", "seeding", "length_scale", "features", "scale", "key_fingerprint")
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(f"consistent noise record is missing field(s): {', '.join(missing)}")
    text = "|".join(f"{f}={record[f]!r}" for f in fields)
    return hashlib.sha256(text.encode()).digest()


def level_functions(record, key: bytes, n_classes: int) -> tuple[list[ConsistentNoise], list[float]]:
    """The centred function g_j and the sigma of every level of a config's consistent record."""
    if record.get("seeding") != "consistent":
        raise ValueError(f"the config's noise record has seeding {record.get('seeding')!r}, not 'consistent'")
    expected = record["key_fingerprint"]
    if key_fingerprint(key) != expected:
        raise ValueError(f"this key's fingerprint {key_fingerprint(key)} differs from the one the config was "
                         f"calibrated with ({expected}): consistent noise is calibrated per key")
    binding = noise_binding(record)
    noises, sigmas = [], []
    for j, level in enumerate(record["levels"], start=1):
        features = int(record["features"])
        noises.append(ConsistentNoise(key, binding=binding, n_classes=n_classes, scale=float(record["scale"]),
                                      length_scale=float(record["length_scale"]), level=j, features=features,
                                      centring=Centring.from_dict(level["centring"], features=features)))
        sigmas.append(float(level["sigma"]))
    if any(b <= a for a, b in zip(sigmas, sigmas[1:])):
        raise ValueError(f"consistent levels must have ascending sigmas, got {sigmas}")
    return noises, sigmas


class ConsistentLevels:
    """The nested consistent noise of one served target of a config (what the runtime adds).

    Parameters
    ----------
    config : dict
        A loaded config with a consistent ``noise`` record.
    target : int
        Index into ``config["targets"]``; served at its ``level``.
    key : bytes
        Must be the key the config was calibrated with (checked by fingerprint).
    """

    def __init__(self, config, *, target: int, key: bytes):
        record = config.get("noise")
        if not isinstance(record, dict):
            raise ValueError("this config has no consistent noise record: calibrate it with --seeding consistent")
        self.n_classes = int(config["n_classes"])
        self.noises, self.levels = level_functions(record, key, self.n_classes)
        entry = config["targets"][target]
        level = entry.get("level")
        if not isinstance(level, int) or not 1 <= level <= len(self.levels):
            raise ValueError(f"targets[{target}].level must be in [1, {len(self.levels)}], got {level!r}")
        self.level = level
        self.sigma = self.levels[level - 1]

    def noise(self, logits) -> np.ndarray:
        """sigma-scaled noise for (N, K) logits, float64 (numpy) or a float64 tensor (torch)."""
        if np.shape(logits)[-1] != self.n_classes:
            raise ValueError(f"logits have {np.shape(logits)[-1]} classes; the config was calibrated "
                             f"for n_classes={self.n_classes}")
        is_tensor = type(logits).__module__.startswith("torch")
        return level_noise(self.noises, self.levels, self.level, logits, torch_tensor=is_tensor)
