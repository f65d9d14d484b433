"""The bundled digits logits in data/: format, split hygiene, spread, reproducibility."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.margins import clean_accuracy, margin_scale

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
FILES = sorted(DATA_DIR.glob("digits_*.npz"))
N_CLASSES = 10
N_PIXELS = 64
SPLITS = {"": "calibration", "heldout_": "held-out"}
# The cheapest model to retrain (about a second); any model would do.
REPRODUCE_ARCH = "logreg-pool"
# Same machine and torch build: the rerun is bitwise equal in practice; 1e-5
# absolute leaves room for other CPUs' float32 summation order.
REPRODUCE_ATOL = 1e-5


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _script():
    """Import scripts/make_demo_data.py (needs scikit-learn, a data-script-only dependency)."""
    pytest.importorskip("sklearn")
    name = "make_demo_data"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, REPO_ROOT / "scripts" / "make_demo_data.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_at_least_six_models_are_bundled():
    assert len(FILES) >= 6, [p.name for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_loads_without_pickle_and_is_well_formed(path):
    arrays = _load(path)  # raises on any object array
    arch = path.stem.removeprefix("digits_")
    assert arrays["name"].shape == ()
    assert arrays["name"].dtype.kind == "U"
    assert str(arrays["name"]) == f"digits-{arch}"
    for prefix in SPLITS:
        logits = arrays[f"{prefix}logits"]
        labels = arrays[f"{prefix}labels"]
        inputs = arrays[f"{prefix}inputs"]
        indices = arrays[f"{prefix}indices"]
        n = labels.shape[0]
        assert n >= 100
        assert logits.shape == (n, N_CLASSES) and logits.dtype == np.float32
        assert labels.shape == (n,) and labels.dtype == np.int64
        assert inputs.shape == (n, N_PIXELS) and inputs.dtype == np.float32
        assert indices.shape == (n,) and indices.dtype == np.int64
        assert np.isfinite(logits).all()
        assert labels.min() >= 0 and labels.max() < N_CLASSES
        # Every class appears (the split is stratified).
        assert set(np.unique(labels)) == set(range(N_CLASSES))
        # Raw digits pixels: integers 0..16.
        assert inputs.min() >= 0 and inputs.max() <= 16
        assert np.array_equal(inputs, np.round(inputs))


def test_all_models_share_one_split():
    first = _load(FILES[0])
    for path in FILES[1:]:
        arrays = _load(path)
        for prefix in SPLITS:
            for key in ("labels", "inputs", "indices"):
                assert np.array_equal(arrays[prefix + key], first[prefix + key]), (path, key)


def test_calibration_and_heldout_are_disjoint():
    arrays = _load(FILES[0])
    cal, held = arrays["indices"], arrays["heldout_indices"]
    assert len(np.unique(cal)) == len(cal)
    assert len(np.unique(held)) == len(held)
    assert np.intersect1d(cal, held).size == 0
    # Digits has no duplicate images, so disjoint indices must also mean no shared pixel row.
    cal_rows = {row.tobytes() for row in arrays["inputs"]}
    shared = sum(row.tobytes() in cal_rows for row in arrays["heldout_inputs"])
    assert shared == 0


def test_inputs_and_labels_are_the_digits_rows_named_by_indices():
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    arrays = _load(FILES[0])
    for prefix in SPLITS:
        idx = arrays[prefix + "indices"]
        np.testing.assert_array_equal(arrays[prefix + "inputs"], digits.data[idx])
        np.testing.assert_array_equal(arrays[prefix + "labels"], digits.target[idx])


def test_models_spread_in_accuracy_and_margin_scale():
    accuracies, scales = [], []
    for path in FILES:
        arrays = _load(path)
        accuracies.append(clean_accuracy(arrays["logits"], arrays["labels"]))
        scales.append(margin_scale(arrays["logits"]))
    assert max(accuracies) - min(accuracies) >= 0.15, accuracies
    assert max(scales) / min(scales) >= 2.0, scales
    # Every model is a real classifier: well above chance, none perfect.
    assert min(accuracies) > 0.5 and max(accuracies) < 1.0, accuracies


def test_every_architecture_has_its_file():
    module = _script()
    assert {f"digits_{a}.npz" for a in module.ARCHITECTURES} == {p.name for p in FILES}


def test_readme_table_matches_the_files():
    module = _script()
    rows = [module.summarize(_load(module.output_path(a))) for a in module.ARCHITECTURES]
    readme = (DATA_DIR / "README.md").read_text()
    assert module.format_table(rows) in readme


def test_retraining_one_model_reproduces_the_committed_logits():
    module = _script()
    committed = _load(module.output_path(REPRODUCE_ARCH))
    fresh = module.make_model_data(REPRODUCE_ARCH)
    assert set(fresh) == set(committed)
    for key in ("logits", "heldout_logits"):
        np.testing.assert_allclose(fresh[key], committed[key], rtol=0, atol=REPRODUCE_ATOL)
    for key in ("labels", "inputs", "indices", "heldout_labels", "heldout_inputs", "name"):
        np.testing.assert_array_equal(fresh[key], committed[key])


def test_unknown_architecture_is_rejected():
    module = _script()
    with pytest.raises(ValueError, match="arch must be one of .* got 'resnet'"):
        module.train_model("resnet", module.load_splits())
