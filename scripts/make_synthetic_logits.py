"""Write SYNTHETIC logits (no model, no data set) to an .npz for scale tests.

Usage::

    .venv/bin/python scripts/make_synthetic_logits.py N K OUT.npz [--accuracy A] [--seed S]

The file holds ``logits`` (float32, N x K), ``labels`` (int64, N) and ``name``
(0-d unicode, e.g. ``synthetic-2000x1000``); it loads with ``allow_pickle=False``.
See :func:`caliber_core.simulation.synthetic.make_synthetic_logits` for the geometry.
Do not commit large generated files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script, the package is not installed
    sys.path.insert(0, str(REPO_ROOT))

from caliber_core.calibration.margins import clean_accuracy, margin_scale  # noqa: E402
from caliber_core.simulation.synthetic import make_synthetic_logits  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n_samples", type=int, metavar="N", help="number of rows")
    parser.add_argument("n_classes", type=int, metavar="K", help="number of classes")
    parser.add_argument("out", type=Path, metavar="OUT.npz", help="output file")
    parser.add_argument("--accuracy", type=float, default=0.75, help="clean accuracy (0, 1]")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        logits, labels = make_synthetic_logits(
            args.n_samples, args.n_classes, clean_accuracy=args.accuracy, seed=args.seed
        )
    except ValueError as exc:
        parser.error(str(exc))  # one line, exit status 2
    name = f"synthetic-{args.n_samples}x{args.n_classes}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, logits=logits, labels=labels, name=np.array(name))
    print(
        f"wrote {args.out}: {name} (SYNTHETIC), seed {args.seed}, "
        f"A0 {clean_accuracy(logits, labels):.4f}, median margin S {margin_scale(logits):.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
