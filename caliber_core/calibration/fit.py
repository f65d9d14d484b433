"""The logistic decay law of normalized utility and its closed-form inverse.

    A~(v) = c + (1 - c) / (1 + (v / v50)^p)                  (Eq. logistic-decay)
    v*    = v50 * ((1 - A~*) / (A~* - c))^(1 / p)            (Eq. inverse-v)

fit by bounded least squares on (v, A~) sweep points, per model or shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize

# Bounds for the bounded least squares: v50 in (1e-8, 1e8), p in [0.05, 50], c in [0, 0.99].
_LOG_V50_BOUNDS = (np.log(1e-8), np.log(1e8))
_P_BOUNDS = (0.05, 50.0)
_C_BOUNDS = (0.0, 0.99)


def logistic_decay(v, *, v50: float, p: float, c: float) -> np.ndarray:
    """A~(v) of Eq. logistic-decay; equals 1 at v = 0 and tends to c."""
    v = np.asarray(v, dtype=np.float64)
    if np.any(v < 0):
        raise ValueError(f"v must be >= 0, got min {v.min()}")
    with np.errstate(over="ignore"):
        return c + (1.0 - c) / (1.0 + (v / v50) ** p)


@dataclass(frozen=True, kw_only=True)
class LogisticFit:
    """Fitted (v50, p, c) with its goodness of fit on the points it was fit to."""

    v50: float
    p: float
    c: float
    r2: float
    rmse: float
    n_points: int

    def predict(self, v) -> np.ndarray:
        return logistic_decay(v, v50=self.v50, p=self.p, c=self.c)

    def inverse(self, utility, *, saturate: bool = False):
        return invert_logistic(utility, v50=self.v50, p=self.p, c=self.c, saturate=saturate)

    def to_dict(self) -> dict:
        return asdict(self)


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
        A~* <= c without ``saturate``: the fitted curve never gets that low.
    """
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


def fit_logistic(v, utility, *, initial: tuple[float, float, float] | None = None) -> LogisticFit:
    """Bounded least-squares fit of Eq. logistic-decay to (v, A~) points.

    Parameters
    ----------
    v : array_like of shape (n_points,), > 0
    utility : array_like of shape (n_points,)
        Normalized utility at each v.
    initial : (v50, p, c), optional
        Starting point; default from where the points cross A~ = 1/2.

    Returns
    -------
    LogisticFit
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    u = np.asarray(utility, dtype=np.float64).ravel()
    if v.shape != u.shape:
        raise ValueError(f"v and utility differ in length: {v.size} vs {u.size}")
    keep = np.isfinite(v) & np.isfinite(u) & (v > 0)
    if keep.sum() < 3:
        raise ValueError(f"need at least 3 finite points with v > 0 to fit, got {int(keep.sum())}")
    v, u = v[keep], u[keep]
    if initial is None:
        order = np.argsort(v)
        below = np.nonzero(u[order] <= 0.5)[0]
        v50_0 = v[order][below[0]] if below.size else v.max()
        initial = (v50_0, 2.0, float(np.clip(np.min(u), 0.0, 0.5)))
    x0 = np.array([np.log(initial[0]), initial[1], initial[2]])
    lower = np.array([_LOG_V50_BOUNDS[0], _P_BOUNDS[0], _C_BOUNDS[0]])
    upper = np.array([_LOG_V50_BOUNDS[1], _P_BOUNDS[1], _C_BOUNDS[1]])
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
    log_v = np.log(v)

    def residuals(x):
        # (v/v50)^p computed in log space: stable for huge and tiny v.
        t = np.exp(np.clip(x[1] * (log_v - x[0]), -700, 700))
        return x[2] + (1.0 - x[2]) / (1.0 + t) - u

    sol = optimize.least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    res = sol.fun
    ss_tot = float(np.sum((u - u.mean()) ** 2))
    r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else float("nan")
    return LogisticFit(
        v50=float(np.exp(sol.x[0])),
        p=float(sol.x[1]),
        c=float(sol.x[2]),
        r2=r2,
        rmse=float(np.sqrt(np.mean(res**2))),
        n_points=int(v.size),
    )
