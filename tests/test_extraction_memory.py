"""Extraction in bounded memory gives the same numbers as the all-at-once computation it replaced.

The thief draws answers when a surrogate trains on them, trains a large
pool's students a few at a time, and fits the prior correction one
surrogate at a time. Each test holds the former whole-batch computation as
a reference and asks for bit-identical results on a fixed seed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from caliber_core.extraction import attacker as attacker_module  # noqa: E402
from caliber_core.extraction.answers import DrawnAnswers, answer_queries  # noqa: E402
from caliber_core.extraction.archive import load_archive  # noqa: E402
from caliber_core.extraction.attacker import Request, Thief  # noqa: E402
from caliber_core.extraction.distill import Schedule, tempered_targets  # noqa: E402
from caliber_core.extraction.prior_correction import corrected_predictions, prior_matching_bias  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data"
FAST = Schedule(epochs=4, min_steps=40)


def _batch_bias(logits, prior=None, iterations=200, tolerance=1e-6):
    """The former prior fit: every student's (n, K) float64 matrices at once, one stop test for all."""
    batch = np.asarray(logits, dtype=np.float64)
    k = batch.shape[-1]
    p = np.full(k, 1.0 / k) if prior is None else np.asarray(prior, dtype=np.float64)
    bias = np.zeros((batch.shape[0], 1, k))
    log_p = np.log(p)
    shifted = batch - batch.max(axis=2, keepdims=True)
    for _ in range(int(iterations)):
        s = shifted + bias
        s -= s.max(axis=2, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=2, keepdims=True)
        freq = s.mean(axis=1, keepdims=True)
        if np.max(np.abs(freq - p)) < tolerance:
            break
        bias += log_p - np.log(np.maximum(freq, 1e-300))
        bias -= bias.mean(axis=2, keepdims=True)
    return bias[:, 0, :]


def _former_targets(answers, temperature):
    z = np.asarray(answers, dtype=np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z.astype(np.float32)


@pytest.mark.parametrize("students, n, k, iterations", [(6, 3000, 20, 200), (48, 300, 10, 200), (3, 200, 2, 4),
                                                        (4, 500, 7, 0)])
def test_the_prior_fit_in_lockstep_one_student_at_a_time_is_bit_identical(students, n, k, iterations):
    rng = np.random.default_rng(n + k)
    # Students of different confidence and class bias converge after different step counts.
    z = (rng.standard_normal((students, n, k)) * rng.uniform(0.5, 4.0, (students, 1, 1))
         + 2.0 * rng.standard_normal((students, 1, k))).astype(np.float32)
    assert np.array_equal(prior_matching_bias(z, iterations=iterations), _batch_bias(z, iterations=iterations))
    prior = rng.dirichlet(np.ones(k) * 5)
    assert np.array_equal(prior_matching_bias(z, prior=prior), _batch_bias(z, prior=prior))
    # A student on its own runs to its own stop, not the batch's.
    assert np.array_equal(prior_matching_bias(z[1]), _batch_bias(z[1:2])[0])
    ev = rng.standard_normal((students, 50, k)).astype(np.float32)
    former = np.argmax(ev.astype(np.float64) + _batch_bias(z)[:, None, :], axis=2)
    assert np.array_equal(corrected_predictions(z, ev), former)


@pytest.mark.parametrize("block_rows", [37, 4096])
def test_the_prior_fit_in_row_blocks_is_bit_identical(block_rows, monkeypatch):
    """Each step's softmax made a block of rows at a time (float32 logits held, no float64 matrix)."""
    from caliber_core.extraction import prior_correction

    rng = np.random.default_rng(block_rows)
    for students, n, k in ((3, 1500, 100), (2, 999, 2), (4, 64, 13)):
        monkeypatch.setattr(prior_correction, "BLOCK_BYTES", 8 * k * block_rows)
        z = (rng.standard_normal((students, n, k)) * rng.uniform(0.5, 4.0, (students, 1, 1))
             + 2.0 * rng.standard_normal((students, 1, k))).astype(np.float32)
        assert np.array_equal(prior_matching_bias(z), _batch_bias(z))
        prior = rng.dirichlet(np.ones(k) * 5)
        assert np.array_equal(prior_matching_bias(z.astype(np.float64), prior=prior), _batch_bias(z, prior=prior))


def test_targets_made_in_row_blocks_equal_the_whole_matrix():
    rng = np.random.default_rng(3)
    for n in (1, 4096, 4097, 9000):
        a = rng.standard_normal((n, 12)) * 4
        for t in (0.3, 1.0, 2.5):
            assert np.array_equal(tempered_targets(a, t), _former_targets(a, t))


@pytest.fixture(scope="module")
def archive():
    return load_archive(DATA / "digits_mlp-wide.npz")


def test_drawn_answers_equal_the_answers_they_stand_for(archive):
    z = archive.pool.logits
    for sigma, seed in ((0.0, 0), (3.0, 1), (3.0, 2)):
        held = answer_queries(z, sigma=sigma, seed=seed)[("soft", 1)]
        drawn = DrawnAnswers(z, sigma, seed)
        assert np.array_equal(drawn.values, held.values) and drawn.digest() == held.digest()
        assert drawn.digest() == hashlib.sha256(b"soft" + held.values.tobytes()).hexdigest()
        assert (drawn.kind, drawn.m, drawn.seeding, drawn.sigma) == (held.kind, held.m, held.seeding, held.sigma)


def _thief(archive, **kw):
    ev = archive.evaluation
    return Thief(archive.pool.inputs, ev.inputs, ev.labels, np.argmax(ev.logits, axis=1),
                 n_classes=archive.n_classes, architecture="linear", schedule=FAST, **kw)


def test_a_thief_training_a_few_students_at_a_time_on_drawn_answers_gives_the_same_outcomes(archive, monkeypatch):
    z = archive.pool.logits
    conditions = [(sigma, s) for sigma in (0.0, 2.0, 6.0) for s in (0, 1)]
    recipes = ("light", "strong")
    held = [Request(answer_queries(z, sigma=sigma, seed=s)[("soft", 1)], r, s) for sigma, s in conditions
            for r in recipes]
    whole = _thief(archive)
    assert whole._students_per_batch() >= len(held)  # the reference: one batch of every student
    reference = whole.train(held)
    # Two students' targets at a time: six batches, one prior-correction lockstep across them.
    monkeypatch.setattr(attacker_module, "_TARGET_BYTES", 2 * 4 * z.size)
    parts = _thief(archive)
    assert parts._students_per_batch() == 2
    drawn = [Request(DrawnAnswers(z, sigma, s), r, s) for sigma, s in conditions for r in recipes]
    assert parts.train(drawn) == reference
    assert all(o.corrected_accuracy is not None for o in reference)


@pytest.mark.parametrize("seeding", ["fresh", "per-input"])
def test_drawn_averages_of_m_rounds_equal_the_answers_asked_for_with_other_m(archive, seeding):
    z = archive.pool.logits[:200]
    held = answer_queries(z, sigma=2.0, seed=5, m_values=(1, 2, 4), seeding=seeding, kinds=("soft", "hard"))
    for m in (1, 2, 4):
        drawn = DrawnAnswers(z, 2.0, 5, m, seeding)
        assert np.array_equal(drawn.values, held[("soft", m)].values)
        assert drawn.digest() == held[("soft", m)].digest()
    alone = answer_queries(z, sigma=2.0, seed=5, m_values=(1, 2, 4), seeding=seeding, kinds=("hard",))
    assert all(np.array_equal(alone[("hard", m)].labels, held[("hard", m)].labels) for m in (1, 2, 4))
