"""Server time of the dashboard's target readout: target in, sigma* out, no resweep.

The Calibrate page's slider calls ``sigma_for_target`` on a cached calibration.
This times that call for every slider position (retention 30-99%, agreement
30-99% in 1-point steps) on each bundled demo model and on a synthetic
2,000 x 1,000 file (Monte-Carlo curve), and prints the median and worst.

Usage: python benchmarks/bench_target_readout.py

Writes the figures to docs/figures/target-readout.md.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from figure_files import FigureFile  # noqa: E402

from caliber_core.calibration.calibrate import calibrate_model, sigma_for_target  # noqa: E402
from caliber_core.loading import load_logits  # noqa: E402
from caliber_core.simulation.synthetic import make_synthetic_logits  # noqa: E402


def time_readouts(cal, kind: str) -> np.ndarray:
    values = np.round(np.arange(0.30, 0.995, 0.01), 2)
    if kind == "agreement":
        values = values[values > 1.0 / cal.n_classes]
    out = []
    for value in values:
        start = time.perf_counter()
        sigma_for_target(cal, float(value), kind=kind, saturate=True)
        out.append((time.perf_counter() - start) * 1000)
    return np.array(out)


def main() -> None:
    models = [(p.stem, load_logits(p)) for p in sorted((ROOT / "data").glob("*.npz"))]
    print(f"load average {os.getloadavg()[0]:.2f} at start on {os.cpu_count()} CPUs; median and worst over "
          "the slider positions of each row (70: 30-99% in 1-point steps)")
    print(f"{'model':<28} {'curve':<12} {'kind':<10} {'median ms':>9} {'worst ms':>9}")
    worst, rows = [], []

    def row(name, curve, kind, t):
        q1, q3 = np.percentile(t, [25, 75])
        rows.append([f"`{name}`", curve, kind, f"{np.median(t):.1f}", f"{q1:.1f}–{q3:.1f}", f"{t.max():.1f}"])

    for name, data in models:
        cal = calibrate_model(data.logits, data.labels, name=name)
        for kind in ("retention", "agreement"):
            t = time_readouts(cal, kind)
            worst.append(t.max())
            row(name, cal.curve_method, kind, t)
            print(f"{name:<28} {cal.curve_method:<12} {kind:<10} {np.median(t):>9.1f} {t.max():>9.1f}")
    logits, labels = make_synthetic_logits(2000, 1000, seed=0)
    cal = calibrate_model(logits, labels, name="synthetic-2000x1000")
    t = time_readouts(cal, "retention")
    worst.append(t.max())
    row("synthetic 2,000 x 1,000", cal.curve_method, "retention", t)
    print(f"{'synthetic-2000x1000':<28} {cal.curve_method:<12} {'retention':<10} "
          f"{np.median(t):>9.1f} {t.max():>9.1f}")
    print(f"worst readout over all: {max(worst):.1f} ms (target: under 50 ms)")
    fig = FigureFile("target-readout", "Dashboard target readout: server time of one slider position "
                     "(sigma_for_target on a cached calibration)")
    fig.table(["model", "curve", "kind", "median ms", "interquartile range ms", "worst ms"], rows)
    fig.note("Over every slider position of a row (30–99% in 1-point steps). The worst positions move with "
             f"the machine's load from run to run; worst over all rows: {max(worst):.1f} ms.")
    fig.write()


if __name__ == "__main__":
    main()
