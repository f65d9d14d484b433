"""The budgeted averaging-attack estimate: exact per-input shortcut, nested fresh sums, trial counts."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.serving.runtime import Perturber
from caliber_core.simulation.attack_estimate import estimate_averaging_attack


def _problem(n=400, k=6, seed=3):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k))
    y = np.argmax(z + rng.normal(scale=0.8, size=z.shape), axis=1)
    return z, y


def _rows(table, seeding, estimator):
    return table[(table["seeding"] == seeding) & (table["estimator"] == estimator)]


def test_per_input_is_the_single_keyed_answer_at_every_m():
    z, y = _problem()
    key = bytes(range(7, 39))
    table = estimate_averaging_attack(z, y, sigma=0.7, repeats=1, key=key, m_values=(1, 4, 16))
    served = Perturber(0.7, key=key).perturb(z, [str(i) for i in range(len(z))])
    want = np.mean(np.argmax(served, axis=1) == y)
    for estimator in ("soft-average", "majority-vote"):
        rows = _rows(table, "per-input", estimator)
        np.testing.assert_array_equal(rows["accuracy"], [want] * 3)
        assert (rows["trials"] == len(z)).all()
    assert table.attrs["per_input_passes"] == (want,)


def test_fresh_soft_average_is_one_draw_at_sigma_over_root_m():
    # Proposition 2(i): the mean of M fresh answers is one answer at sigma / sqrt(M).
    z, y = _problem(n=300, k=4)
    sigma, m = 1.5, 9
    table = estimate_averaging_attack(z, None, sigma=sigma, m_values=(1, m), repeats=40, seed=1)
    got = _rows(table, "fresh", "soft-average")
    rng = np.random.default_rng(99)
    reference = np.mean([np.mean(np.argmax(z + rng.normal(scale=sigma / np.sqrt(m), size=z.shape), axis=1)
                                 == np.argmax(z, axis=1)) for _ in range(200)])
    row = got[got["m"] == m].iloc[0]
    assert row["trials"] == 300 * 40
    assert abs(row["agreement"] - reference) < 4 * row["agreement_se"] + 0.003
    assert np.isnan(row["accuracy"])


def test_majority_vote_trials_follow_the_budget():
    z, y = _problem(n=500, k=10)
    table = estimate_averaging_attack(z, y, sigma=0.5, m_values=(1, 2, 8), repeats=2, max_draws=8 * 10 * 300)
    vote = _rows(table, "fresh", "majority-vote")
    soft = _rows(table, "fresh", "soft-average")
    assert (vote["trials"] == 300).all()
    assert (soft["trials"] == 800).all()  # 3 draws a trial: 24,000 // 30 = 800 of the 1,000
    # M=1 majority vote is one fresh query: its accuracy sits near the per-input single query.
    one = vote[vote["m"] == 1].iloc[0]
    per_input = _rows(table, "per-input", "soft-average").iloc[0]
    assert abs(one["accuracy"] - per_input["accuracy"]) < 4 * (one["accuracy_se"] + per_input["accuracy_se"])


def test_reproducible_and_progress_ends_at_one():
    z, y = _problem(n=120, k=5)
    seen = []
    a = estimate_averaging_attack(z, y, sigma=0.6, seed=4, repeats=2, progress=seen.append)
    b = estimate_averaging_attack(z, y, sigma=0.6, seed=4, repeats=2)
    assert a.equals(b)
    assert seen[-1] == 1.0 and all(x <= y for x, y in zip(seen, seen[1:]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(m_values=()), "at least one query count"),
    (dict(m_values=(0, 2)), "each of m_values must be a positive integer"),
    (dict(repeats=0), "repeats must be a positive integer"),
    (dict(max_draws=0), "max_draws must be a positive integer"),
    (dict(seed=-1), "seed must be a non-negative integer"),
    (dict(sigma=-1.0), "sigma"),
])
def test_bad_options(kwargs, message):
    z, y = _problem(n=10, k=3)
    options = dict(sigma=0.5) | kwargs
    with pytest.raises(ValueError, match=message):
        estimate_averaging_attack(z, y, **options)


def test_progress_must_be_callable():
    z, y = _problem(n=10, k=3)
    with pytest.raises(TypeError, match="progress must be callable"):
        estimate_averaging_attack(z, y, sigma=0.5, progress=3)


def test_the_table_is_the_one_of_the_plain_block_by_block_replay_bit_for_bit():
    """Per-input passes over larger blocks of byte ids and the in-place soft average give the exact counts
    of one whole-array keyed answer per pass (str ids) and of ``z + noise_sum / m`` drawn M step by M step."""
    from caliber_core.simulation.attack import repeat_key

    rng = np.random.default_rng(11)
    n, k, sigma, m_values, repeats, seed = 3000, 500, 1.1, (1, 2, 4, 8), 2, 5
    z = (rng.normal(size=(n, k)) * 2).astype(np.float32)
    y = np.argmax(z + rng.normal(scale=1.0, size=z.shape), axis=1)
    key = b"simulation key, not a secret"
    table = estimate_averaging_attack(z, y, sigma=sigma, m_values=m_values, repeats=repeats, seed=seed,
                                      max_draws=2_000_000)
    clean = np.argmax(z, axis=1)
    passes = []
    for r in range(repeats):
        served = np.argmax(Perturber(sigma, key=repeat_key(key, r)).perturb(z, [str(i) for i in range(n)]), axis=1)
        passes.append(((served == clean).sum(), (served == y).sum()))
    assert table.attrs["per_input_passes"] == tuple(float(b) / n for _, b in passes)
    per_input = _rows(table, "per-input", "soft-average")
    assert (per_input["agreement"] == sum(a for a, _ in passes) / (n * repeats)).all()
    # the soft average: the seeded trial rows, 524-row chunks (2**18 values), fresh draws per M step
    soft_gen, _, order_gen = (np.random.default_rng(s) for s in np.random.SeedSequence([seed, 0xA77AC]).spawn(3))
    soft_trials = min(n * repeats, 2_000_000 // (len(m_values) * k))
    vote_trials = min(n * repeats, 2_000_000 // (m_values[-1] * k))
    count = max(soft_trials, vote_trials)
    rows = np.concatenate([order_gen.permutation(n) for _ in range(-(-count // n))])[:count][:soft_trials]
    hits = np.zeros((len(m_values), 2), dtype=np.int64)
    for start in range(0, rows.size, 2**18 // k):
        chunk = rows[start:start + 2**18 // k]
        noise_sum, previous = np.zeros((chunk.size, k)), 0
        for j, m in enumerate(m_values):
            noise_sum += soft_gen.standard_normal((chunk.size, k)) * (sigma * np.sqrt(m - previous))
            previous = m
            decision = np.argmax(z[chunk] + noise_sum / m, axis=1)
            hits[j] += ((decision == clean[chunk]).sum(), (decision == y[chunk]).sum())
    soft = _rows(table, "fresh", "soft-average")
    np.testing.assert_array_equal(soft["agreement"].to_numpy(), hits[:, 0] / soft_trials)
    np.testing.assert_array_equal(soft["accuracy"].to_numpy(), hits[:, 1] / soft_trials)
