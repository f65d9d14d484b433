"""Two-class curves in closed form: what the noise sweep answers, with no draws (K = 2).

With two classes a row's survival is Phi(g / (sigma sqrt 2)) (Proposition 1
with one gap, :mod:`.survival`), so the agreement and the expected accuracy
at any sigma are exact means over the rows, one normal CDF per row.
:class:`TwoClassCurves` has the small interface of
:class:`.sweep.SurvivalIntervals` that a calibration reads (``agreement``,
``accuracy``, their standard errors, ``realizations``, ``guide``), so a
calibration at K = 2 keeps no per-draw arrays: the sweep's 8 or more draws
per row cost ~190 bytes a row, these curves none beyond the sample's own gaps.

The curves are exact given the sample: their Monte-Carlo standard error is 0.
What the sample itself leaves uncertain is the row bootstrap's
(:mod:`.intervals`), as for any calibration.

An exact mean costs one pass over the rows (~50 ms at 2,000,000 rows here),
too slow for the 2,000-point scan with which a target's first crossing is
found. :meth:`TwoClassCurves.guide` gives that scan the same mean over an
equal-count quantile sketch of the gaps (:data:`SKETCH_POINTS` points): each
CDF is monotone in the gap, so the sketch is within 1 / SKETCH_POINTS of the
exact curve, and sigma* is then solved on the exact curve from there.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from ..validation import as_sigmas
from .engine import CurveEngine
from .sample import LogitSample

#: Points of the quantile sketch behind :meth:`TwoClassCurves.guide`: its curves are within
#: 1 / SKETCH_POINTS (2.4e-4) of the exact ones.
SKETCH_POINTS = 4096


class TwoClassCurves:
    """Exact agreement and accuracy curves of a two-class sample (see the module docstring).

    Parameters
    ----------
    sample : LogitSample
        Two classes.
    seed : int or None, default 0
        Recorded only (nothing here is random): the calibration's seed, for the bootstrap.

    Raises
    ------
    ValueError
        A sample with other than two classes.
    """

    realizations = 0  # no noise draws: the curves are closed form
    pool_rows = None

    def __init__(self, sample: LogitSample, *, seed: int | None = 0):
        if sample.n_classes != 2:
            raise ValueError(f"closed-form curves need n_classes == 2, got {sample.n_classes}")
        self.sample = sample
        self.seed = seed
        self._engine = CurveEngine(sample, method="exact", seed=seed)

    @property
    def n_samples(self) -> int:
        """N, the sample's row count."""
        return self.sample.n_samples

    @property
    def n_classes(self) -> int:
        """K, always 2 here."""
        return 2

    @property
    def has_labels(self) -> bool:
        """Whether the sample carries labels."""
        return self.sample.has_labels

    def agreement(self, sigma) -> np.ndarray:
        """Mean P(noisy argmax = clean argmax) at each sigma, exact (1 at sigma = 0).

        Parameters
        ----------
        sigma : float or 1-D array_like of float >= 0

        Returns
        -------
        ndarray of shape (n_sigma,)

        Raises
        ------
        ValueError
            An invalid sigma.

        Notes
        -----
        Eq. ``top1-exact`` at K = 2: Phi(g / (sigma sqrt 2)) per row.
        """
        return self._engine.agreement(sigma)

    def accuracy(self, sigma) -> np.ndarray:
        """Expected accuracy at each sigma, exact (A0 at sigma = 0).

        Parameters
        ----------
        sigma : float or 1-D array_like of float >= 0

        Returns
        -------
        ndarray of shape (n_sigma,)

        Raises
        ------
        ValueError
            The sample has no labels, or an invalid sigma.
        """
        self._need_labels()
        return self._engine.accuracy(sigma)

    def agreement_stderr(self, sigma, *, rows: np.ndarray | None = None) -> np.ndarray:
        """Zeros: the curve is exact given the sample (``rows`` is accepted as the sweep's is).

        Parameters
        ----------
        sigma : float or 1-D array_like of float >= 0
        rows : ndarray of bool, shape (n_samples,), optional
            Ignored.

        Returns
        -------
        ndarray of shape (n_sigma,)

        Raises
        ------
        ValueError
            An invalid sigma.
        """
        return np.zeros(as_sigmas(sigma).shape)

    def accuracy_stderr(self, sigma) -> np.ndarray:
        """Zeros: the curve is exact given the sample.

        Parameters
        ----------
        sigma : float or 1-D array_like of float >= 0

        Returns
        -------
        ndarray of shape (n_sigma,)

        Raises
        ------
        ValueError
            The sample has no labels, or an invalid sigma.
        """
        self._need_labels()
        return np.zeros(as_sigmas(sigma).shape)

    def guide(self, quantity: str) -> Callable[[np.ndarray], np.ndarray]:
        """A fast curve within 1 / SKETCH_POINTS of ``quantity``'s, for searches over many sigmas.

        Parameters
        ----------
        quantity : {"accuracy", "agreement"}

        Returns
        -------
        callable
            sigma (float or 1-D array) -> the sketched curve at each sigma.
        """
        if quantity not in ("accuracy", "agreement"):
            raise ValueError(f"quantity must be 'accuracy' or 'agreement', got {quantity!r}")
        if quantity == "accuracy":
            self._need_labels()
            points, at_zero = self._accuracy_sketch, self.sample.clean_accuracy
        else:
            points, at_zero = self._agreement_sketch, 1.0
        return lambda sigma: _sketched_mean(points, sigma, at_zero=at_zero)

    @cached_property
    def _agreement_sketch(self) -> np.ndarray:
        return quantile_sketch(self.sample.agreement_gaps[:, 0])

    @cached_property
    def _accuracy_sketch(self) -> np.ndarray:
        # The label's lead over the other class: the argmax's gap on correct rows, minus the deficit on wrong ones.
        smp = self.sample
        return quantile_sketch(np.concatenate([smp.agreement_gaps[smp.correct, 0], smp.label_gaps[:, 0]]))

    def _need_labels(self) -> None:
        if not self.has_labels:
            raise ValueError("accuracy needs labels; the sample has none")


def quantile_sketch(values: np.ndarray, *, points: int = SKETCH_POINTS) -> np.ndarray:
    """The midpoints of ``points`` equal-count blocks of the sorted values (all of them when fewer).

    The means of a monotone function over the values and over the sketch differ
    by at most its range / points: each block's error is at most the function's
    rise within the block, over ``points`` blocks that do not overlap.

    Parameters
    ----------
    values : ndarray of shape (n,)
    points : int, default SKETCH_POINTS

    Returns
    -------
    ndarray of shape (min(n, points),)
    """
    ordered = np.sort(values)
    if ordered.size <= points:
        return ordered
    return ordered[((np.arange(points) + 0.5) * (ordered.size / points)).astype(np.int64)]


def _sketched_mean(points: np.ndarray, sigma, *, at_zero: float) -> np.ndarray:
    from scipy.special import ndtr

    sig = as_sigmas(sigma)
    out = np.full(sig.shape, float(at_zero))
    pos = sig > 0
    if pos.any():
        # A block of sigmas at a time: (sigmas x points) float64 stays a few MB.
        idx = np.nonzero(pos)[0]
        step = max(1, (1 << 18) // max(1, points.size))
        for start in range(0, idx.size, step):
            j = idx[start:start + step]
            out[j] = ndtr(points[None, :] / (np.sqrt(2.0) * sig[j, None])).mean(axis=1)
    return out
