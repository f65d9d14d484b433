"""The thief's training recipes: two fixed ones and a self-tuned one.

* ``light``: T = 2, weight decay 1e-4 -- little regularization;
* ``strong``: T = 4, weight decay 1e-2 -- heavily regularized;
* ``tuned``: chooses (T, weight decay) from :data:`TUNED_CANDIDATES` by
  k-fold *agreement with its own noisy answers*: for each candidate, train on
  k - 1 folds of the pool and count how often the student's argmax matches
  the argmax of the answer it was given on the held-out fold. The thief has no
  true labels, and needs none: held-out noise is independent of the student,
  so the candidate that agrees best with noisy answers is, in expectation,
  the one that agrees best with the clean teacher.

For hard labels the targets are one-hot (T plays no role) and only the weight
decay is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FIXED = ("light", "strong")
TUNED = "tuned"
RECIPE_NAMES = FIXED + (TUNED,)
ATTACKS = ("fixed", "tuned", "all")
DEFAULT_FOLDS = 3


@dataclass(frozen=True)
class Recipe:
    """A distillation setting: temperature T of Eq. 1 and the L2 weight decay.

    Attributes
    ----------
    name : str
    temperature : float
        Used for soft answers; hard labels train at T = 1.
    weight_decay : float
    """

    name: str
    temperature: float
    weight_decay: float

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")

    def key(self) -> tuple[float, float]:
        """What training depends on (the name is only a label)."""
        return (float(self.temperature), float(self.weight_decay))

    def to_dict(self) -> dict:
        """Plain JSON values: ``{"name", "temperature", "weight_decay"}``."""
        return {"name": self.name, "temperature": self.temperature, "weight_decay": self.weight_decay}


LIGHT = Recipe("light", 2.0, 1e-4)
STRONG = Recipe("strong", 4.0, 1e-2)
#: What the tuned attacker chooses from: a moderate temperature for little
#: noise, near-logit matching (T = 16) with two strengths of decay for more.
TUNED_CANDIDATES = (
    Recipe("T4-wd1e-3", 4.0, 1e-3),
    Recipe("T16-wd1e-3", 16.0, 1e-3),
    Recipe("T16-wd1e-2", 16.0, 1e-2),
)


def recipes_for(attack: str) -> tuple[str, ...]:
    """Recipe names run for ``--attack fixed|tuned|all``.

    Parameters
    ----------
    attack : {"fixed", "tuned", "all"}

    Returns
    -------
    tuple of str

    Raises
    ------
    ValueError
        Another value.
    """
    if attack not in ATTACKS:
        raise ValueError(f"attack must be one of {ATTACKS}, got {attack!r}")
    return {"fixed": FIXED, "tuned": (TUNED,), "all": RECIPE_NAMES}[attack]


def fixed_recipe(name: str) -> Recipe:
    """The fixed recipe called ``name``.

    Parameters
    ----------
    name : {"light", "strong"}

    Returns
    -------
    Recipe

    Raises
    ------
    ValueError
        Another name.
    """
    table = {"light": LIGHT, "strong": STRONG}
    if name not in table:
        raise ValueError(f"fixed recipes are {tuple(table)}, got {name!r}")
    return table[name]


def candidates_for(kind: str) -> tuple[Recipe, ...]:
    """The tuned attacker's candidates for soft answers, or the distinct weight decays for hard labels.

    Parameters
    ----------
    kind : {"soft", "hard"}
        Any value but "soft" gives the hard-label candidates (T = 1).

    Returns
    -------
    tuple of Recipe
    """
    if kind == "soft":
        return TUNED_CANDIDATES
    seen, out = set(), []
    for r in TUNED_CANDIDATES:
        if r.weight_decay not in seen:
            seen.add(r.weight_decay)
            out.append(Recipe(f"wd{r.weight_decay:g}", 1.0, r.weight_decay))
    return tuple(out)


def fold_rows(n_samples: int, *, folds: int, seed: int) -> list[np.ndarray]:
    """A random partition of range(n_samples) into ``folds`` near-equal parts (sorted indices).

    Parameters
    ----------
    n_samples : int
    folds : int
        >= 2.
    seed : int

    Returns
    -------
    list of ndarray of int

    Raises
    ------
    ValueError
        Fewer than 2 folds, or fewer rows than folds.
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, got {folds!r}")
    if n_samples < folds:
        raise ValueError(f"need at least {folds} rows for {folds}-fold tuning, got {n_samples}")
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0xF01D])))
    order = gen.permutation(n_samples)
    return [np.sort(part) for part in np.array_split(order, folds)]


def select_by_agreement(held_out_hits: np.ndarray, candidates: Sequence[Recipe]) -> tuple[int, np.ndarray]:
    """The candidate with the most held-out agreements; ties go to the earlier candidate.

    Parameters
    ----------
    held_out_hits : ndarray of shape (n_candidates, folds)
        Held-out rows whose student argmax matched the answer's argmax.
    candidates : sequence of Recipe

    Returns
    -------
    (index of the chosen candidate, agreement per candidate summed over folds)
    """
    hits = np.asarray(held_out_hits)
    if hits.ndim != 2 or hits.shape[0] != len(candidates):
        raise ValueError(f"need one row of fold hits per candidate ({len(candidates)}), got shape {hits.shape}")
    totals = hits.sum(axis=1)
    return int(np.argmax(totals)), totals
