"""Averaging conditions: M repeated queries, fresh against per-input seeding, soft and hard.

A thief that asks the same query M times and averages the soft answers (or
takes the majority of the argmax labels) divides fresh noise's variance by M;
per-input seeding returns M identical answers, so averaging gains nothing.
:func:`averaging_rows` measures both at one sigma over the replicate seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .answers import DrawnAnswers, answer_queries
from .recipes import Recipe
from .spread import Spread
from .surrogate_requests import Request, noise_group

if TYPE_CHECKING:  # trains with torch; only the caller's thief is used here
    from .attacker import Thief


@dataclass
class AveragingRow:
    """One row of the averaging table: M answers per input at one sigma and seeding, over seeds.

    Attributes
    ----------
    sigma : float
    m : int
        Answers averaged (soft) or voted (hard) per input.
    seeding : {"fresh", "per-input"}
    labels : {"soft", "hard"}
    surrogate_accuracy, surrogate_agreement : Spread
        The surrogate's accuracy and its agreement with the teacher.
    label_agreement : Spread or None
        Hard labels: how often the voted label is the clean teacher's argmax on the pool.
    """
    sigma: float
    m: int
    seeding: str
    labels: str
    surrogate_accuracy: Spread
    surrogate_agreement: Spread
    label_agreement: Spread | None  # hard labels: voted label == clean teacher argmax on the pool



def averaging_rows(thief: Thief, soft_attacker: str | Recipe, attacker: Recipe, logits: np.ndarray, sigma: float,
                   seeds: Sequence[int], m_values: Sequence[int], *,
                   on_phase: Callable[[str], None] | None = None) -> list[AveragingRow]:
    """M averaged answers at ``sigma``, fresh against per-input seeding, soft and hard, every seed.

    Averaged soft answers go to ``soft_attacker`` (the tuned one when run: it
    re-tunes for the lower effective noise), hard labels to the frontier
    attacker's weight decay. The last row is the clean-label ceiling (sigma = 0,
    hard labels).

    Parameters
    ----------
    thief : Thief
        Trains the surrogates.
    soft_attacker : str or Recipe
        Who distils averaged soft answers.
    attacker : Recipe
        The frontier attacker (hard labels).
    logits : ndarray of shape (n_pool, n_classes)
        The teacher's clean logits on the pool.
    sigma : float
        The served noise.
    seeds : sequence of int
        Replicate seeds.
    m_values : sequence of int
        Answers per input.
    on_phase : callable, optional
        Called with "averaging" and "hard labels" as each phase starts (timings).

    Returns
    -------
    list of AveragingRow

    Notes
    -----
    Proposition cost: fresh noise averaged over M answers has v / M; per-input
    seeding answers every repeat alike.
    """
    phase = on_phase if on_phase is not None else (lambda name: None)
    phase("averaging")
    rows = []
    reference = np.argmax(logits, axis=1)
    plan = [("fresh", sigma), ("per-input", sigma)]
    answers = {}
    for seeding, s_val in plan:
        for s in seeds:
            # Hard labels are kept (one int a row); soft answers are drawn again when trained on.
            got = answer_queries(logits, sigma=s_val, seed=s, m_values=m_values, seeding=seeding, kinds=("hard",))
            for m in sorted(m_values):
                answers[(seeding, "soft", m, s)] = DrawnAnswers(logits, s_val, s, m, seeding)
                answers[(seeding, "hard", m, s)] = got[("hard", m)]
    # The tuned attacker's choice is shared by the answers of one effective
    # noise level: sigma / sqrt(M) for fresh averages, sigma for per-input ones
    # (identical repeats), whose choice is then the retention target's.
    soft_keys = [k for k in answers if k[1] == "soft"]
    hard_keys = [k for k in answers if k[1] == "hard"]
    soft_reqs = [Request(answers[k], soft_attacker, k[3],
                         noise_group(sigma / math.sqrt(k[2]) if k[0] == "fresh" else sigma)) for k in soft_keys]
    outs = dict(zip(soft_keys, thief.train(soft_reqs)))
    phase("hard labels")
    outs.update(zip(hard_keys, thief.train([Request(answers[k], attacker, k[3]) for k in hard_keys])))
    for seeding, _ in plan:
        for kind in ("soft", "hard"):
            for m in sorted(m_values):
                o = [outs[(seeding, kind, m, s)] for s in seeds]
                label_agr = None
                if kind == "hard":
                    label_agr = Spread.of([float(np.mean(answers[(seeding, kind, m, s)].labels == reference))
                                           for s in seeds])
                rows.append(AveragingRow(sigma, m, seeding, kind, Spread.of([x.accuracy for x in o]),
                                         Spread.of([x.agreement for x in o]), label_agr))
    hard_clean = [answer_queries(logits, sigma=0.0, seed=s, kinds=("hard",))[("hard", 1)] for s in seeds]
    o = thief.train([Request(a, attacker, s) for a, s in zip(hard_clean, seeds)])
    rows.append(AveragingRow(0.0, 1, "fresh", "hard", Spread.of([x.accuracy for x in o]),
                             Spread.of([x.agreement for x in o]), Spread.of([1.0 for _ in seeds])))
    return rows
