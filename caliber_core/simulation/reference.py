"""The straightforward argmax Monte Carlo: add noise, take the argmax, average.

No shortcut of any kind: every draw is a fresh N(0, sigma^2 I) vector added
to every row. It is slow and obviously right, which makes it the reference
the fast sweep (:mod:`caliber_core.calibration.sweep`) and the exact curves
(:mod:`caliber_core.calibration.survival`) are checked against, and what the
dashboard's Verify button measures sigma* with.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..validation import as_labels, as_logits, as_sigmas, check_seed

# Rows per block: one (rows, K) float64 buffer of about 2 MB, reused for every draw.
_BLOCK_VALUES = 2**18


def argmax_monte_carlo(logits, labels, sigma, *, realizations: int, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and agreement under N(0, sigma^2) logit noise, by plain simulation.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,)
    sigma : float or 1-D array of floats >= 0
    realizations : int
        Noise draws per input and sigma (each draw fresh).
    seed : int, None or numpy.random.Generator, default 0

    Returns
    -------
    accuracy, agreement : ndarray of shape (len(sigma),)
        Mean over inputs and draws of 1[noisy argmax == label] and of
        1[noisy argmax == clean argmax] (ties to the lowest index).

    Raises
    ------
    ValueError
        Bad logits, labels or sigmas, or ``realizations`` not a positive integer.

    Notes
    -----
    Eq. logits-noise simulated directly: the tests' reference for Eq. top1-exact and the sweep.
    """
    z = as_logits(logits)
    y = as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    sigmas = as_sigmas(sigma)
    if isinstance(realizations, bool) or not isinstance(realizations, numbers.Integral) or realizations < 1:
        raise ValueError(f"realizations must be a positive integer, got {realizations!r}")
    rng = check_seed(seed)
    pred = np.argmax(z, axis=1)
    n, k = z.shape
    rows = max(1, _BLOCK_VALUES // k)
    buffer = np.empty((min(rows, n), k))
    acc, agr = [], []
    for s in sigmas:
        a = g = 0.0
        for _ in range(int(realizations)):
            # One fresh (N, K) draw, a block of rows at a time and in place: a generator fills an array
            # value after value in row order, so these are the draws of standard_normal(z.shape) and
            # noise * s + z the sums of z + s * noise, without three (N, K) temporaries per draw.
            hits_label = hits_clean = 0
            for start in range(0, n, rows):
                noisy = buffer[:min(rows, n - start)]
                rng.standard_normal(out=noisy)
                noisy *= s
                noisy += z[start:start + noisy.shape[0]]
                top = np.argmax(noisy, axis=1)
                hits_label += np.count_nonzero(top == y[start:start + noisy.shape[0]])
                hits_clean += np.count_nonzero(top == pred[start:start + noisy.shape[0]])
            a += hits_label / n
            g += hits_clean / n
        acc.append(a / realizations)
        agr.append(g / realizations)
    return np.array(acc), np.array(agr)
