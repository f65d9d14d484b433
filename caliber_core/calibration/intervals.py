"""What a sigma delivers on the population: intervals, one-sided bounds, sample-size advice.

A calibration file is a sample of rows from the traffic a model serves. The accuracy, retention and
agreement it reports at a sigma are sample means, and the population values they estimate
(population: every input drawn from the distribution the file samples) differ from them by sampling
error. The rows' survival probabilities a_i, g_i and correctness c_i come from :mod:`.engine` (exact
quadrature, or the sweep's Monte-Carlo draws, whose noise the row bootstrap then carries: each
resampled row brings its own Monte-Carlo error with it). Population accuracy is A = E[a], agreement
G = E[g], retention R = E[a] / E[c].

Method
------
Percentile bootstrap over rows. ``resamples`` multinomial count vectors ``w_b`` (each summing to N)
are fixed once by ``seed``. A replicate is ``A*_b = w_b . a / N``, ``A0*_b = w_b . c / N``, ``R*_b =
A*_b / A0*_b`` and ``G*_b = w_b . g / N``, so A0, the denominator of retention, is resampled with
its numerator. Above ``MAX_UNITS`` rows the resampled units are random groups of rows (see
``MAX_UNITS``), so the cost of a sigma no longer grows with B x N. The same weights serve every
sigma (common random numbers), so bands and one-sided bounds are smooth in sigma. Two-sided
intervals are the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles; the one-sided bounds used
by ``side="at-least"`` / ``"at-most"`` are the ``1 - level`` and ``level`` percentiles.
:meth:`BootstrapIntervals.delta_at` gives the delta-method (normal) interval from the same rows for
comparison.

API (build once per model; everything after is cheap)
-----------------------------------------------------
``target_intervals.interval_estimator(cal, *, confidence=0.95, resamples=2000, seed=0)`` builds the
estimator of a :class:`.Calibration` on the rows its sigma* was solved on (a
:class:`.engine.CurveEngine`, exact or Monte-Carlo); build it once per (model, level) and keep it.
:meth:`BootstrapIntervals.at` gives one sigma's :class:`IntervalSet` (cached per sigma; measured
here ~10 ms at 500 exact rows, ~100 ms at 4,000 (the quadrature), ~25 ms at 50,000 Monte-Carlo
rows), :meth:`BootstrapIntervals.bands` a whole grid in one pass (:meth:`IntervalBands.at`
interpolates it in ~0.1 ms); ``bound``, ``sigma_for_bound``, ``delta_at`` and ``row_spread`` read
the same weights. ``IntervalSet.to_config()`` is a config target's ``interval`` record.
:func:`half_width_rows` and :func:`sample_size_advice` apply the 1/sqrt(N) law; past
``WIDE_HALF_WIDTH`` (2 points) users are warned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..target_record import DEFAULT_CONFIDENCE, check_confidence, check_side
from ..validation import as_sigmas
from .inversion import solve_near
from .engine import CurveEngine, RowValues, row_spread, sample_estimates

QUANTITIES = ("accuracy", "retention", "agreement")
DEFAULT_RESAMPLES = 2000
#: Interval half-width (as a fraction) above which users are warned: 2 points.
WIDE_HALF_WIDTH = 0.02
#: Most units the bootstrap resamples. A larger file's rows are dealt at random
#: into this many groups of equal size (up to one row), fixed by the seed, and
#: groups are resampled: for i.i.d. rows the group sums are i.i.d. too, so this
#: is the same bootstrap of a mean with fewer units, and the weights stay at
#: resamples x 4,000 (32 MB) however large N is.
MAX_UNITS = 4000
_CHUNK_ELEMENTS = 2_000_000
_CACHE_SIZE = 256


@dataclass(frozen=True)
class Interval:
    """A sample estimate and its interval for the population value.

    Attributes
    ----------
    estimate, low, high : float
    """

    estimate: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return 0.5 * (self.high - self.low)

    def as_list(self) -> list[float]:
        """[low, high], as a config stores it."""
        return [self.low, self.high]


@dataclass(frozen=True)
class IntervalSet:
    """Intervals for accuracy, retention and agreement at one sigma.

    Attributes
    ----------
    sigma, level : float
    method : str
    n_samples : int
    accuracy, retention : Interval or None
        None without labels.
    agreement : Interval
    """

    sigma: float
    level: float
    method: str
    n_samples: int
    accuracy: Interval | None
    retention: Interval | None
    agreement: Interval

    def get(self, kind: str) -> Interval | None:
        """The interval of ``kind`` (None without labels); ValueError for an unknown kind."""
        if kind not in QUANTITIES:
            raise ValueError(f"kind must be one of {QUANTITIES}, got {kind!r}")
        return getattr(self, kind)

    def to_config(self) -> dict:
        """The ``interval`` record of a config target (lists [low, high], null without labels)."""
        out = {"level": self.level, "method": self.method}
        for kind in QUANTITIES:
            iv = getattr(self, kind)
            out[kind] = None if iv is None else iv.as_list()
        return out


@dataclass(frozen=True)
class IntervalBands:
    """Estimates, two-sided intervals and one-sided bounds over a sigma grid.

    Attributes
    ----------
    bands : dict
        For each quantity q in ("accuracy", "retention", "agreement"), a dict of arrays over
        ``sigma``: "estimate", "low", "high" (two-sided at ``level``), "lower", "upper" (one-sided
        at ``level``); None without labels (accuracy, retention).
    """

    sigma: np.ndarray
    level: float
    method: str
    n_samples: int
    bands: dict

    def at(self, sigma: float) -> IntervalSet:
        """Interpolated intervals at a sigma inside the grid (linear in sigma).

        Returns
        -------
        IntervalSet

        Raises
        ------
        ValueError
            An invalid sigma, or one outside the grid.
        """
        s = float(as_sigmas(sigma)[0])
        if not self.sigma[0] <= s <= self.sigma[-1]:
            raise ValueError(f"sigma {s:g} is outside the band grid [{self.sigma[0]:g}, {self.sigma[-1]:g}]")
        parts = {}
        for kind in QUANTITIES:
            b = self.bands[kind]
            parts[kind] = None if b is None else Interval(
                *(float(np.interp(s, self.sigma, b[k])) for k in ("estimate", "low", "high")))
        return IntervalSet(s, self.level, self.method, self.n_samples, **parts)


class BootstrapIntervals:
    """Percentile row-bootstrap intervals of one model, at any sigma (see module docstring).

    Parameters
    ----------
    rows : CurveEngine
        The per-row source (``Calibration.engine``).
    confidence : float, default 0.95
        Level of two-sided intervals and of one-sided bounds, in [0.5, 1).
    resamples : int, default 2000
        Bootstrap replicates B, >= 100.
    seed : int or None, default 0
        Fixes the count weights: same seed, same intervals.
    """

    def __init__(self, rows: CurveEngine, *, confidence: float = DEFAULT_CONFIDENCE,
                 resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0):
        if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 100:
            raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
        if rows.n_samples < 2:
            raise ValueError(f"intervals need at least 2 rows, got n_samples={rows.n_samples}")
        self.rows = rows
        self.confidence = check_confidence(confidence)
        self.resamples = int(resamples)
        self.seed = seed
        n = rows.n_samples
        weights_seed, groups_seed = np.random.SeedSequence(seed).spawn(2)
        # Resampled units: the rows, or (beyond MAX_UNITS rows) random groups of rows.
        units = min(n, MAX_UNITS)
        # int32 where it fits: the order is kept, 4 bytes a row instead of 8.
        self._order = None if units == n else np.random.default_rng(groups_seed).permutation(n).astype(
            np.int32 if n < 2**31 else np.int64)
        self._starts = np.linspace(0, n, units + 1).astype(np.int64)[:-1]
        sizes = np.diff(np.append(self._starts, n)).astype(np.float32)
        self._weights = self._counts(units, weights_seed)
        # Rows per replicate: N for rows; for groups, the resampled groups' sizes.
        self._rows_per_replicate = (self._weights @ sizes).astype(np.float64)
        self._cache: dict[float, IntervalSet] = {}

    @property
    def method(self) -> str:
        """The interval method in words: bootstrap unit, resamples and per-row source."""
        rows = "exact" if self.rows.method == "exact" else "Monte-Carlo"
        unit = "row" if self._order is None else f"row-group ({self._starts.size} random groups)"
        return f"percentile {unit} bootstrap, {self.resamples} resamples, {rows} per-row survival"

    def _counts(self, units: int, seed: np.random.SeedSequence) -> np.ndarray:
        """(B, units) multinomial counts, each row summing to ``units``."""
        rng = np.random.default_rng(seed)
        out = np.empty((self.resamples, units), dtype=np.float32)
        per_chunk = max(1, _CHUNK_ELEMENTS // units)
        for start in range(0, self.resamples, per_chunk):
            b = min(per_chunk, self.resamples - start)
            idx = rng.integers(0, units, size=(b, units)) + (np.arange(b) * units)[:, None]
            out[start:start + b] = np.bincount(idx.ravel(), minlength=b * units).reshape(b, units)
        return out

    def _replicate_means(self, columns: list[np.ndarray]) -> np.ndarray:
        """(B, M) resampled means of M per-row columns (each of shape (N,))."""
        # Column by column: an (N, M) float64 copy of all of them (and its reordered copy)
        # would cost 16 M bytes a row, more than the sample itself at small K.
        units = np.empty((self._starts.size, len(columns)), dtype=np.float32)
        for j, column in enumerate(columns):
            # Unit sums: one per random group of rows (beyond MAX_UNITS rows), else the rows.
            units[:, j] = column if self._order is None else np.add.reduceat(column[self._order], self._starts)
        return (self._weights @ units) / self._rows_per_replicate[:, None]

    def _replicates(self, sigma) -> tuple[dict, RowValues]:
        rv = self.rows.at(sigma)
        g = rv.sigma.size
        cols = list(rv.agreement)
        if rv.accuracy is not None:
            cols += [*rv.accuracy, rv.correct]
        t = self._replicate_means(cols)
        out = {"agreement": t[:, :g], "accuracy": None, "retention": None}
        if rv.accuracy is not None:
            acc, a0 = t[:, g:2 * g], t[:, 2 * g:2 * g + 1]
            out["accuracy"] = acc
            with np.errstate(divide="ignore", invalid="ignore"):
                out["retention"] = np.where(a0 > 0, acc / a0, np.nan)
        return out, rv

    def bands(self, sigma) -> IntervalBands:
        """Estimates, intervals and one-sided bounds over a sigma grid (one pass over the weights).

        Returns
        -------
        IntervalBands
        """
        rep, rv = self._replicates(sigma)
        est = sample_estimates(rv)
        alpha = 1.0 - self.confidence
        qs = [alpha / 2, 1 - alpha / 2, alpha, 1 - alpha]
        bands = {}
        for kind in QUANTITIES:
            if rep[kind] is None:
                bands[kind] = None
                continue
            r = rep[kind]
            quantile = np.nanquantile if np.isnan(r).any() else np.quantile
            low, high, lower, upper = quantile(r, qs, axis=0)
            bands[kind] = {"estimate": est[kind], "low": low, "high": high, "lower": lower, "upper": upper}
        return IntervalBands(rv.sigma, self.confidence, self.method, self.rows.n_samples, bands)

    def at(self, sigma: float) -> IntervalSet:
        """Intervals at one sigma (cached).

        Returns
        -------
        IntervalSet
        """
        s = float(as_sigmas(sigma)[0])
        hit = self._cache.get(s)
        if hit is None:
            hit = self.bands([s]).at(s)
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[s] = hit
        return hit

    def bound(self, sigma, *, kind: str, side: str) -> np.ndarray:
        """One-sided bound of ``kind`` at each sigma: "at-least" the lower, "at-most" the upper.

        Parameters
        ----------
        sigma : float or 1-D array_like of float >= 0
        kind : {"accuracy", "retention", "agreement"}
        side : {"at-least", "at-most", "point"}
            "point" gives the sample estimate.

        Returns
        -------
        ndarray of shape (n_sigma,)

        Raises
        ------
        ValueError
            Unknown ``kind`` or ``side``, or an accuracy or retention bound without labels.
        """
        if kind not in QUANTITIES:
            raise ValueError(f"kind must be one of {QUANTITIES}, got {kind!r}")
        check_side(side)
        if kind != "agreement" and not self.rows.has_labels:
            raise ValueError(f"{kind} needs labels; this file has none")
        rep, rv = self._replicates(sigma)
        if side == "point":
            return sample_estimates(rv)[kind]
        r = rep[kind]
        q = 1.0 - self.confidence if side == "at-least" else self.confidence
        return (np.nanquantile if np.isnan(r).any() else np.quantile)(r, q, axis=0)

    def sigma_for_bound(self, target: float, *, kind: str, side: str, guess: float,
                        rtol: float = 1e-4) -> float:
        """sigma at which the one-sided bound equals ``target``, on the side that keeps it.

        "at-least": a sigma whose lower bound is >= target, so the population value is >= target with
        probability ``confidence``; "at-most": a sigma whose upper bound is <= target. Solved by
        :mod:`.inversion` (secant steps from ``guess``, e.g. the point sigma*, then settled on the side
        known to satisfy the target, within ``rtol`` of the crossing).

        Parameters
        ----------
        target : float
        kind : {"accuracy", "retention", "agreement"}
        side : {"at-least", "at-most"}
        guess : float
            A positive starting sigma.
        rtol : float, default 1e-4

        Returns
        -------
        float

        Raises
        ------
        ValueError
            ``side`` "point" or unknown, a non-positive guess, labels missing, or a bound that cannot
            reach the target (e.g. at-least a target above the lower bound of the clean accuracy).
        """
        if check_side(side) == "point":
            raise ValueError(f"side must be 'at-least' or 'at-most', got {side!r}")
        target, guess = float(target), float(guess)
        if not guess > 0:
            raise ValueError(f"guess must be a positive sigma, got {guess}")
        self.bound(guess, kind=kind, side=side)  # validates kind and labels

        def bound(s: float) -> float:
            return float(self.bound(max(s, 0.0), kind=kind, side=side)[0])

        try:
            return solve_near(bound, target, guess=guess, rtol=rtol, side=side)
        except ValueError:
            word = "lower" if side == "at-least" else "upper"
            raise ValueError(
                f"{kind} {side} {target:g} cannot be guaranteed at {self.confidence:.0%} confidence: "
                f"the {word} bound never crosses it (N={self.rows.n_samples}; more rows narrow the bound)"
            ) from None

    def delta_at(self, sigma: float) -> IntervalSet:
        """Delta-method (normal) intervals at one sigma, from the same rows.

        Returns
        -------
        IntervalSet
        """
        s = float(as_sigmas(sigma)[0])
        rv = self.rows.at(s)
        est = {k: (None if v is None else float(v[0])) for k, v in sample_estimates(rv).items()}
        sd = row_spread(rv)[0]
        from scipy.special import ndtri

        z = float(ndtri(0.5 + self.confidence / 2))
        n = self.rows.n_samples
        parts = {k: (None if est[k] is None else
                     Interval(est[k], est[k] - z * sd[k] / math.sqrt(n), est[k] + z * sd[k] / math.sqrt(n)))
                 for k in QUANTITIES}
        return IntervalSet(s, self.confidence, "delta method (normal)", n, **parts)

    def row_spread(self, sigma: float) -> dict:
        """Per-row standard deviations at one sigma; see :func:`row_spread`.

        Returns
        -------
        dict
        """
        return row_spread(self.rows.at(float(as_sigmas(sigma)[0])))[0]


def half_width_rows(half_width: float, n_samples: int, goal: float) -> int:
    """Rows needed for a half-width ``goal``, from a half-width at ``n_samples`` (width ~ 1/sqrt(N)).

    Returns
    -------
    int
        At least 1.

    Raises
    ------
    ValueError
        Unless half_width >= 0, goal > 0 and n_samples >= 1.
    """
    if not (half_width >= 0 and goal > 0 and n_samples >= 1):
        raise ValueError(f"need half_width >= 0, goal > 0 and n_samples >= 1, got "
                         f"{half_width}, {goal}, {n_samples}")
    return max(1, math.ceil(n_samples * (half_width / goal) ** 2))


def _round_rows(n: int) -> str:
    digits = max(0, len(str(n)) - 2)  # two significant figures
    return f"{round(n, -digits):,}"


def _points(x: float) -> str:
    return f"{100 * x:.1f}%" if 100 * x >= 0.95 else f"{100 * x:.2f}%"


def sample_size_advice(half_width: float, n_samples: int, *, goals=None) -> str:
    """One line: the half-width at N and the rows needed for smaller ones.

    ``goals`` are half-widths as fractions; default: 2 points when wider than that, and 1 point (or
    half the current width when already under 1 point). Example: "±2.9% at N=500; about 1,100 rows
    for ±2.0%, about 4,200 rows for ±1.0%".

    Returns
    -------
    str

    Raises
    ------
    ValueError
        ``n_samples`` < 1 while ``half_width`` > 0 (:func:`half_width_rows`).
    """
    if goals is None:
        goals = [g for g in (WIDE_HALF_WIDTH,) if half_width > g]
        goals.append(0.01 if half_width > 0.01 else half_width / 2)
    parts = [f"±{_points(half_width)} at N={n_samples:,}"]
    for g in goals:
        if g > 0:
            parts.append(f"about {_round_rows(half_width_rows(half_width, n_samples, g))} rows "
                         f"for ±{_points(g)}")
    return "; ".join(parts[:1]) + ("; " + ", ".join(parts[1:]) if len(parts) > 1 else "")
