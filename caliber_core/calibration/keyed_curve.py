"""Calibration for one key: the exact accuracy curve of consistent noise on the calibration rows.

With consistent noise a fixed key gives one fixed perturbation per row,
z + t * g(z), linear in the noise step t. Row i's served prediction is a
given class c exactly on one interval of t:

    c wins  <=>  (z_c - z_k) + t (g_c - g_k) > 0   for every k != c,

each constraint a half-line in t. So this key's accuracy (c = true label)
or agreement (c = clean argmax) is an exact step function of t, with no
Monte Carlo: A(t) = mean_i 1[lo_i <= t < hi_i]. This is the *realized*
curve of the key, not the key average: what the key will deliver on rows
like these. The bootstrap over rows gives its interval.

Nested levels (Proposition-2 style, ascending sigma) are calibrated one after
another: level j's noise is base_j + t g_j with base_j the fixed noise of
the lower levels and t = sqrt(sigma_j^2 - sigma_{j-1}^2), so the same
interval argument applies with z + base_j in place of z.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..validation import as_labels, as_logits

DEFAULT_BOOTSTRAP = 400


def win_intervals(logits, noise, reference) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the interval [lo, hi) of t >= 0 on which ``reference`` is the argmax of logits + t * noise.

    Parameters
    ----------
    logits, noise : ndarray of shape (n_samples, n_classes)
    reference : ndarray of shape (n_samples,), int
        The class whose wins are counted (true label or clean argmax).

    Returns
    -------
    lo, hi : ndarray of shape (n_samples,)
        ``lo >= hi`` means the class never wins; ``hi`` may be inf. Ties
        count as losses, which is exact up to a measure-zero set of t.
    """
    z = as_logits(logits)
    g = np.asarray(noise, dtype=np.float64)
    if g.shape != z.shape:
        raise ValueError(f"noise shape {g.shape} differs from logits shape {z.shape}")
    rows = np.arange(z.shape[0])
    ref = np.asarray(reference, dtype=np.int64)
    d = z[rows, ref][:, None] - z  # gap of the reference over each class at t = 0
    e = g[rows, ref][:, None] - g  # how fast the gap grows with t
    d[rows, ref], e[rows, ref] = 1.0, 0.0  # the reference against itself: always satisfied
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -d / e  # where the gap changes sign
    # gap > 0 at t = 0 and shrinking: holds for t < root; else (growing or flat): always
    upper = np.where((d > 0) & (e < 0), root, np.inf)
    # gap <= 0 at t = 0 and growing: holds for t > root; flat or shrinking: never
    lower = np.where(d > 0, 0.0, np.where(e > 0, root, np.inf))
    return lower.max(axis=1), upper.min(axis=1)


def step_curve(lo: np.ndarray, hi: np.ndarray, weights: np.ndarray | None = None):
    """The exact step function A(t) = sum_i w_i 1[lo_i <= t < hi_i] / sum_i w_i.

    Returns
    -------
    (knots, values) : ``values[j]`` holds on [knots[j], knots[j + 1]); knots[0] = 0.
    """
    n = lo.size
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = lo < hi
    events = np.concatenate([lo[ok], hi[ok]])
    jumps = np.concatenate([w[ok], -w[ok]])
    finite = np.isfinite(events)
    events, jumps = events[finite], jumps[finite]
    order = np.argsort(events, kind="stable")
    events, jumps = events[order], jumps[order]
    knots, first = np.unique(events, return_index=True)
    level = np.cumsum(jumps)
    last = np.r_[first[1:] - 1, events.size - 1] if knots.size else np.array([], dtype=int)
    values = level[last] / w.sum() if knots.size else np.array([])
    if knots.size and knots[0] == 0.0:
        return knots, values
    # lo >= 0 always, so no row has started before the first knot
    return np.r_[0.0, knots], np.r_[0.0, values]


def crossing(knots: np.ndarray, values: np.ndarray, target: float) -> float | None:
    """The middle of the first step on which the curve is at ``target`` or below (None: never).

    The middle, not the knot: at a knot one row is exactly tied, and the
    rounding of sigma in serving would decide it.

    Parameters
    ----------
    knots, values : ndarray
        A step curve from :func:`step_curve`.
    target : float

    Returns
    -------
    float or None
        Just past the last knot when the crossing is on the final step.
    """
    below = np.nonzero(values <= target)[0]
    if below.size == 0:
        return None
    j = below[0]
    if j + 1 < knots.size:
        return float(0.5 * (knots[j] + knots[j + 1]))
    return float(knots[j] * (1.0 + 1e-6))


