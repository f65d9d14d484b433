"""The one majority-vote rule: most votes wins, ties uniformly at random, for both attackers that vote."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.extraction import answers
from caliber_core.simulation import attack, votes
from caliber_core.simulation.attack import simulate_averaging_attack
from caliber_core.simulation.votes import majority_vote, vote_generator


def test_ties_go_to_each_tied_class_equally_often():
    v = np.zeros((6000, 4), dtype=np.int64)
    v[:, 1] = v[:, 2] = v[:, 3] = 2  # every row ties between classes 1, 2 and 3
    labels = majority_vote(v, np.random.default_rng(0))
    counts = np.bincount(labels, minlength=4) / len(labels)
    assert counts[0] == 0
    assert np.all(np.abs(counts[1:] - 1 / 3) < 0.025), counts  # binomial sd 0.006


def test_a_clear_majority_wins_whatever_the_draws():
    v = np.array([[0, 3, 2], [5, 0, 1], [1, 1, 2]])
    for seed in range(5):
        assert majority_vote(v, np.random.default_rng(seed)).tolist() == [1, 0, 2]


def test_same_seed_same_tie_breaks_and_streams_apart_from_noise():
    v = np.ones((200, 5), dtype=np.int64)
    a = majority_vote(v, vote_generator(3))
    assert np.array_equal(a, majority_vote(v, vote_generator(3)))
    assert not np.array_equal(a, majority_vote(v, vote_generator(4)))
    assert vote_generator(3).random() != np.random.default_rng(3).random()


def test_bad_votes_are_refused():
    with pytest.raises(ValueError, match=r"votes must have shape \(n_samples, n_classes\), got \(3,\)"):
        majority_vote(np.ones(3), np.random.default_rng(0))


def test_both_attackers_vote_with_the_one_rule():
    assert answers.majority_vote is votes.majority_vote
    assert attack.majority_vote is votes.majority_vote


def test_two_votes_keep_single_query_agreement_when_the_clean_class_has_the_highest_index():
    """With a random tie-break, a vote of two i.i.d. answers picks the clean class with probability
    p^2 + 2 p (1 - p) / 2 = p, the single-query agreement. Ties sent to the lowest index would give p^2
    here, since the clean class (2) is the highest index."""
    n = 20_000
    logits = np.tile([0.0, 0.0, 1.0], (n, 1))
    table = simulate_averaging_attack(logits, sigma=1.5, m_values=(1, 2), seedings=("fresh",),
                                      estimators=("majority-vote",), seed=7)
    one, two = table.agreement.tolist()
    assert 0.5 < one < 0.7
    # Each agreement is a mean of 20,000 Bernoullis (sd <= 0.0035); 0.02 is over 4 sd of the difference.
    assert two == pytest.approx(one, abs=0.02)
    assert abs(two - one ** 2) > 0.15


@pytest.mark.parametrize("key_bytes", [8, 8 * 7 * 3, 4 << 20])
def test_the_vote_in_row_blocks_draws_the_keys_of_the_whole_matrix(key_bytes, monkeypatch):
    """Block by block (no (n, K) float64 keys held): the same labels and the generator left where it was."""
    monkeypatch.setattr(votes, "_KEY_BYTES", key_bytes)
    rng = np.random.default_rng(1)
    v = rng.integers(0, 3, size=(1001, 7)).astype(np.int32)
    gen, former = vote_generator(5), vote_generator(5)
    top = v.max(axis=1, keepdims=True)
    expected = np.argmax(np.where(v == top, former.random(v.shape), -1.0), axis=1)
    assert np.array_equal(majority_vote(v, gen), expected)
    assert gen.random() == former.random()
    assert majority_vote(np.zeros((0, 4), dtype=np.int64), gen).shape == (0,)
