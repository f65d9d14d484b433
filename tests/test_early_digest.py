"""A dump's digest begun before its header is read: the file's SHA-256 still, the same rows, every page let go once."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from caliber_core.calibration import vocab_stream
from caliber_core.calibration.gap_histogram import reduce_block
from caliber_core.cli import main
from caliber_core.loading import early_digest
from caliber_core.loading.early_digest import EarlyDigest, begin_digest
from caliber_core.loading.row_stream import MappedMatrix
from caliber_core.simulation.llm_like import llm_like_logits

V = 8_192


@pytest.fixture(scope="module")
def logits():
    return llm_like_logits(40, V, seed=31, dtype=np.float32)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("early_rows", [0.5, 7.3, 40, 60])  # inside the first block, across blocks, all, past the end
def test_a_digest_taken_over_is_the_files_and_every_block_is_let_go_once(logits, tmp_path, monkeypatch, early_rows):
    path = tmp_path / "dump.npy"
    np.save(path, logits)
    monkeypatch.setattr(vocab_stream, "BLOCK_BYTES", 3 * V * 4)
    monkeypatch.setattr(vocab_stream, "HASH_LAG_BYTES", 7 * V * 4)
    monkeypatch.setattr(early_digest, "_CHUNK", 2 * V * 4 + 100)  # chunks that do not line up with rows
    released = []
    real_release = MappedMatrix.release
    monkeypatch.setattr(MappedMatrix, "release", lambda self, a, b: released.append((a, b)) or real_release(self, a, b))
    early = EarlyDigest(path, limit=int(early_rows * V * 4))
    reduced, _, digest = vocab_stream.reduce_file_hashing(path, early_digest=early)
    assert digest.result() == sha(path)
    assert sorted(released) == [(a, min(a + 3, len(logits))) for a in range(0, len(logits), 3)]
    top, counts = reduce_block(logits)
    np.testing.assert_array_equal(reduced.top_gaps, top)
    np.testing.assert_array_equal(reduced.counts, counts)
    early.close()  # a no-op once taken over
    with pytest.raises(RuntimeError, match="taken over"):
        early.take_over()


def test_a_matrix_that_is_not_read_in_place_closes_the_early_digest_and_is_hashed_apart(logits, tmp_path):
    path = tmp_path / "half.npy"
    np.save(path, logits.astype(np.float16))  # converted block by block: not the map's bytes
    early = EarlyDigest(path)
    _, _, digest = vocab_stream.reduce_file_hashing(path, early_digest=early)
    assert digest.result() == sha(path)
    with pytest.raises(RuntimeError, match="closed"):
        early.take_over()


def test_a_bad_file_closes_the_early_digest(logits, tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, logits)
    path.write_bytes(path.read_bytes()[:-V])
    early = EarlyDigest(path)
    with pytest.raises(Exception, match="truncated"):
        vocab_stream.reduce_file_hashing(path, early_digest=early)
    assert early.map.closed


def test_only_a_large_file_in_a_streamed_format_gets_a_head_start(tmp_path, monkeypatch):
    small, text = tmp_path / "a.npy", tmp_path / "a.csv"
    small.write_bytes(b"\0" * 1000)
    text.write_bytes(b"\0" * 1000)
    assert begin_digest(small) is None and begin_digest(tmp_path / "missing.npy") is None
    monkeypatch.setattr(early_digest, "MIN_FILE_BYTES", 0)
    assert begin_digest(text) is None
    started = begin_digest(small)
    assert isinstance(started, EarlyDigest)
    started.close()
    started.close()
    assert started.map.closed


def test_the_cli_starts_the_digest_early_and_leaves_nothing_running(logits, tmp_path, monkeypatch, capsys):
    path = tmp_path / "dump.npy"
    np.save(path, logits)
    monkeypatch.setattr(early_digest, "MIN_FILE_BYTES", 0)
    begun = []
    real_begin = early_digest.begin_digest
    monkeypatch.setattr(early_digest, "begin_digest", lambda p: begun.append(real_begin(p)) or begun[-1])
    out = tmp_path / "cfg.json"
    assert main(["calibrate", str(path), "--agreement", "0.9", "--out", str(out), "--quiet"]) == 0
    assert isinstance(begun[0], EarlyDigest) and begun[0].map.closed
    assert json.loads(out.read_text())["sha256"] == sha(path)
    # A matrix the dump path does not take (too few classes) and a refused seeding close it too.
    narrow = tmp_path / "narrow.npy"
    np.save(narrow, logits[:, :100])
    main(["calibrate", str(narrow), "--agreement", "0.9", "--out", str(tmp_path / "n.json"), "--quiet"])
    assert main(["calibrate", str(path), "--agreement", "0.9", "--seeding", "consistent"]) == 2
    capsys.readouterr()
    assert all(d is not None and d.map.closed for d in begun[1:]) and len(begun) == 3
