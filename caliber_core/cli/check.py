"""``caliber check CONFIG FILE``: does a deployed config still fit new traffic?

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

from .arguments import add_confidence, add_max_elements, load

EXIT_DRIFT = 3


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``check`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``check`` parser.
    """
    check = sub.add_parser(
        "check", help="check a config against a new sample of the same model's logits (exit 3 on drift)")
    check.add_argument("config", help="a config JSON written by calibrate")
    check.add_argument("file", help="the new sample's logits file (same formats as calibrate)")
    check.add_argument("--labels", help="labels file for .npy logits (labels enable accuracy, "
                       "retention and A0 comparisons)")
    add_confidence(check, "simultaneous level of all expected ranges")
    check.add_argument("--seed", type=int, default=0, help="seed of Monte-Carlo rows for large files (a "
                       "full-vocabulary dump, K >= 8,192, is streamed and bounded instead: no draws)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    add_max_elements(check)
    return check


def run(args) -> int:
    """Run ``check``: compare a new sample against a config's expected ranges.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``check`` options: config, file, ``--labels``, ``--confidence``,
        ``--seed``, ``--json``, ``--max-elements``.

    Returns
    -------
    int
        0 when the sample is consistent with the config, :data:`EXIT_DRIFT` (3) when something moved.

    Raises
    ------
    caliber_core.config.ConfigError
        A config that does not load.
    caliber_core.loading.LogitsFileError
        A logits or labels file the loader refuses.
    ValueError
        A config calibrated for consistent seeding (its sigma cannot be
        re-measured with independent noise), or a sample whose K differs
        (errors propagate to the CLI's handler: one line, exit 2).
    """
    from ..calibration.drift import check_drift
    from ..calibration.sample import LogitSample
    from ..config import load_config

    config = load_config(args.config)
    if (config.get("noise") or {}).get("seeding") == "consistent":
        # Its sigma comes from one key's realized curve; re-measuring with independent
        # noise would judge a different defence and could call it consistent.
        raise ValueError(f"{args.config} is calibrated for consistent seeding with one key; check measures "
                         "per-input noise and cannot judge it: recalibrate on the new sample with "
                         "calibrate --seeding consistent --key-file KEYFILE and compare the sigmas")
    from .check_log import is_log_config

    if is_log_config(config):  # a top-k logprob log's config: compared with a new log
        return _check_log(config, args)
    from .calibrate import is_full_vocabulary

    if is_full_vocabulary(args.file):  # streamed once and reduced, as calibrate does: no Monte-Carlo rows
        report = _check_streamed(config, args)
    else:
        data = load(args.file, args, labels_path=args.labels)
        for warning in data.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        # The loaded file's sample: its checks and margins are reused, not taken a second time.
        report = check_drift(config, LogitSample.from_data(data), confidence=args.confidence, seed=args.seed)
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


def _check_streamed(config: dict, args):
    """The drift report of a full-vocabulary dump (``vocab_check``), from one streamed pass."""
    from ..calibration.full_vocab import check_kept_size, reduce_file, stream_labels
    from ..calibration.vocab_check import check_reduced
    from ..loading import DEFAULT_MAX_ELEMENTS
    from ..loading.row_stream import open_rows

    limit = DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements
    source = open_rows(args.file)
    check_kept_size(source, max_elements=limit)  # from the header, before anything is read
    labels = stream_labels(source, args.labels, max_elements=limit)
    reduced, _, _ = reduce_file(args.file, max_elements=limit, labels=labels, source=source)
    return check_reduced(config, reduced, confidence=args.confidence)


def _check_log(config: dict, args) -> int:
    """``check`` of a logprob log's config against a new log (``check_log``)."""
    from ..calibration.llm_inputs import read_llm_file
    from .check_log import check_log

    if args.labels:
        raise ValueError("a top-k logprob log has no labels: --labels does not apply to its config")
    consistent, lines = check_log(config, read_llm_file(args.file, max_elements=args.max_elements), args.file,
                                  confidence=args.confidence)
    if args.json:
        print(json.dumps({"consistent": consistent, "lines": lines}, indent=2))
    else:
        print("\n".join(lines))
    return 0 if consistent else EXIT_DRIFT
