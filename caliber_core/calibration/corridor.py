"""Agreement, expected accuracy and the accuracy corridor of Corollary 1 on a sigma grid.

For a model with clean accuracy A0 the corridor is (Eq. corridor)

    A0 * pibar_c(sigma)  <=  A(sigma)  <=  A0 * pibar_c(sigma) + (1 - A0) * beta(sigma),

with pibar_c the mean survival probability pi(sigma) of the correctly
classified rows and beta(sigma) = mean over the misclassified rows of
Phi(-h / (sqrt(2) sigma)), h = z_pred - z_label > 0. The term (1 - A0) beta is
closed form at any size; the rest are means of the per-row survival
probabilities of :class:`.engine.CurveEngine`, exact or Monte Carlo by its
one cost policy, so the correct rows' survival is computed once for the
agreement, the expected accuracy and the floor. The engine keeps the grid's
rows, so the row bootstrap of :mod:`.intervals` draws its bands on the same
grid without evaluating them again (``ModelCurves.rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..validation import as_sigmas
from .engine import CurveEngine, deficit_term
from .sample import LogitSample
from .sweep import SurvivalIntervals

__all__ = ["ModelCurves", "curves_of", "deficit_term", "misclassified_deficits", "model_curves"]


@dataclass(frozen=True, kw_only=True)
class ModelCurves:
    """Agreement, expected accuracy and the corridor of one model on a sigma grid.

    Attributes
    ----------
    sigma : ndarray (n_sigma,)
    method : {"exact", "monte-carlo"}
    agreement : ndarray (n_sigma,)
        Mean probability that the noisy argmax is the clean one (pi of Prop. 1).
    accuracy, lower, upper : ndarray (n_sigma,) or None
        Expected accuracy and the corridor's envelopes; None without labels.
    agreement_se, accuracy_se, lower_se : ndarray (n_sigma,) or None
        Monte-Carlo standard errors (None when exact). ``upper`` carries the
        same error as ``lower``: its other term is closed form.
    rows : CurveEngine
        The engine the curves are means of, holding this grid's per-row values,
        as a row source for ``intervals.BootstrapIntervals``.
    """

    sigma: np.ndarray
    method: str
    agreement: np.ndarray
    accuracy: np.ndarray | None
    lower: np.ndarray | None
    upper: np.ndarray | None
    agreement_se: np.ndarray | None
    accuracy_se: np.ndarray | None
    lower_se: np.ndarray | None
    rows: CurveEngine

    @property
    def estimated(self) -> bool:
        """True when the curves are Monte-Carlo estimates (they carry standard errors)."""
        return self.method != "exact"

    def max_error(self) -> float:
        """Largest standard error over the grid and the curves (0.0 when exact)."""
        if not self.estimated:
            return 0.0
        parts = [a for a in (self.agreement_se, self.accuracy_se, self.lower_se) if a is not None]
        return float(max(np.max(a) for a in parts))


def misclassified_deficits(logits, labels) -> np.ndarray:
    """h = z_pred - z_label > 0 for every misclassified row (Corollary 1).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,)

    Returns
    -------
    ndarray of shape (n_misclassified,)

    Raises
    ------
    ValueError
        Logits or labels that fail validation.

    Notes
    -----
    The deficits h of Eq. ``corridor``.
    """
    return LogitSample(logits, labels).deficits


def curves_of(engine: CurveEngine, sigma, *, chunk: int = 6,
              progress: Callable[[float], None] | None = None) -> ModelCurves:
    """Agreement, expected accuracy and the Corollary 1 corridor of an engine on a sigma grid.

    Parameters
    ----------
    engine : CurveEngine
        E.g. ``Calibration.engine``: the rows sigma* was solved on.
    sigma : 1-D array of floats >= 0
    chunk : int, default 6
        Sigmas per step between ``progress`` calls.
    progress : callable, optional
        Called with the fraction done in [0, 1].

    Returns
    -------
    ModelCurves
        Accuracy and envelopes only with labels; standard errors only when estimated.

    Raises
    ------
    ValueError
        ``sigma`` missing or invalid, or ``chunk`` not an int >= 1.

    Notes
    -----
    Corollary 1, Eq. ``corridor``; the exact route is Eq. ``top1-exact`` per row.
    """
    if sigma is None:
        raise ValueError("sigma (the grid) is required")
    grid = as_sigmas(sigma)
    rv = engine.progress_rows(grid, chunk=chunk, progress=progress)
    agreement = rv.agreement.mean(axis=1)
    accuracy = lower = upper = None
    if engine.has_labels:
        accuracy = rv.accuracy.mean(axis=1)
        lower = engine.floor(rv)
        upper = lower + engine.corridor_width(grid)
    agreement_se = accuracy_se = lower_se = None
    if engine.estimated:
        agreement_se = engine.agreement_stderr(grid)
        if engine.has_labels:
            accuracy_se = engine.accuracy_stderr(grid)
            lower_se = engine.floor_stderr(grid)
    return ModelCurves(sigma=grid, method=engine.method, agreement=agreement, accuracy=accuracy,
                       lower=lower, upper=upper, agreement_se=agreement_se,
                       accuracy_se=accuracy_se, lower_se=lower_se, rows=engine)


def model_curves(
    logits,
    labels=None,
    sigma=None,
    *,
    draws: SurvivalIntervals | None = None,
    method: str = "auto",
    chunk: int = 6,
    progress: Callable[[float], None] | None = None,
) -> ModelCurves:
    """:func:`curves_of` for raw logits (a new engine on them).

    ``method`` "auto" is the engine's cost policy; the Monte-Carlo route uses
    ``draws`` (the calibration sweep's, ``Calibration.intervals``) or runs the
    sweep itself. A calibrated model already has its engine: prefer
    ``curves_of(cal.engine, sigma)``.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, optional
    sigma : 1-D array of floats >= 0
        The grid (required).
    draws : SurvivalIntervals, optional
    method : {"auto", "exact", "monte-carlo"}, default "auto"
    chunk : int, default 6
    progress : callable, optional

    Returns
    -------
    ModelCurves

    Raises
    ------
    ValueError
        Invalid logits, labels, sigma or method, or draws that do not match the rows.

    Notes
    -----
    Eq. ``corridor`` and Eq. ``top1-exact``.
    """
    engine = CurveEngine(logits, labels, method=method, draws=draws)
    return curves_of(engine, sigma, chunk=chunk, progress=progress)
