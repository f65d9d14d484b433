"""Agreement, expected accuracy and the accuracy corridor of Corollary 1, at any size.

For a model with clean accuracy A0 the corridor is (Eq. corridor)

    A0 * pibar_c(sigma)  <=  A(sigma)  <=  A0 * pibar_c(sigma) + (1 - A0) * beta(sigma),

with pibar_c the mean survival probability pi(sigma) of the correctly
classified rows and beta(sigma) = mean over the misclassified rows of
Phi(-h / (sqrt(2) sigma)), h = z_pred - z_label > 0. The term (1 - A0) beta is
closed form at any size. The rest needs per-row survival probabilities, and
this module evaluates them one of two ways:

* ``"exact"``: quadrature of Eq. top1-exact for every row (``survival``),
  about N (K - 1) x 54-80 normal CDFs per sigma. Exact to ~1e-11.
* ``"monte-carlo"``: the fraction of the calibration sweep's noise draws
  whose survival interval contains sigma (``sweep``). The sweep has run
  already, so this costs one comparison per (row, draw) and sigma; it is an
  estimate, with the standard error of the antithetic draw pairs.

Both routes go through the same per-row values (``row_probabilities``):
agreement is the mean of g_i, expected accuracy the mean of a_i, and the
corridor's floor the sum of g_i over the correct rows divided by N (on a
correct row a_i = g_i), so the correct rows' survival is computed once for
all three. The per-row values are kept in the result (:class:`GridRows`), so
the row bootstrap of ``intervals`` can draw its bands on the same grid
without evaluating them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from ..validation import as_labels, as_logits, as_sigmas
from .row_probabilities import RowProbabilities, RowValues
from .survival import FEW_CLASSES, QUAD_STEP, QUAD_STEP_FEW, U_MAX
from .sweep import SurvivalIntervals

CURVE_METHODS = ("auto", "exact", "monte-carlo")
#: Normal-CDF evaluations (rows x (K - 1) x nodes x sigmas) under which "auto"
#: picks exact curves: about 1-2 s on one core here. The bundled 500 x 10
#: models need ~2e7 for 60 sigmas; a 2,000 x 1,000 file ~1e10.
EXACT_CURVE_BUDGET = 1.5e8


class GridRows:
    """A row source (``row_probabilities.RowProbabilities``) with its values on one grid kept.

    ``at(grid)`` returns the kept values for that exact grid and asks the
    underlying rows for anything else; every other attribute is the rows'.

    Parameters
    ----------
    rows : RowProbabilities
    values : RowValues
        ``rows.at(values.sigma)``, computed by the caller.
    """

    def __init__(self, rows: RowProbabilities, values: RowValues):
        if values.agreement.shape != (values.sigma.size, rows.n_samples):
            raise ValueError(f"values cover {values.agreement.shape} (sigma, rows), the rows "
                             f"have {rows.n_samples} rows")
        self.rows = rows
        self.values = values

    def __getattr__(self, name):
        return getattr(self.rows, name)

    def at(self, sigma) -> RowValues:
        s = as_sigmas(sigma)
        if s.shape == self.values.sigma.shape and np.array_equal(s, self.values.sigma):
            return self.values
        return self.rows.at(s)


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
    rows : GridRows
        The per-row values the curves are means of, as a row source for
        ``intervals.BootstrapIntervals`` (any other sigma is evaluated anew).
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
    rows: GridRows

    @property
    def estimated(self) -> bool:
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
    deficits : ndarray of shape (n_misclassified,)
    """
    z = as_logits(logits)
    y = as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    pred = np.argmax(z, axis=1)
    wrong = np.nonzero(pred != y)[0]
    return np.asarray(z[wrong, pred[wrong]] - z[wrong, y[wrong]], dtype=np.float64)


def deficit_term(deficits, sigma, *, n_samples: int) -> np.ndarray:
    """(1 - A0) beta(sigma) = sum over misclassified rows of Phi(-h / (sqrt(2) sigma)) / N.

    The width of the corridor, closed form (Eq. corridor). Zero at sigma = 0.

    Parameters
    ----------
    deficits : array_like of shape (n_misclassified,)
        From :func:`misclassified_deficits`.
    sigma : float or 1-D array of floats >= 0
    n_samples : int
        N, all rows (correct ones included).
    """
    h = np.asarray(deficits, dtype=np.float64)
    s = as_sigmas(sigma)
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= max(1, h.size)):
        raise ValueError(f"n_samples must be an int >= the number of deficits ({h.size}), "
                         f"got {n_samples!r}")
    if h.size == 0:
        return np.zeros(s.shape)
    out = np.zeros(s.shape)
    pos = s > 0
    out[pos] = ndtr(-h[None, :] / (np.sqrt(2.0) * s[pos, None])).sum(axis=1) / n_samples
    return out


