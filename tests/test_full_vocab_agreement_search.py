"""The unlabelled dump path's shortcuts keep its numbers: the reduction, the digest, the quadrature, the search."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from caliber_core.calibration import vocab_sigma
from caliber_core.calibration.full_vocab import reduce_file
from caliber_core.calibration.gap_histogram import N_BINS, ReducedRows, bin_edges, reduce_block, row_bounds
from caliber_core.calibration.vocab_sigma import AGREEMENT_STEP, mean_bounds
from caliber_core.calibration.margins import scale_from_margins
from caliber_core.simulation.llm_like import llm_like_logits

V = 16_384


@pytest.fixture(scope="module")
def logits():
    return llm_like_logits(48, V, seed=11, dtype=np.float32)


def reference_reduction(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The reduction spelled out: sorted gaps, the rest counted by searching the bin edges."""
    lower, upper = bin_edges()
    gaps = np.sort(x.max(axis=1, keepdims=True) - x, axis=1)[:, 1:]  # the top's own 0 dropped
    counts = np.zeros((x.shape[0], N_BINS), dtype=np.int64)
    for i, row in enumerate(gaps[:, m:]):
        idx = np.searchsorted(lower, row, side="right") - 1
        assert np.all((row < upper[idx]) | np.isinf(upper[idx]))
        counts[i] = np.bincount(idx, minlength=N_BINS)
    return gaps[:, :m].astype(np.float64), counts


def test_the_reduction_matches_its_plain_definition_on_awkward_rows(logits):
    x = logits[:12].copy()
    x[0, :-20] = -np.inf  # fewer finite gaps than kept ones: +inf gaps in the last bin
    x[1, ::2] = x[1].max()  # ties at the top
    x[2] = 0.0  # every gap is +0.0
    x[3, 100:] -= 1e4  # gaps far past 2 ** HIGH_EXP, beyond the first kept ones
    x[4, :-5] = -1e30  # only 4 gaps below the last bin: the kept ones reach into it
    for m in (1, 32):
        top, counts = reduce_block(x, m=m)
        ref_top, ref_counts = reference_reduction(x, m)
        np.testing.assert_array_equal(top, ref_top)
        np.testing.assert_array_equal(counts, ref_counts)


def test_the_streamed_file_gives_the_blockwise_reduction_and_the_file_digest(logits, tmp_path, monkeypatch):
    path = tmp_path / "dump.npy"
    np.save(path, logits)
    monkeypatch.setattr("caliber_core.calibration.vocab_stream.BLOCK_BYTES", 5 * V * 4)  # many blocks in flight
    reduced, _, sha = reduce_file(path)
    top, counts = reduce_block(logits)
    np.testing.assert_array_equal(reduced.top_gaps, top)
    np.testing.assert_array_equal(reduced.counts, counts)
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_agreement_quadrature_step_keeps_its_stated_error(logits):
    """AGREEMENT_STEP against a 4x finer rule: each row over the display grid, the sigma at each target."""
    from scipy.optimize import brentq

    g, c = reduce_block(logits)
    red = ReducedRows(g, c, V)
    scale = scale_from_margins(g[:, 0], statistic="median")
    for sigma in np.geomspace(scale / 20, scale * 20, 9):
        used = row_bounds(red, sigma, step=AGREEMENT_STEP)
        fine = row_bounds(red, sigma, step=AGREEMENT_STEP / 4)
        assert np.max(np.abs(used.agree_lo - fine.agree_lo)) < 5e-5, sigma
        assert np.max(np.abs(used.agree_hi - fine.agree_hi)) < 5e-5, sigma
    for target, tol in ((0.9, 1e-7), (0.5, 1e-7), (0.1, 2e-5), (0.01, 2e-5)):
        roots = [brentq(lambda s: _midpoint(red, s, step) - target, 1e-3, 1e3, rtol=1e-11)
                 for step in (AGREEMENT_STEP, AGREEMENT_STEP / 4)]
        assert abs(roots[0] - roots[1]) / roots[1] < tol, target


def test_the_search_serves_the_root_of_the_fine_rule_in_few_evaluations(logits, monkeypatch):
    """Each target: at most 3 evaluations past the display grid, and the fine rule's root within 2e-5."""
    from scipy.optimize import brentq

    from caliber_core.calibration import full_vocab

    g, c = reduce_block(logits)
    red = ReducedRows(g, c, V)
    evaluations = []
    real = vocab_sigma.row_bounds
    monkeypatch.setattr(vocab_sigma, "row_bounds", lambda *a, **k: evaluations.append(a[1]) or real(*a, **k))
    targets = (0.9, 0.8, 0.5)
    records, config = full_vocab.config_for_full_vocab(red, [("agreement", t) for t in targets], name="lm")
    assert len(evaluations) <= 3 * len(targets), evaluations
    for target, record in zip(targets, records):
        fine = brentq(lambda s: _midpoint(red, s, 0.05) - target, record.sigma * 0.98, record.sigma * 1.02,
                      rtol=1e-11)
        assert abs(record.sigma - fine) / fine < 2e-5, target
        lo, hi = mean_bounds(red, record.sigma)
        assert lo - 1e-6 <= target <= hi + 1e-6, target
        assert record.interval["agreement"] == [lo, hi]


def _midpoint(red, sigma, step):
    b = row_bounds(red, sigma, step=step)
    return 0.5 * (b.agree_lo.mean() + b.agree_hi.mean())


def test_the_trailing_digest_is_the_files_and_every_block_is_let_go(logits, tmp_path, monkeypatch):
    """The digest trails the reduction; it still hashes every byte in order, and each block is let go once."""
    from caliber_core.calibration import vocab_stream
    from caliber_core.loading.row_stream import MappedMatrix

    path = tmp_path / "dump.npy"
    np.save(path, logits)
    monkeypatch.setattr(vocab_stream, "BLOCK_BYTES", 3 * V * 4)
    monkeypatch.setattr(vocab_stream, "HASH_LAG_BYTES", 7 * V * 4)  # the reduction waits for the digest often
    released = []
    real_release = MappedMatrix.release
    monkeypatch.setattr(MappedMatrix, "release",
                        lambda self, a, b: released.append((a, b)) or real_release(self, a, b))
    reduced, _, digest = vocab_stream.reduce_file_hashing(path)
    assert digest.result() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest.result() == digest.result()  # kept once done
    blocks = [(a, min(a + 3, len(logits))) for a in range(0, len(logits), 3)]
    assert sorted(released) == blocks  # once each, by whichever of the digest and the reducer was last
    top, counts = reduce_block(logits)
    np.testing.assert_array_equal(reduced.top_gaps, top)
    np.testing.assert_array_equal(reduced.counts, counts)
    _, _, given_up = vocab_stream.reduce_file_hashing(path)
    given_up.close()  # a caller that failed: nothing left running, the map closed
    given_up.close()


def test_a_config_from_the_file_records_the_files_digest_after_its_solve(logits, tmp_path):
    from caliber_core.calibration.full_vocab import config_for_vocab_file

    path = tmp_path / "dump.npy"
    np.save(path, logits)
    _, config = config_for_vocab_file(path, [("agreement", 0.9)])
    assert config["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="out of reach"):
        config_for_vocab_file(path, [("agreement", 1e-9)])  # below chance: the solve fails
