"""Monte-Carlo simulation of the averaging attack of Proposition 2.

An attacker sends the same input M times and combines the M noisy responses.
Under fresh noise the combination recovers the clean decision (the sample
mean has noise variance sigma^2 / M, Proposition 2(i)); under per-input
seeding the M responses are identical and nothing is recovered
(Proposition 2(ii)). Both seedings run through the real
:class:`~caliber_core.serving.runtime.Perturber`, one ``perturb`` call per query, so
the simulation also checks the deployed runtime end to end.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import numbers

import numpy as np
import pandas as pd

from ..serving.runtime import SEEDINGS, Perturber
from ..validation import as_labels, as_logits, check_key, check_sigma
from .votes import majority_vote, vote_generator

ESTIMATORS = ("soft-average", "majority-vote")
ATTACK_COLUMNS = ("seeding", "estimator", "m", "agreement", "agreement_se", "accuracy", "accuracy_se")

# Rows per chunk are chosen so one (rows, K) float64 work array holds about
# this many values (2 MiB); the simulation keeps a handful of them alive.
_CHUNK_VALUES = 2**18


def _check_choice_tuple(values, allowed, name: str) -> tuple:
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must name at least one of {allowed}, got an empty sequence")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{name} must be drawn from {allowed}, got {value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has duplicates: {values}")
    return values


def check_count(value, name: str, *, allow_none: bool = False):
    """A positive integer option, or None where ``allow_none``.

    Parameters
    ----------
    value : int or None
        The value to check.
    name : str
        The option's name, for the message.
    allow_none : bool, default False
        Let None through (meaning "not set").

    Returns
    -------
    int or None
        ``value`` as a Python int (None only where allowed).

    Raises
    ------
    ValueError
        Not an integer (bools refused) or below 1.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def repeat_key(key: bytes, repeat: int) -> bytes:
    # Repeat 0 uses the key as given, so it reproduces exactly what a
    # deployed Perturber with that key serves for ids "0", "1", ...; later
    # repeats need independent per-input noise, hence derived keys.
    """The per-input seeding key of one simulation repeat.

    Parameters
    ----------
    key : bytes
        The simulation's key.
    repeat : int
        The repeat's index, >= 0.

    Returns
    -------
    bytes
        ``key`` itself for repeat 0 (so it reproduces what a deployed
        Perturber with that key serves), else HMAC-SHA256 of the repeat under ``key``.

    Notes
    -----
    Independent repeats need independent per-input noise, Proposition cost (ii).
    """
    if repeat == 0:
        return key
    return hmac.new(key, b"caliber.attack.repeat/%d" % repeat, hashlib.sha256).digest()


