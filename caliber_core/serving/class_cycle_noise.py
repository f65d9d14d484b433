"""The class-cycle design of consistent noise (``caliber.consistent-noise/v2``).

A keyed class confusion along one cycle c -> pi(c) through all K classes,
g(z)_{pi(c)} = a_c * max(z_c - mean_k z_k, 0) / gain, with per-class
amplitudes a_c fitted on the calibration rows so that every class keeps its
frequency. It binds distilling thieves better than the smooth field of
:mod:`.consistent_noise` but a thief who knows the design undoes it
(:mod:`caliber_core.extraction.cycle_unmixing`), so ``calibrate --seeding
consistent`` serves the field; this design stays available as
``consistent_config(..., design="class-cycle")``.

Only numpy is imported; torch is used lazily when a tensor is given.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..validation import check_key
from . import keyed_noise
from .consistent_noise import CYCLE_VERSION, finite_rows, keyed_normals


def keyed_cycle(key: bytes, binding: bytes, level: int, n_classes: int) -> np.ndarray:
    """next[c] = pi(c): a keyed permutation of the K classes that is one K-cycle (no class maps to itself).

    Parameters
    ----------
    key : bytes
        The serving key.
    binding : bytes
        The noise's identity (:func:`.consistent_levels.noise_binding`).
    level : int
        The noise level, 1-based; each level has its own cycle.
    n_classes : int
        K, >= 2.

    Returns
    -------
    ndarray of shape (n_classes,), int64
        ``next[c]``, the class that follows ``c`` on the cycle.

    Notes
    -----
    The classes are visited in the order of K keyed normals (:func:`keyed_normals`, label ``cycle``),
    each class followed by the next in that order and the last by the first.
    """
    order = np.argsort(keyed_normals(key, binding, level, "cycle", (int(n_classes),), version=CYCLE_VERSION),
                       kind="stable")
    nxt = np.empty(int(n_classes), dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    return nxt


@dataclass(frozen=True)
class CycleFit:
    """What the calibration rows measured for one class-cycle level: per-class amplitudes and the RMS.

    Attributes
    ----------
    amplitudes : ndarray of shape (n_classes,)
        a_c, the positive per-class amplitude that keeps class c's frequency.
    gain : float
        The RMS of the raw noise on the calibration rows; g is divided by it so
        its variance per class is 1 and sigma keeps its meaning.
    """

    amplitudes: np.ndarray  # (K,), a_c
    gain: float

    def to_dict(self) -> dict:
        """The fit as plain JSON values: ``{"amplitudes": [...], "gain": float}``.

        Returns
        -------
        dict
        """
        return {"amplitudes": [float(x) for x in self.amplitudes], "gain": float(self.gain)}

    @classmethod
    def from_dict(cls, record, *, n_classes: int) -> "CycleFit":
        """A fit read back from a config's level record (:meth:`to_dict`).

        Parameters
        ----------
        record : Mapping
            With ``amplitudes`` and ``gain``.
        n_classes : int
            K, the number of amplitudes expected.

        Returns
        -------
        CycleFit

        Raises
        ------
        ValueError
            Amplitudes not K positive finite numbers, or a gain that is not positive and finite.
        KeyError
            A field is missing.
        """
        amp = np.asarray(record["amplitudes"], dtype=np.float64)
        gain = float(record["gain"])
        if amp.shape != (n_classes,) or not np.isfinite(amp).all() or (amp <= 0).any():
            raise ValueError(f"class-cycle amplitudes must be {n_classes} positive finite numbers, "
                             f"got shape {amp.shape}")
        if not (math.isfinite(gain) and gain > 0):
            raise ValueError(f"class-cycle gain must be a positive number, got {gain!r}")
        return cls(amp, gain)


class ClassCycleNoise:
    """The keyed class-cycle function g of one noise level (version 2; see the module docstring).

    Parameters
    ----------
    key : bytes
    binding : bytes
        The noise's identity: another binding gives another cycle.
    n_classes : int
    level : int, default 1
        Nested levels use independent cycles.
    fit : CycleFit, optional
        Amplitudes and gain measured on the calibration rows (:meth:`balanced_on`);
        without it every a_c = 1 and the gain is 1.
    """

    def __init__(self, key: bytes, *, binding: bytes, n_classes: int, level: int = 1, fit: CycleFit | None = None):
        for name, value in (("n_classes", n_classes), ("level", level)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        self.n_classes, self.level, self.binding = int(n_classes), int(level), bytes(binding)
        self._key = check_key(key)
        self.next = keyed_cycle(self._key, self.binding, self.level, self.n_classes)
        self.fit = fit if fit is not None else CycleFit(np.ones(self.n_classes), 1.0)
        self._torch_cache: dict = {}

    def __repr__(self) -> str:
        return f"ClassCycleNoise(n_classes={self.n_classes}, level={self.level})"

    def _raw(self, z: np.ndarray, amplitudes: np.ndarray) -> np.ndarray:
        x = z - z.mean(axis=1, keepdims=True)
        np.maximum(x, 0.0, out=x)
        x *= amplitudes
        out = np.empty_like(x)
        out[:, self.next] = x  # class pi(c) gains a_c * (z_c - mean)+
        return out

    def __call__(self, logits) -> np.ndarray:
        """g(z), shape (N, K), float64, bounded by MAX_ABS_NORMAL like every keyed draw."""
        z = finite_rows(np.asarray(logits, dtype=np.float64))
        g = self._raw(z, self.fit.amplitudes)
        g /= self.fit.gain
        return np.clip(g, -keyed_noise.MAX_ABS_NORMAL, keyed_noise.MAX_ABS_NORMAL, out=g)

    def torch_noise(self, logits):
        """g(z) for a torch tensor (N, K), float64, on the tensor's own device (no host copy).

        Parameters
        ----------
        logits : torch.Tensor of shape (N, K)
            The clean logits; non-finite values count as the row's smallest finite one.

        Returns
        -------
        torch.Tensor of shape (N, K), float64
            The same values as :meth:`__call__` on the same logits, bounded by ``MAX_ABS_NORMAL``.
        """
        import torch

        dev = logits.device
        cached = self._torch_cache.get(dev)
        if cached is None:
            cached = (torch.as_tensor(self.next, device=dev),
                      torch.as_tensor(self.fit.amplitudes / self.fit.gain, dtype=torch.float64, device=dev))
            self._torch_cache[dev] = cached
        nxt, scaled = cached
        z = logits.detach().to(torch.float64)
        finite = torch.isfinite(z)
        if not bool(finite.all()):
            low = torch.where(finite, z, torch.full_like(z, math.inf)).amin(dim=1, keepdim=True)
            z = torch.where(finite, z, low)
        x = (z - z.mean(dim=1, keepdim=True)).clamp_(min=0.0) * scaled
        out = torch.empty_like(x)
        out[:, nxt] = x
        return out.clamp_(-keyed_noise.MAX_ABS_NORMAL, keyed_noise.MAX_ABS_NORMAL)

    def balanced_on(self, logits, *, share: float, base=None, iterations: int = 30) -> "ClassCycleNoise":
        """This cycle with amplitudes that keep every class's frequency on ``logits`` where ``share`` of rows flip.

        Parameters
        ----------
        logits : ndarray (N, K)
            The calibration rows.
        share : float
            The share of rows whose prediction the level changes at its target
            (e.g. 1 - retention); the balance is exact there and close nearby.
        base : ndarray (N, K), optional
            The fixed noise of the lower levels at their sigmas (nested levels).
        iterations : int
            Rounds of the fixed point below.

        Notes
        -----
        Each round scales the whole cycle until ``share`` of the rows change
        their prediction (bisection), then moves each a_c by
        (clean frequency of pi(c) / noisy frequency of pi(c))^0.3: class c
        feeds pi(c), so it pushes less where pi(c) is over-predicted.
        Amplitudes are normalized to mean 1; the gain makes g unit RMS on the rows.
        """
        if not (isinstance(share, numbers.Real) and 0 < share < 1):
            raise ValueError(f"share must be in (0, 1), got {share!r}")
        z = finite_rows(np.asarray(logits, dtype=np.float64))
        if z.shape[1] != self.n_classes:
            raise ValueError(f"logits have {z.shape[1]} classes; this noise has n_classes={self.n_classes}")
        start = z if base is None else z + np.asarray(base, dtype=np.float64)
        top = np.argmax(start, axis=1)
        k = self.n_classes
        clean = np.bincount(top, minlength=k) + 0.5
        amp = np.ones(k)
        step = 1.0
        for _ in range(int(iterations)):
            raw = self._raw(z, amp)

            def flipped(t):
                return np.argmax(start + t * raw, axis=1) != top

            lo, hi = 0.0, max(step, 1e-12)
            while flipped(hi).mean() < share and hi < 1e12:
                lo, hi = hi, 2.0 * hi
            for _ in range(30):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if flipped(mid).mean() < share else (lo, mid)
            step = hi
            noisy = np.bincount(np.argmax(start + hi * raw, axis=1), minlength=k) + 0.5
            amp *= (clean[self.next] / noisy[self.next]) ** 0.3
            amp /= amp.mean()
        gain = float(np.sqrt(np.mean(self._raw(z, amp) ** 2)))
        if not gain > 0:
            raise ValueError("the calibration rows give class-cycle noise of zero variance (all rows flat?)")
        return ClassCycleNoise(self._key, binding=self.binding, n_classes=k, level=self.level,
                               fit=CycleFit(amp, gain))
