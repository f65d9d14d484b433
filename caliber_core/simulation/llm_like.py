"""Synthetic language-model next-token logits with a known full vocabulary, for checks and benchmarks.

Real vocabularies decay like a power of the rank with noise around it, and a
position's top-1 confidence ranges from a near coin-toss to near-certain.
Logits are rounded to a grid of ``quantum`` nats (bfloat16 logits are as
coarse near their usual range), so a row holds a few thousand distinct values
and its exact agreement (:func:`exact_agreement`) groups equal gaps:
Phi(g / sigma + u) ** count is exact, and a 32,000-class row costs what a
few-thousand-class one does.
"""

from __future__ import annotations

import numpy as np

from ..calibration.survival import U_MAX

QUANTUM = 1.0 / 64.0


def llm_like_logits(n_rows: int, vocab_size: int, *, seed: int = 0, zipf=(1.2, 1.8),
                    jitter: float = 0.5, boost=(-1.0, 7.0), quantum: float = QUANTUM,
                    dtype=np.float64) -> np.ndarray:
    """Rows of V logits decaying like -a log(rank), jittered, the top one boosted.

    Parameters
    ----------
    n_rows, vocab_size : int
    seed : int
    zipf : (float, float)
        Range of the per-row decay exponent a (logit = -a log rank).
    jitter : float
        Standard deviation of the Gaussian noise around the power law.
    boost : (float, float)
        Range of the extra logit of the top token (sets the top-1 confidence).
    quantum : float
        Logits are rounded to multiples of this.
    dtype : numpy dtype
        Of the returned array.

    Returns
    -------
    logits : ndarray of shape (n_rows, vocab_size)
        Each row's classes in a random order (the top one is not column 0).
    """
    rng = np.random.default_rng(seed)
    log_rank = np.log(np.arange(1, vocab_size + 1, dtype=np.float64))
    out = np.empty((n_rows, vocab_size), dtype=dtype)
    for i in range(n_rows):
        z = -rng.uniform(*zipf) * log_rank + rng.normal(0.0, jitter, vocab_size)
        z[0] = z[1:].max() + rng.uniform(*boost)
        z = np.round(z / quantum) * quantum
        out[i] = z[rng.permutation(vocab_size)]
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64.

    Parameters
    ----------
    logits : array_like of shape (n_rows, vocab_size)
        Real logits.

    Returns
    -------
    ndarray of shape (n_rows, vocab_size), float64
        log p per row, computed after subtracting the row's maximum.
    """
    z = np.asarray(logits, dtype=np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def exact_agreement(logits: np.ndarray, sigma: float, *, step: float = 0.1) -> np.ndarray:
    """pi_i(sigma) of every row over its full vocabulary, grouping equal gaps.

    Parameters
    ----------
    logits : ndarray of shape (n_rows, vocab_size)
        Clean logits.
    sigma : float
        Noise standard deviation, > 0.
    step : float, default 0.1
        Trapezoid step of the quadrature over u in [-U_MAX, U_MAX].

    Returns
    -------
    ndarray of shape (n_rows,)
        The probability that each row's top class survives the noise. A row
        whose top logit is tied gets the tie's share (the top class is the
        first maximum).

    Notes
    -----
    Eq. top1-exact, with gaps far beyond the noise (Phi = 1 in float64) dropped.
    """
    from scipy.special import log_ndtr

    nodes = np.arange(-U_MAX, U_MAX + step / 2, step)
    weights = np.full(nodes.shape, step) * np.exp(-0.5 * nodes**2) / np.sqrt(2 * np.pi)
    weights[[0, -1]] *= 0.5
    out = np.empty(logits.shape[0])
    for i, row in enumerate(np.asarray(logits, dtype=np.float64)):
        a = int(np.argmax(row))
        gaps = row[a] - np.delete(row, a)
        values, counts = np.unique(gaps, return_counts=True)
        keep = values < (8.3 + U_MAX) * sigma  # Phi == 1 in float64 beyond
        lp = counts[keep, None] * log_ndtr(values[keep, None] / sigma + nodes[None, :])
        out[i] = np.exp(lp.sum(axis=0)) @ weights
    return out
