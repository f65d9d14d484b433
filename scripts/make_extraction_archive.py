"""Write a synthetic extraction archive large enough for big query pools.

The task is scikit-learn's ``make_classification`` (Gaussian clusters around
the vertices of a hypercube, with redundant and noise features); the teacher
is a small torch MLP trained on a split of its own. Nothing is downloaded.
The archive holds the layout ``caliber extract`` reads
(:mod:`caliber_core.extraction.archive`): ``inputs``, ``logits``, ``labels``
for the thief's query pool and ``heldout_*`` for evaluation, so that
``extract --pool-sizes`` can measure the thief on pools up to ``--pool``
rows::

    .venv/bin/python scripts/make_extraction_archive.py --pool 32000 --out /tmp/synthetic-32k.npz

A second teacher, on a different task and with a different architecture
(20 classes, a wider and deeper MLP), for checking that a result is not one
teacher's::

    .venv/bin/python scripts/make_extraction_archive.py --pool 32000 --classes 20 --hidden 128 --layers 3 \
        --class-sep 2.0 --seed 1 --out /tmp/synthetic-20c-32k.npz

The archive also holds the teacher's layers (``teacher_weight_<i>``,
``teacher_bias_<i>``), so that a thief's new queries can be answered.
The train, pool and held-out rows are disjoint draws of one task; every
draw is seeded (``--seed``), so a file is a pure function of its options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script, the package is not installed
    sys.path.insert(0, str(REPO_ROOT))

N_FEATURES = 40
N_INFORMATIVE = 20
N_REDUNDANT = 10
N_CLASSES = 10
HIDDEN = 64


def make_task(n_rows: int, *, seed: int, class_sep: float = 1.75, flip_y: float = 0.05, n_classes: int = N_CLASSES):
    """Draw the task's inputs and labels, standardized by the first rows' statistics.

    Parameters
    ----------
    n_rows : int
        Rows of every split together.
    seed : int
        scikit-learn's ``random_state``.
    class_sep, flip_y : float
        ``make_classification``'s cluster spread and label noise (the task's difficulty).
    n_classes : int, default 10

    Returns
    -------
    x : ndarray of shape (n_rows, N_FEATURES), float32
    y : ndarray of shape (n_rows,), int64
    """
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=n_rows, n_features=N_FEATURES, n_informative=N_INFORMATIVE,
                               n_redundant=N_REDUNDANT, n_classes=n_classes, n_clusters_per_class=2,
                               class_sep=class_sep, flip_y=flip_y, shuffle=True, random_state=seed)
    return x.astype(np.float32), y.astype(np.int64)


def train_teacher(x: np.ndarray, y: np.ndarray, *, seed: int, steps: int = 300, hidden: int = HIDDEN,
                  layers: int = 2, n_classes: int = N_CLASSES):
    """A D-hidden-...-hidden-K MLP (``layers`` hidden layers) trained full-batch with Adam on (x, y).

    Parameters
    ----------
    x : ndarray of shape (n, D)
    y : ndarray of shape (n,)
    seed : int
        torch's seed (initial weights).
    steps : int, default 300
        Adam steps; the teacher is deliberately not trained to convergence, so
        that its margins spread out as a served model's do.
    hidden : int
        Units per hidden layer.
    layers : int, default 2
        Hidden layers.
    n_classes : int, default 10

    Returns
    -------
    torch.nn.Module
        In evaluation mode.
    """
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    widths = [x.shape[1]] + [hidden] * layers
    blocks = [m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
    model = nn.Sequential(*blocks, nn.Linear(widths[-1], n_classes))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return model.eval()


def logits_of(model, x: np.ndarray) -> np.ndarray:
    """The teacher's logits on ``x`` (float32)."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy().astype(np.float32)


