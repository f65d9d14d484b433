"""The logistic decay law of normalized utility and its closed-form inverse.

    A~(v) = c + (1 - c) / (1 + (v / v50)^p)                  (Eq. logistic-decay)
    v*    = v50 * ((1 - A~*) / (A~* - c))^(1 / p)            (Eq. inverse-v)

(the inverse lives with every other target -> sigma map, in :mod:`.inversion`),
fit by bounded least squares on (v, A~) sweep points, per model or shared.
The solver is a Levenberg-Marquardt on (log v50, p, c) with an active set for
the bounds, in numpy alone (three parameters, a few dozen points): the
command line then never imports scipy.optimize, which costs more than the
whole fit. It reports whether it converged; a fit that did not raises.
tests/test_fit.py checks it against ``scipy.optimize.least_squares``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .inversion import invert_logistic

# Bounds for the bounded least squares: v50 in (1e-8, 1e8), p in [0.05, 50], c in [0, 0.99].
_LOG_V50_BOUNDS = (np.log(1e-8), np.log(1e8))
_P_BOUNDS = (0.05, 50.0)
_C_BOUNDS = (0.0, 0.99)
_MAX_ITERATIONS = 500
_FTOL = 1e-12  # relative decrease of the cost below which the fit has converged
_XTOL = 1e-10  # relative step below which it has converged


class FitError(ValueError):
    """The least-squares fit stopped without converging.

    A ``ValueError`` subclass, so callers that catch bad input catch it too.
    """


def logistic_decay(v, *, v50: float, p: float, c: float) -> np.ndarray:
    """Normalized utility A~(v) under the logistic law.

    Parameters
    ----------
    v : float or array_like of float
        Normalized intensities, each >= 0.
    v50 : float
        Half-degradation scale (> 0).
    p : float
        Steepness (> 0).
    c : float
        Residual floor in [0, 1).

    Returns
    -------
    ndarray
        A~ at each v: 1 at v = 0, decreasing towards c.

    Raises
    ------
    ValueError
        If any v is negative.

    Notes
    -----
    Eq. ``logistic-decay``.
    """
    v = np.asarray(v, dtype=np.float64)
    if np.any(v < 0):
        raise ValueError(f"v must be >= 0, got min {v.min()}")
    with np.errstate(over="ignore"):
        return c + (1.0 - c) / (1.0 + (v / v50) ** p)


@dataclass(frozen=True, kw_only=True)
class LogisticFit:
    """Fitted (v50, p, c) with its goodness of fit on the points it was fit to.

    Attributes
    ----------
    v50, p, c : float
        The law's half-degradation scale, steepness and floor.
    r2 : float
        Coefficient of determination on the fitted points (NaN if they are constant).
    rmse : float
        Root-mean-square residual in A~.
    n_points : int
        Points the fit used (finite, v > 0).

    Notes
    -----
    Eq. ``logistic-decay``; its inverse is Eq. ``inverse-v``.
    """

    v50: float
    p: float
    c: float
    r2: float
    rmse: float
    n_points: int

    def predict(self, v) -> np.ndarray:
        """A~ at ``v`` under this fit (Eq. ``logistic-decay``).

        Parameters
        ----------
        v : float or array_like of float
            Normalized intensities, each >= 0.

        Returns
        -------
        ndarray

        Raises
        ------
        ValueError
            If any v is negative.
        """
        return logistic_decay(v, v50=self.v50, p=self.p, c=self.c)

    def inverse(self, utility, *, saturate: bool = False):
        """v* reaching normalized utility ``utility`` under this fit (Eq. ``inverse-v``).

        Parameters
        ----------
        utility : float or array_like of float
            Target A~*.
        saturate : bool, default False
            Return inf instead of raising for targets at or below the floor c.

        Returns
        -------
        float or ndarray
            v* (0 where A~* >= 1).

        Raises
        ------
        ValueError
            A NaN target, or A~* <= c without ``saturate``.
        """
        return invert_logistic(utility, v50=self.v50, p=self.p, c=self.c, saturate=saturate)

    def to_dict(self) -> dict:
        """The fields as a plain dict (JSON-ready)."""
        return asdict(self)


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
    x, res = bounded_least_squares(np.log(v), u, x0, lower=lower, upper=upper)
    ss_tot = float(np.sum((u - u.mean()) ** 2))
    r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else float("nan")
    return LogisticFit(
        v50=float(np.exp(x[0])),
        p=float(x[1]),
        c=float(x[2]),
        r2=r2,
        rmse=float(np.sqrt(np.mean(res**2))),
        n_points=int(v.size),
    )


def _residuals_and_jacobian(x, log_v, u):
    """Residuals of Eq. logistic-decay at (log v50, p, c), and their Jacobian (n, 3)."""
    a, p, c = x
    # (v/v50)^p in log space: stable for huge and tiny v.
    e = p * (log_v - a)
    inside = np.abs(e) < 700
    t = np.exp(np.clip(e, -700, 700))
    q = 1.0 / (1.0 + t)
    r = c + (1.0 - c) * q - u
    dq_de = np.where(inside, -t * q * q, 0.0)
    jac = np.empty((log_v.size, 3))
    jac[:, 0] = (1.0 - c) * dq_de * -p
    jac[:, 1] = (1.0 - c) * dq_de * (log_v - a)
    jac[:, 2] = 1.0 - q
    return r, jac


def bounded_least_squares(log_v, u, x0, *, lower, upper, max_iterations: int = _MAX_ITERATIONS):
    """Minimize the squared residuals of Eq. logistic-decay over (log v50, p, c) within bounds.

    Levenberg-Marquardt steps on the parameters not held at a bound (a
    parameter at its bound whose gradient pushes outwards is held), each step
    clipped into the box and accepted only when it lowers the cost.

    Returns
    -------
    x : ndarray (3,)
    residuals : ndarray (n_points,)

    Raises
    ------
    FitError
        No convergence within ``max_iterations`` steps.
    """
    x = np.asarray(x0, dtype=np.float64).copy()
    r, jac = _residuals_and_jacobian(x, log_v, u)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(max_iterations):
        grad = jac.T @ r
        held = ((x <= lower) & (grad > 0)) | ((x >= upper) & (grad < 0))
        free = ~held
        if cost == 0.0 or not free.any():
            return x, r
        jf = jac[:, free]
        normal = jf.T @ jf
        scale = np.maximum(np.diag(normal), 1e-300)
        while True:
            try:
                step = np.linalg.solve(normal + damping * np.diag(scale), -grad[free])
            except np.linalg.LinAlgError:
                step = None
            if step is not None and np.all(np.isfinite(step)):
                trial = x.copy()
                trial[free] += step
                trial = np.clip(trial, lower, upper)
                r_new, jac_new = _residuals_and_jacobian(trial, log_v, u)
                cost_new = float(r_new @ r_new)
                if cost_new <= cost:
                    break
            damping *= 4.0
            if damping > 1e16:
                return x, r  # no step lowers the cost: a (bounded) minimum
        moved = np.abs(trial - x)
        small_step = np.all(moved <= _XTOL * (np.abs(x) + _XTOL))
        small_gain = cost - cost_new <= _FTOL * cost
        x, r, jac, cost = trial, r_new, jac_new, cost_new
        damping = max(damping / 3.0, 1e-12)
        if small_step or small_gain:
            return x, r
    raise FitError(f"the logistic fit did not converge in {max_iterations} steps (cost {cost:.3g})")
