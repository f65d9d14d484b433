"""The per-row top-two logit margin: the one array primitive the loader and the calibration share.

The loader checks with it that the margin scale S is positive; the
calibration takes S and the normalized axes from it
(:mod:`caliber_core.calibration.margins`, which hands it on).
"""

from __future__ import annotations

import numpy as np

from .validation import as_logits


def top_two_margins(logits, *, validated: bool = False) -> np.ndarray:
    """Per-row gap between the largest and second-largest logit.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    validated : bool, default False
        The caller passes logits already validated as float64 (a
        :class:`~caliber_core.calibration.sample.LogitSample`'s): not checked again.

    Returns
    -------
    margins : ndarray of shape (n_samples,), non-negative.
    """
    z = logits if validated else as_logits(logits)
    top2 = np.partition(z, z.shape[1] - 2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]