def exact_cost(n_samples: int, n_classes: int, n_sigma: int) -> float:
    """Normal-CDF evaluations the exact route needs for ``n_sigma`` sigmas."""
    nodes = 2 * U_MAX / (QUAD_STEP_FEW if n_classes <= FEW_CLASSES else QUAD_STEP) + 1
    return float(n_samples) * (n_classes - 1) * nodes * n_sigma


def choose_method(n_samples: int, n_classes: int, n_sigma: int, *,
                  budget: float = EXACT_CURVE_BUDGET) -> str:
    """"exact" when quadrature on the grid costs at most ``budget`` CDFs, else "monte-carlo"."""
    return "exact" if exact_cost(n_samples, n_classes, n_sigma) <= budget else "monte-carlo"


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
    """Agreement, expected accuracy and the Corollary 1 corridor on a sigma grid.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
        Needed for accuracy and the corridor.
    sigma : 1-D array of floats >= 0
        The grid.
    draws : SurvivalIntervals, optional
        The calibration sweep's draws (``Calibration.intervals``); needed by
        the Monte-Carlo route, with labels when ``labels`` are given.
    method : {"auto", "exact", "monte-carlo"}, default "auto"
        "auto": exact when :func:`choose_method` allows it or no draws are given.
    chunk : int, default 6
        Sigmas per step between ``progress`` calls.
    progress : callable, optional
        Called with the fraction done in [0, 1].

    Returns
    -------
    ModelCurves

    Notes
    -----
    Corollary 1, Eq. corridor; the exact route is Eq. top1-exact per row.
    """
    z = as_logits(logits)
    n, k = z.shape
    y = None if labels is None else as_labels(labels, n_samples=n, n_classes=k)
    if sigma is None:
        raise ValueError("sigma (the grid) is required")
    grid = as_sigmas(sigma)
    if method not in CURVE_METHODS:
        raise ValueError(f"method must be one of {CURVE_METHODS}, got {method!r}")
    if not (isinstance(chunk, (int, np.integer)) and chunk >= 1):
        raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
    if method == "auto":
        method = "exact" if draws is None else choose_method(n, k, grid.size)
    if method == "monte-carlo":
        if draws is None:
            raise ValueError("the Monte-Carlo route needs the sweep's draws (Calibration.intervals)")
        if draws.n_samples != n:
            raise ValueError(f"draws cover {draws.n_samples} rows, logits have {n}")
        if y is not None and not draws.has_labels:
            raise ValueError("the draws were computed without labels; accuracy needs them")
    rows = RowProbabilities(z, y, method=method, draws=draws if method == "monte-carlo" else None)
    parts = []
    for start in range(0, grid.size, chunk):
        parts.append(rows.at(grid[start:start + chunk]))
        if progress is not None:
            progress(min(1.0, (start + chunk) / grid.size))
    rv = RowValues(sigma=grid, agreement=np.concatenate([p.agreement for p in parts]),
                   accuracy=None if y is None else np.concatenate([p.accuracy for p in parts]),
                   correct=rows.correct)
    agreement = rv.agreement.mean(axis=1)
    accuracy = lower = upper = None
    if y is not None:
        correct = rv.correct > 0
        accuracy = rv.accuracy.mean(axis=1)
        lower = rv.agreement[:, correct].sum(axis=1) / n
        upper = lower + deficit_term(misclassified_deficits(z, y), grid, n_samples=n)
    agreement_se = accuracy_se = lower_se = None
    if method == "monte-carlo":
        agreement_se = draws.agreement_stderr(grid)
        if y is not None:
            accuracy_se = draws.accuracy_stderr(grid)
            lower_se = _floor_stderr(draws, rv.correct > 0, grid)
    return ModelCurves(sigma=grid, method=method, agreement=agreement, accuracy=accuracy,
                       lower=lower, upper=upper, agreement_se=agreement_se,
                       accuracy_se=accuracy_se, lower_se=lower_se, rows=GridRows(rows, rv))


def _floor_stderr(draws: SurvivalIntervals, correct: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Standard error of sum_correct g_i / N: the correct rows' agreement error, scaled."""
    if not correct.any():
        return np.zeros(sigma.shape)
    subset = SurvivalIntervals(agree_hi=draws.agree_hi[correct], acc_lo=None, acc_hi=None,
                               n_classes=draws.n_classes, seed=draws.seed)
    return subset.agreement_stderr(sigma) * (np.count_nonzero(correct) / correct.size)
