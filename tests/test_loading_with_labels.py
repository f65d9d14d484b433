"""with_labels_bytes: a separate labels file attached to logits already read gives what one load of both gives."""

from __future__ import annotations

import io

import numpy as np
import pytest

from caliber_core.loading import LogitsFileError, load_logits_bytes, with_labels_bytes


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a))
    return buf.getvalue()


@pytest.fixture
def files():
    rng = np.random.default_rng(7)
    z = rng.normal(size=(300, 5)).astype(np.float32)
    y = rng.integers(0, 5, size=300)
    return _npy(z), _npy(y), z, y


def test_same_as_loading_both_files(files):
    content, labels, z, y = files
    both = load_logits_bytes(content, "run.npy", labels_content=labels, labels_filename="run_labels.npy")
    first = load_logits_bytes(content, "run.npy")
    attached = with_labels_bytes(first, labels, "run_labels.npy")
    np.testing.assert_array_equal(attached.labels, both.labels)
    assert attached.labels.dtype == both.labels.dtype == np.int64
    assert attached.logits is first.logits  # not read again
    np.testing.assert_array_equal(attached.logits, both.logits)
    np.testing.assert_array_equal(attached.margins, both.margins)
    for name in ("name", "sha256", "source", "labels_source", "warnings"):
        assert getattr(attached, name) == getattr(both, name), name
    assert first.labels is None  # the original is left as it was


def test_refusals_match_loading_both_files(files):
    content, _, _, y = files
    first = load_logits_bytes(content, "run.npy")
    for labels, name in ((_npy(y[:-1]), "short.npy"), (_npy(np.full(300, 5)), "big.npy"), (b"", "empty.npy"),
                         (b"0\n1\n", "labels.bin")):
        with pytest.raises(LogitsFileError) as both:
            load_logits_bytes(content, "run.npy", labels_content=labels, labels_filename=name)
        with pytest.raises(LogitsFileError) as attached:
            with_labels_bytes(first, labels, name)
        assert str(attached.value) == str(both.value)


def test_replacing_stored_labels_warns(files):
    _, labels, z, y = files
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=(y + 1) % 5)
    first = load_logits_bytes(buf.getvalue(), "run.npz")
    attached = with_labels_bytes(first, labels, "run_labels.npy")
    np.testing.assert_array_equal(attached.labels, y)
    assert attached.warnings[0] == "labels from run_labels.npy replace the labels stored in run.npz"
