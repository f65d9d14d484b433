"""The averaging attack of Proposition 2, estimated within a fixed budget of noise draws.

:func:`~caliber_core.simulation.attack.simulate_averaging_attack` issues every
query of every input through the serving runtime: M_max full draws per input
and seeding, about 1.3e9 normals at 10,000 x 1,000 with M up to 64. The
dashboard needs the same table in seconds, so this module computes each part
the cheapest way that keeps its distribution:

* **per-input seeding**: repeats of a query return the identical response
  (Proposition 2(ii)), so one keyed query per input and repeat gives every
  M exactly; a second query of a slice of rows checks the identity on the
  deployed runtime. All inputs, every repeat.
* **fresh noise, soft average**: the mean of the first M fresh responses is
  z + S_M / M with S_M a sum of M i.i.d. N(0, sigma^2) vectors. Over the
  sorted M values the sums are nested, so S_{M_j} = S_{M_{j-1}} + N(0, (M_j -
  M_{j-1}) sigma^2) draws the whole nested sequence exactly with one full draw
  per M value (7 for M = 1, 2, ..., 64) instead of 64.
* **fresh noise, majority vote**: every response's top-1 counts, so it needs
  all M_max draws per input; it runs on as many (input, repeat) trials as
  the budget allows, drawn without replacement from a seeded permutation.

Each row of the table states its number of trials, and its standard error is
the binomial one over those trials.
"""

from __future__ import annotations

import math
import numbers
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from ..serving.keyed_noise import row_digests
from ..serving.runtime import Perturber
from ..validation import as_labels, as_logits, check_key, check_sigma
from .attack import binomial_se, check_count, repeat_key
from .votes import majority_vote, vote_generator

ESTIMATE_COLUMNS = ("seeding", "estimator", "m", "trials", "agreement", "agreement_se",
                    "accuracy", "accuracy_se")

#: Normals drawn per fresh estimator by default (about 0.15 s of numpy on one idle core): at 10,000 x 1,000
#: and M up to 64, 2,142 soft-average trials and 234 majority-vote trials, each row's standard error stated
#: with its trials. Drawing normals is nearly all of the fresh estimators' time, and the dashboard's page
#: waits for them.
DEFAULT_MAX_DRAWS = 15_000_000

# Rows per block so one (rows, K) float64 array holds about this many values.
_BLOCK_VALUES = 2**18
# Rows re-queried to check that per-input seeding repeats its answer.
_IDENTITY_ROWS = 256
# The per-input passes answer this many blocks of rows per keyed call: its fixed cost (request checks, the
# stream key, the kernel's call) paid a quarter as often; each row's noise depends on its id only.
_PER_INPUT_BLOCKS = 4


