"""Does sigma* deliver the target? An independent check of the command line.

For each logits file: run ``python -m caliber_core calibrate FILE`` with
retention targets 90/80/70/60% and agreement targets 0.9/0.8/0.7/0.6, then
measure accuracy and agreement at every returned sigma* with a fresh torch
Monte Carlo (no project code involved) and print the relative errors.

Usage: python benchmarks/check_calibration.py [FILE ...] [--draws N]
(default: every bundled data/*.npz)

Writes the figures to docs/figures/calibration-error.md, with each check's own
Monte-Carlo standard error (the spread of the per-draw means over the draws).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from figure_files import FigureFile

ROOT = Path(__file__).resolve().parents[1]
RETENTIONS = ("0.9", "0.8", "0.7", "0.6")
AGREEMENTS = ("0.9", "0.8", "0.7", "0.6")


def measure(logits, labels, sigma, *, draws, seed):
    """Fresh-noise accuracy and agreement (means over draws and inputs), each with its standard error."""
    z = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float64))
    pred = z.argmax(dim=1)
    y = None if labels is None else torch.from_numpy(labels.astype(np.int64))
    gen = torch.Generator().manual_seed(seed)
    acc, agr = [], []
    for _ in range(draws):
        noisy = (z + float(sigma) * torch.randn(z.shape, generator=gen, dtype=z.dtype)).argmax(dim=1)
        agr.append((noisy == pred).double().mean().item())
        if y is not None:
            acc.append((noisy == y).double().mean().item())
    acc = np.array(acc if acc else [0.0])
    agr = np.array(agr)
    se = lambda x: float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0  # noqa: E731
    return (float(acc.mean()), se(acc)), (float(agr.mean()), se(agr))


def check_file(path: Path, *, draws: int, workdir: Path) -> list[tuple]:
    out = workdir / (path.stem + ".json")
    cmd = [sys.executable, "-m", "caliber_core", "calibrate", str(path), "--quiet",
           "--retention", *RETENTIONS, "--agreement", *AGREEMENTS, "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    config = json.loads(out.read_text())
    with np.load(path) as f:
        logits, labels = f["logits"], f["labels"]
    rows = []
    for i, t in enumerate(config["targets"]):
        acc, agr = measure(logits, labels, t["sigma"], draws=draws, seed=7919 + i)
        if t["kind"] == "agreement":
            rows.append(("agreement", t["requested"], t["sigma"], t["agreement"], *agr))
        else:
            rows.append(("retention", t["requested"], t["sigma"], t["accuracy"], *acc))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--draws", type=int, default=400, help="Monte-Carlo draws per sigma*")
    args = parser.parse_args()
    files = args.files or sorted((ROOT / "data").glob("*.npz"))
    errors = {"retention": [], "agreement": []}
    ses = {"retention": [], "agreement": []}
    per_file = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            print(f"{path.name}")
            mine = {"retention": ([], []), "agreement": ([], [])}
            for kind, req, sigma, target, got, se in check_file(path, draws=args.draws, workdir=Path(tmp)):
                rel = (got - target) / target * 100
                errors[kind].append(abs(rel))
                ses[kind].append(se / target * 100)
                mine[kind][0].append(abs(rel))
                mine[kind][1].append(se / target * 100)
                print(f"  {kind:>9} {req:<4} sigma*={sigma:<9.4f} target={target:.4f} "
                      f"measured={got:.4f} ± {se:.4f} (s.e.) rel err={rel:+.3f}%")
            per_file.append((path.stem, mine))
    for kind, errs in errors.items():
        e = np.array(errs)
        print(f"{kind}: mean |relative error| {e.mean():.3f}%, worst {e.max():.3f}% over {e.size} targets")

    def cell(errs, se):
        return f"{np.mean(errs):.3f}% / {np.max(errs):.3f}% (± {np.min(se):.3f}–{np.max(se):.3f}%)"

    fig = FigureFile("calibration-error", "Solver check: what each sigma* delivers on the rows it was solved on")
    rows = [[f"`{name}`", cell(*mine["retention"]), cell(*mine["agreement"])] for name, mine in per_file]
    rows.append([f"**all {len(per_file)} files**", cell(errors["retention"], ses["retention"]),
                 cell(errors["agreement"], ses["agreement"])])
    fig.table(["model", "retention 0.9/0.8/0.7/0.6: mean / worst relative error (check's s.e.)",
               "agreement 0.9/0.8/0.7/0.6: mean / worst relative error (check's s.e.)"], rows)
    fig.note(f"Each sigma* from `calibrate` is measured with a fresh torch Monte Carlo that shares no code "
             f"with the project ({args.draws} draws of every row); the check's own standard error, relative to "
             f"the target, is in brackets (the range over the file's targets). This checks the solver and the "
             f"curve it inverts on the same rows; what sigma* delivers on new rows is the interval check.")
    fig.write()


if __name__ == "__main__":
    main()