@dataclass(frozen=True)
class KeyedTarget:
    """One target solved for one key.

    Attributes
    ----------
    sigma : float
        The served sigma of this level.
    step : float
        t = sqrt(sigma^2 - previous sigma^2).
    delivered : float
        The quantity this key delivers on the calibration rows at ``sigma``.
    interval : tuple of float
        Bootstrap percentile interval of ``sigma`` (rows resampled).
    sigma_draws : int
        Bootstrap resamples that crossed the target.
    """

    sigma: float
    step: float
    delivered: float
    interval: tuple[float, float]
    sigma_draws: int


def solve_keyed(logits, labels, noise, *, target: float, base=None, previous_sigma: float = 0.0,
                quantity: str = "accuracy", bootstrap: int = DEFAULT_BOOTSTRAP, confidence: float = 0.95,
                seed: int = 0) -> KeyedTarget:
    """The sigma at which this key's exact curve on the calibration rows reaches ``target``.

    Parameters
    ----------
    logits : ndarray (N, K)
    labels : ndarray (N,)
    noise : ndarray (N, K)
        This level's unit noise g_j(z) on the rows (this key).
    target : float
        Absolute accuracy (quantity "accuracy") or agreement with the clean
        argmax (quantity "agreement") to reach.
    base : ndarray (N, K), optional
        The fixed noise of the lower levels at their sigmas.
    previous_sigma : float
        The sigma of the level below (0 for the first level).
    bootstrap, confidence, seed
        Resamples of the rows for the interval of sigma.

    Raises
    ------
    ValueError
        The target is not reached on the rows at any sigma, or is above the
        quantity at ``previous_sigma``.
    """
    z = as_logits(logits, finite=True)
    y = as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    if quantity not in ("accuracy", "agreement"):
        raise ValueError(f"quantity must be 'accuracy' or 'agreement', got {quantity!r}")
    shifted = z if base is None else z + np.asarray(base, dtype=np.float64)
    ref = y if quantity == "accuracy" else np.argmax(z, axis=1)
    lo, hi = win_intervals(shifted, noise, ref)
    knots, values = step_curve(lo, hi)
    if values[0] <= target:
        raise ValueError(f"{quantity} target {target:.4g} is already reached below the previous level's "
                         f"sigma {previous_sigma:.4g} (this key gives {values[0]:.4g} there)")
    step = crossing(knots, values, target)
    if step is None:
        raise ValueError(f"{quantity} target {target:.4g} is not reached by this key at any sigma "
                         f"(lowest {values.min():.4g})")
    sigma = math.hypot(previous_sigma, step)
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0xC0A5])))
    draws = []
    n = z.shape[0]
    for _ in range(int(bootstrap)):
        w = np.bincount(gen.integers(0, n, n), minlength=n).astype(np.float64)
        kb, vb = step_curve(lo, hi, w)
        tb = crossing(kb, vb, target) if vb[0] > target else 0.0
        if tb is not None:
            draws.append(math.hypot(previous_sigma, tb))
    alpha = (1.0 - confidence) / 2.0
    interval = (float(np.quantile(draws, alpha)), float(np.quantile(draws, 1 - alpha))) if draws else (sigma, sigma)
    delivered = float(np.mean((lo <= step) & (step < hi)))
    return KeyedTarget(float(sigma), float(step), delivered, interval, len(draws))


def keyed_accuracy(logits, labels, noise, step: float, *, base=None) -> float:
    """Accuracy of argmax(z + base + step * noise) on these rows (one key, exact).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,)
    noise : array_like of shape (n_samples, n_classes)
        The key's unit noise.
    step : float
        The noise scale applied to ``noise``.
    base : array_like, optional
        Noise already served below this level, added as is.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Invalid logits, or arrays that do not broadcast together.
    """
    z = as_logits(logits) + (0.0 if base is None else np.asarray(base, dtype=np.float64))
    pred = np.argmax(z + step * np.asarray(noise, dtype=np.float64), axis=1)
    return float(np.mean(pred == np.asarray(labels)))
