"""Exact survival probabilities by quadrature (Proposition 1, Corollary 1).

For one input with reference class ``c`` and gaps ``g_j = z_c - z_j``, the
probability that class ``c`` is the argmax after adding i.i.d. N(0, sigma^2)
noise to every logit is

    P(sigma) = int phi(u) prod_{j != c} Phi(g_j / sigma + u) du      (Eq. top1-exact)

With ``c`` the clean argmax (all g_j >= 0) this is the agreement pi(sigma) of
Proposition 1; with ``c`` the true label (gaps may be negative) it is the
probability that the noisy prediction is correct, so its mean over inputs is
the exact expected accuracy A(sigma). No Monte Carlo is involved.

The integrand is analytic in u and decays like phi, so the trapezoid rule on a
uniform grid converges geometrically; nodes on [-U_MAX, U_MAX] match mpmath to
~2e-11 (tests/test_survival_reference.py).

With two classes (one gap g) the integral has a closed form: the reference
stays ahead iff the difference of two independent N(0, sigma^2) noises, a
N(0, 2 sigma^2) variable, stays below g, so P(sigma) = Phi(g / (sigma sqrt 2)).
:func:`survival_probability` uses it (one CDF per row, no quadrature).
"""

from __future__ import annotations

import numpy as np

from ..validation import as_logits, as_sigmas

U_MAX = 8.0  # 2 (1 - Phi(8)) ~ 1e-15: the mass beyond cannot move P in float64
# Trapezoid spacing in u. The integrand sharpens as K grows (it is the law of a
# maximum over K - 1 classes), so few classes allow a coarser grid. Errors
# against mpmath (tests/reference): K <= 10 at 0.3: < 3e-15; K <= 1000 at 0.2: < 2e-11.
QUAD_STEP_FEW, FEW_CLASSES = 0.3, 10
QUAD_STEP = 0.2
# Phi(x) == 1.0 in float64 for x > 8.3, so a class whose scaled gap exceeds this
# for every node can be left out of the product exactly.
_PHI_ONE = 8.3
_CHUNK_ELEMENTS = 2_000_000


def _rule(step: float) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.arange(-U_MAX, U_MAX + step / 2, step)
    weights = np.full(nodes.shape, step) * np.exp(-0.5 * nodes**2) / np.sqrt(2 * np.pi)
    weights[[0, -1]] *= 0.5
    return nodes, weights


_RULE_FEW = _rule(QUAD_STEP_FEW)
_RULE = _rule(QUAD_STEP)


def sorted_gaps(logits, reference, *, validated: bool = False) -> np.ndarray:
    """Gaps z_c - z_j to every other class, sorted ascending per row.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    reference : array_like of int, shape (n_samples,)
        The class c whose survival is asked for (argmax or true label).
    validated : bool, default False
        The logits are already validated float64 (a sample's): not checked again.

    Returns
    -------
    gaps : ndarray of shape (n_samples, n_classes - 1)
    """
    z = logits if validated else as_logits(logits)
    c = np.asarray(reference, dtype=np.int64)
    if c.shape != (z.shape[0],):
        raise ValueError(f"reference must have shape ({z.shape[0]},), got {c.shape}")
    rows = np.arange(z.shape[0])
    if z.shape[1] == 2:
        # One gap per row: built as an (n, 1) array of its own, not a view of an (n, 2) one.
        return (z[rows, c] - z[rows, 1 - c])[:, None]
    gaps = z[rows, c][:, None] - z
    gaps[rows, c] = np.inf  # the reference itself: Phi(inf) = 1, sorted to the end
    gaps.sort(axis=1)
    return gaps[:, :-1]


def survival_probability(gaps_sorted: np.ndarray, sigma: float) -> np.ndarray:
    """P(sigma) of the module docstring for every row of pre-sorted gaps.

    Parameters
    ----------
    gaps_sorted : ndarray of shape (n_samples, n_classes - 1)
        From :func:`sorted_gaps`.
    sigma : float, >= 0

    Returns
    -------
    prob : ndarray of shape (n_samples,)

    Notes
    -----
    Eq. top1-exact by trapezoid quadrature; with one gap per row (K = 2) its
    closed form Phi(g / (sigma sqrt 2)), exact.
    """
    from scipy.special import ndtr  # on first quadrature only: the Monte-Carlo path never needs scipy

    sigma = float(as_sigmas(sigma)[0])
    g = gaps_sorted
    n = g.shape[0]
    if sigma == 0.0:
        # Noise-free: the reference wins iff every gap is positive.
        return (g[:, 0] > 0).astype(np.float64) if g.shape[1] else np.ones(n)
    if g.shape[1] == 1:
        return _two_class_survival(g[:, 0], sigma, ndtr)
    nodes, weights = _RULE_FEW if g.shape[1] + 1 <= FEW_CLASSES else _RULE
    # Columns whose scaled gap puts Phi at exactly 1 on every node drop out.
    cut = (_PHI_ONE + U_MAX) * sigma
    out = np.empty(n)
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // (g.shape[1] * nodes.size))
    for start in range(0, n, rows_per_chunk):
        block = g[start : start + rows_per_chunk]
        k = int(np.max(np.sum(block < cut, axis=1)))
        if k == 0:
            out[start : start + block.shape[0]] = 1.0
            continue
        t = block[:, :k, None] / sigma + nodes[None, None, :]
        cond = np.prod(ndtr(t), axis=1)  # P(survive | reference noise = u)
        out[start : start + block.shape[0]] = cond @ weights
    return np.clip(out, 0.0, 1.0)


def _two_class_survival(gaps: np.ndarray, sigma: float, ndtr) -> np.ndarray:
    """Phi(g / (sigma sqrt 2)) per row (K = 2: the closed form of Eq. top1-exact), in row blocks."""
    out = np.empty(gaps.shape[0])
    scale = 1.0 / (sigma * np.sqrt(2.0))
    for start in range(0, gaps.shape[0], _CHUNK_ELEMENTS):
        block = out[start:start + _CHUNK_ELEMENTS]
        np.multiply(gaps[start:start + _CHUNK_ELEMENTS], scale, out=block)
        ndtr(block, out=block)
    return out


def agreement_probability(logits, sigma) -> np.ndarray:
    """Exact pi_i(sigma) per input (Proposition 1, Eq. top1-exact).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    sigma : float or 1-D array of floats >= 0

    Returns
    -------
    pi : ndarray of shape (n_samples,) for scalar sigma, else (len(sigma), n_samples)
    """
    z = as_logits(logits)
    sig = as_sigmas(sigma)
    gaps = sorted_gaps(z, np.argmax(z, axis=1))
    res = np.stack([survival_probability(gaps, s) for s in sig])
    return res[0] if np.ndim(sigma) == 0 else res
