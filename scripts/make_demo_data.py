"""Train small torch classifiers on scikit-learn's bundled digits; cache their logits.

Regenerate every bundled file (about half a minute on 2 CPU cores)::

    .venv/bin/python scripts/make_demo_data.py

or one model: ``.venv/bin/python scripts/make_demo_data.py --arch logreg-pool``.

The 1797 digits images are split once, stratified, with ``SPLIT_SEED`` into
disjoint train / calibration / held-out sets (797 / 500 / 500). Each model in
``ARCHITECTURES`` is trained on (part of) the train split and its logits on the
calibration and held-out splits are written to ``data/digits_<arch>.npz``
(arrays only; loads with ``allow_pickle=False``). The models deliberately differ
in capacity, training budget and regularization so that clean accuracy A0 and
the margin scale S spread out: the same sigma must hurt them differently.

Nothing is downloaded: ``sklearn.datasets.load_digits`` ships with scikit-learn.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script, the package is not installed
    sys.path.insert(0, str(REPO_ROOT))

from caliber_core.calibration.margins import clean_accuracy, margin_scale  # noqa: E402

DATA_DIR = REPO_ROOT / "data"
SPLIT_SEED = 0
N_CALIBRATION = 500
N_HELDOUT = 500
N_CLASSES = 10
PIXEL_MAX = 16.0  # digits pixels are integers in [0, 16]; models divide by this


@dataclass(frozen=True)
class Splits:
    """The one fixed split of digits; ``*_indices`` index ``load_digits()`` rows."""

    train_inputs: np.ndarray
    train_labels: np.ndarray
    train_indices: np.ndarray
    cal_inputs: np.ndarray
    cal_labels: np.ndarray
    cal_indices: np.ndarray
    heldout_inputs: np.ndarray
    heldout_labels: np.ndarray
    heldout_indices: np.ndarray


@dataclass(frozen=True)
class Recipe:
    """How one architecture is trained (full-batch, so runs are reproducible)."""

    name: str
    build: str  # key of _BUILDERS
    n_train: int | None  # first n of a seeded stratified subset of train; None = all
    steps: int
    lr: float
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    seed: int = 0
    description: str = ""


ARCHITECTURES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe(
            "logreg-raw", "logreg_raw", None, steps=300, lr=0.05, weight_decay=1e-3,
            description="multinomial logistic regression on the raw 64 pixels",
        ),
        Recipe(
            "logreg-pool", "logreg_pool", None, steps=300, lr=0.05,
            description="logistic regression on a 2x2 average-pooled (4x4 = 16 inputs) image",
        ),
        Recipe(
            "mlp-narrow", "mlp_narrow", 20, steps=200, lr=0.02,
            description="MLP 64-16-10 trained on only 20 training images (2 per class)",
        ),
        Recipe(
            "mlp-wide", "mlp_wide", None, steps=400, lr=0.003,
            description="MLP 64-256-128-10, no regularization, trained to fit",
        ),
        Recipe(
            "cnn", "cnn", None, steps=300, lr=0.003, weight_decay=1e-4,
            description="CNN: conv3x3(16)-conv3x3(32)-maxpool-linear on the 8x8 image",
        ),
        Recipe(
            "mlp-smooth", "mlp_wide", None, steps=300, lr=0.003, label_smoothing=0.6,
            description="MLP 64-256-128-10 with heavy label smoothing (0.6): small margins",
        ),
        Recipe(
            "mlp-brief", "mlp_narrow", None, steps=25, lr=0.01,
            description="MLP 64-16-10 stopped after 25 steps: undertrained, tiny margins",
        ),
    ]
}


class _Scale(nn.Module):
    """Divide raw pixels (0..16) by PIXEL_MAX so every model takes the stored inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / PIXEL_MAX


class _Image(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 1, 8, 8)


def _logreg_raw() -> nn.Module:
    return nn.Sequential(_Scale(), nn.Linear(64, N_CLASSES))


def _logreg_pool() -> nn.Module:
    return nn.Sequential(
        _Scale(), _Image(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, N_CLASSES)
    )


def _mlp_narrow() -> nn.Module:
    return nn.Sequential(_Scale(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, N_CLASSES))


def _mlp_wide() -> nn.Module:
    return nn.Sequential(
        _Scale(),
        nn.Linear(64, 256), nn.ReLU(),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, N_CLASSES),
    )


