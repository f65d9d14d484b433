"""The loader's fast paths give what the plain ones did: same arrays, same verdicts, own memory.

* the margin check takes top-two margins a block of rows at a time;
* a whole ``.npy`` is read as a view of its bytes, then converted (one copy);
* finiteness is checked by min/max before any mask is built.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from caliber_core.calibration.margins import top_two_margins
from caliber_core.loading import LogitsFileError, checks, load_logits_bytes


@pytest.mark.parametrize("n, k, chunk", [(1, 2, 4), (1000, 7, 70), (1001, 7, 70), (999, 7, 7), (50, 3, 1 << 20)])
def test_chunked_margins_equal_one_pass(monkeypatch, n, k, chunk):
    monkeypatch.setattr(checks, "_MARGIN_CHUNK_ELEMENTS", chunk)
    z = np.random.default_rng(n * k).normal(size=(n, k))
    z[::5, 1] = z[::5, 0]  # ties: margin 0
    got = checks.margins_in_chunks(z)
    assert got.dtype == np.float64 and got.shape == (n,)
    assert np.array_equal(got, top_two_margins(z))


def test_degenerate_verdict_across_chunks(monkeypatch):
    monkeypatch.setattr(checks, "_MARGIN_CHUNK_ELEMENTS", 40)  # 10 rows per block of K=4
    z = np.zeros((300, 4))
    z[:100, 0] = 1.0  # the rows with a winner all sit in the first blocks
    with pytest.raises(LogitsFileError, match=r"f\.npy: logits are degenerate: .* 67% of rows tie"):
        checks.check_margin_scale(z, "f.npy")
    z[:, 0] = np.arange(300) + 1.0
    checks.check_margin_scale(z, "f.npy")  # every row has a winner: no error


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8", ">f8", "<f2", "<i4"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_view_then_copy_gives_the_same_float64_array(dtype, order):
    z = np.random.default_rng(1).normal(size=(40, 7)) * 5
    z[np.arange(40), np.arange(40) % 7] += 3
    src = np.asarray(z.astype(dtype), order=order)
    content = _npy(src)
    data = load_logits_bytes(content, "z.npy")
    assert data.logits.dtype == np.float64 and data.logits.flags.c_contiguous
    assert data.logits.flags.writeable and data.logits.flags.owndata
    assert np.array_equal(data.logits, src.astype(np.float64))
    data.logits[0, 0] = 1e6  # our own memory, not the upload's bytes
    assert load_logits_bytes(content, "z.npy").logits[0, 0] != 1e6


@pytest.mark.parametrize("bad, shown", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_non_finite_value_is_still_named(bad, shown, dtype):
    z = np.random.default_rng(2).normal(size=(50, 4)).astype(dtype)
    z[31, 2] = bad
    z[40, 1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the min/max test itself warns about nothing
        with pytest.raises(LogitsFileError, match=rf"z\.npy: logits row 31, column 2 is {shown} "):
            load_logits_bytes(_npy(z), "z.npy")


def test_largest_finite_values_pass():
    z = np.random.default_rng(3).normal(size=(30, 3))
    z[0, 0], z[1, 1] = np.finfo(np.float64).max, -np.finfo(np.float64).max
    z[2:, 0] += 5
    assert np.array_equal(load_logits_bytes(_npy(z), "z.npy").logits, z)


def test_truncated_npy_is_refused_before_any_view():
    content = _npy(np.zeros((100, 10), dtype=np.float32))
    with pytest.raises(LogitsFileError, match=r"truncated npy"):
        load_logits_bytes(content[:-4], "z.npy")


def _npy_bytes(z) -> bytes:
    buf = io.BytesIO()
    np.save(buf, z)
    return buf.getvalue()


def test_a_digest_the_caller_checked_is_used_as_given():
    import hashlib

    z = np.random.default_rng(3).normal(size=(40, 5)).astype(np.float32)
    content = _npy_bytes(z)
    plain = load_logits_bytes(content, "m.npy")
    assert plain.sha256 == hashlib.sha256(content).hexdigest()
    given = load_logits_bytes(content, "m.npy", sha256=plain.sha256)
    assert given.sha256 == plain.sha256
    assert np.array_equal(given.logits, plain.logits) and given.logits.dtype == np.float64
    # the validation still runs in full with a digest given
    bad = z.copy()
    bad[7, 2] = np.nan
    with pytest.raises(LogitsFileError, match="row 7, column 2"):
        load_logits_bytes(_npy_bytes(bad), "m.npy", sha256=plain.sha256)


@pytest.mark.parametrize("digest", ["", "ab" * 31, "AB" * 32, "g" * 64, 12])
def test_a_malformed_digest_is_refused(digest):
    content = _npy_bytes(np.eye(3))
    with pytest.raises(ValueError, match="64 lowercase hex"):
        load_logits_bytes(content, "m.npy", sha256=digest)


def test_the_loader_keeps_the_margins_it_checked():
    z = np.random.default_rng(5).normal(size=(300, 9)).astype(np.float32)
    data = load_logits_bytes(_npy_bytes(z), "m.npy")
    assert data.margins is not None and not data.margins.flags.writeable
    assert np.array_equal(data.margins, top_two_margins(data.logits))
    with pytest.raises(ValueError):
        data.margins[0] = 1.0
