"""What a thief is asked to train (:class:`Request`) and what one trained surrogate scored (:class:`Outcome`).

With the seeds and groups that tie requests together (:func:`training_seed`,
:func:`noise_group`, :func:`modal_choice`). Apart from :mod:`.attacker`, whose
:class:`~.attacker.Thief` trains with torch, so that the experiment's results
can be built, read and shown without importing torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .answers import Answers
from .recipes import Recipe


@dataclass(frozen=True)
class Outcome:
    """One trained surrogate, scored on the evaluation split.

    Attributes
    ----------
    accuracy : float
        Against the evaluation labels.
    agreement : float
        With the clean teacher's argmax on the evaluation split (fidelity).
    recipe : Recipe
        The recipe trained (for the tuned attacker: the candidate it chose).
    """

    accuracy: float
    agreement: float
    recipe: Recipe
    corrected_accuracy: float | None = None  # after prior correction (:mod:`.prior_correction`)
    corrected_agreement: float | None = None
    recalibrated_accuracy: float | None = None  # with a few labels (:mod:`.recalibration`)


@dataclass(frozen=True)
class Request:
    """Train one surrogate on ``answers`` with ``recipe`` ("light", "strong", "tuned" or a Recipe).

    ``group`` (tuned requests only): requests with equal groups -- answers at
    one noise level, one per replicate seed -- share one k-fold selection,
    whose folds are spread over the group's answers (see :meth:`.attacker.Thief.train`).
    Without a group, the selection uses this request's answers alone.

    Attributes
    ----------
    answers : Answers
        What the thief received for the pool's queries.
    recipe : str or Recipe
        The training recipe.
    seed : int
        The replicate seed (student init and order, :func:`training_seed`).
    group : tuple or None
        The tuned selection's group (:func:`noise_group`).
    """

    answers: Answers
    recipe: str | Recipe
    seed: int
    group: tuple | None = None


def training_seed(seed: int, role: int = 0) -> int:
    """A student's init/order seed: depends on the replicate seed only (common across conditions).

    Parameters
    ----------
    seed : int
        The replicate seed.
    role : int, default 0
        Separates students trained for different purposes under one seed.

    Returns
    -------
    int
        A 32-bit seed.
    """
    return int(np.random.SeedSequence([int(seed), 0x5EED, int(role)]).generate_state(1)[0])


def modal_choice(recipes: Sequence[Recipe]) -> Recipe:
    """The candidate chosen most often (ties: the first chosen).

    Parameters
    ----------
    recipes : sequence of Recipe
        The tuned attacker's choices, one per seed.

    Returns
    -------
    Recipe

    Raises
    ------
    ValueError
        No recipes given.
    """
    counts = Counter(r.key() for r in recipes)
    top = max(counts.values())
    for r in recipes:
        if counts[r.key()] == top:
            return r
    raise ValueError("no recipes given")


def noise_group(sigma: float) -> tuple:
    """The tuned attacker's selection group (:attr:`Request.group`) of soft answers at effective noise ``sigma``.

    Parameters
    ----------
    sigma : float

    Returns
    -------
    tuple
        ``("soft", sigma)``.
    """
    return ("soft", float(sigma))
