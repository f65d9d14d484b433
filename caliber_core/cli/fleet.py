"""``caliber fleet FILE FILE ...``: the shared logistic law over several models, leave-one-out, the margin ablation."""

from __future__ import annotations

import argparse
import json

from .arguments import add_max_elements, load


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``fleet`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``fleet`` parser.
    """
    fleet = sub.add_parser("fleet", help="shared fit and leave-one-out table over several models")
    fleet.add_argument("files", nargs="+")
    fleet.add_argument("--margin-stat", choices=("median", "mean", "trimmed"), default="median")
    fleet.add_argument("--seed", type=int, default=0)
    fleet.add_argument("--out", help="write the shared fit and tables as JSON here")
    add_max_elements(fleet)
    return fleet


def run(args) -> int:
    """Run ``fleet``: the shared logistic fit, its leave-one-out table and the margin ablation.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``fleet`` options: files, ``--margin-stat``, ``--seed``, ``--out``, ``--max-elements``.

    Returns
    -------
    int
        0; the tables go to stdout.

    Raises
    ------
    ValueError
        Fewer than 2 files, or a file without labels.
    caliber_core.loading.LogitsFileError
        A file the loader refuses.
    OSError
        ``--out`` cannot be written.

    Notes
    -----
    Eq. logistic-decay fitted once over every model's (v, normalized accuracy) points.
    """
    import numpy as np

    from ..calibration.fleet import leave_one_out, margin_ablation, shared_fit
    from ..loading import require_labels
    from ..calibration.pipeline import calibrate_data

    if len(args.files) < 2:
        raise ValueError(f"fleet needs at least 2 files, got {len(args.files)}")
    cals = []
    for path in args.files:
        data = load(path, args)
        require_labels(data, "the fleet's accuracy fit")
        cals.append(calibrate_data(data, statistic="median", seed=args.seed))
    fit = shared_fit(cals, statistic=args.margin_stat)
    loo = leave_one_out(cals, statistic=args.margin_stat)
    ablation = margin_ablation(cals)
    print(f"shared logistic ({args.margin_stat}): v50={fit.v50:.4g} p={fit.p:.4g} c={fit.c:.4g} "
          f"R2={fit.r2:.4f} over {len(cals)} models")
    print(f"{'model':>28} {'S':>9} {'in-sample %':>12} {'held-out %':>11}")
    for r in loo:
        print(f"{r['model']:>28} {r['scale']:>9.4g} {r['in_sample_error']:>12.2f} {r['held_out_error']:>11.2f}")
    print(f"{'mean':>28} {'':>9} {np.mean([r['in_sample_error'] for r in loo]):>12.2f} "
          f"{np.mean([r['held_out_error'] for r in loo]):>11.2f}")
    print("margin-statistic ablation (mean |relative error| %, shared fit):")
    for r in ablation:
        print(f"{r['statistic']:>10}  R2={r['r2']:.4f}  in-sample {r['in_sample_error']:.2f}  "
              f"held-out {r['held_out_error']:.2f}")
    if args.out:
        doc = {
            "schema": "caliber.fleet/v1",
            "statistic": args.margin_stat,
            "shared_fit": fit.to_dict(),
            "models": [{"model": c.name, "n_classes": c.n_classes, "clean_accuracy": c.clean_accuracy,
                        "scales": c.scales} for c in cals],
            "leave_one_out": loo,
            "margin_ablation": ablation,
        }
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        print(f"fleet report written to {args.out}")
    return 0
