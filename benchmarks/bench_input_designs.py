"""Errors a student can learn: designs keyed on the input against the served field, across campaign sizes.

Measures :func:`caliber_core.extraction.input_frontier.measure_input_frontier`
on a synthetic archive (``scripts/make_extraction_archive.py``) at each pool
size in turn, for the served field and the input-keyed designs of
:mod:`caliber_core.extraction.input_designs`, and rewrites
``docs/figures/<figure>.md`` and ``.json`` after each size, so that a run cut
short still states exactly which sizes it measured::

    python benchmarks/bench_input_designs.py --archive /tmp/syn41-32k.npz --sizes 2000 8000 --keys 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from figure_files import FIGURES_DIR, FigureFile  # noqa: E402

from caliber_core.extraction.input_designs import INPUT_DESIGNS  # noqa: E402
from caliber_core.extraction.input_frontier import measure_input_frontier  # noqa: E402
from caliber_core.extraction.noise_designs import SERVED_DESIGN  # noqa: E402
from caliber_core.extraction.archive import load_archive  # noqa: E402
from caliber_core.extraction.pool_sizes import (SizedFrontier, check_pool_sizes, sizes_table,  # noqa: E402
                                                sizes_to_json)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archive", required=True, help="extraction archive with inputs (make_extraction_archive.py)")
    ap.add_argument("--sizes", nargs="+", type=int, default=[2000, 8000])
    ap.add_argument("--designs", nargs="+", default=[SERVED_DESIGN, *INPUT_DESIGNS])
    ap.add_argument("--level", type=float, default=0.75, help="the flagged user's retention target")
    ap.add_argument("--keys", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--near-duplicates", type=int, default=16)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--figure", default="input-designs", help="figure name under docs/figures")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if not Path(args.archive).exists():
        print(f"error: no archive at {args.archive}; write one with scripts/make_extraction_archive.py",
              file=sys.stderr)
        return 2
    archive = load_archive(args.archive)
    try:
        sizes = check_pool_sizes(args.sizes, archive.pool.n_samples, archive.n_classes, name=args.archive)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.time()
    done = SizedFrontier(args.archive, [], [])
    for n in sizes:
        done.frontiers.append(measure_input_frontier(args.archive, designs=args.designs, level=args.level,
                                                     keys=args.keys, seeds=args.seeds,
                                                     near_duplicates=args.near_duplicates,
                                                     processes=args.processes, pool_rows=n))
        done.sizes.append(n)
        print(f"{n} queries: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
        fig = FigureFile(args.figure, "Designs keyed on the input against the served field, across campaign sizes")
        fig.note("\n".join(sizes_table(done)))
        missing = [s for s in sorted(set(args.sizes)) if s not in done.sizes]
        fig.note("σ/S of an input design is its strength: σ/S for `input-field-*`, the cut t on the cells' "
                 "keyed uniforms for `cells-swap-*`. `seams:` is the thief that knows the cell design "
                 "(caliber_core/extraction/cell_seams.py); `unmix:` the one that knows the class cycle; "
                 "`copiesMxs:` the one that spends the budget on M jittered copies of fewer inputs "
                 "(jitter s feature standard deviations), answered by the teacher at the copies, and averages "
                 "them (`...all:` trains on every copy; caliber_core/extraction/input_copies.py).")
        fig.note(f"Pool sizes measured: {', '.join(f'{s:,}' for s in done.sizes)}"
                 + (f"; not measured in this run: {', '.join(f'{s:,}' for s in missing)}." if missing else ".")
                 + f" {time.time() - start:.0f} s of training over {args.processes} processes.")
        fig.write()
        (FIGURES_DIR / f"{args.figure}.json").write_text(sizes_to_json(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
