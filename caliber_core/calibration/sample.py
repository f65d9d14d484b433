"""One sample of logits (and labels), validated once, with the arrays every curve is built from.

A calibration file is read and checked once; everything downstream (the
sweep, the exact curves, the corridor, the intervals, the drift reference)
takes a :class:`LogitSample` and reads its derived arrays, each computed on
first use and kept:

* ``margins``: top-two margins (the margin scale S is a statistic of them);
* ``pred``: the clean argmax (ties to the lowest index, as ``numpy.argmax``);
* ``correct``: the mask pred == label, and A0 its mean;
* ``agreement_gaps``: per row, z_pred - z_j sorted ascending (Eq. top1-exact
  with the clean argmax as reference);
* ``wrong_rows``, ``label_gaps``: the misclassified rows and, per such row,
  z_label - z_j sorted (the label as reference: it trails, so some gaps are < 0);
* ``deficits``: h = z_pred - z_label > 0 on the misclassified rows (Corollary 1).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..validation import as_labels, as_logits
from .margins import top_two_margins
from .survival import sorted_gaps


class LogitSample:
    """Validated logits and labels with their derived arrays (see the module docstring).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
        Real values; ``finite=True`` also refuses NaN and inf.
    labels : array_like of int, shape (n_samples,), optional
    margins : ndarray of shape (n_samples,), optional
        Top-two margins already taken (the loader keeps them), used as given.
    finite : bool, default False

    Raises
    ------
    ValueError
        Logits or labels that fail :mod:`caliber_core.validation`.
    """

    def __init__(self, logits, labels=None, *, margins=None, finite: bool = False):
        z = as_logits(logits, finite=finite)
        self.logits = z
        self.n_samples, self.n_classes = z.shape
        self.labels = None if labels is None else as_labels(labels, n_samples=self.n_samples,
                                                            n_classes=self.n_classes)
        if margins is not None:
            m = np.asarray(margins, dtype=np.float64)
            if m.shape != (self.n_samples,):
                raise ValueError(f"margins must have shape ({self.n_samples},), got {m.shape}")
            self.__dict__["margins"] = m

    @classmethod
    def of(cls, logits, labels=None) -> LogitSample:
        """``logits`` itself when it is a sample already (labels must then be None), else a new one.

        Parameters
        ----------
        logits : LogitSample, or array_like of shape (n_samples, n_classes)
        labels : array_like of int, shape (n_samples,), optional
            Only with raw logits.

        Returns
        -------
        LogitSample

        Raises
        ------
        ValueError
            Labels passed with a sample, or logits or labels that fail validation.
        """
        if isinstance(logits, cls):
            if labels is not None:
                raise ValueError("labels come with the LogitSample; pass them when building it")
            return logits
        return cls(logits, labels)

    @classmethod
    def from_data(cls, data) -> LogitSample:
        """The sample of a loaded file (:class:`caliber_core.loading.LogitsData`), its margins reused.

        The loader validated the file by the rules of :mod:`caliber_core.validation`
        (a test holds the two to the same verdicts) and took the margins while
        checking S > 0: a ``LogitsData`` that carries its margins is taken as it
        is, not checked again. One built by hand without margins is checked here.

        Parameters
        ----------
        data : LogitsData

        Returns
        -------
        LogitSample

        Raises
        ------
        ValueError
            Data without margins whose logits or labels fail validation.
        """
        if data.margins is None:
            return cls(data.logits, data.labels)
        self = cls.__new__(cls)
        self.logits = data.logits
        self.n_samples, self.n_classes = data.logits.shape
        self.labels = data.labels
        self.__dict__["margins"] = data.margins
        return self

    @property
    def has_labels(self) -> bool:
        """Whether labels were given."""
        return self.labels is not None

    def need_labels(self, what: str = "accuracy and the corridor") -> np.ndarray:
        """The labels, or an error naming what needed them.

        Parameters
        ----------
        what : str, default "accuracy and the corridor"
            Named in the message.

        Returns
        -------
        ndarray of int64, shape (n_samples,)

        Raises
        ------
        ValueError
            The sample has no labels.
        """
        if self.labels is None:
            raise ValueError(f"labels are required for {what}; this sample has none")
        return self.labels

    @cached_property
    def margins(self) -> np.ndarray:
        """Top-two margins z_(1) - z_(2), shape (n_samples,)."""
        return top_two_margins(self.logits, validated=True)

    @cached_property
    def pred(self) -> np.ndarray:
        """The clean argmax per row (ties to the lowest index), shape (n_samples,)."""
        return np.argmax(self.logits, axis=1)

    @cached_property
    def correct(self) -> np.ndarray:
        """Boolean mask of correctly classified rows."""
        return self.pred == self.need_labels("the correct-row mask")

    @cached_property
    def clean_accuracy(self) -> float:
        """A0, the fraction of correct rows (raises ValueError without labels)."""
        return float(np.mean(self.correct))

    @cached_property
    def agreement_gaps(self) -> np.ndarray:
        """(n_samples, K - 1) gaps to the clean argmax, sorted ascending per row.

        At K = 2 the one gap is the top-two margin: the margins' array is shared
        (a view) when it holds exactly these values, rather than kept twice.
        """
        gaps = sorted_gaps(self.logits, self.pred, validated=True)
        if self.n_classes == 2 and np.array_equal(gaps[:, 0], self.margins):
            return self.margins[:, None]
        return gaps

    @cached_property
    def correct_gaps(self) -> np.ndarray:
        """``agreement_gaps`` of the correctly classified rows (there the label is the argmax)."""
        return self.agreement_gaps[self.correct]

    @cached_property
    def wrong_rows(self) -> np.ndarray:
        """Indices of the misclassified rows (raises ValueError without labels)."""
        return np.nonzero(~self.correct)[0]

    @cached_property
    def label_gaps(self) -> np.ndarray:
        """(n_misclassified, K - 1) gaps to the true label, sorted ascending per row."""
        w = self.wrong_rows
        if w.size == 0:
            return np.empty((0, self.n_classes - 1))
        return sorted_gaps(self.logits[w], self.labels[w], validated=True)

    @cached_property
    def deficits(self) -> np.ndarray:
        """h = z_pred - z_label > 0 for every misclassified row (Corollary 1)."""
        w = self.wrong_rows
        return self.logits[w, self.pred[w]] - self.logits[w, self.labels[w]]
