"""The thief's frontier across campaign sizes: what the strongest thief keeps at 500 to 32,000 queries.

Measures :func:`caliber_core.extraction.pool_sizes.measure_pool_sizes` on a
synthetic archive (``scripts/make_extraction_archive.py``; written first when
``--archive`` does not exist) for per-input noise and the served field, one
size at a time, and rewrites ``docs/figures/frontier-sizes.md`` and
``docs/figures/frontier-sizes.json`` (which the dashboard's Extraction page
reads) after each size, so that a run cut short still states exactly which
sizes it measured.

    python benchmarks/bench_frontier_sizes.py --sizes 500 2000 8000 --keys 3 --seeds 1
    python benchmarks/bench_frontier_sizes.py --sizes 500 2000 8000 32000 --keys 4 --seeds 2 --processes 16

``--figure NAME`` writes ``docs/figures/NAME.md`` and ``NAME.json`` instead (a
second teacher's curve beside the first, which the Extraction page reads).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from figure_files import FIGURES_DIR, FigureFile  # noqa: E402

from caliber_core.extraction.noise_designs import SERVED_DESIGN  # noqa: E402
from caliber_core.extraction.pool_sizes import (SizedFrontier, measure_pool_sizes, sizes_table,  # noqa: E402
                                                sizes_to_json)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archive", default="/tmp/caliber-synthetic-32k.npz",
                    help="extraction archive; written by scripts/make_extraction_archive.py if absent")
    ap.add_argument("--pool", type=int, default=32000, help="pool rows of an archive written here (default 32000)")
    ap.add_argument("--sizes", nargs="+", type=int, default=[500, 2000, 8000, 32000])
    ap.add_argument("--designs", nargs="+", default=["per-input", SERVED_DESIGN])
    ap.add_argument("--level", type=float, default=0.75, help="the flagged user's retention target")
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--near-duplicates", type=int, default=16)
    ap.add_argument("--processes", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    ap.add_argument("--figure", default="frontier-sizes", help="figure name under docs/figures (default frontier-sizes)")
    ap.add_argument("--archive-options", default="",
                    help="options (one quoted string) for scripts/make_extraction_archive.py when it writes the archive")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if not Path(args.archive).exists():
        import make_extraction_archive

        make_extraction_archive.main(["--pool", str(args.pool), "--out", args.archive, *shlex.split(args.archive_options)])
    start = time.time()
    done = SizedFrontier(args.archive, [], [])
    for n in sorted(set(args.sizes)):
        one = measure_pool_sizes(args.archive, sizes=[n], designs=args.designs, levels=[args.level],
                                 keys=args.keys, seeds=args.seeds, near_duplicates=args.near_duplicates,
                                 processes=args.processes)
        done.sizes += one.sizes
        done.frontiers += one.frontiers
        print(f"{n} queries: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
        fig = FigureFile(args.figure, "The thief's retention across campaign sizes")
        fig.note("\n".join(sizes_table(done)))
        missing = [s for s in sorted(set(args.sizes)) if s not in done.sizes]
        fig.note(f"Pool sizes measured: {', '.join(f'{s:,}' for s in done.sizes)}"
                 + (f"; not measured in this run: {', '.join(f'{s:,}' for s in missing)}." if missing else ".")
                 + f" {time.time() - start:.0f} s of training over {args.processes} processes.")
        fig.write()
        (FIGURES_DIR / f"{args.figure}.json").write_text(sizes_to_json(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
