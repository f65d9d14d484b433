"""What a top-k logprob log tells about each position: :class:`TopKRows`, and the bounds' quadrature rule.

A logged position shows the k largest logprobs of a V-class distribution. The
other m = V - k classes are unseen: each has probability at most p_k (the
smallest one shown), and together they hold the leftover mass r = 1 - sum of
the shown probabilities. :mod:`.topk_bounds` bounds the agreement over every
tail that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

U_MAX = 8.0
#: Trapezoid spacing of the bounds' quadrature: the lower bound's integrand
#: has a kink where y_k crosses y*, so a finer grid than the plain survival's.
BOUND_STEP = 0.1


def quadrature_rule(step: float) -> tuple[np.ndarray, np.ndarray]:
    """Trapezoid nodes on [-U_MAX, U_MAX] at ``step`` and their weights against the standard normal density."""
    nodes = np.arange(-U_MAX, U_MAX + step / 2, step)
    weights = np.full(nodes.shape, step) * np.exp(-0.5 * nodes**2) / np.sqrt(2 * np.pi)
    weights[[0, -1]] *= 0.5
    return nodes, weights


#: The bounds' own rule.
BOUND_NODES, BOUND_WEIGHTS = quadrature_rule(BOUND_STEP)


@dataclass(frozen=True)
class TopKRows:
    """What a top-k logprob log tells about each generated position.

    Attributes
    ----------
    gaps : ndarray of shape (n_rows, n_shown - 1)
        l_top - l_j for every shown class other than the top one, ascending
        per row; rows showing fewer classes are padded with +inf.
    top_logprob : ndarray of shape (n_rows,)
        l_top, the largest logprob of each row (<= 0).
    tail_mass : ndarray of shape (n_rows,)
        r = 1 - sum of the shown probabilities, clipped at 0.
    floor_gap : ndarray of shape (n_rows,)
        g_k = l_top - l_k: every unseen class is at least this far below the top.
    unseen : ndarray of int64, shape (n_rows,)
        m = V - (classes shown), the number of unseen classes.
    vocab_size : int
        V.
    """

    gaps: np.ndarray
    top_logprob: np.ndarray
    tail_mass: np.ndarray
    floor_gap: np.ndarray
    unseen: np.ndarray
    vocab_size: int

    @property
    def n_rows(self) -> int:
        """Rows (inputs) held."""
        return int(self.gaps.shape[0])

    @property
    def shown(self) -> int:
        """k: the largest number of classes a row shows."""
        return int(self.gaps.shape[1]) + 1

    @classmethod
    def from_logprobs(cls, logprobs, *, vocab_size: int) -> TopKRows:
        """Rows from shown logprobs, one row per position (NaN or -inf pads a row that shows fewer).

        Parameters
        ----------
        logprobs : array_like of shape (n_rows, n_shown)
            The shown logprobs of each position, in any order.
        vocab_size : int
            V, the number of classes of every row's distribution.

        Raises
        ------
        ValueError
            Fewer than two shown classes in a row, a positive logprob, shown
            mass above 1 beyond rounding, V not above the classes shown, or a
            leftover mass that V - k classes at or below the k-th cannot hold.
        """
        lp = np.array(logprobs, dtype=np.float64, copy=True)
        if lp.ndim != 2 or lp.shape[0] == 0:
            raise ValueError(f"logprobs must be a non-empty 2-D array, got shape {lp.shape}")
        lp[np.isnan(lp)] = -np.inf
        shown = np.sum(np.isfinite(lp), axis=1)
        if np.any(shown < 2):
            i = int(np.argmax(shown < 2))
            raise ValueError(f"row {i} shows {int(shown[i])} finite logprob(s); at least 2 are needed")
        if np.any(lp > 1e-6):
            i = int(np.argmax(np.any(lp > 1e-6, axis=1)))
            raise ValueError(f"row {i} has a positive logprob {float(np.max(lp[i])):.6g}")
        if not (isinstance(vocab_size, (int, np.integer)) and vocab_size > int(shown.max())):
            raise ValueError(f"vocab size must be an integer above the classes shown "
                             f"({int(shown.max())}), got {vocab_size!r}")
        lp = -np.sort(-lp, axis=1)  # descending, -inf padding last
        top = np.minimum(lp[:, 0], 0.0)
        mass = np.sum(np.exp(lp), axis=1)
        # Logprobs are rounded in transit: a shown mass a hair above 1 is rounding, more is not.
        if np.any(mass > 1.0 + 1e-3):
            i = int(np.argmax(mass > 1.0 + 1e-3))
            raise ValueError(f"row {i}'s shown probabilities sum to {float(mass[i]):.6g} > 1")
        rows = np.arange(lp.shape[0])
        # The unseen classes, each at most the k-th shown, must be able to hold the leftover mass.
        unseen = vocab_size - shown
        room = unseen * np.exp(lp[rows, shown - 1]) * (1.0 + 1e-3) + 1e-6
        if np.any(1.0 - mass > room):
            i = int(np.argmax(1.0 - mass > room))
            raise ValueError(f"row {i}'s leftover mass {float(1.0 - mass[i]):.4g} does not fit in its "
                             f"{int(unseen[i]):,} unseen classes at or below its smallest shown probability: "
                             f"the vocabulary size {vocab_size:,} is too small for this log")
        gaps = top[:, None] - lp[:, 1:]
        return cls(
            gaps=gaps,
            top_logprob=top,
            tail_mass=np.clip(1.0 - mass, 0.0, 1.0),
            floor_gap=top - lp[rows, shown - 1],
            unseen=(vocab_size - shown).astype(np.int64),
            vocab_size=int(vocab_size),
        )

    def top_two_gaps(self) -> np.ndarray:
        """l_top - l_2 per row: the margin of each position (the scale S is their median)."""
        return self.gaps[:, 0].copy()
