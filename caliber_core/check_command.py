"""``python -m caliber_core check CONFIG FILE``: does a deployed config still fit new traffic?

Exit status: 0 when every comparison is consistent with the config; 3 when
something moved (one line per finding on stdout, each saying what moved, by
how much, and "recalibrate"); 2 for bad input (a config or logits file that
cannot be read, or K that differs from the config's). ``--json`` prints the
whole report (schema ``caliber.check/v1``) instead, with the same exit status.
The comparisons are those of :func:`caliber_core.calibration.drift.check_drift`.
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_DRIFT = 3


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``check`` subcommand on an argparse subparsers object."""
    check = sub.add_parser(
        "check", help="check a config against a new sample of the same model's logits (exit 3 on drift)")
    check.add_argument("config", help="a config JSON written by calibrate")
    check.add_argument("file", help="the new sample's logits file (same formats as calibrate)")
    check.add_argument("--labels", help="labels file for .npy logits (labels enable accuracy, "
                       "retention and A0 comparisons)")
    check.add_argument("--confidence", type=confidence_level, default=0.95,
                       help="simultaneous level of all expected ranges (default 0.95)")
    check.add_argument("--seed", type=int, default=0, help="seed of Monte-Carlo rows for large files")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return check


def confidence_level(text: str) -> float:
    """argparse type: a confidence level in [0.5, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.5 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a confidence level in [0.5, 1), got {text}")
    return value


def run(args) -> int:
    """Run ``check``; returns the exit status (errors propagate to the CLI's handler)."""
    from .calibration.drift import check_drift
    from .config import load_config
    from .loading import DEFAULT_MAX_ELEMENTS, load_logits

    config = load_config(args.config)
    if (config.get("noise") or {}).get("seeding") == "consistent":
        # Its sigma comes from one key's realized curve; re-measuring with independent
        # noise would judge a different defence and could call it consistent.
        raise ValueError(f"{args.config} is calibrated for consistent seeding with one key; check measures "
                         "per-input noise and cannot judge it: recalibrate on the new sample with "
                         "calibrate --seeding consistent --key-file KEYFILE and compare the sigmas")
    limit = DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements
    data = load_logits(args.file, labels_path=args.labels, max_elements=limit)
    for warning in data.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    report = check_drift(config, data.logits, data.labels, confidence=args.confidence, seed=args.seed)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.consistent:
        for finding in report.findings:
            print(finding.message)
        print(f"consistent with {args.config}: {len(report.findings)} comparisons at "
              f"{report.level:.0%} (simultaneous), N={report.n_samples:,} against the config's "
              f"N={report.n_calibration:,}")
    else:
        for finding in report.problems:
            print(finding.message)
    return 0 if report.consistent else EXIT_DRIFT