def _cnn() -> nn.Module:
    return nn.Sequential(
        _Scale(), _Image(),
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),  # 32 x 4 x 4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, N_CLASSES),
    )


_BUILDERS = {
    "logreg_raw": _logreg_raw,
    "logreg_pool": _logreg_pool,
    "mlp_narrow": _mlp_narrow,
    "mlp_wide": _mlp_wide,
    "cnn": _cnn,
}


def configure_torch() -> None:
    """Single-threaded, deterministic kernels: the committed logits must be reproducible."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def load_splits(*, seed: int = SPLIT_SEED) -> Splits:
    """Split digits once into stratified, disjoint train / calibration / held-out sets."""
    digits = load_digits()
    inputs = digits.data.astype(np.float32)
    labels = digits.target.astype(np.int64)
    indices = np.arange(len(labels), dtype=np.int64)
    rest, heldout = train_test_split(
        indices, test_size=N_HELDOUT, stratify=labels, random_state=seed
    )
    train, cal = train_test_split(
        rest, test_size=N_CALIBRATION, stratify=labels[rest], random_state=seed
    )
    train, cal, heldout = np.sort(train), np.sort(cal), np.sort(heldout)
    return Splits(
        train_inputs=inputs[train], train_labels=labels[train], train_indices=train,
        cal_inputs=inputs[cal], cal_labels=labels[cal], cal_indices=cal,
        heldout_inputs=inputs[heldout], heldout_labels=labels[heldout], heldout_indices=heldout,
    )


def _train_subset(splits: Splits, n_train: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if n_train is None or n_train >= len(splits.train_labels):
        return splits.train_inputs, splits.train_labels
    keep, _ = train_test_split(
        np.arange(len(splits.train_labels)),
        train_size=n_train,
        stratify=splits.train_labels,
        random_state=seed,
    )
    keep = np.sort(keep)
    return splits.train_inputs[keep], splits.train_labels[keep]


def train_model(arch: str, splits: Splits) -> nn.Module:
    """Train one architecture of ``ARCHITECTURES`` full-batch with Adam; return it in eval mode."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
    recipe = ARCHITECTURES[arch]
    configure_torch()
    torch.manual_seed(recipe.seed)
    model = _BUILDERS[recipe.build]()
    x_np, y_np = _train_subset(splits, recipe.n_train, recipe.seed)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    opt = torch.optim.Adam(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    model.train()
    for _ in range(recipe.steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return model.eval()


def compute_logits(model: nn.Module, inputs: np.ndarray) -> np.ndarray:
    """Logits of ``model`` on ``inputs`` (raw pixels, shape (n_samples, 64)), float32."""
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))).numpy()


def make_model_data(arch: str, splits: Splits | None = None) -> dict[str, np.ndarray]:
    """Train ``arch`` and return the arrays written to ``data/digits_<arch>.npz``."""
    splits = load_splits() if splits is None else splits
    model = train_model(arch, splits)
    return {
        "logits": compute_logits(model, splits.cal_inputs).astype(np.float32),
        "labels": splits.cal_labels.astype(np.int64),
        "name": np.array(f"digits-{arch}"),
        "inputs": splits.cal_inputs.astype(np.float32),
        "indices": splits.cal_indices.astype(np.int64),
        "heldout_logits": compute_logits(model, splits.heldout_inputs).astype(np.float32),
        "heldout_labels": splits.heldout_labels.astype(np.int64),
        "heldout_inputs": splits.heldout_inputs.astype(np.float32),
        "heldout_indices": splits.heldout_indices.astype(np.int64),
    }


def output_path(arch: str, data_dir: Path = DATA_DIR) -> Path:
    return Path(data_dir) / f"digits_{arch}.npz"


def summarize(arrays: dict[str, np.ndarray]) -> dict[str, object]:
    """Name, N, clean accuracy on both splits and the median top-two margin S."""
    return {
        "name": str(arrays["name"]),
        "n": int(arrays["logits"].shape[0]),
        "acc_cal": clean_accuracy(arrays["logits"], arrays["labels"]),
        "acc_heldout": clean_accuracy(arrays["heldout_logits"], arrays["heldout_labels"]),
        "scale": margin_scale(arrays["logits"]),
    }


