"""Target -> sigma on a curve that falls as sigma grows: the one home of every inversion.

Accuracy, agreement and their confidence bounds all fall (in expectation)
as the noise grows, so a target value is met where the curve crosses it.

* :func:`first_crossing` scans a vectorized curve (the instant Monte-Carlo
  curve of a sweep, or a tabulated curve) on a log grid for the first bracket,
  then bisects it.
* :func:`solve_near` refines on an expensive scalar curve (the exact
  quadrature) from a good guess by secant steps, falling back to
  :func:`invert_decreasing` (a growing bracket, then Brent).
* :func:`invert_logistic` is the closed form of the fitted law (Eq.
  inverse-v), :func:`logistic_sigma` the same mapped to sigma.

Which side is returned (``side``), as the Opacus accountants do for their
noise search:

* ``"point"`` -- the best estimate of the crossing itself;
* ``"at-most"`` -- the upper end of the final bracket, where the curve is
  known to be <= target (the delivered value is at most the target);
* ``"at-least"`` -- the lower end, where the curve is known to be >= target.

A curve is either a callable (vectorized: array of sigma in, array out) or a
tabulated pair ``(sigma, values)`` with sigma increasing and positive,
interpolated linearly in log sigma (:func:`as_curve`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..target_record import check_side  # noqa: F401  (handed on to the solvers' callers)
from .margins import sigma_from_v

Curve = Callable[[np.ndarray], np.ndarray]


def as_curve(curve) -> Curve:
    """A vectorized callable from a callable or a tabulated ``(sigma, values)`` pair.

    Parameters
    ----------
    curve : callable or (array_like, array_like)
        A callable is returned as is; a pair (sigma increasing and > 0, finite
        values, equal 1-D lengths >= 2) is interpolated linearly in log sigma,
        clamped at its ends.

    Returns
    -------
    callable
        Array of sigma in, array of values out.

    Raises
    ------
    TypeError
        ``curve`` is neither a callable nor a pair of arrays.
    ValueError
        The pair has mismatched or too short arrays, non-increasing or
        non-positive sigma, or non-finite values.
    """
    if callable(curve):
        return curve
    try:
        x, y = (np.asarray(a, dtype=np.float64) for a in curve)
    except (TypeError, ValueError):
        raise TypeError(f"curve must be a callable or a (sigma, values) pair, got {type(curve).__name__}") from None
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise ValueError(f"a tabulated curve needs two 1-D arrays of equal length >= 2, got {x.shape} and {y.shape}")
    if not (np.all(x > 0) and np.all(np.diff(x) > 0) and np.all(np.isfinite(y))):
        raise ValueError("a tabulated curve needs increasing sigma > 0 and finite values")
    log_x = np.log(x)

    def tabulated(sigma):
        s = np.maximum(np.atleast_1d(np.asarray(sigma, dtype=np.float64)), np.finfo(float).tiny)
        return np.interp(np.log(s), log_x, y)

    return tabulated


def first_crossing(curve, target: float, *, lo: float, hi: float, n_grid: int = 2000,
                   side: str = "point") -> float:
    """Smallest sigma in [lo, hi] where the curve falls to ``target`` (it starts above it).

    A log grid finds the first bracket; bisection then pins the crossing.

    Parameters
    ----------
    curve : callable or (array_like, array_like)
        A decreasing curve, as accepted by :func:`as_curve`.
    target : float
    lo, hi : float
        The search range, 0 < lo < hi < inf.
    n_grid : int, default 2000
    side : {"point", "at-most", "at-least"}, default "point"

    Returns
    -------
    float
        The crossing; 0.0 for "at-least" (else ``lo``) when the curve is already
        at or below the target at ``lo``.

    Raises
    ------
    ValueError
        Unknown ``side``, a bad range, or a curve that stays above the target on
        the whole range.
    """
    check_side(side)
    func = as_curve(curve)
    if not (0 < lo < hi and np.isfinite(hi)):
        raise ValueError(f"need 0 < lo < hi < inf, got lo={lo}, hi={hi}")
    grid = np.geomspace(lo, hi, n_grid)
    below = np.nonzero(func(grid) <= target)[0]
    if below.size == 0:
        raise ValueError(f"target {target:g} not reached for sigma in [{lo:g}, {hi:g}]")
    i = below[0]
    if i == 0:
        # Already at or below the target where the range starts; no noise is the only "at least".
        return 0.0 if side == "at-least" else float(grid[0])
    a, b = grid[i - 1], grid[i]
    for _ in range(60):
        mid = 0.5 * (a + b)
        if func(np.array([mid]))[0] <= target:
            b = mid
        else:
            a = mid
    return float({"point": 0.5 * (a + b), "at-most": b, "at-least": a}[side])


def invert_decreasing(
    func: Callable[[float], float],
    target: float,
    *,
    lo: float,
    hi: float,
    rtol: float = 1e-6,
    max_expand: int = 60,
    side: str = "point",
) -> float:
    """Root of ``func(sigma) = target`` for a decreasing scalar func, from a growing bracket.

    Expands [lo, hi] geometrically until it brackets the target, then Brent;
    ``side`` then moves to the bracket end that satisfies the target.

    Parameters
    ----------
    func : callable, float -> float, decreasing in sigma
    target : float
    lo, hi : float
        The initial bracket (> 0); halved and doubled as needed.
    rtol : float, default 1e-6
    max_expand : int, default 60
    side : {"point", "at-most", "at-least"}, default "point"

    Returns
    -------
    float
        The root, moved to the requested side.

    Raises
    ------
    ValueError
        Unknown ``side``, or no bracket found (the target is out of reach), or
        :func:`settle` finds no sigma on the requested side.
    """
    check_side(side)
    f_lo, f_hi = func(lo) - target, func(hi) - target
    for _ in range(max_expand):
        if f_lo >= 0:
            break
        hi, f_hi = lo, f_lo
        lo /= 2.0
        f_lo = func(lo) - target
    for _ in range(max_expand):
        if f_hi <= 0:
            break
        lo, f_lo = hi, f_hi
        hi *= 2.0
        f_hi = func(hi) - target
    if f_lo < 0 or f_hi > 0:
        raise ValueError(f"target {target:g} is not reachable in sigma range [{lo:g}, {hi:g}]")
    if f_lo == 0:
        root = lo
    elif f_hi == 0:
        root = hi
    else:
        from scipy.optimize import brentq  # only when a bracket is needed: a heavy import

        root = float(brentq(lambda s: func(s) - target, lo, hi, rtol=rtol, xtol=1e-12))
    return settle(func, target, root, side=side, rtol=rtol)


def solve_near(
    func: Callable[[float], float],
    target: float,
    *,
    guess: float,
    slope: float | None = None,
    rtol: float = 1e-4,
    max_iter: int = 8,
    side: str = "point",
) -> float:
    """Root of ``func(sigma) = target`` near a good ``guess`` (e.g. from the Monte-Carlo curve).

    Secant steps from the guess (the first along ``slope`` when given) stop once
    a step is below ``rtol`` relative; secant convergence is superlinear, so the
    error left is of the order of that step times the one before (~1e-6 relative
    here), in two or three evaluations of an expensive exact curve. If the steps
    wander, a bracketing search takes over (:func:`invert_decreasing`).

    Parameters
    ----------
    func : callable, float -> float, decreasing in sigma
    target : float
    guess : float
        Starting sigma (> 0).
    slope : float, optional
        d func / d sigma at ``guess`` (used when negative).
    rtol : float, default 1e-4
        Relative step size at which the secant stops.
    max_iter : int, default 8
    side : {"point", "at-most", "at-least"}, default "point"

    Returns
    -------
    float
        The root, moved to the requested side.

    Raises
    ------
    ValueError
        Unknown ``side``, or the fallback finds no bracket.
    """
    check_side(side)
    x0 = float(guess)
    f0 = func(x0) - target
    if f0 == 0.0:
        return settle(func, target, x0, side=side, rtol=rtol)
    x1 = x0 - f0 / slope if slope is not None and slope < 0 else x0 * (1.01 if f0 > 0 else 0.99)
    for _ in range(max_iter):
        if not (np.isfinite(x1) and x1 > 0):
            break
        f1 = func(x1) - target
        if f1 == 0.0 or f1 == f0:
            if f1 == 0.0:
                return settle(func, target, x1, side=side, rtol=rtol)
            break
        step = f1 * (x1 - x0) / (f1 - f0)
        x0, f0, x1 = x1, f1, x1 - step
        if abs(step) <= rtol * abs(x1):
            return settle(func, target, float(x1), side=side, rtol=rtol)
    return invert_decreasing(func, target, lo=guess * 0.97, hi=guess * 1.03, rtol=rtol, side=side)


def settle(func: Callable[[float], float], target: float, sigma: float, *, side: str,
           rtol: float = 1e-4, max_steps: int = 60) -> float:
    """Move an estimated crossing to the nearby sigma known to satisfy ``side``.

    "point" returns ``sigma`` unchanged. "at-most" steps sigma up (relative
    steps rtol, 2 rtol, 4 rtol, ...) until func(sigma) <= target; "at-least"
    steps down until func(sigma) >= target (sigma = 0, the clean model, if
    needed).

    Parameters
    ----------
    func : callable, float -> float, decreasing in sigma
    target : float
        The value to satisfy.
    sigma : float
        The estimated crossing.
    side : {"point", "at-most", "at-least"}
    rtol : float, default 1e-4
        The first relative step.
    max_steps : int, default 60

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Unknown ``side``, or no sigma within ``max_steps`` steps satisfies it.
    """
    check_side(side)
    if side == "point":
        return float(sigma)
    s = float(sigma)
    ok = (lambda v: v <= target) if side == "at-most" else (lambda v: v >= target)
    step = rtol
    for _ in range(max_steps):
        if ok(func(s)):
            return s
        s = s * (1.0 + step) if side == "at-most" else s * max(0.0, 1.0 - step)
        step *= 2.0
        if s == 0.0:
            return 0.0
    raise ValueError(f"no sigma near {sigma:g} satisfies the {side} side of target {target:g}")


def check_law(*, v50, p, c) -> None:
    """Check the logistic law's parameters before they are used.

    Parameters
    ----------
    v50, p : float
        Must be finite real numbers > 0.
    c : float
        Must be a finite real number in [0, 1).

    Raises
    ------
    ValueError
        Naming the first parameter out of its domain and its value.

    Notes
    -----
    The domain of Eq. ``logistic-decay``.
    """
    for name, value in (("v50", v50), ("p", p)):
        if not (isinstance(value, (int, float, np.floating, np.integer)) and np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not (isinstance(c, (int, float, np.floating, np.integer)) and np.isfinite(c) and 0.0 <= c < 1.0):
        raise ValueError(f"c must be a finite number in [0, 1), got {c!r}")


def invert_logistic(utility, *, v50: float, p: float, c: float, saturate: bool = False):
    """v* for a normalized target A~* (Eq. inverse-v).

    Parameters
    ----------
    utility : float or array_like
        Target normalized utility A~*.
    v50, p, c : float
        Fitted parameters.
    saturate : bool, default False
        For A~* <= c (at or below the floor the curve can reach) return inf
        instead of raising.

    Returns
    -------
    v : float or ndarray
        0 where A~* >= 1 (no noise needed).

    Raises
    ------
    ValueError
        Parameters outside the law's domain (v50 and p finite and > 0, c in
        [0, 1)), a NaN target, or A~* <= c without ``saturate``: the fitted
        curve never gets that low.
    """
    check_law(v50=v50, p=p, c=c)
    u = np.asarray(utility, dtype=np.float64)
    if np.any(np.isnan(u)):
        raise ValueError("target utility is NaN")
    unreachable = u <= c
    if np.any(unreachable) and not saturate:
        worst = float(np.min(u[unreachable]))
        raise ValueError(
            f"normalized target {worst:.4f} is at or below the curve's floor c={c:.4f}: "
            "no noise level reaches it (pass saturate=True to get sigma = inf)"
        )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = v50 * ((1.0 - u) / (u - c)) ** (1.0 / p)
    v = np.where(u >= 1.0, 0.0, np.where(unreachable, np.inf, v))
    return float(v) if v.ndim == 0 else v


def logistic_sigma(fit, utility: float, *, scale: float, saturate: bool = False) -> float:
    """sigma* = S sqrt(v*) with v* the fitted law's closed-form inverse.

    Parameters
    ----------
    fit : LogisticFit
        The fitted law.
    utility : float
        Target normalized utility A~*.
    scale : float
        The margin scale S (> 0).
    saturate : bool, default False
        A target at or below the law's floor gives inf instead of raising.

    Returns
    -------
    float
        sigma* (0 for A~* >= 1).

    Raises
    ------
    ValueError
        A NaN target, a target at or below the floor without ``saturate``, or a
        non-positive scale.

    Notes
    -----
    Eq. ``inverse-v``.
    """
    return float(sigma_from_v(fit.inverse(utility, saturate=saturate), scale))


def sigma_for_agreement(curves, target: float, *, guess: float, slope: float | None = None,
                        side: str = "point") -> float:
    """sigma at which the exact mean agreement equals ``target``.

    Parameters
    ----------
    curves : CurveEngine
        Anything with ``agreement(sigma)`` and ``n_classes``.
    target : float
        Agreement target, strictly between 1/K and 1.
    guess : float
        Starting sigma for the search.
    slope : float, optional
        d agreement / d sigma at ``guess``, if known.
    side : {"point", "at-least", "at-most"}, default "point"
        Which side of the target the returned sigma must lie on (see :func:`solve_near`).

    Returns
    -------
    float
        The sigma found.

    Raises
    ------
    ValueError
        Target outside (1/K, 1), or no sigma satisfying ``side`` near the guess.

    Notes
    -----
    Eq. ``top1-exact`` inverted numerically; pi is strictly decreasing
    (Proposition 1), so the root is unique.
    """
    chance = 1.0 / curves.n_classes
    if not chance < target < 1.0:
        raise ValueError(
            f"agreement target must lie strictly between 1/K={chance:.4g} and 1, got {target}"
        )
    return solve_near(lambda s: float(curves.agreement(s)[0]), target, guess=guess, slope=slope, side=side)
