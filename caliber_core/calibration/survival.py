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
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import optimize
from scipy.special import ndtr

from .margins import _as_logits

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


def _check_sigma(sigma) -> np.ndarray:
    s = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    if s.ndim != 1:
        raise ValueError(f"sigma must be a scalar or 1-D, got shape {s.shape}")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        bad = s[~(np.isfinite(s) & (s >= 0))][0]
        raise ValueError(f"sigma must be finite and >= 0, got {bad}")
    return s


def sorted_gaps(logits, reference) -> np.ndarray:
    """Gaps z_c - z_j to every other class, sorted ascending per row.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    reference : array_like of int, shape (n_samples,)
        The class c whose survival is asked for (argmax or true label).

    Returns
    -------
    gaps : ndarray of shape (n_samples, n_classes - 1)
    """
    z = _as_logits(logits)
    c = np.asarray(reference, dtype=np.int64)
    if c.shape != (z.shape[0],):
        raise ValueError(f"reference must have shape ({z.shape[0]},), got {c.shape}")
    rows = np.arange(z.shape[0])
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
    """
    sigma = float(_check_sigma(sigma)[0])
    g = gaps_sorted
    n = g.shape[0]
    if sigma == 0.0:
        # Noise-free: the reference wins iff every gap is positive.
        return (g[:, 0] > 0).astype(np.float64) if g.shape[1] else np.ones(n)
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
    z = _as_logits(logits)
    sig = _check_sigma(sigma)
    gaps = sorted_gaps(z, np.argmax(z, axis=1))
    res = np.stack([survival_probability(gaps, s) for s in sig])
    return res[0] if np.ndim(sigma) == 0 else res


class ExactCurves:
    """Exact mean agreement and expected accuracy of one model as functions of sigma.

    Sorting the gaps once lets every sigma reuse them.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
        Needed for accuracy and the corridor.
    """

    def __init__(self, logits, labels=None):
        z = _as_logits(logits)
        self.n_samples, self.n_classes = z.shape
        self.pred = np.argmax(z, axis=1)
        self._agree_gaps = sorted_gaps(z, self.pred)
        self.labels = None
        if labels is not None:
            y = np.asarray(labels, dtype=np.int64)
            if y.shape != (z.shape[0],):
                raise ValueError(
                    f"inconsistent numbers of samples: logits {z.shape[0]}, labels {y.shape}"
                )
            self.labels = y
            self.correct = self.pred == y
            self._correct_gaps = self._agree_gaps[self.correct]
            wrong = ~self.correct
            # Accuracy on a wrong row = survival of the true label, which trails.
            self._wrong_label_gaps = (
                sorted_gaps(z[wrong], y[wrong]) if wrong.any() else np.empty((0, z.shape[1] - 1))
            )
            rows = np.nonzero(wrong)[0]
            self._deficit = z[rows, self.pred[wrong]] - z[rows, y[wrong]]  # h > 0

    def _need_labels(self):
        if self.labels is None:
            raise ValueError("labels are required for accuracy and the corridor")

    def agreement(self, sigma) -> np.ndarray:
        """Mean pi(sigma) over all inputs, for each sigma."""
        sig = _check_sigma(sigma)
        return np.array([survival_probability(self._agree_gaps, s).mean() for s in sig])

    # Per-sigma pieces. The correctly classified rows' sum of pi is shared by the
    # expected accuracy and the corridor's floor: A0 * mean_correct(pi) = sum / N.
    def _correct_sum(self, s: float) -> float:
        return float(survival_probability(self._correct_gaps, s).sum())

    def _wrong_sum(self, s: float) -> float:
        return float(survival_probability(self._wrong_label_gaps, s).sum())

    def _beta(self, s: float) -> float:
        if self._deficit.size == 0 or s == 0:
            return 0.0
        return float(np.mean(ndtr(-self._deficit / (np.sqrt(2.0) * s))))

    def accuracy(self, sigma) -> np.ndarray:
        """Exact expected accuracy E[A(sigma)] over the noise, for each sigma."""
        self._need_labels()
        return np.array([(self._correct_sum(s) + self._wrong_sum(s)) / self.n_samples
                         for s in _check_sigma(sigma)])

    def corridor(self, sigma) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper accuracy envelopes of Corollary 1 (Eq. corridor).

        lower = A0 * mean_correct(pi), upper = lower + (1 - A0) * mean_wrong(Phi(-h / (sqrt(2) sigma))).
        """
        _, lower, upper = self._accuracy_corridor(sigma, with_accuracy=False)
        return lower, upper

    def accuracy_with_corridor(self, sigma) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(accuracy, lower, upper) at each sigma, the correct rows' pi computed once."""
        return self._accuracy_corridor(sigma, with_accuracy=True)

    def _accuracy_corridor(self, sigma, *, with_accuracy: bool):
        self._need_labels()
        a0 = float(np.mean(self.correct))
        acc, lower, upper = [], [], []
        for s in _check_sigma(sigma):
            c = self._correct_sum(s)
            lower.append(c / self.n_samples)
            upper.append(lower[-1] + (1.0 - a0) * self._beta(s))
            if with_accuracy:
                acc.append((c + self._wrong_sum(s)) / self.n_samples)
        return (np.array(acc) if with_accuracy else None), np.array(lower), np.array(upper)


