"""The defense frontier and sigma for a target on the thief's surrogate.

The surrogate's retention rho(sigma) -- its accuracy at sigma over the
accuracy of the strongest recipe on clean answers, per seed -- is a *noisy* decreasing function: each
evaluation trains surrogates. :func:`solve_retention` finds the sigma where its
mean crosses a target R:

1. the frontier grid (already evaluated) brackets the crossing: the first
   sigma whose mean retention is <= R, and the one before it;
2. the bracket is narrowed by interpolation in log sigma, each new point
   evaluated on the "near" seeds (more seeds than the grid used);
3. sigma* is the root of a least-squares line through the per-seed values of
   the points in the final bracket, and its standard error follows by the
   delta method, se(sigma*) = se(fit at sigma*) / |slope| (in log sigma).

Every draw comes from seeded generators, so the result is a deterministic
function of the seeds. If even the last grid point (where the teacher is
near chance) keeps the mean retention above R, the target is out of reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RetentionRoot:
    """sigma for a surrogate-retention target.

    Attributes
    ----------
    target : float
    sigma : float or None
        None when out of reach.
    sigma_se : float or None
        Standard error of sigma (delta method; None if it cannot be estimated).
    bracket : (float, float) or None
        Evaluated sigmas around the crossing: the mean retention is above R
        at the left end and at most R at the right end.
    evaluations : list of (sigma, per-seed retention values)
        Every point the search evaluated beyond the grid.
    reason : str
        How the answer was reached, or why there is none.
    """

    target: float
    sigma: float | None
    sigma_se: float | None
    bracket: tuple[float, float] | None
    evaluations: list = field(default_factory=list)
    reason: str = ""


def _log(sigma: float) -> float:
    return math.log(sigma) if sigma > 0 else -math.inf


def _interpolate(lo: tuple[float, float], hi: tuple[float, float], target: float) -> float:
    """Point in (lo, hi) where the line through the two (sigma, mean) points meets target.

    Interpolates in log sigma (retention decays roughly linearly in log sigma
    near a crossing), in sigma when the left end is sigma = 0; clipped to the
    middle 80% of the bracket so that each step shrinks it.
    """
    (s0, m0), (s1, m1) = lo, hi
    t = 0.5 if m0 == m1 else (m0 - target) / (m0 - m1)
    t = min(0.9, max(0.1, t))
    if s0 <= 0:
        return s0 + t * (s1 - s0)
    return math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0)))


def solve_retention(
    grid: Sequence[tuple[float, np.ndarray]],
    target: float,
    evaluate: Callable[[float], np.ndarray],
    *,
    max_refinements: int = 3,
    rel_width: float = 0.04,
) -> RetentionRoot:
    """sigma at which the mean surrogate retention falls to ``target``.

    Parameters
    ----------
    grid : sequence of (sigma, per-seed retention values), sigma ascending
        The frontier's evaluations (sigma = 0 included).
    target : float
        R in (0, 1).
    evaluate : callable
        ``evaluate(sigma)`` -> per-seed retention values on the "near" seeds;
        called on the bracket's ends and on each refinement.
    max_refinements : int, default 3
        New sigmas evaluated at most.
    rel_width : float, default 0.04
        Stop once the bracket is narrower than this, relative to its right end.

    Returns
    -------
    RetentionRoot
    """
    if not (0.0 < target < 1.0):
        raise ValueError(f"surrogate retention target must lie in (0, 1), got {target}")
    pts = sorted((float(s), np.asarray(v, dtype=np.float64)) for s, v in grid)
    means = [float(v.mean()) for _, v in pts]
    below = [i for i, m in enumerate(means) if m <= target]
    if not below:
        last_sigma, last_mean = pts[-1][0], means[-1]
        return RetentionRoot(target, None, None, None, reason=(
            f"out of reach: the surrogate keeps {last_mean:.3f} of its clean accuracy even at "
            f"sigma={last_sigma:.4g}, where the teacher is near chance"))
    i = below[0]
    if i == 0:
        return RetentionRoot(target, pts[0][0], 0.0, (pts[0][0], pts[0][0]),
                             reason="reached at the first grid point")
    # The bracket's ends again on the near seeds (a superset of the grid's), so
    # that every point of the final fit rests on the same seeds.
    lo, hi = ((s, np.asarray(evaluate(s), dtype=np.float64) if s > 0 else v) for s, v in (pts[i - 1], pts[i]))
    extra = []
    for _ in range(max_refinements):
        if lo[0] > 0 and (hi[0] - lo[0]) <= rel_width * hi[0]:
            break
        s_new = _interpolate((lo[0], float(lo[1].mean())), (hi[0], float(hi[1].mean())), target)
        v_new = np.asarray(evaluate(s_new), dtype=np.float64)
        extra.append((s_new, v_new))
        if float(v_new.mean()) > target:
            lo = (s_new, v_new)
        else:
            hi = (s_new, v_new)
    sigma, se = _line_root([lo, hi] + [p for p in extra if lo[0] < p[0] < hi[0]], target)
    if sigma is None or not (lo[0] <= sigma <= hi[0]):
        sigma = _interpolate((lo[0], float(lo[1].mean())), (hi[0], float(hi[1].mean())), target)
        se = None
    return RetentionRoot(target, sigma, se, (lo[0], hi[0]), extra,
                         reason=f"bracketed and refined with {len(extra)} extra evaluation(s)")


def _line_root(points, target: float) -> tuple[float | None, float | None]:
    """Root and its delta-method standard error of a least-squares line in log sigma."""
    if any(s <= 0 for s, _ in points):
        return None, None
    x = np.concatenate([np.full(v.size, math.log(s)) for s, v in points])
    y = np.concatenate([v for _, v in points])
    if np.ptp(x) == 0 or x.size < 3:
        return None, None
    xm = x.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - y.mean())).sum() / sxx)
    if not slope < 0:
        return None, None
    intercept = float(y.mean() - slope * xm)
    root = (target - intercept) / slope
    resid = y - (intercept + slope * x)
    dof = x.size - 2
    if dof < 1:
        return float(math.exp(root)), None
    s2 = float((resid**2).sum() / dof)
    se_fit = math.sqrt(s2 * (1.0 / x.size + (root - xm) ** 2 / sxx))
    se_log = se_fit / abs(slope)
    return float(math.exp(root)), float(math.exp(root) * se_log)


def teacher_grid(retention_levels: Sequence[float], sigma_for_retention: Callable[[float], float | None]) -> list[float]:
    """Sigmas of a frontier grid: one per teacher retention level that calibration can reach.

    Parameters
    ----------
    retention_levels : sequence of float
        Teacher retention levels.
    sigma_for_retention : callable
        sigma for a retention level, or None when out of reach.

    Returns
    -------
    list of float
        0 and each distinct positive sigma reached, ascending.
    """
    out = [0.0]
    for r in retention_levels:
        s = sigma_for_retention(r)
        if s is not None and s > 0 and all(abs(s - t) > 1e-9 * max(s, 1.0) for t in out):
            out.append(float(s))
    return sorted(out)
