"""Noise designs keyed on the input: errors consistent over regions of the standardized inputs.

The designs of :mod:`.noise_designs` see only logits. These see the query's
inputs as well, standardized with the calibration rows' per-feature mean and
standard deviation (statistics the provider holds), so that their errors are
a fixed function of *where* the query lies -- a function a student can fit,
the way its own function varies over the input space:

* ``input-field-L``: z + sigma * g(x), g a keyed smooth random field of the
  standardized inputs (random Fourier features, length scale L in units of
  sqrt(D), the typical distance between two standardized inputs being about
  sqrt(2 D)); centred and scaled to unit RMS on the calibration rows, sigma
  solved exactly (:func:`~caliber_core.calibration.keyed_curve.solve_keyed`);
* ``cells-swap-pxh``: the inputs projected on p keyed directions and cut into
  cells of width h (units of each projection's standard deviation, keyed
  offsets); every cell draws a keyed uniform u, and in every cell with
  u < t the top two logits of every query are swapped. t is solved on the
  calibration rows: the cells are added in order of u until the accuracy is
  nearest the target, so the retention is exact to one cell's rows.

Both are pure functions of (key, inputs, logits) once calibrated: a repeated
or near-duplicate query gets the same error.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..calibration.keyed_curve import solve_keyed

RANDOM_FEATURES = 256  # cosines of the input field (its smoothness does not depend on this count)


@dataclass(frozen=True)
class InputDesign:
    """A design keyed on the input: a name, its family and its geometry.

    Attributes
    ----------
    name : str
    family : {"input-field", "cells-swap"}
    length_scale : float
        input-field: the field's length scale in units of sqrt(D); cells-swap: the
        cell width in units of each projection's standard deviation.
    dims : int
        cells-swap: the keyed directions the cells are cut along.
    """

    name: str
    family: str
    length_scale: float
    dims: int = 0

    def calibrate(self, inputs, logits, labels, key: bytes, *, target: float) -> "CalibratedInputNoise":
        """The design under ``key``, its strength solved so the calibration rows' accuracy is ``target``.

        Parameters
        ----------
        inputs : ndarray of shape (n, D)
            The calibration rows' inputs.
        logits : ndarray of shape (n, K)
            Their clean logits.
        labels : ndarray of shape (n,)
        key : bytes
            The provider's key.
        target : float
            Absolute accuracy on these rows, in (0, 1).

        Returns
        -------
        CalibratedInputNoise

        Raises
        ------
        ValueError
            Mismatched shapes, a target outside (0, 1), or an unknown family.
        """
        x = np.asarray(inputs, dtype=np.float64)
        z = np.asarray(logits, dtype=np.float64)
        y = np.asarray(labels)
        if x.ndim != 2 or z.ndim != 2 or len(x) != len(z) or len(y) != len(z):
            raise ValueError(f"inputs, logits and labels must have the same rows, got {x.shape}, {z.shape}, {y.shape}")
        if not 0 < target < 1:
            raise ValueError(f"target accuracy must be in (0, 1), got {target!r}")
        standardize = _Standardizer(x)
        u = standardize(x)
        if self.family == "input-field":
            field = _InputField(key, self.name, x.shape[1], z.shape[1], self.length_scale)
            raw = field(u)
            mean = raw.mean(axis=0)
            gain = float(np.sqrt(np.mean((raw - mean) ** 2)))
            g = (raw - mean) / gain
            sigma = solve_keyed(z, y, g, target=target, bootstrap=0).sigma
            return _FieldNoise(standardize, field, mean, gain, float(sigma))
        if self.family == "cells-swap":
            cells = _Cells(key, self.name, u, self.dims, self.length_scale)
            return _SwapNoise(standardize, cells, _threshold(cells.uniforms(u), z, y, target))
        raise ValueError(f"unknown input design family {self.family!r}")


class CalibratedInputNoise:
    """A calibrated input-keyed design: :meth:`serve` answers queries, ``strength`` says how hard it pushes."""

    strength: float  # input-field: sigma in logit units; cells-swap: the cut t on the cells' uniforms

    def serve(self, inputs, logits) -> np.ndarray:  # pragma: no cover - interface
        """The answers to queries ``inputs`` whose clean logits are ``logits``."""
        raise NotImplementedError

    def altered(self, inputs) -> np.ndarray:  # pragma: no cover - interface
        """Boolean, per query: whether the design changes its answer's order (cells) or adds to it (field)."""
        raise NotImplementedError


INPUT_DESIGNS = {d.name: d for d in (
    InputDesign("input-field-0.3", "input-field", 0.3),
    InputDesign("input-field-1", "input-field", 1.0),
    InputDesign("cells-swap-4x1", "cells-swap", 1.0, 4),
)}


def input_design(name: str) -> InputDesign:
    """The input-keyed design called ``name`` (one of :data:`INPUT_DESIGNS`).

    Parameters
    ----------
    name : str

    Returns
    -------
    InputDesign

    Raises
    ------
    ValueError
        An unknown name.
    """
    if name not in INPUT_DESIGNS:
        raise ValueError(f"input design must be one of {sorted(INPUT_DESIGNS)}, got {name!r}")
    return INPUT_DESIGNS[name]