def invert_decreasing(
    func: Callable[[float], float],
    target: float,
    *,
    lo: float,
    hi: float,
    rtol: float = 1e-6,
    max_expand: int = 60,
) -> float:
    """Smallest-bracket root of ``func(sigma) = target`` for a decreasing func.

    Expands [lo, hi] geometrically until it brackets the target, then Brent.
    Raises ValueError if no bracket is found (target unreachable).
    """
    f_lo, f_hi = func(lo) - target, func(hi) - target
    for _ in range(max_expand):
        if f_lo >= 0:
            break
        hi, f_hi = lo, f_lo
        lo /= 2.0
        f_lo = func(lo) - target
    for _ in range(max_expand):
        if f_hi <= 0:
            break
        lo, f_lo = hi, f_hi
        hi *= 2.0
        f_hi = func(hi) - target
    if f_lo < 0 or f_hi > 0:
        raise ValueError(f"target {target:g} is not reachable in sigma range [{lo:g}, {hi:g}]")
    if f_lo == 0:
        return lo
    if f_hi == 0:
        return hi
    return float(optimize.brentq(lambda s: func(s) - target, lo, hi, rtol=rtol, xtol=1e-12))


def solve_near(
    func: Callable[[float], float],
    target: float,
    *,
    guess: float,
    slope: float | None = None,
    rtol: float = 1e-4,
    max_iter: int = 8,
) -> float:
    """Root of ``func(sigma) = target`` near a good ``guess`` (e.g. from the Monte-Carlo curve).

    Secant steps from the guess (the first along ``slope`` when given) stop once
    a step is below ``rtol`` relative; secant convergence is superlinear, so the
    error left is of the order of that step times the one before (~1e-6 relative
    here), in two or three evaluations of an expensive exact curve. If the steps
    wander, a bracketing search takes over (:func:`invert_decreasing`).
    """
    x0 = float(guess)
    f0 = func(x0) - target
    if f0 == 0.0:
        return x0
    x1 = x0 - f0 / slope if slope is not None and slope < 0 else x0 * (1.01 if f0 > 0 else 0.99)
    for _ in range(max_iter):
        if not (np.isfinite(x1) and x1 > 0):
            break
        f1 = func(x1) - target
        if f1 == 0.0 or f1 == f0:
            if f1 == 0.0:
                return x1
            break
        step = f1 * (x1 - x0) / (f1 - f0)
        x0, f0, x1 = x1, f1, x1 - step
        if abs(step) <= rtol * abs(x1):
            return float(x1)
    return invert_decreasing(func, target, lo=guess * 0.97, hi=guess * 1.03, rtol=rtol)


def sigma_for_agreement(
    curves: ExactCurves, target: float, *, guess: float, slope: float | None = None
) -> float:
    """sigma at which the exact mean agreement equals ``target`` (in (1/K, 1)).

    pi is strictly decreasing (Proposition 1), so the root is unique.
    """
    chance = 1.0 / curves.n_classes
    if not chance < target < 1.0:
        raise ValueError(
            f"agreement target must lie strictly between 1/K={chance:.4g} and 1, got {target}"
        )
    return solve_near(lambda s: float(curves.agreement(s)[0]), target, guess=guess, slope=slope)