def make_archive(*, pool: int, heldout: int = 2000, train: int = 4000, seed: int = 0, steps: int = 300,
                 class_sep: float = 1.75, n_classes: int = N_CLASSES, hidden: int = HIDDEN,
                 layers: int = 2) -> dict[str, np.ndarray]:
    """The archive's arrays: a teacher trained on ``train`` rows, answering ``pool`` and ``heldout`` others.

    Parameters
    ----------
    pool, heldout, train : int
        Rows of the thief's query pool, the evaluation split and the teacher's training split.
    seed : int
        Seeds the task and the teacher.
    steps : int
        The teacher's Adam steps.
    class_sep : float
        The task's cluster spread (smaller is harder).
    n_classes, hidden, layers : int
        The task's classes; the teacher's units per hidden layer and hidden layers.

    Returns
    -------
    dict of str to ndarray
        ``inputs``, ``logits``, ``labels``, ``heldout_inputs``, ``heldout_logits``, ``heldout_labels``, and the
        teacher's layers (:func:`teacher_layers`).

    Raises
    ------
    ValueError
        A split with fewer than 10 rows per class on average, or a class count, width or depth out of range.
    """
    for name, n, low in (("classes", n_classes, 2), ("hidden", hidden, 1), ("layers", layers, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise ValueError(f"--{name} must be an integer of at least {low}, got {n!r}")
    if n_classes * 2 > 2 ** N_INFORMATIVE:
        raise ValueError(f"--classes must be at most {2 ** N_INFORMATIVE // 2}, got {n_classes}")
    for name, n in (("pool", pool), ("heldout", heldout), ("train", train)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 10 * n_classes:
            raise ValueError(f"--{name} must be an integer of at least {10 * n_classes} rows, got {n!r}")
    x, y = make_task(train + pool + heldout, seed=seed, class_sep=class_sep, n_classes=n_classes)
    mean, std = x[:train].mean(axis=0), x[:train].std(axis=0) + 1e-6  # the provider's own feature scaling
    x = ((x - mean) / std).astype(np.float32)
    teacher = train_teacher(x[:train], y[:train], seed=seed, steps=steps, hidden=hidden, layers=layers,
                            n_classes=n_classes)
    p, h = slice(train, train + pool), slice(train + pool, train + pool + heldout)
    return {"inputs": x[p], "logits": logits_of(teacher, x[p]), "labels": y[p],
            "heldout_inputs": x[h], "heldout_logits": logits_of(teacher, x[h]), "heldout_labels": y[h],
            **teacher_layers(teacher)}


def teacher_layers(model) -> dict[str, np.ndarray]:
    """The teacher's linear layers as ``teacher_weight_<i>`` (out, in) and ``teacher_bias_<i>`` arrays (float32).

    A thief who asks *new* inputs (jittered copies of its queries,
    :mod:`caliber_core.extraction.input_copies`) needs the teacher's answers
    there, not only the cached logits; the layers are ReLU-separated.
    """
    from torch import nn

    linear = [m for m in model if isinstance(m, nn.Linear)]
    out = {}
    for i, layer in enumerate(linear):
        out[f"teacher_weight_{i}"] = layer.weight.detach().numpy().astype(np.float32)
        out[f"teacher_bias_{i}"] = layer.bias.detach().numpy().astype(np.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="where to write the .npz")
    ap.add_argument("--pool", type=int, default=32000, help="query pool rows (default 32000)")
    ap.add_argument("--heldout", type=int, default=2000, help="evaluation rows (default 2000)")
    ap.add_argument("--train", type=int, default=4000, help="the teacher's training rows (default 4000)")
    ap.add_argument("--steps", type=int, default=300, help="the teacher's Adam steps (default 300)")
    ap.add_argument("--class-sep", type=float, default=1.75,
                    help="make_classification's class_sep (default 1.75: a teacher near 0.77 held-out accuracy)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the task and the teacher (default 0)")
    ap.add_argument("--classes", type=int, default=N_CLASSES, help=f"the task's classes (default {N_CLASSES})")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help=f"teacher units per hidden layer (default {HIDDEN})")
    ap.add_argument("--layers", type=int, default=2, help="teacher hidden layers (default 2)")
    args = ap.parse_args(argv)
    try:
        arrays = make_archive(pool=args.pool, heldout=args.heldout, train=args.train, seed=args.seed,
                              steps=args.steps, class_sep=args.class_sep, n_classes=args.classes,
                              hidden=args.hidden, layers=args.layers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    np.savez_compressed(args.out, **arrays)
    acc = float(np.mean(arrays["heldout_logits"].argmax(1) == arrays["heldout_labels"]))
    print(f"{args.out}: {args.pool} pool rows, {args.heldout} held-out rows, {N_FEATURES} features, "
          f"{args.classes} classes, a {args.layers}-layer MLP of {args.hidden} units; "
          f"teacher held-out accuracy {acc:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
