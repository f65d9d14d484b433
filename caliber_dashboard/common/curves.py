"""Plot-ready curves of one calibrated model, on the normalized axes of the paper.

Plain functions (no Streamlit), so tests can call them directly. The numerics
are the core's (the curves and corridor themselves: ``caliber_core.calibration.corridor``);
this module picks the grid and normalizes values the way the paper does
(v = sigma^2 / S^2, A~ = (A - 1/K) / (A0 - 1/K)) for the figures.
"""

from __future__ import annotations

import numpy as np

from caliber_core.calibration import margins
from caliber_core.calibration.calibrate import Calibration


def sigma_grid(cal: Calibration, n_points: int = 60) -> np.ndarray:
    """A log grid over the sweep's sigma range (where the page draws its curves)."""
    lo, hi = cal.sigma_range()
    return np.geomspace(lo, hi, n_points)


def normalized_accuracy(accuracy, cal: Calibration) -> np.ndarray:
    """A~ = (A - 1/K) / (A0 - 1/K) (Eq. util-norm)."""
    return margins.normalized_utility(accuracy, clean=cal.clean_accuracy, n_classes=cal.n_classes)


def normalized_agreement(agreement, n_classes: int) -> np.ndarray:
    """Agreement on the same [chance, clean] scale: (pi - 1/K) / (1 - 1/K)."""
    chance = 1.0 / n_classes
    return (np.asarray(agreement, dtype=np.float64) - chance) / (1.0 - chance)


def fitted_points(cal: Calibration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(v, normalized value, its standard error) of the points the logistic was fit to."""
    sw = cal.sweep
    if cal.fit_quantity == "accuracy":
        span = cal.clean_accuracy - cal.chance
        return sw.v, sw.utility, sw.accuracy_se / span
    return sw.v, normalized_agreement(sw.agreement, cal.n_classes), sw.agreement_se / (1 - cal.chance)


def residuals(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(v, point - logistic) on the fitted points."""
    v, u, _ = fitted_points(cal)
    return v, u - cal.fit.predict(v)


# ----------------------------------------------------------------- attack-cost grids


def m_grid(m_max: int, n_points: int = 40) -> np.ndarray:
    """Integers M in [1, m_max], log-spaced (for the analytic curves)."""
    return np.unique(np.round(np.geomspace(1, int(m_max), n_points)).astype(int))


def powers_of_two(m_max: int) -> tuple[int, ...]:
    out, m = [], 1
    while m <= m_max:
        out.append(m)
        m *= 2
    return tuple(out)