def swap_top2(answers, rows) -> np.ndarray:
    """``answers`` with the two largest entries of every row in ``rows`` exchanged.

    Parameters
    ----------
    answers : array_like of shape (n, K)
    rows : array_like of bool, shape (n,)

    Returns
    -------
    ndarray of shape (n, K), float64
    """
    out = np.array(answers, dtype=np.float64, copy=True)
    idx = np.flatnonzero(np.asarray(rows, dtype=bool))
    if idx.size:
        order = np.argsort(out[idx], axis=1)
        first, second = order[:, -1], order[:, -2]
        a, b = out[idx, first].copy(), out[idx, second].copy()
        out[idx, first], out[idx, second] = b, a
    return out


# ---------------------------------------------------------------------------

def _generator(key: bytes, name: str, what: str) -> np.random.Generator:
    seed = hashlib.blake2b(bytes(key) + b"|input-design|" + name.encode() + b"|" + what.encode(), digest_size=16)
    return np.random.Generator(np.random.SFC64(int.from_bytes(seed.digest(), "little")))


class _Standardizer:
    """(x - mean) / std with the calibration rows' statistics (std floored at a tenth of the mean std)."""

    def __init__(self, x: np.ndarray):
        self.mean = x.mean(axis=0)
        std = x.std(axis=0)
        self.std = np.maximum(std, 0.1 * float(std.mean()) if std.mean() > 0 else 1.0)

    def __call__(self, x) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std


class _InputField:
    """sqrt(2 / F) cos(u W / (L sqrt(D)) + b) A: a smooth keyed field of the standardized inputs u."""

    def __init__(self, key: bytes, name: str, n_features: int, n_classes: int, length_scale: float):
        if not (math.isfinite(length_scale) and length_scale > 0):
            raise ValueError(f"length scale must be > 0, got {length_scale!r}")
        gen = _generator(key, name, "field")
        self.w = gen.standard_normal((n_features, RANDOM_FEATURES)) / (length_scale * math.sqrt(n_features))
        self.b = gen.uniform(0.0, 2 * math.pi, RANDOM_FEATURES)
        self.a = gen.standard_normal((RANDOM_FEATURES, n_classes)) * math.sqrt(2.0 / RANDOM_FEATURES)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return np.cos(u @ self.w + self.b) @ self.a


class _FieldNoise(CalibratedInputNoise):
    def __init__(self, standardize, field, mean, gain, sigma):
        self.standardize, self.field, self.mean, self.gain, self.strength = standardize, field, mean, gain, sigma

    def unit(self, inputs) -> np.ndarray:
        return (self.field(self.standardize(inputs)) - self.mean) / self.gain

    def serve(self, inputs, logits) -> np.ndarray:
        return np.asarray(logits, dtype=np.float64) + self.strength * self.unit(inputs)

    def altered(self, inputs) -> np.ndarray:
        return np.ones(len(inputs), dtype=bool)


class _Cells:
    """Cells of the standardized inputs: floor(u P / (h s) + o) along p keyed unit directions P."""

    def __init__(self, key: bytes, name: str, u: np.ndarray, dims: int, width: float):
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise ValueError(f"cells need at least one direction, got {dims!r}")
        if not (math.isfinite(width) and width > 0):
            raise ValueError(f"cell width must be > 0, got {width!r}")
        gen = _generator(key, name, "cells")
        p = gen.standard_normal((u.shape[1], dims))
        self.directions = p / np.linalg.norm(p, axis=0)
        spread = (u @ self.directions).std(axis=0)
        self.width = width * np.where(spread > 0, spread, 1.0)
        self.offsets = gen.uniform(0.0, 1.0, dims)
        self.key, self.name = bytes(key), name

    def coordinates(self, u: np.ndarray) -> np.ndarray:
        return np.floor(u @ self.directions / self.width + self.offsets).astype(np.int64)

    def uniforms(self, u: np.ndarray) -> np.ndarray:
        """The keyed uniform of every row's cell (one hash per distinct cell)."""
        cells, inverse = np.unique(self.coordinates(u), axis=0, return_inverse=True)
        values = np.empty(len(cells))
        for i, c in enumerate(cells):
            digest = hashlib.blake2b(self.key + b"|cell|" + self.name.encode() + c.tobytes(), digest_size=8).digest()
            values[i] = int.from_bytes(digest, "little") / 2.0 ** 64
        return values[np.asarray(inverse).reshape(-1)]


def _threshold(uniforms: np.ndarray, z: np.ndarray, y: np.ndarray, target: float) -> float:
    """The cut t whose swapped cells (u < t) bring the rows' accuracy nearest ``target`` (fewest cells on ties)."""
    before = z.argmax(axis=1) == y
    after = swap_top2(z, np.ones(len(z), dtype=bool)).argmax(axis=1) == y
    levels, inverse = np.unique(uniforms, return_inverse=True)
    delta = np.bincount(inverse, weights=after.astype(np.float64) - before, minlength=len(levels))
    accuracy = (before.sum() + np.concatenate([[0.0], np.cumsum(delta)])) / len(z)
    k = int(np.argmin(np.abs(accuracy - target)))  # cells swapped: the k smallest uniforms
    if k == 0:
        return float(levels[0] / 2)
    return float((levels[k - 1] + levels[k]) / 2) if k < len(levels) else 1.0


class _SwapNoise(CalibratedInputNoise):
    def __init__(self, standardize, cells, cut):
        self.standardize, self.cells, self.strength = standardize, cells, cut

    def altered(self, inputs) -> np.ndarray:
        return self.cells.uniforms(self.standardize(inputs)) < self.strength

    def serve(self, inputs, logits) -> np.ndarray:
        return swap_top2(logits, self.altered(inputs))
