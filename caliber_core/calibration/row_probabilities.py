"""Per-row survival probabilities at any sigma: the rows every interval is built from.

Per row ``i`` and noise scale sigma:

* ``a_i(sigma)`` = P(noisy argmax = label y_i)        (accuracy row),
* ``g_i(sigma)`` = P(noisy argmax = clean argmax)     (agreement row, pi_i of Eq. top1-exact),
* ``c_i`` = 1[clean argmax = y_i]                     (clean accuracy A0 = mean c).

Sample accuracy, agreement and retention at sigma are mean a, mean g and
mean a / mean c. The rows are exact by quadrature (Proposition 1, the label as
the reference class for ``a``; on a correct row a_i = g_i) or, when N K is too
large for quadrature, the fraction of the sweep's draws whose survival
interval contains sigma (:mod:`.sweep`), which carries Monte-Carlo error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_labels, as_logits, as_sigmas
from .survival import FEW_CLASSES, QUAD_STEP, QUAD_STEP_FEW, U_MAX, sorted_gaps, survival_probability
from .sweep import SurvivalIntervals, default_realizations, survival_intervals

ROW_METHODS = ("exact", "monte-carlo")
#: Quadrature evaluations (rows x (K - 1) x nodes) per sigma under which
#: :func:`rows_for_sample` uses exact rows: about 0.3 s per sigma here.
EXACT_ROW_BUDGET = 2e7


@dataclass(frozen=True)
class RowValues:
    """Per-row probabilities at a set of sigmas.

    Attributes
    ----------
    sigma : ndarray (n_sigma,)
    accuracy : ndarray (n_sigma, n_samples) or None
        a_i(sigma); None without labels.
    agreement : ndarray (n_sigma, n_samples)
        g_i(sigma).
    correct : ndarray (n_samples,) or None
        c_i as 0/1 floats; None without labels.
    """

    sigma: np.ndarray
    accuracy: np.ndarray | None
    agreement: np.ndarray
    correct: np.ndarray | None


class RowProbabilities:
    """a_i(sigma) and g_i(sigma) for every row, exact or Monte Carlo.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
    method : {"exact", "monte-carlo"}, default "exact"
        "exact": quadrature per row (cost ~ N (K - 1) 54-80 per sigma).
        "monte-carlo": the fraction of the row's draws in ``draws`` whose
        survival interval contains sigma (cost ~ N R per sigma).
    draws : SurvivalIntervals, optional
        The sweep's per-(row, draw) intervals; required for "monte-carlo"
        (labels must match: accuracy rows need a sweep run with labels).
    """

    def __init__(self, logits, labels=None, *, method: str = "exact",
                 draws: SurvivalIntervals | None = None):
        z = as_logits(logits, finite=True)
        if z.shape[0] < 2:
            raise ValueError(f"intervals need at least 2 rows, got n_samples={z.shape[0]}")
        if method not in ROW_METHODS:
            raise ValueError(f"method must be 'exact' or 'monte-carlo', got {method!r}")
        self.n_samples, self.n_classes = z.shape
        self.method = method
        pred = np.argmax(z, axis=1)
        self.correct = None
        if labels is not None:
            y = as_labels(labels, n_samples=self.n_samples, n_classes=self.n_classes)
            self.correct = (pred == y).astype(np.float64)
        if method == "monte-carlo":
            if draws is None:
                raise ValueError("method 'monte-carlo' needs the sweep's draws (SurvivalIntervals)")
            if draws.n_samples != self.n_samples:
                raise ValueError(f"draws cover {draws.n_samples} rows, logits have {self.n_samples}")
            if labels is not None and not draws.has_labels:
                raise ValueError("the draws were computed without labels; accuracy rows need them")
            self._draws = draws
            return
        self._agree_gaps = sorted_gaps(z, pred)
        if labels is not None:
            # On a correct row a_i = g_i; only the wrong rows need the label as reference.
            self._wrong = np.nonzero(self.correct == 0)[0]
            self._label_gaps = sorted_gaps(z[self._wrong], y[self._wrong])

    @property
    def has_labels(self) -> bool:
        return self.correct is not None

    def at(self, sigma) -> RowValues:
        """Per-row probabilities at each sigma (a scalar or a 1-D grid)."""
        sig = as_sigmas(sigma)
        agree = np.empty((sig.size, self.n_samples))
        acc = np.empty_like(agree) if self.has_labels else None
        for j, s in enumerate(sig):
            if self.method == "exact":
                agree[j] = survival_probability(self._agree_gaps, s)
                if acc is not None:
                    acc[j] = agree[j] * self.correct
                    if self._wrong.size:
                        acc[j, self._wrong] = survival_probability(self._label_gaps, s)
            else:
                s = max(s, np.finfo(np.float64).tiny)  # sigma = 0 is the clean limit 0+
                d = self._draws
                agree[j] = np.mean(s < d.agree_hi, axis=1)
                if acc is not None:
                    acc[j] = np.mean((d.acc_lo < s) & (s < d.acc_hi), axis=1)
        return RowValues(sig, acc, agree, self.correct)


def sample_estimates(rv: RowValues) -> dict:
    """Sample accuracy, retention and agreement at each sigma of ``rv`` (arrays; None without labels)."""
    est = {"agreement": rv.agreement.mean(axis=1), "accuracy": None, "retention": None}
    if rv.accuracy is not None:
        est["accuracy"] = rv.accuracy.mean(axis=1)
        est["retention"] = est["accuracy"] / rv.correct.mean()
    return est


def row_spread(rv: RowValues) -> list[dict]:
    """Per-row standard deviation of each estimate's influence function, one dict per sigma.

    The standard error of the estimate is sd / sqrt(N). Accuracy and agreement
    are means (influence a_i, g_i); retention A / A0 linearizes as
    (a_i - R c_i) / A0. Values are None without labels (accuracy, retention).
    """
    out = []
    for j in range(rv.sigma.size):
        d = {"agreement": float(np.std(rv.agreement[j], ddof=1)), "accuracy": None, "retention": None}
        if rv.accuracy is not None:
            a, c = rv.accuracy[j], rv.correct
            a0 = c.mean()
            d["accuracy"] = float(np.std(a, ddof=1))
            d["retention"] = float(np.std((a - a.mean() / a0 * c) / a0, ddof=1))
        out.append(d)
    return out


def rows_for_sample(logits, labels=None, *, seed: int | None = 0) -> RowProbabilities:
    """Exact rows when quadrature is cheap enough (``EXACT_ROW_BUDGET``), else Monte-Carlo rows.

    The Monte-Carlo rows use the sweep's default number of draws for N and K.
    """
    z = as_logits(logits, finite=True)
    n, k = z.shape
    nodes = 2 * U_MAX / (QUAD_STEP_FEW if k <= FEW_CLASSES else QUAD_STEP)
    if n * (k - 1) * nodes <= EXACT_ROW_BUDGET:
        return RowProbabilities(z, labels, method="exact")
    draws = survival_intervals(z, labels, realizations=default_realizations(n, k), seed=seed)
    return RowProbabilities(z, labels, method="monte-carlo", draws=draws)
