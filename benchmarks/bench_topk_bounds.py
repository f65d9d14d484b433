"""Top-k logprob logs: how wide the certified agreement bounds are, and what at-least serves, against the truth.

Full 32,000-token vocabularies are drawn (:func:`caliber_core.simulation.llm_like.llm_like_logits`)
at three tail shapes; only each position's top k logprobs are kept, as an API
log would show them. For each shape the table gives the exact full-vocabulary
agreement and the width of the bounds at the sigma where the truth is 0.9 and
0.8, and the true agreement at the sigma ``--side at-least`` serves.

    python benchmarks/bench_topk_bounds.py [--rows 200] [--k 20]

Writes docs/figures/topk_bounds.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core.calibration.topk_bounds import (  # noqa: E402
    TopKRows,
    mean_agreement_bounds,
    sigma_for_agreement_bound,
)
from caliber_core.simulation.llm_like import exact_agreement, llm_like_logits, log_softmax  # noqa: E402

V = 32_000
SHAPES = {
    "steep tail (Zipf 1.6-2.4)": dict(zipf=(1.6, 2.4)),
    "default (Zipf 1.2-1.8)": dict(zipf=(1.2, 1.8)),
    "flat tail (Zipf 0.9-1.3)": dict(zipf=(0.9, 1.3)),
}


def true_sigma(full, target):
    from scipy.optimize import brentq

    return brentq(lambda s: exact_agreement(full, s).mean() - target, 1e-3, 50.0, rtol=1e-6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures" / "topk_bounds.md"))
    args = ap.parse_args()
    lines = [
        f"Measured {dt.date.today().isoformat()} on {platform.platform()}, {os.cpu_count()} cores; "
        f"`python benchmarks/bench_topk_bounds.py --rows {args.rows} --k {args.k}`",
        "",
        f"{args.rows} positions of a {V:,}-token vocabulary per shape, top {args.k} logprobs kept.",
        "",
        "| tail shape | median top-1 p | mean leftover mass | width at true 0.9 | width at true 0.8 | "
        "at-least 0.9: truth | at-least 0.8: truth |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, kw in SHAPES.items():
        full = llm_like_logits(args.rows, V, seed=2026, **kw)
        lp = log_softmax(full)
        rows = TopKRows.from_logprobs(-np.sort(-lp, axis=1)[:, : args.k], vocab_size=V)
        cells = [label, f"{np.median(np.exp(lp.max(axis=1))):.2f}", f"{rows.tail_mass.mean():.3f}"]
        for target in (0.9, 0.8):
            lo, hi = mean_agreement_bounds(rows, true_sigma(full, target))
            cells.append(f"{hi[0] - lo[0]:.4f}")
        for target in (0.9, 0.8):
            sigma = sigma_for_agreement_bound(rows, target, side="at-least")
            cells.append(f"{exact_agreement(full, sigma).mean():.4f}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.figures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
