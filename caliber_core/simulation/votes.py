"""The one majority-vote rule for hard labels: most votes wins, ties broken uniformly at random.

Both attackers that vote over M noisy top-1 answers use it: the averaging
attack of Proposition 2 (:mod:`caliber_core.simulation.attack`) and the
thief's hard labels (:mod:`caliber_core.extraction.answers`). A fixed rule
such as "lowest class index wins" would favour low-numbered classes, so an
attacker's agreement would depend on how the classes happen to be numbered.
"""

from __future__ import annotations

import numpy as np

#: Folded into a simulation seed for the tie-break stream, kept apart from the noise.
VOTE_TAG = 0x707E


def vote_generator(seed: int) -> np.random.Generator:
    """The tie-break stream of a simulation with this seed (independent of its noise stream).

    Parameters
    ----------
    seed : int
        The simulation's seed.

    Returns
    -------
    numpy.random.Generator
        SFC64 seeded from (seed, :data:`VOTE_TAG`).
    """
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), VOTE_TAG])))


def majority_vote(votes: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """The most voted class per row; ties broken uniformly at random.

    Parameters
    ----------
    votes : ndarray of shape (n_samples, n_classes), int
        Votes per class (a row may sum to anything >= 1).
    generator : numpy.random.Generator
        Draws one key per (row, class); the tied class with the largest key wins.

    Returns
    -------
    labels : ndarray of shape (n_samples,), int64
    """
    votes = np.asarray(votes)
    if votes.ndim != 2 or votes.shape[1] < 1:
        raise ValueError(f"votes must have shape (n_samples, n_classes), got {votes.shape}")
    n, k = votes.shape
    labels = np.empty(n, dtype=np.int64)
    # A block of rows at a time (4 MiB of keys): the generator draws the same keys in the same
    # order as one (n, K) draw would, without an (n, K) float64 matrix or two.
    rows = max(1, _KEY_BYTES // (8 * k))
    for start in range(0, n, rows):
        block = votes[start : start + rows]
        top = block.max(axis=1, keepdims=True)
        keys = np.where(block == top, generator.random(block.shape), -1.0)
        labels[start : start + rows] = np.argmax(keys, axis=1)
    return labels


_KEY_BYTES = 4 << 20
