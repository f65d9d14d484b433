"""Extraction: wall time of the judged command and the figures it is judged on.

    .venv/bin/python benchmarks/bench_extraction.py            # 3,000-row pool + a demo model
    .venv/bin/python benchmarks/bench_extraction.py --quick    # the demo model only

The 3,000-row pool is built here, deterministically, from scikit-learn's
digits: every image is shifted by up to one pixel and given N(0, 0.5) pixel
noise; a teacher MLP 64-128-10 trains on augmented copies of 797 images; the
pool holds 6 augmented copies of 500 other images and the evaluation split 2
copies of the remaining 500. It runs

    python -m caliber_core extract POOL --retention 0.95 0.85 0.75 --surrogate-retention 0.9 --seeds 3 --json R

as a subprocess, times it, and prints from the report: teacher accuracy against
r x A0 at each target, per-input flatness and fresh averaging at M=16, and the
surrogate retention reached at the returned sigma. Then it times the
dashboard's default run (3 seeds, retention 0.95/0.85/0.75, every recipe, averaged
answers attacked by the frontier attacker) on
the bundled mlp-wide demo model. Timings depend on what else runs on the machine.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _shift(img: np.ndarray, dx: int, dy: int) -> np.ndarray:
    out = np.zeros_like(img)
    h, w = img.shape
    out[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)] = img[max(dy, 0):h + min(dy, 0),
                                                                        max(dx, 0):w + min(dx, 0)]
    return out


def _augment(x: np.ndarray, copies: int, rng: np.random.Generator) -> np.ndarray:
    imgs = x.reshape(-1, 8, 8)
    out = []
    for _ in range(copies):
        shifts = rng.integers(-1, 2, size=(len(imgs), 2))
        a = np.stack([_shift(i, int(dx), int(dy)) for i, (dx, dy) in zip(imgs, shifts)])
        out.append(np.clip(a + rng.normal(0.0, 0.5, a.shape), 0, 16).reshape(len(x), 64))
    return np.concatenate(out).astype(np.float32)


def make_pool_archive(path: Path, *, seed: int = 0) -> None:
    """The 3,000-row digits pool archive described in the module docstring."""
    import torch
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    train, pool, held = order[:797], order[797:1297], order[1297:]
    x_train = np.concatenate([x[train], _augment(x[train], 12, rng)])
    y_train = np.tile(y[train], 13)
    x_pool, y_pool = _augment(x[pool], 6, rng), np.tile(y[pool], 6)
    x_eval, y_eval = _augment(x[held], 2, rng), np.tile(y[held], 2)
    gen = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for p in net.parameters():
        torch.nn.init.uniform_(p, -0.125, 0.125, generator=gen)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train / 16), torch.from_numpy(y_train)
    for _ in range(400):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    with torch.no_grad():
        z_pool = net(torch.from_numpy(x_pool / 16)).numpy()
        z_eval = net(torch.from_numpy(x_eval / 16)).numpy()
    np.savez_compressed(path, inputs=x_pool, logits=z_pool, labels=y_pool, heldout_inputs=x_eval,
                        heldout_logits=z_eval, heldout_labels=y_eval, name=np.array("digits-augmented-3000"))


def judged(report: dict) -> None:
    a0 = report["teacher"]["clean_accuracy"]
    print(f"  A0 (evaluation split) = {a0 * 100:.1f}%")
    for t in report["targets"]:
        if t["kind"] == "retention":
            print(f"  retention {t['requested']:.2f}: teacher {t['teacher_accuracy'] * 100:.1f}% vs r x A0 "
                  f"{t['requested'] * a0 * 100:.1f}% (diff {abs(t['teacher_accuracy'] - t['requested'] * a0) * 100:.1f} pt); "
                  f"surrogate {t['surrogate_accuracy']['mean'] * 100:.1f} ± {t['surrogate_accuracy']['sd'] * 100:.1f}% "
                  f"({t['attacker']})")
        elif t.get("reachable"):
            fr = t["frontier_retention"]
            clean = report["clean"]["surrogate_accuracy"]["mean"]
            print(f"  surrogate retention {t['requested']}: sigma={t['sigma']:.4g} ± {t['sigma_se'] or 0:.2g}, "
                  f"teacher {t['teacher_accuracy'] * 100:.1f}%, strongest surrogate "
                  f"{t['surrogate_accuracy']['mean'] * 100:.1f}% = {t['surrogate_accuracy']['mean'] / clean:.3f} of the "
                  f"clean headline; frontier attacker keeps {fr['mean']:.3f} ± {fr['sd']:.3f} (near seeds)")
    soft = [r for r in report["averaging"] if r["labels"] == "soft" and r["sigma"] > 0]
    per = [r["surrogate_accuracy"]["mean"] for r in soft if r["seeding"] == "per-input"]
    fresh = {r["m"]: r["surrogate_accuracy"]["mean"] for r in soft if r["seeding"] == "fresh"}
    clean = report["clean"]["surrogate_accuracy"]["mean"]
    if per and fresh:
        m_max = max(fresh)
        closed = (fresh[m_max] - fresh[1]) / (clean - fresh[1]) if clean > fresh[1] else float("nan")
        print(f"  per-input averaging spread over M: {(max(per) - min(per)) * 100:.2f} pt; fresh M=1 "
              f"{fresh[1] * 100:.1f}% -> M={m_max} {fresh[m_max] * 100:.1f}% vs clean {clean * 100:.1f}% "
              f"(closes {closed:.0%} of the gap)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 3,000-row pool")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:
            pool = Path(tmp) / "digits_aug3000.npz"
            make_pool_archive(pool)
            report_path = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "caliber_core", "extract", str(pool), "--retention", "0.95", "0.85",
                   "0.75", "--surrogate-retention", "0.9", "--seeds", "3", "--json", str(report_path)]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                print(out.stderr)
                return 1
            print(f"judged command on a 3,000-row pool: {wall:.1f} s wall (budget 240 s)")
            print("  " + " ".join(["python", "-m", "caliber_core", *cmd[3:]]))
            judged(json.loads(report_path.read_text()))
    from caliber_core.extraction.archive import load_archive
    from caliber_core.extraction.experiment import ExtractionSettings, run_extraction
    from caliber_core.extraction.report import to_report

    archive = load_archive(ROOT / "data" / "digits_mlp-wide.npz")
    t0 = time.perf_counter()
    result = run_extraction(archive, ExtractionSettings(averaging_attacker="frontier"))  # the page's default
    print(f"dashboard default run on {archive.name} (pool 500): {time.perf_counter() - t0:.1f} s wall "
          f"(budget 40 s), {result.runs} training runs")
    judged(to_report(result))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