def estimate_averaging_attack(
    logits,
    labels=None,
    *,
    sigma,
    m_values=(1, 2, 4, 8, 16, 32, 64),
    repeats: int = 4,
    seed: int = 0,
    key: bytes = b"simulation key, not a secret",
    max_draws: int = DEFAULT_MAX_DRAWS,
    progress=None,
) -> pd.DataFrame:
    """Agreement and accuracy of an averaging attacker, both seedings, both estimators.

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
        Clean logits, finite.
    labels : array_like of shape (n_samples,), optional
        True classes; without them the accuracy columns are NaN.
    sigma : float
        Noise standard deviation (>= 0) of the defended API.
    m_values : sequence of int, default (1, 2, 4, 8, 16, 32, 64)
        Queries per input; the curves come from nested query sets.
    repeats : int, default 4
        Passes over the inputs. Per-input seeding runs every input on every
        pass (each pass with its own derived key, as in
        ``simulate_averaging_attack``); the fresh estimators take at most
        ``n_samples * repeats`` trials, fewer when ``max_draws`` binds.
    seed : int, default 0
        Seeds the fresh noise, the choice of trials and the vote tie-breaks.
    key : bytes, default b"simulation key, not a secret"
        Per-input key; row i's id is ``str(i)``; pass 0 replays what
        ``Perturber(sigma, key=key)`` serves.
    max_draws : int, default 15,000,000
        Largest number of standard normals each fresh estimator draws.
    progress : callable, optional
        ``progress(fraction)``, non-decreasing, ending at 1.0.

    Returns
    -------
    table : pandas.DataFrame
        One row per (seeding, estimator, m) with columns ``seeding, estimator,
        m, trials, agreement, agreement_se, accuracy, accuracy_se``; the
        standard errors are binomial over ``trials`` (input, pass) pairs.
        ``table.attrs`` records sigma, n_samples, n_classes, repeats, seed and,
        under ``"per_input_passes"``, the per-input accuracy of each pass
        (agreement when there are no labels).

    Raises
    ------
    ValueError
        For bad logits, labels, sigma, counts or seed.
    RuntimeError
        If per-input seeding does not repeat its answer (a broken runtime).

    Notes
    -----
    Proposition 2: the soft average of M fresh responses is one draw at
    sigma / sqrt(M) (part (i)); per-input seeding answers every repeat
    identically (part (ii)).
    """
    z = as_logits(logits, finite=True)
    y = None if labels is None else as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    sigma = check_sigma(sigma)
    if isinstance(m_values, numbers.Integral):
        m_values = (m_values,)
    m_list = sorted({check_count(m, "each of m_values") for m in m_values})
    if not m_list:
        raise ValueError("m_values must hold at least one query count, got an empty sequence")
    repeats = check_count(repeats, "repeats")
    max_draws = check_count(max_draws, "max_draws")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    key = check_key(key)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")

    n, k = z.shape
    clean = np.argmax(z, axis=1)
    m_max = m_list[-1]
    block = max(1, _BLOCK_VALUES // k)
    sequence = np.random.SeedSequence([int(seed), 0xA77AC])
    soft_gen, vote_gen, order_gen = (np.random.default_rng(s) for s in sequence.spawn(3))
    soft_trials = min(n * repeats, max(1, max_draws // (len(m_list) * k)))
    vote_trials = min(n * repeats, max(1, max_draws // (m_max * k)))
    trial_rows = _trial_rows(n, max(soft_trials, vote_trials), order_gen)
    # Work in normals drawn (per-input counted as one draw per value), for the progress bar.
    total = float(n * repeats * k + soft_trials * len(m_list) * k + vote_trials * m_max * k)
    done, done_lock = [0.0], threading.Lock()

    def advance(values: float) -> None:
        with done_lock:  # also from the vote's thread; the bar is drawn from the caller's only
            done[0] += values

    def advance_and_report(values: float) -> None:
        advance(values)
        if progress is not None:
            progress(min(1.0, done[0] / total))

    # Two threads of about equal work: the majority vote and the later per-input passes on one, the soft
    # average and the earlier passes on the other. Each part's generators are its own and numpy's draws and
    # reductions release the interpreter lock, so with two cores the table takes about half the time.
    # The table is the same with or without the thread (a pass's noise depends on its key only).
    pass_split = repeats // 2

    def other_thread():
        vote = _majority_vote_part(z, clean, y, trial_rows[:vote_trials], m_list, sigma, vote_gen,
                                   vote_generator(seed), block, advance)
        return vote, _per_input_part(z, clean, y, sigma, key, range(pass_split, repeats),
                                     _PER_INPUT_BLOCKS * block, advance)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-vote") as pool:
        other = pool.submit(other_thread)
        first_passes = _per_input_part(z, clean, y, sigma, key, range(pass_split), _PER_INPUT_BLOCKS * block,
                                       advance_and_report)
        soft = _soft_average_part(z, clean, y, trial_rows[:soft_trials], m_list, sigma, soft_gen, block,
                                  advance_and_report)
        vote, later_passes = other.result()
    passes = np.concatenate([first_passes, later_passes]).reshape(repeats, 2)
    per_input_hits = passes.sum(axis=0)
    # [estimator, m, agreement/accuracy]: both estimators and every M get the single answer.
    per_input = np.broadcast_to(per_input_hits, (2, len(m_list), 2))

    rows_out = []
    for seeding, estimator, hits, trials in (
            ("fresh", "soft-average", soft, soft_trials),
            ("fresh", "majority-vote", vote, vote_trials),
            ("per-input", "soft-average", per_input[0], n * repeats),
            ("per-input", "majority-vote", per_input[1], n * repeats)):
        for j, m in enumerate(m_list):
            agreement = hits[j, 0] / trials
            accuracy = math.nan if y is None else hits[j, 1] / trials
            rows_out.append((seeding, estimator, m, trials, agreement, binomial_se(agreement, trials),
                             accuracy, binomial_se(accuracy, trials)))
    table = pd.DataFrame(rows_out, columns=list(ESTIMATE_COLUMNS))
    column = 0 if y is None else 1
    table.attrs.update(sigma=sigma, n_samples=n, n_classes=k, repeats=repeats, seed=int(seed),
                       per_input_passes=tuple(float(h) / n for h in passes[:, column]))
    if progress is not None:
        progress(1.0)
    return table


def _per_input_part(z, clean, y, sigma, key, pass_numbers, block, advance):
    """Hits (agreement, accuracy) of one keyed answer per input in each of the passes ``pass_numbers``,
    one row per pass."""
    n, k = z.shape
    passes = []
    # The digests of the row ids str(i), once for every pass (hashing ids holds the interpreter lock, which the
    # other thread's draws wait on): each pass's keyed call reads them in place of the ids, the same answer.
    all_digests = row_digests([str(i).encode("ascii") for i in range(n)])
    for r in pass_numbers:
        perturber = Perturber(sigma, key=repeat_key(key, r))
        pass_hits = np.zeros(2, dtype=np.int64)
        for start in range(0, n, block):
            rows = slice(start, min(start + block, n))
            digests = all_digests[rows]
            response = perturber.perturb(z[rows], digests=digests)
            if start == 0:
                check = min(_IDENTITY_ROWS, rows.stop)
                again = perturber.perturb(z[:check], digests=digests[:check])
                if not np.array_equal(again, response[:check]):
                    raise RuntimeError("per-input seeding returned a different answer to a repeated query")
            decision = np.argmax(response, axis=1)
            pass_hits += _hits(decision, clean[rows], None if y is None else y[rows])
            advance((rows.stop - rows.start) * k)
        passes.append(pass_hits)
    return np.array(passes, dtype=np.int64).reshape(-1, 2)


def _soft_average_part(z, clean, y, trial_rows, m_list, sigma, generator, block, advance):
    """Hits of the soft average of M fresh answers, nested sums over the sorted M values."""
    k = z.shape[1]
    soft = np.zeros((len(m_list), 2), dtype=np.int64)
    for chunk in _chunks(trial_rows, block):
        z_chunk, clean_chunk = z[chunk], clean[chunk]  # gathered once for every M, not once per M
        labels_chunk = None if y is None else y[chunk]
        noise_sum = np.zeros((chunk.size, k))
        step, noisy = np.empty_like(noise_sum), np.empty_like(noise_sum)
        previous = 0
        for j, m in enumerate(m_list):
            generator.standard_normal(out=step)  # the draws of standard_normal((chunk.size, k)), in place
            step *= sigma * math.sqrt(m - previous)
            noise_sum += step
            previous = m
            np.divide(noise_sum, m, out=noisy)
            noisy += z_chunk  # the same sum as z_chunk + noise_sum / m, without two temporaries
            soft[j] += _hits(np.argmax(noisy, axis=1), clean_chunk, labels_chunk)
        advance(chunk.size * k * len(m_list))
    return soft


def _majority_vote_part(z, clean, y, trial_rows, m_list, sigma, generator, tie_breaks, block, advance):
    """Hits of the majority vote of the first M fresh top-1 answers, for each M."""
    k = z.shape[1]
    m_max = m_list[-1]
    vote = np.zeros((len(m_list), 2), dtype=np.int64)
    index = {m: j for j, m in enumerate(m_list)}
    for chunk in _chunks(trial_rows, block):
        counts = np.zeros((chunk.size, k), dtype=np.int32)
        at = np.arange(chunk.size)
        zc = z[chunk]
        noise = np.empty((chunk.size, k))
        for query in range(1, m_max + 1):
            generator.standard_normal(out=noise)
            noise *= sigma
            noise += zc
            counts[at, np.argmax(noise, axis=1)] += 1
            if query in index:
                decision = majority_vote(counts, tie_breaks)
                vote[index[query]] += _hits(decision, clean[chunk], None if y is None else y[chunk])
        advance(chunk.size * k * m_max)
    return vote


def _hits(decision, clean, labels) -> np.ndarray:
    agree = np.count_nonzero(decision == clean)
    correct = 0 if labels is None else np.count_nonzero(decision == labels)
    return np.array([agree, correct], dtype=np.int64)


def _trial_rows(n: int, count: int, generator: np.random.Generator) -> np.ndarray:
    """``count`` row indices: whole seeded permutations of the rows, one after another."""
    out = [generator.permutation(n) for _ in range(-(-count // n))]
    return np.concatenate(out)[:count]


def _chunks(rows: np.ndarray, size: int):
    for start in range(0, rows.size, size):
        yield rows[start:start + size]
