"""What the defended API answers the thief: cached logits through the Perturber.

Every answer is produced by :class:`caliber_core.serving.runtime.Perturber`,
one ``perturb`` call per query round, exactly as deployed:

* ``"fresh"`` seeding: each round draws new noise. The generator of a thief's
  seed is the same for every sigma, so answers at different sigma share their
  standard-normal draws (common random numbers: the frontier and the root
  finder then compare sigmas, not draws).
* ``"per-input"`` seeding: the noise of a row is a pure function of (key, row
  id, K); M rounds return bit-identical answers, which is checked on every
  call (:class:`RepeatMismatchError` otherwise).

Averaging M soft answers takes first + sum(a_m - first) / M, which equals the
first answer *exactly* when all M are identical (a plain mean can move by an
ulp and flip near-ties). Hard labels are the argmax of each answer, combined
by :func:`~caliber_core.simulation.votes.majority_vote` (ties broken uniformly
at random), the rule the averaging attack uses too.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..serving.runtime import SEEDINGS as ALL_SEEDINGS
from ..serving.runtime import Perturber
from ..simulation.votes import majority_vote, vote_generator

SEEDINGS = tuple(s for s in ALL_SEEDINGS if s != "consistent")  # independent Gaussian rows
LABELS = ("soft", "hard")
_NOISE_TAG = 0x4E015E


class RepeatMismatchError(RuntimeError):
    """Per-input answers to a repeated query differed (the runtime broke its contract, Proposition cost (ii))."""


@dataclass(frozen=True)
class Answers:
    """The thief's training signal for one condition.

    Attributes
    ----------
    values : ndarray of shape (n_samples, n_classes)
        Soft answers (averaged logits, float64) or, for hard labels, the voted
        class per row as a one-column int64 array is *not* used: see ``labels``.
    labels : ndarray of shape (n_samples,) or None
        The voted hard label per row (hard answers only).
    sigma, m, seeding, kind : the condition.
    """

    values: np.ndarray | None
    labels: np.ndarray | None
    sigma: float
    m: int
    seeding: str
    kind: str

    def digest(self) -> str:
        """SHA-256 of the answer bytes: equal digests mean equal training data."""
        arr = self.values if self.kind == "soft" else self.labels
        h = hashlib.sha256(self.kind.encode())
        h.update(np.ascontiguousarray(arr))  # the array's own buffer: no copy of its bytes
        return h.hexdigest()


class DrawnAnswers:
    """Soft answers averaged over M rounds, drawn again each time they are read.

    The same training signal as ``answer_queries(logits, sigma=sigma,
    seed=seed, m_values=..., seeding=seeding)[("soft", m)]`` (equal values,
    equal :meth:`digest`: the rounds and their average do not depend on the
    other M asked for), without holding an (n, K) float64 matrix per
    condition: a list of conditions costs one matrix at a time, while it is read.

    Parameters
    ----------
    logits : ndarray of shape (n_samples, n_classes)
        The teacher's cached clean logits for the pool (held by reference).
    sigma : float
    seed : int
    m : int, default 1
    seeding : {"fresh", "per-input"}, default "fresh"
    """

    labels = None
    kind = "soft"

    def __init__(self, logits: np.ndarray, sigma: float, seed: int, m: int = 1, seeding: str = "fresh"):
        self._logits = logits
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.m = _check_m_values(m)[0]
        if seeding not in SEEDINGS:
            raise ValueError(f"seeding must be one of {SEEDINGS}, got {seeding!r}")
        self.seeding = seeding
        self._digest: str | None = None

    @property
    def values(self) -> np.ndarray:
        """The answers, drawn now: (n_samples, n_classes) float64."""
        return answer_queries(self._logits, sigma=self.sigma, seed=self.seed, m_values=(self.m,),
                              seeding=self.seeding)[("soft", self.m)].values

    def digest(self) -> str:
        """SHA-256 of the answer bytes, as :meth:`Answers.digest` (computed once)."""
        if self._digest is None:
            h = hashlib.sha256(self.kind.encode())
            h.update(np.ascontiguousarray(self.values))
            self._digest = h.hexdigest()
        return self._digest


def per_input_key(seed: int) -> bytes:
    """The provider's per-input secret in a simulation with this seed (the thief never sees it).

    Parameters
    ----------
    seed : int
        The simulation's seed, >= 0.

    Returns
    -------
    bytes
        32 bytes: SHA-256 of a fixed label and the seed.
    """
    return hashlib.sha256(b"caliber.extraction.per-input-key\x00" + int(seed).to_bytes(8, "big")).digest()


def _check_m_values(m_values) -> list[int]:
    if isinstance(m_values, numbers.Integral):
        m_values = (m_values,)
    out = []
    for m in m_values:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise ValueError(f"each M must be a positive integer, got {m!r}")
        out.append(int(m))
    if not out:
        raise ValueError("need at least one M, got an empty sequence")
    if len(set(out)) != len(out):
        raise ValueError(f"M values have duplicates: {tuple(out)}")
    return sorted(out)


def answer_queries(
    logits: np.ndarray,
    *,
    sigma: float,
    seed: int,
    m_values: Sequence[int] = (1,),
    seeding: str = "fresh",
    kinds: Sequence[str] = ("soft",),
) -> dict[tuple[str, int], Answers]:
    """Answers to M rounds of queries over the whole pool, for every M asked.

    Parameters
    ----------
    logits : ndarray of shape (n_samples, n_classes)
        The teacher's cached clean logits for the pool (the API's side).
    sigma : float
        Noise standard deviation served.
    seed : int
        The simulation seed: fixes the fresh draws (the same standard normals
        for every sigma), the per-input key and the vote tie-breaks.
    m_values : sequence of int, default (1,)
        Rounds averaged; answers for M are built from the first M rounds.
    seeding : {"fresh", "per-input"}
    kinds : sequence of {"soft", "hard"}

    Returns
    -------
    dict mapping (kind, M) to :class:`Answers`.

    Raises
    ------
    RepeatMismatchError
        Per-input seeding returned different answers to a repeated query.
    ValueError
        An unknown seeding or answer kind, or a bad M.

    Notes
    -----
    Eq. logits-noise per answer; averaging M fresh answers is the route
    Proposition cost (i) prices, and per-input seeding closes it (ii).
    """
    if seeding not in SEEDINGS:
        raise ValueError(f"seeding must be one of {SEEDINGS}, got {seeding!r}")
    bad = [k for k in kinds if k not in LABELS]
    if bad or not kinds:
        raise ValueError(f"kinds must be drawn from {LABELS}, got {tuple(kinds)!r}")
    ms = _check_m_values(m_values)
    z = np.asarray(logits, dtype=np.float64)
    n, k = z.shape
    if seeding == "fresh":
        gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), _NOISE_TAG])))
        perturber = Perturber(sigma, seeding="fresh", generator=gen)
        ids = None
    else:
        perturber = Perturber(sigma, seeding="per-input", key=per_input_key(seed))
        ids = [f"pool-{i}" for i in range(n)]
    vote_gen = vote_generator(seed)
    first = None
    # Only what is asked for is held: M = 1 soft answers need neither the deviations nor the votes.
    dev_sum = np.zeros_like(z) if ms[-1] > 1 and "soft" in kinds else None
    # int32 counts (a row's votes are at most M): half the (n, K) matrix an int64 one would be.
    votes = np.zeros((n, k), dtype=np.int32) if "hard" in kinds else None
    rows = np.arange(n)
    out: dict[tuple[str, int], Answers] = {}
    for m in range(1, ms[-1] + 1):
        answer = perturber.perturb(z, ids)
        if first is None:
            first = answer
        else:
            if seeding == "per-input" and not np.array_equal(answer, first):
                diff = int(np.count_nonzero(np.any(answer != first, axis=1)))
                raise RepeatMismatchError(
                    f"per-input seeding answered round {m} differently from round 1 on {diff} of {n} rows"
                )
            if dev_sum is not None:
                dev_sum += answer - first
        if votes is not None:
            votes[rows, np.argmax(answer, axis=1)] += 1
        if m not in ms:
            continue
        if "soft" in kinds:
            values = first if m == 1 else first + dev_sum / m
            out[("soft", m)] = Answers(values, None, float(sigma), m, seeding, "soft")
        if "hard" in kinds:
            out[("hard", m)] = Answers(None, majority_vote(votes, vote_gen), float(sigma), m, seeding, "hard")
    return out
