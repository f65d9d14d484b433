"""Our thief against a peer from another library, on the bundled digits models: the README's peer figures.

For each model (default ``digits_mlp-wide`` and ``digits_cnn``) and each
condition (clean answers; sigma for teacher retention 0.75, calibrated on the
pool), every seed gets one soft answer per pool row, and on those same answers:

* ours: the ``tuned`` recipe (T and weight decay by 3-fold agreement with its
  own noisy answers, no labels), and for context the strongest of
  light/strong/tuned picked on the evaluation labels (``extract``'s headline);
* the peer: ART's KnockoffNets with its learning rate, weight decay and passes
  chosen on a held-out fifth of its own answers
  (:mod:`caliber_core.extraction.peer`).

Printed per row: mean ± sd over the seeds of the evaluation accuracy, and the
paired difference ours - peer as mean ± standard error over seeds.
``tests/test_extraction_peer.py`` runs the same attackers on digits_mlp-wide
with three seeds.

    python benchmarks/bench_peer.py [--models mlp-wide cnn] [--seeds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _stat(x: np.ndarray) -> str:
    return f"{100 * x.mean():5.1f} ± {100 * x.std(ddof=1):.1f}%"


def run_model(name: str, seeds: list[int]) -> None:
    import torch

    from caliber_core.calibration.calibrate import calibrate_model, sigma_for_target
    from caliber_core.extraction.answers import answer_queries
    from caliber_core.extraction.archive import load_archive
    from caliber_core.extraction.attacker import Request, Thief
    from caliber_core.extraction.peer import knockoff_nets_peer

    torch.set_num_threads(1)
    archive = load_archive(ROOT / "data" / f"digits_{name}.npz")
    ev = archive.evaluation
    cal = calibrate_model(archive.pool.logits, archive.pool.labels)
    for label, retention in (("clean", None), ("retention 0.75", 0.75)):
        t0 = time.perf_counter()
        sigma = 0.0 if retention is None else float(sigma_for_target(cal, retention, kind="retention").sigma)
        answers = [answer_queries(archive.pool.logits, sigma=sigma, seed=s)[("soft", 1)] for s in seeds]
        thief = Thief(archive.pool.inputs, ev.inputs, ev.labels, np.argmax(ev.logits, axis=1),
                      n_classes=archive.n_classes)
        recipes = ("tuned", "light", "strong")
        outcomes = thief.train([Request(a, r, s) for r in recipes for a, s in zip(answers, seeds)])
        acc = np.array([o.accuracy for o in outcomes]).reshape(len(recipes), len(seeds))
        tuned = acc[0]
        strongest = acc[int(np.argmax(acc.mean(axis=1)))]
        peers = [knockoff_nets_peer(archive, a, seed=s) for a, s in zip(answers, seeds)]
        peer = np.array([p.accuracy for p in peers])
        diff = tuned - peer
        chosen = sorted({(p.chosen.learning_rate, p.chosen.weight_decay) for p in peers})
        passes = [p.chosen.epochs for p in peers]
        print(f"  {label:<15} sigma={sigma:<7.4g} ours (tuned) {_stat(tuned)}  ART KnockoffNets (tuned) "
              f"{_stat(peer)}  ours - ART {100 * diff.mean():+.1f} ± {100 * diff.std(ddof=1) / np.sqrt(len(diff)):.1f}"
              f" pt (s.e.)")
        print(f"  {'':<15} strongest recipe on evaluation labels {_stat(strongest)}; ART chose lr/decay "
              f"{', '.join(f'{lr:g}/{wd:g}' for lr, wd in chosen)}, {min(passes)}-{max(passes)} passes "
              f"({time.perf_counter() - t0:.0f} s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp-wide", "cnn"], help="digits_<name>.npz in data/")
    parser.add_argument("--seeds", type=int, default=5, help="replicate seeds 0..N-1 (default 5)")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds must be at least 2 (a spread needs two), got {args.seeds}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"accuracy on the evaluation split, mean ± sd over {args.seeds} seeds")
    for name in args.models:
        print(f"digits_{name}:")
        run_model(name, list(range(args.seeds)))
    return 0


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("extraction-peer", "--models"), "Our thief against the KnockoffNets of ART on the same answers"):
        raise SystemExit(main())
