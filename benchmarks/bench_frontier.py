"""The thief's frontier per noise design: what a flagged user keeps (x) against what the strongest thief keeps (y).

For each design of :mod:`caliber_core.extraction.noise_designs`, each teacher
retention target and each key, sigma is solved exactly on the pool rows, the
pool is answered as served, and every thief of
:mod:`caliber_core.extraction.thief_frontier` distills from it (KD at
T = 1..32 and three weight decays, each plain and prior-corrected; hard
labels; 16 near-duplicates averaged). Prints one table per archive and the
thief's retention where the user keeps 0.75, and writes them to
docs/figures/frontier.md (``--out``) and the points to docs/figures/frontier.json (``--json``), which the
dashboard's Extraction page reads.

    python benchmarks/bench_frontier.py                       # quick: 3 designs, demo file, 2 keys, 1 seed
    python benchmarks/bench_frontier.py --full --processes 16 # every design, two teachers, 3 keys, 2 seeds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caliber_core.extraction.noise_designs import DESIGNS  # noqa: E402
from caliber_core.extraction.frontier_report import frontier_summary, frontier_table, frontier_to_json  # noqa: E402
from caliber_core.extraction.thief_frontier import DEFAULT_LEVELS, measure_frontier  # noqa: E402

QUICK_DESIGNS = ("per-input", "field-4", "field-2")
DEMO = ROOT / "data" / "digits_mlp-wide.npz"
SECOND = ROOT / "data" / "digits_cnn.npz"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archive", action="append", help="extraction archive(s) (default: the demo file)")
    ap.add_argument("--designs", nargs="+", choices=sorted(DESIGNS), help="noise designs")
    ap.add_argument("--levels", nargs="+", type=float, help="teacher retention targets")
    ap.add_argument("--keys", type=int, help="keys per point")
    ap.add_argument("--seeds", type=int, help="thief training seeds per key")
    ap.add_argument("--near-duplicates", type=int, default=16)
    ap.add_argument("--processes", type=int, default=max(1, min(16, (os.cpu_count() or 1))))
    ap.add_argument("--full", action="store_true", help="every design, both demo teachers, 3 keys, 2 seeds")
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "frontier.md"))
    ap.add_argument("--json", default=str(ROOT / "docs" / "figures" / "frontier.json"),
                    help="the points as JSON (the Extraction page reads docs/figures/frontier.json)")
    args = ap.parse_args(argv)
    archives = args.archive or ([str(DEMO), str(SECOND)] if args.full else [str(DEMO)])
    designs = args.designs or (sorted(DESIGNS) if args.full else list(QUICK_DESIGNS))
    levels = args.levels or (list(DEFAULT_LEVELS) if args.full else [0.85, 0.75, 0.65])
    keys = args.keys or (3 if args.full else 2)
    seeds = args.seeds or (2 if args.full else 1)
    start = time.time()
    frontiers = []
    for path in archives:
        def progress(done, total, _p=path):
            print(f"\r{Path(_p).name}: {done}/{total} cells, {time.time() - start:.0f} s", end="", file=sys.stderr,
                  flush=True)

        frontiers.append(measure_frontier(path, designs=designs, levels=levels, keys=keys, seeds=seeds,
                                          near_duplicates=args.near_duplicates, processes=args.processes,
                                          progress=progress))
        print(file=sys.stderr)
    shown, skip = [], False
    for a in (argv if argv is not None else sys.argv[1:]):
        if skip or a in ("--out", "--json"):  # where it wrote is not part of what it measured
            skip = not skip
            continue
        shown.append(shlex.quote(a))
    command = "python benchmarks/bench_frontier.py " + " ".join(shown)
    lines = [f"<!-- written by benchmarks/bench_frontier.py; do not edit by hand -->",
             f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on "
             f"{platform.platform()} ({os.cpu_count()} cores, {args.processes} processes, "
             f"{time.time() - start:.0f} s). Command: `{command.strip()}`", ""]
    for f in frontiers:
        lines += frontier_table(f) + [""]
    lines += frontier_summary(frontiers)
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(frontier_to_json(frontiers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
