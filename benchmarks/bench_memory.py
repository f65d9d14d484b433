"""Peak memory per logit element of ``calibrate``, ``check``, ``extract`` and the dashboard's calibration.

For each shape (N, K) the script writes a float32 ``.npz`` (logits and labels)
and a 2,000 x K baseline file, runs each command in a fresh process, reads
the child's peak resident set size from ``os.wait4`` (``ru_maxrss``) and
prints

    bytes per element = (peak(N x K) - peak(B x K)) / (N x K)

with B = 2,000 baseline rows (N / 10 when N is 2,000 itself). The baseline
holds the interpreter, numpy and scipy and the command's fixed costs at that
K, so the figure is what the data themselves cost. The commands:

* ``calibrate``: ``python -m caliber_core calibrate FILE --quiet --out CONFIG``;
* ``check``: ``python -m caliber_core check CONFIG FILE``, with a config
  calibrated on the baseline file;
* ``dashboard``: what the Calibrate page runs for an uploaded file: the
  upload's bytes through ``load_logits_bytes``, then
  ``caliber_dashboard.common.cache.calibration`` (outside a Streamlit session);
* ``extract``: ``python -m caliber_core extract ARCHIVE`` with one seed, one
  query per input, the fixed attacks, a linear student and one process, on an
  archive of its own shape (``--extract-shape``, default 20,000 x 100, with
  16 float32 input features per row and a 2,000-row evaluation split; the
  baseline archive has 2,000 query rows): training surrogates on millions of
  rows would take hours, and the figure is per logit element all the same.

The table is also written to ``docs/figures/memory.md`` (with the date, the
machine and this command).

Usage::

    python benchmarks/bench_memory.py [--shapes 2000000x2 2000000x10 20000x1000 2000x32000]
                                      [--commands calibrate check dashboard extract]
                                      [--extract-shape 20000x100] [--workdir DIR] [--no-figure]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINE_ROWS = 2_000
DEFAULT_SHAPES = ("2000000x2", "2000000x10", "20000x1000", "2000x32000")
COMMANDS = ("calibrate", "check", "dashboard", "extract")
EXTRACT_FEATURES = 16
EXTRACT_EVAL_ROWS = 2_000
FIGURE = ROOT / "docs" / "figures" / "memory.md"


def write_logits(path: Path, n: int, k: int, *, seed: int) -> None:
    """A float32 npz of n x k logits (the label's column raised by 2.5) and int64 labels, built in blocks."""
    rng = np.random.default_rng(seed)
    logits = np.empty((n, k), dtype=np.float32)
    labels = rng.integers(0, k, size=n)
    block = max(1, 4_000_000 // k)
    for start in range(0, n, block):
        stop = min(n, start + block)
        part = rng.standard_normal((stop - start, k), dtype=np.float32)
        part[np.arange(stop - start), labels[start:stop]] += 2.5
        logits[start:stop] = part
    np.savez(path, logits=logits, labels=labels)


def write_archive(path: Path, n: int, k: int, *, seed: int) -> None:
    """An extraction archive: n query rows and an evaluation split, float32 inputs and logits, int64 labels.

    The logits are a fixed linear map of the inputs plus noise, so a student has something to learn.
    """
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((EXTRACT_FEATURES, k), dtype=np.float32)

    def split(rows):
        inputs = rng.standard_normal((rows, EXTRACT_FEATURES), dtype=np.float32)
        logits = inputs @ weights + rng.standard_normal((rows, k), dtype=np.float32)
        labels = np.argmax(logits + rng.standard_normal((rows, k), dtype=np.float32), axis=1)
        return inputs, logits, labels

    x, z, y = split(n)
    hx, hz, hy = split(EXTRACT_EVAL_ROWS)
    np.savez(path, inputs=x, logits=z, labels=y, heldout_inputs=hx, heldout_logits=hz, heldout_labels=hy)


def peak_rss(argv: list[str]) -> tuple[int, float, int]:
    """Run ``argv``; return the child's peak RSS in bytes, its wall seconds and exit status."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    # A child's ru_maxrss starts at its parent's RSS when forked (this process held the arrays it
    # wrote): a small interpreter forks the command and reports its status and peak.
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    status, peak = map(int, proc.stdout.split())
    if status not in (0, 3):  # check exits 3 on drift, which is still a full run
        raise SystemExit(f"{' '.join(argv)} exited {status}: {proc.stderr.strip()[-400:]}")
    return peak, wall, status


_LAUNCHER = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
             "_, s, u = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(s), u.ru_maxrss * 1024)")


# The Calibrate page's path for an uploaded file: its bytes, the upload loader, the cached calibration.
_DASHBOARD = ("import sys; from pathlib import Path; from caliber_core.loading import load_logits_bytes; "
              "from caliber_dashboard.common import cache; p = Path(sys.argv[1]); "
              "cache.calibration(load_logits_bytes(p.read_bytes(), p.name))")
_EXTRACT_OPTIONS = ["--seeds", "1", "--m", "1", "--attack", "fixed", "--student", "linear",
                    "--retention", "0.9", "--processes", "1", "--quiet"]


def command(name: str, data: Path, config: Path, out: Path) -> list[str]:
    cli = [sys.executable, "-m", "caliber_core"]
    if name == "calibrate":
        return cli + ["calibrate", str(data), "--quiet", "--out", str(out)]
    if name == "check":
        return cli + ["check", str(config), str(data)]
    if name == "dashboard":
        return [sys.executable, "-c", _DASHBOARD, str(data)]
    if name == "extract":
        return cli + ["extract", str(data), *_EXTRACT_OPTIONS]
    raise ValueError(f"unknown command {name!r}")


def baseline_rows(n: int) -> int:
    """2,000 rows, or a tenth of N when N is not larger (the 2,000 x 32,000 shape)."""
    return BASELINE_ROWS if n > BASELINE_ROWS else max(200, n // 10)


def parse_shape(text: str) -> tuple[int, int]:
    n, k = text.lower().split("x")
    return int(n), int(k)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    parser.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=COMMANDS)
    parser.add_argument("--extract-shape", default="20000x100", help="N x K of the extraction archive")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--no-figure", action="store_true", help="print only; leave docs/figures/memory.md")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="caliber-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    head = f"{'command':>10} {'N':>10} {'K':>7} {'elements':>12} {'peak MB':>9} {'baseline MB':>12} " \
           f"{'B/element':>10} {'wall s':>7}"
    print(head, flush=True)
    def measure(name, n, k, base_rows, big, small, config):
        out = work / f"out-{name}-{n}x{k}.json"
        base, _, _ = peak_rss(command(name, small, config, out))
        peak, wall, _ = peak_rss(command(name, big, config, out))
        per = (peak - base) / (n * k)
        rows.append((name, n, k, base_rows, peak, base, per, wall))
        print(f"{name:>10} {n:>10,} {k:>7,} {n * k:>12,} {peak / 1e6:>9.0f} {base / 1e6:>12.0f} "
              f"{per:>10.1f} {wall:>7.1f}", flush=True)

    per_file = [c for c in args.commands if c != "extract"]
    for text in args.shapes if per_file else ():
        n, k = parse_shape(text)
        base_rows = baseline_rows(n)
        big, small = work / f"logits-{n}x{k}.npz", work / f"logits-{base_rows}x{k}.npz"
        for path, rows_ in ((big, n), (small, base_rows)):
            if not path.exists():
                write_logits(path, rows_, k, seed=rows_ + k)
        config = work / f"config-{base_rows}x{k}.json"
        if "check" in per_file and not config.exists():
            peak_rss(command("calibrate", small, config, config))
        for name in per_file:
            measure(name, n, k, base_rows, big, small, config)
    if "extract" in args.commands:
        n, k = parse_shape(args.extract_shape)
        base_rows = baseline_rows(n)
        big, small = work / f"archive-{n}x{k}.npz", work / f"archive-{base_rows}x{k}.npz"
        for path, rows_ in ((big, n), (small, base_rows)):
            if not path.exists():
                write_archive(path, rows_, k, seed=rows_ + k)
        measure("extract", n, k, base_rows, big, small, None)
    if not args.no_figure:
        write_figure(rows, argv if argv is not None else sys.argv[1:])
    return 0


def write_figure(rows, argv) -> None:
    cmd = "python benchmarks/bench_memory.py" + ("".join(f" {a}" for a in argv) if argv else "")
    lines = [
        f"Measured {datetime.date.today().isoformat()} on {platform.platform()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, with `{cmd}`. "
        f"Float32 `.npz` input with labels; peak RSS from `wait4`; bytes per element = (peak - peak "
        f"on the baseline rows B x K) / (N x K). `dashboard` is the Calibrate page's calibration of an "
        f"uploaded file (`load_logits_bytes`, then `caliber_dashboard.common.cache.calibration`); `extract` runs "
        f"on an archive with {EXTRACT_FEATURES} input features per row and a {EXTRACT_EVAL_ROWS:,}-row "
        f"evaluation split (`{' '.join(_EXTRACT_OPTIONS)}`).",
        "",
        "| command | N | K | elements | baseline rows B | peak MB | baseline MB | bytes / element | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, k, b, peak, base, per, wall in rows:
        lines.append(f"| {name} | {n:,} | {k:,} | {n * k:,} | {b:,} | {peak / 1e6:.0f} | {base / 1e6:.0f} | "
                     f"{per:.1f} | {wall:.1f} |")
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    FIGURE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {FIGURE.relative_to(ROOT)}")


if __name__ == "__main__":
    raise SystemExit(main())
