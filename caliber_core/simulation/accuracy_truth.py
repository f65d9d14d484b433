"""An independent Monte-Carlo truth of the expected accuracy of full logit rows under Gaussian noise.

Nothing here is shared with the reduction or its quadrature: each draw adds
N(0, sigma^2) noise to a row's own competitors (every class but the label, read
from the full row) and takes their maximum M. Conditioning on the competitors'
noise, the label wins with probability Phi((z_label - M) / sigma), so each draw
contributes that number instead of a 0/1 hit: the same mean, a far smaller
spread (Rao-Blackwell). Draws come in mirrored pairs (the noise and its
negative, each a draw of the same law): half the normals, and the pair's two
maxima move against each other. The standard error is taken over pairs.

A competitor j that would need to beat the row's clean top to matter is left
out when the union bound of such events over the classes left out, the sum of
P(z_j + e_j > z_top + e_top) = Phi(-(z_top - z_j) / (sigma sqrt 2)), stays
below ``slack`` a row: leaving classes out can only raise the estimate, and by
at most that sum (the label, to win, must beat the top, so an omitted class
that beats the label beats the top too). The truth therefore lies in
[estimate - bias_bound - z se, estimate + z se].
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

#: Default union bound on what the classes left out can move a row's accuracy.
SLACK = 1e-6
_BATCH_BYTES = 16 << 20  # noise drawn this much at a time


@dataclass(frozen=True)
class AccuracyTruth:
    """Monte-Carlo mean accuracy of some rows at one sigma (:func:`monte_carlo_accuracy`).

    Attributes
    ----------
    mean : float
        The estimate of the mean expected accuracy over the rows.
    standard_error : float
        Its standard error over the draws (rows fixed).
    bias_bound : float
        The estimate exceeds the truth by at most this (the classes left out); it never falls below.
    draws : int
        Noise draws in all (rows x draws per row).
    classes_drawn : float
        Mean competitors drawn a row.
    """

    mean: float
    standard_error: float
    bias_bound: float
    draws: int
    classes_drawn: float

    def interval(self, z: float = 2.576) -> tuple[float, float]:
        """Where the truth lies: [mean - bias_bound - z se, mean + z se] (z = 2.576: 99%)."""
        return self.mean - self.bias_bound - z * self.standard_error, self.mean + z * self.standard_error


def monte_carlo_accuracy(logits: np.ndarray, labels: np.ndarray, sigma: float, *, draws_per_row: int,
                         seed: int = 0, slack: float = SLACK, workers: int | None = None) -> AccuracyTruth:
    """Mean expected accuracy of full rows at sigma by Monte Carlo, with its standard error and bias bound.

    Parameters
    ----------
    logits : ndarray of shape (n, V)
        The full rows (any float dtype; noise is added in float32, as served logits are).
    labels : ndarray of shape (n,), int
    sigma : float
        > 0.
    draws_per_row : int
        >= 2; taken as mirrored pairs (an odd count loses one).
    seed : int, default 0
        Row i draws from ``SeedSequence(seed).spawn(n)[i]``: the same numbers on any number of threads.
    slack : float, default ``SLACK``
        Union bound a row may give up by leaving far competitors out.
    workers : int, optional
        Threads (default: the cores).

    Returns
    -------
    AccuracyTruth

    Raises
    ------
    ValueError
        A sigma that is not positive, fewer than 2 draws, or labels of another length.
    """
    from scipy.special import ndtr

    x = np.asarray(logits)
    y = np.asarray(labels, dtype=np.int64)
    if not (np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    if draws_per_row < 2:
        raise ValueError(f"draws_per_row must be at least 2, got {draws_per_row}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels have shape {y.shape}, the logits {x.shape}")
    seeds = np.random.SeedSequence(seed).spawn(x.shape[0])
    means, variances = np.empty(x.shape[0]), np.empty(x.shape[0])
    bias, drawn = np.empty(x.shape[0]), np.empty(x.shape[0])

    def row(i: int) -> None:
        z = x[i].astype(np.float64)
        rival = np.delete(z, y[i])
        # P(class j beats the clean top), smallest first: leave out the longest run whose sum stays within slack.
        beats_top = ndtr(-(z.max() - rival) / (sigma * np.sqrt(2.0)))
        order = np.argsort(beats_top)
        kept = order[np.searchsorted(np.cumsum(beats_top[order]), slack, side="right"):]
        bias[i] = float(beats_top.sum() - beats_top[kept].sum())
        drawn[i] = kept.size
        comp = rival[kept].astype(np.float32)
        if comp.size == 0:  # every rival is beyond the slack: the label wins but for what was left out
            means[i], variances[i] = 1.0, 0.0
            return
        rng = np.random.default_rng(seeds[i])
        pairs = draws_per_row // 2
        per = max(1, min(pairs, _BATCH_BYTES // (4 * max(1, comp.size))))
        values = np.empty(pairs)
        for a in range(0, pairs, per):
            b = min(pairs, a + per)
            noise = rng.standard_normal((b - a, comp.size), dtype=np.float32)
            noise *= np.float32(sigma)
            # Each draw and its mirror image (noise -> -noise): two draws of the same law for one set of normals.
            high = (comp + noise).max(axis=1).astype(np.float64)
            np.subtract(comp, noise, out=noise)
            low = noise.max(axis=1).astype(np.float64)
            values[a:b] = 0.5 * (ndtr((z[y[i]] - high) / sigma) + ndtr((z[y[i]] - low) / sigma))
        means[i], variances[i] = values.mean(), values.var(ddof=1) / pairs

    n_workers = workers or min(x.shape[0], os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, n_workers)) as pool:
        list(pool.map(row, range(x.shape[0])))
    n = x.shape[0]
    return AccuracyTruth(mean=float(means.mean()), standard_error=float(np.sqrt(variances.sum()) / n),
                         bias_bound=float(bias.mean()), draws=n * 2 * (draws_per_row // 2),
                         classes_drawn=float(drawn.mean()))
