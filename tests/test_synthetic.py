"""The SYNTHETIC large-K logit generator and its command-line script."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.margins import clean_accuracy, top_two_margins
from caliber_core.simulation.synthetic import CHUNK_ROWS, NEAR_MISS_FRACTION, make_synthetic_logits

REPO_ROOT = Path(__file__).resolve().parents[1]


def _runner_up(logits: np.ndarray) -> np.ndarray:
    return np.argpartition(logits, -2, axis=1)[:, -2]


def test_same_seed_same_output_other_seed_different():
    a_logits, a_labels = make_synthetic_logits(500, 50, seed=7)
    b_logits, b_labels = make_synthetic_logits(500, 50, seed=7)
    c_logits, c_labels = make_synthetic_logits(500, 50, seed=8)
    np.testing.assert_array_equal(a_logits, b_logits)
    np.testing.assert_array_equal(a_labels, b_labels)
    assert not np.array_equal(a_logits, c_logits)
    assert not np.array_equal(a_labels, c_labels)


def test_rows_do_not_depend_on_n_samples_across_chunks():
    small, small_labels = make_synthetic_logits(CHUNK_ROWS + 7, 20, seed=3)
    large, large_labels = make_synthetic_logits(3 * CHUNK_ROWS, 20, seed=3)
    np.testing.assert_array_equal(small, large[: CHUNK_ROWS + 7])
    np.testing.assert_array_equal(small_labels, large_labels[: CHUNK_ROWS + 7])
    # Chunks are independent draws, not copies of one another.
    assert not np.array_equal(large[:CHUNK_ROWS], large[CHUNK_ROWS : 2 * CHUNK_ROWS])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shapes_dtypes_and_ranges(dtype):
    logits, labels = make_synthetic_logits(300, 17, seed=1, dtype=dtype)
    assert logits.shape == (300, 17) and logits.dtype == dtype
    assert labels.shape == (300,) and labels.dtype == np.int64
    assert np.isfinite(logits).all()
    assert labels.min() >= 0 and labels.max() < 17


def test_default_dtype_is_float32():
    logits, _ = make_synthetic_logits(10, 5)
    assert logits.dtype == np.float32


@pytest.mark.parametrize("target", [0.3, 0.75, 0.95])
def test_clean_accuracy_matches_request(target):
    # Binomial sd at N=20000 is <= 0.0036, so 0.02 is over 5 sd.
    logits, labels = make_synthetic_logits(20_000, 100, clean_accuracy=target, seed=11)
    assert abs(clean_accuracy(logits, labels) - target) <= 0.02


def test_accuracy_one_is_exact():
    logits, labels = make_synthetic_logits(2000, 100, clean_accuracy=1.0, seed=2)
    assert clean_accuracy(logits, labels) == 1.0


def test_thousand_classes():
    logits, labels = make_synthetic_logits(2000, 1000, clean_accuracy=0.8, seed=5)
    assert logits.shape == (2000, 1000) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert labels.max() < 1000 and len(np.unique(labels)) > 800  # ~864 expected
    # Binomial sd at N=2000 is 0.009; 0.04 is over 4 sd.
    assert abs(clean_accuracy(logits, labels) - 0.8) <= 0.04


def test_two_classes():
    logits, labels = make_synthetic_logits(5000, 2, clean_accuracy=0.6, seed=4)
    assert abs(clean_accuracy(logits, labels) - 0.6) <= 0.03
    assert set(np.unique(labels)) == {0, 1}


def test_argmax_is_strict_in_float32():
    # A tie would silently hand the argmax to the lowest index and bias accuracy.
    logits, _ = make_synthetic_logits(20_000, 100, seed=9)
    assert top_two_margins(logits).min() > 0


def test_margins_are_spread_and_on_the_background_scale():
    logits, labels = make_synthetic_logits(20_000, 100, clean_accuracy=0.75, seed=12)
    m = top_two_margins(logits)
    background_sd = np.median(np.std(logits, axis=1))
    median = np.median(m)
    # Median margin comparable to the background noise scale, not >> or <<.
    assert 0.5 * background_sd < median < 3 * background_sd, (median, background_sd)
    q25, q75 = np.percentile(m, [25, 75])
    assert q75 / q25 > 3, (q25, q75)
    # Misclassified rows sit closer to the decision boundary, as in trained models.
    correct = np.argmax(logits, axis=1) == labels
    assert np.median(m[correct]) > 2 * np.median(m[~correct])


def test_misclassified_rows_often_have_the_label_as_runner_up():
    logits, labels = make_synthetic_logits(20_000, 100, clean_accuracy=0.75, seed=13)
    wrong = np.argmax(logits, axis=1) != labels
    near_miss = np.mean(_runner_up(logits[wrong]) == labels[wrong])
    # NEAR_MISS_FRACTION by construction plus ~1/99 by chance; ~5000 rows, sd ~0.007.
    assert abs(near_miss - NEAR_MISS_FRACTION) < 0.04, near_miss
    # A wrong argmax is spread over the other classes, not one fixed class.
    assert len(np.unique(np.argmax(logits[wrong], axis=1))) == 100


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_samples": 0}, r"n_samples must be >= 1, got 0"),
        ({"n_samples": -5}, r"n_samples must be >= 1, got -5"),
        ({"n_samples": 2.5}, r"n_samples must be an integer >= 1, got 2\.5"),
        ({"n_samples": True}, r"n_samples must be an integer >= 1, got True"),
        ({"n_classes": 1}, r"n_classes must be >= 2, got 1"),
        ({"n_classes": "10"}, r"n_classes must be an integer >= 2, got '10'"),
        ({"clean_accuracy": 0.0}, r"clean_accuracy must be in \(0, 1\], got 0\.0"),
        ({"clean_accuracy": 1.5}, r"clean_accuracy must be in \(0, 1\], got 1\.5"),
        ({"clean_accuracy": -0.1}, r"clean_accuracy must be in \(0, 1\], got -0\.1"),
        ({"clean_accuracy": float("nan")}, r"clean_accuracy must be in \(0, 1\], got nan"),
        ({"clean_accuracy": "high"}, r"clean_accuracy must be a number in \(0, 1\], got 'high'"),
        ({"dtype": np.int32}, r"dtype must be a floating dtype, got int32"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    args = {"n_samples": 10, "n_classes": 5, **kwargs}
    n_samples, n_classes = args.pop("n_samples"), args.pop("n_classes")
    with pytest.raises(ValueError, match=match):
        make_synthetic_logits(n_samples, n_classes, **args)


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_logits", REPO_ROOT / "scripts" / "make_synthetic_logits.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_writes_a_pickle_free_npz(tmp_path):
    out = tmp_path / "sub" / "syn.npz"
    assert _script().main(["300", "20", str(out), "--accuracy", "0.9", "--seed", "4"]) == 0
    with np.load(out, allow_pickle=False) as f:
        assert set(f.files) == {"logits", "labels", "name"}
        assert str(f["name"]) == "synthetic-300x20" and f["name"].shape == ()
        expected_logits, expected_labels = make_synthetic_logits(
            300, 20, clean_accuracy=0.9, seed=4
        )
        np.testing.assert_array_equal(f["logits"], expected_logits)
        np.testing.assert_array_equal(f["labels"], expected_labels)


def test_script_rejects_bad_arguments_with_a_message(tmp_path, capsys):
    out = tmp_path / "syn.npz"
    with pytest.raises(SystemExit) as excinfo:
        _script().main(["10", "5", str(out), "--accuracy", "2"])
    assert excinfo.value.code == 2
    assert "clean_accuracy must be in (0, 1], got 2.0" in capsys.readouterr().err
    assert not out.exists()