def simulate_averaging_attack(
    logits,
    labels=None,
    *,
    sigma,
    m_values=(1, 2, 4, 8, 16, 32, 64),
    seedings=("fresh", "per-input"),
    estimators=ESTIMATORS,
    seed: int = 0,
    key: bytes = b"simulation key, not a secret",
    repeats: int = 1,
    chunk_size: int | None = None,
    progress=None,
) -> pd.DataFrame:
    """Agreement and accuracy an averaging attacker reaches with M queries per input.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
        Clean logits, finite.
    labels : array_like of shape (n_samples,), optional
        True classes; without them the accuracy columns are NaN.
    sigma : float
        Noise standard deviation (>= 0) of the defended API.
    m_values : sequence of int, default (1, 2, 4, 8, 16, 32, 64)
        Queries per input. Each input's first M responses are used for M, so
        the curves over M come from nested query sets (smooth in M).
    seedings : sequence of {"fresh", "per-input"}, default both
    estimators : sequence of {"soft-average", "majority-vote"}, default both
        "soft-average": argmax of the mean of the M noisy logit vectors.
        "majority-vote": the most frequent argmax among the M responses,
        ties broken uniformly at random
        (:func:`~caliber_core.simulation.votes.majority_vote`, the thief's rule too).
    seed : int, default 0
        Seeds ``np.random.default_rng(seed)``, the source of fresh noise, and
        the vote tie-breaks (a separate stream,
        :func:`~caliber_core.simulation.votes.vote_generator`); the table is
        reproducible for a given seed and chunk_size.
    key : bytes, default b"simulation key, not a secret"
        Per-input key; row i's id is ``str(i)``. Repeat 0 uses the key
        itself, so it replays what ``Perturber(sigma, key=key)`` serves;
        further repeats use keys derived from it by HMAC.
    repeats : int, default 1
        Independent passes over all inputs (fresh draws; new per-input keys).
    chunk_size : int, optional
        Inputs processed at once. Default: about 2**18 / n_classes, so memory
        stays O(chunk_size * n_classes) whatever M is.
    progress : callable, optional
        Called as ``progress(fraction)`` with fraction in [0, 1], non-decreasing,
        ending at 1.0.

    Returns
    -------
    table : pandas.DataFrame
        One row per (seeding, estimator, m), in the order given (m ascending),
        with columns ``seeding, estimator, m, agreement, agreement_se,
        accuracy, accuracy_se``. Agreement is with the clean argmax
        (lowest index on ties). The standard errors are binomial,
        sqrt(p (1 - p) / (n_samples * repeats)): an upper bound on the
        Monte-Carlo error of the mean over these inputs, since each input's
        hit is an independent Bernoulli. Rows for different m share queries
        and are positively correlated. ``table.attrs`` records sigma,
        n_samples, n_classes, repeats and seed.

    Notes
    -----
    Proposition 2: under fresh noise the soft average of M responses is one
    draw at sigma / sqrt(M) (part (i)); under per-input seeding all M
    responses are identical, so both estimators return the single-query
    decision for every M, exactly (part (ii)).
    """
    z = as_logits(logits, finite=True)
    y = None if labels is None else as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    sigma = check_sigma(sigma)
    if isinstance(m_values, numbers.Integral):
        m_values = (m_values,)
    m_list = [check_count(m, "each of m_values") for m in m_values]
    if not m_list:
        raise ValueError("m_values must hold at least one query count, got an empty sequence")
    if len(set(m_list)) != len(m_list):
        raise ValueError(f"m_values has duplicates: {tuple(m_list)}")
    m_list.sort()
    seedings = _check_choice_tuple(seedings, SEEDINGS, "seedings")
    estimators = _check_choice_tuple(estimators, ESTIMATORS, "estimators")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    key = check_key(key)
    repeats = check_count(repeats, "repeats")
    chunk_size = check_count(chunk_size, "chunk_size", allow_none=True)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")

    n_samples, n_classes = z.shape
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_VALUES // n_classes)
    chunk_size = min(chunk_size, n_samples)
    clean = np.argmax(z, axis=1)
    ids = [str(i) for i in range(n_samples)]
    m_index = {m: i for i, m in enumerate(m_list)}
    m_max = m_list[-1]
    # hits[seeding, estimator, m, 0 = agreement / 1 = accuracy]
    hits = np.zeros((len(seedings), len(estimators), len(m_list), 2), dtype=np.int64)
    generator = np.random.default_rng(seed)
    tie_breaks = vote_generator(seed)
    starts = range(0, n_samples, chunk_size)
    total_steps = repeats * len(seedings) * len(starts)
    step = 0

    for repeat in range(repeats):
        for s_i, seeding in enumerate(seedings):
            if seeding == "fresh":
                perturber = Perturber(sigma, seeding="fresh", generator=generator)
            else:
                perturber = Perturber(sigma, key=repeat_key(key, repeat))
            for start in starts:
                stop = min(start + chunk_size, n_samples)
                _attack_chunk(
                    perturber, z[start:stop], ids[start:stop], clean[start:stop],
                    None if y is None else y[start:stop],
                    m_index, m_max, estimators, hits[s_i], tie_breaks,
                )
                step += 1
                if progress is not None:
                    progress(step / total_steps)

    n_trials = n_samples * repeats
    rows = []
    for s_i, seeding in enumerate(seedings):
        for e_i, estimator in enumerate(estimators):
            for m_i, m in enumerate(m_list):
                agreement = hits[s_i, e_i, m_i, 0] / n_trials
                accuracy = math.nan if y is None else hits[s_i, e_i, m_i, 1] / n_trials
                rows.append((seeding, estimator, m, agreement, binomial_se(agreement, n_trials),
                             accuracy, binomial_se(accuracy, n_trials)))
    table = pd.DataFrame(rows, columns=list(ATTACK_COLUMNS))
    table.attrs.update(sigma=sigma, n_samples=n_samples, n_classes=n_classes, repeats=repeats, seed=int(seed))
    return table


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion measured over ``n`` independent trials.

    Parameters
    ----------
    p : float
        The observed proportion (NaN passes through).
    n : int
        The number of trials, >= 1.

    Returns
    -------
    float
        sqrt(p (1 - p) / n), or NaN when ``p`` is NaN.
    """
    return math.nan if math.isnan(p) else math.sqrt(p * (1.0 - p) / n)


def _attack_chunk(perturber, z, ids, clean, y, m_index, m_max, estimators, hits, tie_breaks) -> None:
    """Issue m_max queries for each input of the chunk; add hits at each M in m_index."""
    n_rows, n_classes = z.shape
    rows = np.arange(n_rows)
    votes = np.zeros((n_rows, n_classes), dtype=np.int32)
    # Running sum of deviations from the first response: the soft average is
    # first + dev_sum / M, which is *exactly* the first response when all M
    # responses are equal (a plain sum / M can be off by an ulp and flip
    # near-ties), and it is better conditioned for fresh noise too.
    first = None
    dev_sum = np.zeros((n_rows, n_classes))
    deviation = np.empty((n_rows, n_classes))
    for query in range(1, m_max + 1):
        response = perturber.perturb(z, ids)
        if first is None:
            first = response
        else:
            np.subtract(response, first, out=deviation)
            dev_sum += deviation
        if "majority-vote" in estimators:
            votes[rows, np.argmax(response, axis=1)] += 1
        if query not in m_index:
            continue
        for e_i, estimator in enumerate(estimators):
            if estimator == "soft-average":
                decision = np.argmax(first + dev_sum / query, axis=1)
            else:
                decision = majority_vote(votes, tie_breaks)
            hits[e_i, m_index[query], 0] += np.count_nonzero(decision == clean)
            if y is not None:
                hits[e_i, m_index[query], 1] += np.count_nonzero(decision == y)


def format_attack_table(table) -> str:
    """A fixed-width text rendering of :func:`simulate_averaging_attack` output.

    Parameters
    ----------
    table : pandas.DataFrame
        Needs ``seeding, estimator, m, agreement``; ``accuracy`` and the
        ``*_se`` columns are shown when present (NaN prints as "n/a").

    Returns
    -------
    text : str
        Header line, a rule, one line per row; no trailing newline.
    """
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in ("seeding", "estimator", "m", "agreement") if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks column(s) {missing}; has {list(table.columns)}")

    def cell(row, name):
        value = row.get(name, math.nan)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        se = row.get(f"{name}_se", math.nan)
        if se is None or (isinstance(se, float) and math.isnan(se)):
            return f"{value:.4f}"
        return f"{value:.4f} +/- {se:.4f}"

    header = ("seeding", "estimator", "M", "agreement", "accuracy")
    lines = [(str(r["seeding"]), str(r["estimator"]), str(int(r["m"])), cell(r, "agreement"), cell(r, "accuracy"))
             for r in table.to_dict("records")]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    align = ("<", "<", ">", ">", ">")

    def fmt(fields):
        return "  ".join(f"{f:{a}{w}}" for f, a, w in zip(fields, align, widths)).rstrip()

    out = [fmt(header), "  ".join("-" * w for w in widths)]
    out.extend(fmt(line) for line in lines)
    return "\n".join(out)
