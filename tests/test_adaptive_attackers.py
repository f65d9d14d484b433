"""The adaptive thieves: prior correction (class-frequency matching) and matrix scaling with a few labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from caliber_core.extraction.prior_correction import corrected_predictions, prior_matching_bias
from caliber_core.extraction.recalibration import labelled_rows, matrix_scaling, recalibrated_predictions


def _softmax_mean(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).mean(axis=0)


def test_prior_matching_bias_reaches_the_prior():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2000, 5)) * 2 + np.array([3.0, 0, 0, -1, 0])  # class 0 pushed up
    b = prior_matching_bias(z)
    assert np.allclose(_softmax_mean(z + b), 0.2, atol=1e-5)
    assert b[0] < 0 and abs(b.mean()) < 1e-12
    prior = np.array([0.4, 0.15, 0.15, 0.15, 0.15])
    assert np.allclose(_softmax_mean(z + prior_matching_bias(z, prior=prior)), prior, atol=1e-5)


def test_prior_correction_undoes_a_class_bias():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 4000)
    clean = rng.normal(size=(4000, 4)) + 3.0 * np.eye(4)[labels]
    biased = clean + np.array([2.5, 0.0, 0.0, 0.0])
    before = np.mean(biased.argmax(1) == labels)
    after = np.mean(corrected_predictions(biased[:2000], biased[2000:]) == labels[2000:])
    assert after > before + 0.05 and after == pytest.approx(np.mean(clean[2000:].argmax(1) == labels[2000:]),
                                                            abs=0.03)


def test_prior_matching_refuses_bad_input():
    with pytest.raises(ValueError, match="shape"):
        prior_matching_bias(np.zeros(3))
    with pytest.raises(ValueError, match="prior"):
        prior_matching_bias(np.zeros((3, 2)), prior=[0.9, 0.9])


def test_labelled_rows_take_per_class():
    y = np.repeat(np.arange(3), [5, 20, 2])
    rows = labelled_rows(y, per_class=4, seed=0)
    assert np.bincount(y[rows]).tolist() == [4, 4, 2]
    with pytest.raises(ValueError, match="per_class"):
        labelled_rows(y, per_class=0)


def test_matrix_scaling_undoes_a_linear_mix_from_few_labels():
    torch.manual_seed(0)
    gen = np.random.default_rng(2)
    k = 5
    labels = gen.integers(0, k, 600)
    clean = gen.normal(size=(600, k)) * 0.7 + 2.0 * np.eye(k)[labels]
    mix = np.eye(k)[[1, 2, 3, 4, 0]]  # the logits' classes permuted: a worst-case affine distortion
    seen = torch.from_numpy(clean @ mix).float().unsqueeze(0)
    y = torch.from_numpy(labels)
    rows = torch.from_numpy(labelled_rows(labels, per_class=10))
    pred = recalibrated_predictions(seen[:, rows], y[rows], seen)
    assert float((seen.argmax(2) == y).float().mean()) < 0.3
    assert float((pred[0] == y).float().mean()) > 0.9
    w, b = matrix_scaling(seen[:, rows], y[rows])
    assert w.shape == (1, k, k) and b.shape == (1, 1, k)


def test_a_batch_of_students_is_solved_as_each_alone():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(3, 400, 6)) * np.array([1.0, 2.0, 4.0])[:, None, None] + rng.normal(size=(3, 1, 6))
    together = prior_matching_bias(z)
    for i in range(3):
        assert np.allclose(together[i], prior_matching_bias(z[i]), atol=1e-9)
    ev = rng.normal(size=(3, 50, 6))
    assert np.array_equal(corrected_predictions(z, ev)[1], corrected_predictions(z[1], ev[1]))
