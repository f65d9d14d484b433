"""argmax_monte_carlo draws a block of rows at a time in place: the very numbers of the whole-array formula."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.simulation.reference import argmax_monte_carlo


def _whole_array(z, y, sigmas, realizations, seed):
    # The formula written out: one (N, K) draw per realization, z + s * noise, argmax, mean.
    rng = np.random.default_rng(seed)
    pred = np.argmax(z, axis=1)
    acc, agr = [], []
    for s in sigmas:
        a = g = 0.0
        for _ in range(realizations):
            noisy = np.argmax(z + s * rng.standard_normal(z.shape), axis=1)
            a += np.mean(noisy == y)
            g += np.mean(noisy == pred)
        acc.append(a / realizations)
        agr.append(g / realizations)
    return np.array(acc), np.array(agr)


@pytest.mark.parametrize("shape", [(5, 3), (700, 9), (1_000, 600), (3, 300_000)])
def test_blocks_give_the_whole_array_numbers(shape):
    rng = np.random.default_rng(shape[0])
    z = rng.normal(size=shape) * 2
    y = rng.integers(0, shape[1], shape[0])
    sigmas = [0.0, 0.7, 3.0]
    got = argmax_monte_carlo(z, y, sigmas, realizations=3, seed=11)
    want = _whole_array(z, y, sigmas, 3, 11)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)  # bit for bit, not approximately


def test_float32_logits_and_a_shared_generator():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(900, 40)).astype(np.float32)
    y = rng.integers(0, 40, 900)
    shared = np.random.default_rng(5)
    first = argmax_monte_carlo(z, y, [1.1], realizations=2, seed=shared)
    second = argmax_monte_carlo(z, y, [1.1], realizations=2, seed=shared)  # the stream goes on
    plain = np.random.default_rng(5)
    pred = np.argmax(z, axis=1)
    for got in (first, second):
        a = g = 0.0
        for _ in range(2):
            noisy = np.argmax(z + 1.1 * plain.standard_normal(z.shape), axis=1)
            a += np.mean(noisy == y)
            g += np.mean(noisy == pred)
        assert got[0][0] == a / 2 and got[1][0] == g / 2
