"""The one engine of Proposition 1 and Corollary 1: per-row survival at any sigma, one cost policy.

Per row ``i`` and noise scale sigma:

* ``a_i(sigma)`` = P(noisy argmax = label y_i)        (accuracy row),
* ``g_i(sigma)`` = P(noisy argmax = clean argmax)     (agreement row, pi_i of Eq. top1-exact),
* ``c_i`` = 1[clean argmax = y_i]                     (clean accuracy A0 = mean c).

Every curve is a mean of these rows: agreement = mean g, expected accuracy =
mean a, retention = mean a / mean c, and the corridor of Corollary 1 (Eq.
corridor) has floor sum over the correct rows of g_i / N (a_i = g_i there) and
width (1 - A0) beta(sigma), closed form in the deficits h. The rows are

* ``"exact"``: quadrature of Eq. top1-exact per row (:mod:`.survival`);
* ``"monte-carlo"``: the fraction of the calibration sweep's draws whose
  survival interval contains sigma (:mod:`.sweep`), with the sweep's standard
  errors.

:func:`choose_method` is the single rule between them, decided once per
sample from N and K: sigma*, its intervals, the corridor, the drift reference,
the Export review and the Fleet page all read the same rows. At sigma = 0
the rows are the clean model's (g = 1, a = c), ties included, so accuracy(0)
is A0 exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..validation import as_sigmas
from .sample import LogitSample
from .survival import FEW_CLASSES, QUAD_STEP, QUAD_STEP_FEW, U_MAX, survival_probability
from .sweep import SurvivalIntervals, default_realizations, survival_intervals

METHODS = ("exact", "monte-carlo")
#: Normal-CDF evaluations per sigma (rows x (K - 1) x quadrature nodes) up to
#: which a sample's rows are exact: a sigma* costs ~24 such evaluations (about
#: 4e8 CDFs, ~10 s here at the limit). The bundled 500 x 10 models need 2.4e5;
#: a 2,000 x 1,000 file 1.6e8, so its rows come from the sweep's draws.
EXACT_BUDGET = 1.7e7


def exact_cost(n_samples: int, n_classes: int) -> float:
    """Normal-CDF evaluations of one sigma's exact rows (one per row at K = 2: the closed form).

    Returns
    -------
    float
    """
    if n_classes == 2:
        return float(n_samples)
    nodes = 2 * U_MAX / (QUAD_STEP_FEW if n_classes <= FEW_CLASSES else QUAD_STEP) + 1
    return float(n_samples) * (n_classes - 1) * nodes


def choose_method(n_samples: int, n_classes: int, n_sigmas: int = 1) -> str:
    """"exact" when ``n_sigmas`` sigmas' quadrature costs at most ``EXACT_BUDGET`` CDFs, else "monte-carlo".

    At K = 2 the rows are closed form (one CDF per row, no draws needed): always "exact". A plotted
    grid asks for many sigmas at once: at 2,000 x 100 (1.6e7 CDFs a sigma) 60 exact ones took 31 s
    here, the sweep's draws 0.8 s with a largest standard error of 5e-4.

    Returns
    -------
    {"exact", "monte-carlo"}
    """
    if n_classes == 2:
        return "exact"
    return "exact" if n_sigmas * exact_cost(n_samples, n_classes) <= EXACT_BUDGET else "monte-carlo"


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


def sample_estimates(rv: RowValues) -> dict:
    """Sample accuracy, retention and agreement at each sigma of ``rv``.

    Returns
    -------
    dict
        "agreement", "accuracy", "retention" arrays (n_sigma,); the last two None without labels.
    """
    est = {"agreement": rv.agreement.mean(axis=1), "accuracy": None, "retention": None}
    if rv.accuracy is not None:
        est["accuracy"] = rv.accuracy.mean(axis=1)
        est["retention"] = est["accuracy"] / rv.correct.mean()
    return est


def row_spread(rv: RowValues) -> list[dict]:
    """Per-row standard deviation of each estimate's influence function, one dict per sigma.

    The standard error of the estimate is sd / sqrt(N). Accuracy and agreement
    are means (influence a_i, g_i); retention A / A0 linearizes as
    (a_i - R c_i) / A0.

    Returns
    -------
    list of dict
        "agreement", "accuracy", "retention" floats (NaN below 2 rows; the last two None without labels).
    """
    out = []
    for j in range(rv.sigma.size):
        g = rv.agreement[j]
        d = {"agreement": _spread(g.size, lambda lo, hi: g[lo:hi]), "accuracy": None, "retention": None}
        if rv.accuracy is not None:
            a, c = rv.accuracy[j], rv.correct
            a0 = c.mean()
            ratio = a.mean() / a0
            d["accuracy"] = _spread(a.size, lambda lo, hi: a[lo:hi])
            d["retention"] = _spread(a.size, lambda lo, hi: (a[lo:hi] - ratio * c[lo:hi]) / a0)
        out.append(d)
    return out


_SPREAD_ROWS = 1 << 16


def _spread(n: int, block: Callable[[int, int], np.ndarray]) -> float:
    """Sample standard deviation (ddof 1) of a per-row value made ``block(lo, hi)`` rows at a time.

    Two passes over blocks of rows: no temporary the size of all rows (the
    retention's influence would otherwise need three of them).
    """
    if n < 2:
        return float("nan")
    starts = range(0, n, _SPREAD_ROWS)
    mean = sum(float(block(lo, min(n, lo + _SPREAD_ROWS)).sum()) for lo in starts) / n
    squares = sum(float(np.sum((block(lo, min(n, lo + _SPREAD_ROWS)) - mean) ** 2)) for lo in starts)
    return float(np.sqrt(squares / (n - 1)))


def deficit_term(deficits, sigma, *, n_samples: int) -> np.ndarray:
    """(1 - A0) beta(sigma) = sum over misclassified rows of Phi(-h / (sqrt(2) sigma)) / N.

    The width of the corridor, closed form (Eq. corridor). Zero at sigma = 0.

    Parameters
    ----------
    deficits : array_like of shape (n_misclassified,)
        h = z_pred - z_label > 0 (``LogitSample.deficits``).
    sigma : float or 1-D array of floats >= 0
    n_samples : int
        N, all rows (correct ones included).
    """
    h = np.asarray(deficits, dtype=np.float64)
    s = as_sigmas(sigma)
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= max(1, h.size)):
        raise ValueError(f"n_samples must be an int >= the number of deficits ({h.size}), "
                         f"got {n_samples!r}")
    out = np.zeros(s.shape)
    pos = s > 0
    if h.size and pos.any():
        from scipy.special import ndtr

        out[pos] = ndtr(-h[None, :] / (np.sqrt(2.0) * s[pos, None])).sum(axis=1) / n_samples
    return out


class CurveEngine:
    """Per-row survival and the curves that are its means, for one sample.

    Methods taking ``sigma`` accept a float or a 1-D array of floats >= 0 and
    raise ValueError otherwise; ``accuracy``, ``corridor``, ``corridor_width`` and ``floor``
    raise ValueError when the sample has no labels.

    Parameters
    ----------
    sample : LogitSample, or array_like logits of shape (n_samples, n_classes)
    labels : array_like of int, optional
        Only with raw logits (a sample carries its own).
    method : {"auto", "exact", "monte-carlo"}, default "auto"
        "auto": :func:`choose_method`.
    draws : SurvivalIntervals, optional
        The calibration sweep's draws for the Monte-Carlo rows; without them
        the sweep is run on first use with ``seed`` and the default draws.
        Curves with no draws (``realizations`` 0: the closed form at K = 2)
        are taken as none.
    seed : int or None, default 0

    Raises
    ------
    ValueError
        Unknown ``method``; ``draws`` for another row count, or without labels for a labelled sample.
    """

    def __init__(self, sample, labels=None, *, method: str = "auto",
                 draws: SurvivalIntervals | None = None, seed: int | None = 0):
        self.sample = LogitSample.of(sample, labels)
        n, k = self.sample.n_samples, self.sample.n_classes
        if method not in ("auto", *METHODS):
            raise ValueError(f"method must be one of {('auto', *METHODS)}, got {method!r}")
        self.method = choose_method(n, k) if method == "auto" else method
        if draws is not None and draws.realizations == 0:
            draws = None
        if draws is not None:
            if draws.n_samples != n:
                raise ValueError(f"draws cover {draws.n_samples} rows, logits have {n}")
            if self.sample.has_labels and not draws.has_labels:
                raise ValueError("the draws were computed without labels; accuracy rows need them")
        self._draws = draws
        self.seed = seed
        self._kept: RowValues | None = None

    # -- the sample ---------------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        """N, the sample's row count."""
        return self.sample.n_samples

    @property
    def n_classes(self) -> int:
        """K, the number of classes."""
        return self.sample.n_classes

    @property
    def has_labels(self) -> bool:
        """Whether the sample carries labels."""
        return self.sample.has_labels

    @property
    def correct(self) -> np.ndarray | None:
        """c_i as 0/1 floats, or None without labels."""
        return self.sample.correct.astype(np.float64) if self.has_labels else None

    @property
    def estimated(self) -> bool:
        """True when the rows come from Monte-Carlo draws rather than quadrature."""
        return self.method != "exact"

    @property
    def draws(self) -> SurvivalIntervals:
        """The Monte-Carlo draws (the sweep is run on first use when none were given)."""
        if self._draws is None:
            n, k = self.n_samples, self.n_classes
            self._draws = survival_intervals(self.sample, realizations=default_realizations(n, k),
                                             seed=self.seed)
        return self._draws

    # -- rows ---------------------------------------------------------------------------
    def at(self, sigma) -> RowValues:
        """Per-row probabilities at each sigma, Eq. ``top1-exact`` per row (or its draws' estimate).

        The last grid asked for is kept, so a bootstrap over the rows a plot
        was drawn from does not evaluate them again.

        Returns
        -------
        RowValues
        """
        sig = as_sigmas(sigma)
        kept = self._kept
        if kept is not None and kept.sigma.shape == sig.shape and np.array_equal(kept.sigma, sig):
            return kept
        agree = np.empty((sig.size, self.n_samples))
        acc = np.empty_like(agree) if self.has_labels else None
        for j, s in enumerate(sig):
            agree[j], a = self._rows_at(float(s))
            if acc is not None:
                acc[j] = a
        rv = RowValues(sig, acc, agree, self.correct)
        if sig.size > 1:
            self._kept = rv
        return rv

    def _rows_at(self, s: float) -> tuple[np.ndarray, np.ndarray | None]:
        smp = self.sample
        if s == 0.0:
            # The clean model itself: its argmax agrees with itself and is right on the correct
            # rows, ties included (the quadrature's limit at 0+ splits a tie instead).
            return np.ones(self.n_samples), (self.correct if self.has_labels else None)
        if self.method == "monte-carlo":
            d = self.draws
            s = np.float64(s)  # compared in float64 with the float32 ends, as the sweep's curves are
            agree = np.mean(s < d.agree_hi, axis=1)
            acc = np.mean((d.acc_lo < s) & (s < d.acc_hi), axis=1) if self.has_labels else None
            return agree, acc
        agree = survival_probability(smp.agreement_gaps, s)
        if not self.has_labels:
            return agree, None
        acc = np.where(smp.correct, agree, 0.0)
        if smp.wrong_rows.size:
            acc[smp.wrong_rows] = survival_probability(smp.label_gaps, s)
        return agree, acc

    # -- curves -------------------------------------------------------------------------
    def agreement(self, sigma) -> np.ndarray:
        """Mean pi(sigma) of Eq. ``top1-exact`` over all inputs, for each sigma (1 at sigma = 0).

        Returns
        -------
        ndarray of shape (n_sigma,)
        """
        sig = as_sigmas(sigma)
        if self.method == "monte-carlo":
            return np.where(sig == 0.0, 1.0, self.draws.agreement(sig))
        return np.array([1.0 if s == 0.0 else survival_probability(self.sample.agreement_gaps, s).mean()
                         for s in sig])

    def accuracy(self, sigma) -> np.ndarray:
        """Expected accuracy E[A(sigma)] over the noise, for each sigma (A0 at sigma = 0).

        Returns
        -------
        ndarray of shape (n_sigma,)
        """
        self.sample.need_labels()
        sig = as_sigmas(sigma)
        if self.method == "monte-carlo":
            return np.where(sig == 0.0, self.sample.clean_accuracy, self.draws.accuracy(sig))
        smp = self.sample
        out = np.empty(sig.shape)
        for j, s in enumerate(sig):
            if s == 0.0:
                out[j] = smp.clean_accuracy
                continue
            # Correct rows survive with the argmax, wrong ones need their label to win.
            if self.n_classes == 2:  # one CDF a row: all rows', summed over the correct ones (no gap copy)
                total = np.sum(survival_probability(smp.agreement_gaps, s), where=smp.correct)
            else:
                total = survival_probability(smp.correct_gaps, s).sum()
            if smp.wrong_rows.size:
                total += survival_probability(smp.label_gaps, s).sum()
            out[j] = total / self.n_samples
        return out

    def agreement_stderr(self, sigma) -> np.ndarray | None:
        """Monte-Carlo standard error of :meth:`agreement`.

        Returns
        -------
        ndarray of shape (n_sigma,) or None
            None when the rows are exact.
        """
        return None if self.method == "exact" else self.draws.agreement_stderr(sigma)

    def accuracy_stderr(self, sigma) -> np.ndarray | None:
        """Monte-Carlo standard error of :meth:`accuracy`.

        Returns
        -------
        ndarray of shape (n_sigma,) or None
            None when the rows are exact.
        """
        return None if self.method == "exact" else self.draws.accuracy_stderr(sigma)

    def corridor_width(self, sigma) -> np.ndarray:
        """(1 - A0) beta(sigma), the width of Eq. ``corridor``, at each sigma (:func:`deficit_term`).

        Returns
        -------
        ndarray of shape (n_sigma,)
        """
        self.sample.need_labels()
        return deficit_term(self.sample.deficits, sigma, n_samples=self.n_samples)

    def corridor(self, sigma) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper accuracy envelopes of Corollary 1 (Eq. ``corridor``).

        Returns
        -------
        lower, upper : ndarray of shape (n_sigma,)
        """
        rv = self.at(sigma)
        lower = self.floor(rv)
        return lower, lower + self.corridor_width(rv.sigma)

    def floor(self, rv: RowValues) -> np.ndarray:
        """A0 * mean_correct(pi) = sum over the correct rows of g_i / N: the floor of Eq. ``corridor``.

        Parameters
        ----------
        rv : RowValues
            Rows from :meth:`at` on this engine.

        Returns
        -------
        ndarray of shape (n_sigma,)
        """
        correct = self.sample.correct
        return rv.agreement[:, correct].sum(axis=1) / self.n_samples

    def floor_stderr(self, sigma) -> np.ndarray | None:
        """Monte-Carlo standard error of the corridor's floor (:meth:`floor`).

        Returns
        -------
        ndarray of shape (n_sigma,) or None
            None when the rows are exact.
        """
        if self.method == "exact":
            return None
        return self.draws.agreement_stderr(sigma, rows=self.sample.correct)

    def progress_rows(self, grid: np.ndarray, *, chunk: int,
                      progress: Callable[[float], None] | None) -> RowValues:
        """:meth:`at` over a grid, ``chunk`` sigmas at a time, reporting the fraction done.

        Parameters
        ----------
        grid : 1-D array_like of float >= 0
        chunk : int
            Sigmas per step (>= 1).
        progress : callable or None
            Called with the fraction done in [0, 1] after each step.

        Returns
        -------
        RowValues

        Raises
        ------
        ValueError
            ``chunk`` is not an int >= 1.
        """
        if not (isinstance(chunk, (int, np.integer)) and chunk >= 1):
            raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
        grid = as_sigmas(grid)
        if progress is None or grid.size <= chunk:
            return self.at(grid)
        parts = []
        for start in range(0, grid.size, chunk):
            parts.append(self.at(grid[start:start + chunk]))
            progress(min(1.0, (start + chunk) / grid.size))
        rv = RowValues(grid, None if not self.has_labels else np.concatenate([p.accuracy for p in parts]),
                       np.concatenate([p.agreement for p in parts]), self.correct)
        self._kept = rv
        return rv
