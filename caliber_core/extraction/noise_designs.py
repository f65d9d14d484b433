"""Noise designs the thief frontier compares: each a keyed unit noise g(z) of the clean logits.

Every design here serves z + sigma * g(z) with g fixed by a key and scaled to
unit RMS on the calibration rows, so one key's accuracy is an exact step
function of sigma (:func:`~caliber_core.calibration.keyed_curve.solve_keyed`)
and every design is calibrated the same way: a target in, sigma out.

* ``per-input``: one independent normal draw per row (what per-input seeding
  serves; a near-duplicate is a new row, hence a new draw);
* ``field``: the consistent field of :mod:`caliber_core.serving.consistent_noise`
  at a length scale (units of S), centred on the calibration rows (``field-4`` is
  what ``--seeding consistent`` serves);
* ``balanced``: the same field, centred and variance-equalized *per predicted
  class* on the calibration rows, so that no cluster of inputs carries a
  systematic push toward one other class (a class-frequency shift that prior
  correction removes);
* ``simplex``: a field of the softmax probabilities instead of the raw logits
  (length scale in probability units), centred on the rows;
* ``mixed``: a field plus a share of per-input noise (variance shares add to 1);
* ``deep``: a field whose amplitude grows with the row's margin (1 + margin / S),
  so that errors fall inside class regions rather than on their borders;
* ``class-cycle``: consistent noise version 2
  (:class:`~caliber_core.serving.class_cycle_noise.ClassCycleNoise`): class pi(c)
  gains a_c (z_c - mean z)+ along a keyed K-cycle, the amplitudes balanced on
  the calibration rows so that class frequencies stay put at the target;
* ``cycle-mix`` / ``cycle-push-bal`` / ``random-mix``: its relatives (the whole
  centred logit vector mixed along the cycle, unbalanced; a bounded push toward
  pi(argmax), balanced; a keyed random K x K mixing).

Designs only see logits: the served API has no inputs. Designs keyed on the
inputs, measured but not served, are in :mod:`.input_designs`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..serving.class_cycle_noise import ClassCycleNoise
from ..serving.consistent_levels import noise_binding
from ..serving.consistent_noise import DEFAULT_FEATURES, ConsistentNoise

#: Callable g: (N, K) logits -> (N, K) unit noise. ``rows`` names the rows for per-input draws.
UnitNoise = Callable[..., np.ndarray]


@dataclass(frozen=True)
class Design:
    """A noise design: a name, its family and its parameters.

    Attributes
    ----------
    name : str
    family : str
        "per-input", "class-cycle", "simplex", "field", "balanced", "deep", "cycle-mix", "cycle-push",
        "random-mix", "cycle-field" or "mixed".
    length_scale : float, default 4.0
        A field's length scale in units of S.
    iid_share : float, default 0.0
        Share of the variance drawn per input instead of from the field.
    balance_share : float, default 0.0
        Class cycles: balance class frequencies where this share of rows flips.
    """

    name: str
    family: str
    length_scale: float = 4.0
    iid_share: float = 0.0
    balance_share: float = 0.0  # class cycles: balance class frequencies where this share of rows flips

    def build(self, logits: np.ndarray, key: bytes, *, scale: float, target: float = 0.75) -> UnitNoise:
        """g for ``key``, scaled and centred on ``logits`` (the calibration rows).

        Parameters
        ----------
        logits : ndarray of shape (n, K)
            The calibration rows.
        key : bytes
            The simulated provider's key.
        scale : float
            S of the logits.
        target : float, default 0.75
            The teacher retention the noise will be calibrated for; only the class
            cycle uses it (it is balanced where 1 - target of the rows change).

        Returns
        -------
        callable
            Unit noise ``g(x, rows=None)`` of shape (n, K) for answers ``x``.

        Raises
        ------
        ValueError
            An unknown family.
        """
        z = np.asarray(logits, dtype=np.float64)
        if self.family == "per-input":
            return _PerInput(key)
        if self.family == "class-cycle":
            share = min(max(1.0 - float(target), 0.01), 0.95)
            served = ClassCycleNoise(key, binding=hashlib.sha256(b"frontier|" + z.tobytes()).digest(),
                                     n_classes=z.shape[1]).balanced_on(z, share=share)
            return lambda x, rows=None: served(x)
        if self.family == "simplex":
            field = _field(_probabilities(z), key, self.name, scale=1.0, length_scale=self.length_scale)
            return _Composed(field, _probabilities, z)
        field = _field(z, key, self.name, scale=scale, length_scale=self.length_scale)
        if self.family == "field":
            return _Composed(field, None, z)
        if self.family == "balanced":
            return _Balanced(field, z)
        if self.family == "deep":
            return _Composed(field, None, z, weight=lambda x: 1.0 + _margins(x) / scale)
        if self.family in ("cycle-mix", "cycle-push", "random-mix"):
            return _ClassMix(z, key, self.family, scale=scale, balanced=self.balance_share)
        if self.family == "cycle-field":
            return _Mixed(_ClassMix(z, key, "cycle-push", scale=scale), _Composed(field, None, z), 0.5, z)
        if self.family == "mixed":
            return _Mixed(_Composed(field, None, z), _PerInput(key + b"iid"), self.iid_share, z)
        raise ValueError(f"unknown noise family {self.family!r}")


DESIGNS = {d.name: d for d in (
    Design("per-input", "per-input"),
    Design("field-0.5", "field", 0.5),
    Design("field-1", "field", 1.0),
    Design("field-2", "field", 2.0),
    Design("field-4", "field", 4.0),
    Design("field-8", "field", 8.0),
    Design("balanced-1", "balanced", 1.0),
    Design("balanced-2", "balanced", 2.0),
    Design("balanced-4", "balanced", 4.0),
    Design("simplex-0.1", "simplex", 0.1),
    Design("simplex-0.3", "simplex", 0.3),
    Design("mixed-2", "mixed", 2.0, 0.3),
    Design("deep-2", "deep", 2.0),
    Design("deep-4", "deep", 4.0),
    Design("cycle-mix", "cycle-mix"),
    Design("cycle-push", "cycle-push"),
    Design("random-mix", "random-mix"),
    Design("class-cycle", "class-cycle"),
    Design("cycle-push-bal", "cycle-push", balance_share=0.25),
    Design("cycle-field-4", "cycle-field", 4.0),
)}


#: The design ``--seeding consistent`` serves (:mod:`caliber_core.serving.consistent_noise`).
SERVED_DESIGN = "field-4"


def design(name: str) -> Design:
    """The design called ``name`` (one of :data:`DESIGNS`).

    Parameters
    ----------
    name : str

    Returns
    -------
    Design

    Raises
    ------
    ValueError
        An unknown name.
    """
    if name not in DESIGNS:
        raise ValueError(f"noise design must be one of {sorted(DESIGNS)}, got {name!r}")
    return DESIGNS[name]


# ---------------------------------------------------------------------------

def _field(z: np.ndarray, key: bytes, name: str, *, scale: float, length_scale: float) -> ConsistentNoise:
    record = {"noise_id": "frontier-" + name, "data_sha256": hashlib.sha256(z.tobytes()).hexdigest(),
              "seeding": "consistent", "length_scale": float(length_scale), "features": DEFAULT_FEATURES,
              "scale": float(scale), "key_fingerprint": "simulation"}
    return ConsistentNoise(key, binding=noise_binding(record), n_classes=z.shape[1], scale=scale,
                           length_scale=length_scale)


def _probabilities(z: np.ndarray) -> np.ndarray:
    s = z - z.max(axis=1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=1, keepdims=True)


def _margins(z: np.ndarray) -> np.ndarray:
    top2 = np.sort(z, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0])[:, None]


def _rms(g: np.ndarray) -> float:
    value = float(np.sqrt(np.mean(g * g)))
    if not value > 0:
        raise ValueError("the calibration rows give noise of zero variance")
    return value


class _Composed:
    """(field(transform(z)) - mean) * weight(z) / rms, the centring and rms measured on the calibration rows."""

    def __init__(self, field: ConsistentNoise, transform, z, *, weight=None):
        self.field, self.transform, self.weight = field, transform, weight
        self.mean = self._field(z).mean(axis=0)
        self.gain = 1.0
        self.gain = _rms(self(z))

    def _field(self, z):
        x = z if self.transform is None else self.transform(z)
        return self.field.features_of(x) @ self.field._mix

    def __call__(self, z, rows=None):
        z = np.asarray(z, dtype=np.float64)
        g = self._field(z) - self.mean
        if self.weight is not None:
            g = g * self.weight(z)
        return g / self.gain


class _Balanced:
    """A field centred and variance-equalized within every predicted class of the calibration rows."""

    def __init__(self, field: ConsistentNoise, z):
        self.field = field
        g = self._plain(z)
        pred = z.argmax(axis=1)
        k = z.shape[1]
        self.means = np.zeros((k, k))
        self.scales = np.ones(k)
        for c in range(k):
            rows = g[pred == c]
            if len(rows) >= 2:
                self.means[c] = rows.mean(axis=0)
                self.scales[c] = _rms(rows - self.means[c])

    def _plain(self, z):
        return self.field.features_of(z) @ self.field._mix

    def __call__(self, z, rows=None):
        z = np.asarray(z, dtype=np.float64)
        c = z.argmax(axis=1)
        return (self._plain(z) - self.means[c]) / self.scales[c][:, None]


class _PerInput:
    """Independent standard normals per named row (rows: sequence of distinct labels)."""

    def __init__(self, key: bytes):
        self.key = bytes(key)

    def __call__(self, z, rows=None):
        z = np.asarray(z)
        if rows is None:
            raise ValueError("per-input noise needs row names")
        out = np.empty(z.shape, dtype=np.float64)
        for i, name in enumerate(rows):
            seed = int.from_bytes(hashlib.blake2b(self.key + str(name).encode(), digest_size=8).digest(), "little")
            out[i] = np.random.Generator(np.random.SFC64(seed)).standard_normal(z.shape[1])
        return out


class _Mixed:
    """sqrt(1 - share) a + sqrt(share) b, rescaled to unit RMS on the calibration rows."""

    def __init__(self, first, second, share: float, z):
        self.first, self.second, self.share = first, second, float(share)
        self.gain = 1.0
        self.gain = _rms(self(z, [f"calibration-{i}" for i in range(len(z))]))

    def __call__(self, z, rows=None):
        mix = math.sqrt(1 - self.share) * self.first(z, rows) + math.sqrt(self.share) * self.second(z, rows)
        return mix / self.gain


def keyed_cycle(key: bytes, n_classes: int) -> np.ndarray:
    """A keyed permutation of the classes that is one K-cycle (no class maps to itself).

    Parameters
    ----------
    key : bytes
    n_classes : int

    Returns
    -------
    ndarray of shape (n_classes,), int64
        ``next[c]``, the class that follows ``c``.
    """
    from ..serving.consistent_noise import keyed_normals

    order = np.argsort(keyed_normals(key, b"class-cycle", 1, "cycle", (n_classes,)))
    nxt = np.empty(n_classes, dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    return nxt


class _ClassMix:
    """Class confusion along a keyed cycle c -> pi(c), or a keyed random linear mixing of the centred logits.

    cycle-mix:  g = z~ P         (class pi(c) gains sigma * z~_c)
    cycle-push: g = S softmax(z / S) P   (a bounded push toward pi(argmax))
    random-mix: g = z~ A,  A ~ N(0, 1) keyed
    """

    def __init__(self, z, key, family, *, scale, balanced: float = 0.0):
        from ..serving.consistent_noise import keyed_normals

        k = z.shape[1]
        self.family, self.scale = family, float(scale)
        if family == "random-mix":
            self.matrix = keyed_normals(key, b"class-mix", 1, "mix", (k, k))
        else:
            nxt = keyed_cycle(key, k)
            self.matrix = np.zeros((k, k))
            self.matrix[np.arange(k), nxt] = 1.0
            if balanced:
                # per source class, the push that flips the same share of its rows at unit step (frequencies kept)
                self._balance(z, balanced)
        self.mean = 0.0
        self.gain = 1.0
        raw = self(z)
        # cycles are not centred: a constant vector would be a class bias, and balance keeps frequencies
        self.mean = raw.mean(axis=0) if family == "random-mix" else 0.0
        self.gain = _rms(raw - self.mean)

    def _balance(self, z, share: float) -> None:
        top = z.argmax(axis=1)
        base = self.matrix.copy()
        amp = np.ones(z.shape[1])
        self.mean, self.gain = 0.0, 1.0

        def flips(step):
            self.matrix = step * amp[:, None] * base
            return (z + self(z)).argmax(axis=1) != top

        for _ in range(40):
            lo, hi = 0.0, 1.0
            while flips(hi).mean() < share and hi < 1e6:
                lo, hi = hi, 2 * hi
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if flips(mid).mean() < share else (lo, mid)
            served = (z + self(z)).argmax(axis=1) if flips(hi) is not None else None
            clean_freq = np.bincount(top, minlength=z.shape[1]) + 0.5
            noisy_freq = np.bincount(served, minlength=z.shape[1]) + 0.5
            # class c feeds pi(c): push it less when pi(c) is over-predicted, more when under-predicted
            target = base.argmax(axis=1)
            amp *= (clean_freq[target] / noisy_freq[target]) ** 0.3
            amp /= amp.mean()
        self.matrix = hi * amp[:, None] * base

    def _source(self, z):
        if self.family == "cycle-push":
            return self.scale * _probabilities(z / (0.1 * self.scale))
        return z - z.mean(axis=1, keepdims=True)

    def __call__(self, z, rows=None):
        z = np.asarray(z, dtype=np.float64)
        return (self._source(z) @ self.matrix - self.mean) / self.gain
