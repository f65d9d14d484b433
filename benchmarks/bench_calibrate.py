"""Calibration speed and precision at ImageNet scale (K = 1000).

One process run does it all and prints the figures:

1. builds synthetic 2,000 x 1,000 and 50,000 x 1,000 logits files
   (caliber_core.simulation.synthetic; clearly synthetic, ImageNet-like geometry);
2. times the straightforward torch sweep, the baseline:
   24 sigma values x 64 fresh draws, add noise, argmax, mean;
3. times ``python -m caliber_core calibrate FILE --retention 0.9 0.8 0.7 0.6``
   end to end in a fresh process (start, load, sweep, fit, inversion, intervals,
   config written), ``--runs`` times, and reports the median and the peak memory
   (ru_maxrss from wait4);
4. checks the in-sample error: accuracy measured at each returned sigma* on the
   same rows by an independent torch Monte Carlo, against the target.

The load average is printed next to the timings: the machine is shared, and
both the baseline and the command slow down under load.

Usage: python benchmarks/bench_calibrate.py [--skip-large] [--runs N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core.calibration.margins import margin_scale  # noqa: E402
from caliber_core.simulation.synthetic import make_synthetic_logits  # noqa: E402

RETENTIONS = (0.9, 0.8, 0.7, 0.6)


def write_file(path: Path, n: int, k: int, seed: int) -> None:
    logits, labels = make_synthetic_logits(n, k, clean_accuracy=0.75, seed=seed)
    np.savez(path, logits=logits, labels=labels, name=np.array(f"synthetic-{n}x{k}"))


def baseline_torch_sweep(logits: np.ndarray, labels: np.ndarray, *, n_sigma=24, draws=64) -> tuple[float, float]:
    """The straightforward sweep: a fresh noise tensor per (sigma, draw). Returns wall and CPU seconds."""
    import torch

    z = torch.from_numpy(logits)
    y = torch.from_numpy(labels)
    s_med = margin_scale(logits)
    sigmas = s_med * np.sqrt(np.geomspace(1e-2, 10.0, n_sigma))
    gen = torch.Generator().manual_seed(0)
    start, cpu = time.perf_counter(), time.process_time()
    curve = []
    for s in sigmas:
        acc = 0.0
        for _ in range(draws):
            noisy = z + float(s) * torch.randn(z.shape, generator=gen)
            acc += (noisy.argmax(dim=1) == y).float().mean().item()
        curve.append(acc / draws)
    return time.perf_counter() - start, time.process_time() - cpu


def run_cli(path: Path, out: Path) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (GB) and CPU seconds of one CLI calibration in a fresh process."""
    cmd = [sys.executable, "-m", "caliber_core", "calibrate", str(path),
           "--retention", *map(str, RETENTIONS), "--out", str(out), "--quiet"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024**2, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB on Linux


def independent_accuracy(logits, labels, sigma, *, draws, seed) -> tuple[float, float]:
    """Fresh torch Monte Carlo (not the project's code): accuracy and its standard error."""
    import torch

    z = torch.from_numpy(logits)
    y = torch.from_numpy(labels)
    gen = torch.Generator().manual_seed(seed)
    per_input = torch.zeros(z.shape[0], dtype=torch.float64)
    for _ in range(draws):
        noisy = z + float(sigma) * torch.randn(z.shape, generator=gen)
        per_input += (noisy.argmax(dim=1) == y).double()
    p = (per_input / draws).numpy()
    se = np.sqrt(np.sum(p * (1 - p)) / (draws * p.size**2))
    return float(p.mean()), float(se)


def precision_check(path: Path, config_path: Path, *, draws: int) -> list[tuple]:
    with np.load(path) as f:
        logits, labels = f["logits"], f["labels"]
    config = json.loads(config_path.read_text())
    rows = []
    for i, t in enumerate(config["targets"]):
        acc, se = independent_accuracy(logits, labels, t["sigma"], draws=draws, seed=1000 + i)
        rows.append((t["retention"], t["accuracy"], t["sigma"], acc, se,
                     (acc - t["accuracy"]) / t["accuracy"] * 100))
    return rows


def report_precision(rows) -> None:
    print(f"  {'retention':>9} {'target':>8} {'sigma*':>9} {'measured':>9} {'+/-se':>7} {'rel err %':>9}")
    for r in rows:
        print(f"  {r[0]:>9.2f} {r[1]:>8.4f} {r[2]:>9.4f} {r[3]:>9.4f} {r[4]:>7.4f} {r[5]:>+9.3f}")
    errs = np.abs([r[5] for r in rows])
    print(f"  mean |relative error| {errs.mean():.3f}%   worst {errs.max():.3f}%")
    return float(errs.max())


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="skip the 50,000-row file")
    parser.add_argument("--workdir", help="where the synthetic files go (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=5, help="CLI runs per file (median reported)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="caliber-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cores; files in {work}")

    small = work / "synthetic_2000x1000.npz"
    write_file(small, 2000, 1000, seed=0)
    with np.load(small) as f:
        logits, labels = f["logits"], f["labels"]
    print(f"\n== 2,000 x 1,000 (A0 {np.mean(logits.argmax(1) == labels):.4f}) ==")
    print(f"load average before: {_load()}")
    t_base, cpu_base = baseline_torch_sweep(logits, labels)
    print(f"baseline torch sweep (24 sigma x 64 draws, one run): {t_base:7.2f} s  (CPU {cpu_base:.2f} s)")
    runs = [run_cli(small, work / "small.json") for _ in range(args.runs)]
    t_cli = float(np.median([r[0] for r in runs]))
    rss = max(r[1] for r in runs)
    cpu_cli = float(np.median([r[2] for r in runs]))
    print(f"caliber calibrate, end to end, median of {args.runs}: {t_cli:7.2f} s  "
          f"(runs {', '.join(f'{r[0]:.2f}' for r in runs)} s; CPU {cpu_cli:.2f} s; peak RSS {rss:.2f} GB)")
    print(f"load average after: {_load()}")
    print(f"speedup (baseline / median CLI run): {t_base / t_cli:.1f}x "
          f"(target >= 25x: {'yes' if t_base / t_cli >= 25 else 'NO'}); "
          f"in CPU seconds: {cpu_base / cpu_cli:.1f}x")
    print("in-sample error (independent torch Monte Carlo on the same rows, 200 draws per sigma*):")
    worst = report_precision(precision_check(small, work / "small.json", draws=200))
    print(f"  target <= 0.5%: {'yes' if worst <= 0.5 else 'NO'}")

    if args.skip_large:
        return
    large = work / "synthetic_50000x1000.npz"
    write_file(large, 50_000, 1000, seed=1)
    print("\n== 50,000 x 1,000 ==")
    t_cli, rss, _ = run_cli(large, work / "large.json")
    print(f"caliber calibrate, end to end, one run: {t_cli:.2f} s  (peak RSS {rss:.2f} GB)")
    print(f"targets: under 60 s: {'yes' if t_cli < 60 else 'NO'}; under 3 GB: {'yes' if rss < 3 else 'NO'}")
    print("precision (independent torch Monte Carlo, 16 draws per sigma*):")
    report_precision(precision_check(large, work / "large.json", draws=16))


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("calibrate-speed", "--skip-large", "--runs"), "Calibration speed and peak memory on synthetic ImageNet-scale logits"):
        main()