def format_table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| file | name | N cal | A0 cal | A0 held-out | median margin S |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        arch = str(r["name"]).removeprefix("digits-")
        lines.append(
            f"| `digits_{arch}.npz` | {r['name']} | {r['n']} | {r['acc_cal']:.3f} "
            f"| {r['acc_heldout']:.3f} | {r['scale']:.3f} |"
        )
    return "\n".join(lines)


_README_TEMPLATE = """\
# Bundled demo data: digits classifiers' logits

Generated by `scripts/make_demo_data.py`; do not edit by hand. Regenerate (all files
and this README, about half a minute on 2 CPU cores) with

    .venv/bin/python scripts/make_demo_data.py

These are logits of **real** (small) classifiers, trained in torch on scikit-learn's
bundled digits data set (`sklearn.datasets.load_digits`: 1797 grey 8x8 images,
pixels are integers 0..16, 10 classes). Nothing is downloaded. For large-K scale tests
use the clearly synthetic generator `caliber_core.simulation.synthetic.make_synthetic_logits`
(`scripts/make_synthetic_logits.py`) instead; its output is not committed.

## Split

The 1797 images are split once, stratified by label, with
`sklearn.model_selection.train_test_split(random_state={seed})` (first the held-out
set, then the calibration set from the rest) into disjoint sets:

| split | images | used for |
|---|---:|---|
| train | {n_train} | fitting the models (some models see only a subset) |
| calibration | {n_cal} | `logits`, `labels`, `inputs`, `indices` |
| held-out | {n_heldout} | `heldout_logits`, `heldout_labels`, `heldout_inputs`, `heldout_indices` |

Digits has no duplicate images, so the three sets share no image row.

## Files

Each `digits_<arch>.npz` (`np.savez_compressed`, arrays only, loads with
`np.load(path, allow_pickle=False)`) holds:

| array | dtype | shape | meaning |
|---|---|---|---|
| `logits` | float32 | (500, 10) | the model's logits on the calibration split |
| `labels` | int64 | (500,) | true labels, 0..9 |
| `name` | unicode, 0-d | () | model name, e.g. `digits-mlp-wide` |
| `inputs` | float32 | (500, 64) | raw pixels 0..16, row-major 8x8 (models divide by 16 themselves) |
| `indices` | int64 | (500,) | row numbers in `load_digits()` order |
| `heldout_*` | as above | (500, ...) | the same four arrays for the held-out split |

## Models

Training: full batch, Adam, single thread, `torch.manual_seed(0)`,
`torch.use_deterministic_algorithms(True)`; subsets of the train split are drawn
stratified with seed 0.

| arch | model | train images | Adam steps | lr | weight decay | label smoothing |
|---|---|---:|---:|---:|---:|---:|
{recipes}

Clean accuracy A0 and median top-two logit margin S (on the calibration split;
`caliber_core.calibration.margins.clean_accuracy`, `top_two_margins` / `margin_scale`):

{table}
"""


def format_readme(splits: Splits, rows: list[dict[str, object]]) -> str:
    recipes = "\n".join(
        f"| {r.name} | {r.description} | {r.n_train or len(splits.train_labels)} "
        f"| {r.steps} | {r.lr:g} | {r.weight_decay:g} | {r.label_smoothing:g} |"
        for r in ARCHITECTURES.values()
    )
    return _README_TEMPLATE.format(
        seed=SPLIT_SEED,
        n_train=len(splits.train_labels),
        n_cal=len(splits.cal_labels),
        n_heldout=len(splits.heldout_labels),
        recipes=recipes,
        table=format_table(rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", action="append", choices=sorted(ARCHITECTURES),
        help="train only this model (repeatable); default: all",
    )
    parser.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)

    splits = load_splits()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for arch in args.arch or list(ARCHITECTURES):
        arrays = make_model_data(arch, splits)
        np.savez_compressed(output_path(arch, args.out_dir), **arrays)
        rows.append(summarize(arrays))
        print(f"wrote {output_path(arch, args.out_dir)}", flush=True)
    print(
        f"split seed {SPLIT_SEED}: train {len(splits.train_labels)}, "
        f"calibration {len(splits.cal_labels)}, held-out {len(splits.heldout_labels)}"
    )
    print(format_table(rows))
    if not args.arch:  # the README describes the full set only
        readme = args.out_dir / "README.md"
        readme.write_text(format_readme(splits, rows))
        print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
