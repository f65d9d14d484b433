"""``caliber extract FILE ...``: the extraction simulation from the command line.

:func:`add_parser` registers the subcommand; :func:`run` executes it. A bad
file or option raises ``ValueError`` (the CLI prints one line and exits 2).
"""

from __future__ import annotations

import argparse
import os

from .arguments import add_max_elements, fraction, non_negative_int, positive_int, progress


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``extract`` and its options on an argparse subparsers object.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``extract`` parser.
    """
    p = subparsers.add_parser(
        "extract", help="train the thief's surrogate on noisy answers: Table 3/4 analogues, frontier, "
        "sigma for a surrogate target",
        description="Simulate model extraction against the calibrated noise: a surrogate distilled "
        "from answers to the pool's queries, scored on the evaluation split.")
    p.add_argument("file", help=".npz with inputs, logits, labels (query pool) and heldout_inputs, "
                   "heldout_logits, heldout_labels (evaluation)")
    p.add_argument("--eval", dest="eval_file", metavar="FILE",
                   help="evaluation split from this .npz instead (heldout_* or inputs/logits/labels)")
    p.add_argument("--retention", nargs="+", type=fraction, metavar="R", default=None,
                   help="teacher retention targets (fraction of A0; default 0.95 0.85 0.75)")
    p.add_argument("--surrogate-retention", nargs="+", type=fraction, metavar="R", default=[],
                   help="find sigma where the strongest attacker keeps R of its clean accuracy")
    p.add_argument("--seeds", type=positive_int, default=3, help="replicates per condition (default 3)")
    p.add_argument("--m", nargs="+", type=positive_int, default=[1, 2, 4, 8, 16],
                   help="queries per input averaged (default 1 2 4 8 16)")
    p.add_argument("--attack", choices=("fixed", "tuned", "all"), default="all",
                   help="recipes: the fixed light/strong ones, the self-tuned one, or all (default)")
    p.add_argument("--student", choices=("mlp", "linear"), default="mlp", help="surrogate model (default mlp)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="base seed (default 0)")
    p.add_argument("--processes", type=positive_int, default=None, metavar="N",
                   help="processes that train surrogates (default: 2 when the machine has 2 or more CPUs; "
                        "the numbers do not depend on it)")
    p.add_argument("--json", dest="json_out", metavar="REPORT", help="write the caliber.extraction/v1 report here")
    p.add_argument("--out", metavar="CONFIG",
                   help="write a config with the retention and surrogate-retention targets here")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr; results and warnings still print")
    add_max_elements(p, "arrays")
    p.add_argument("--seeding", choices=("per-input", "consistent"), default=None,
                   help="compare per-input and consistent seeding side by side at the --retention levels "
                   "(strongest thief, prior correction included; near-duplicate averaging at the lowest)")
    p.add_argument("--key-file", help="with --seeding: calibrate and answer with this key only")
    p.add_argument("--length-scale", type=float, default=None, metavar="L",
                   help="with --seeding: consistent noise's length scale in units of S")
    p.add_argument("--keys", type=positive_int, default=3, help="with --seeding or --frontier: simulated keys "
                   "(default 3)")
    p.add_argument("--frontier", nargs="*", metavar="DESIGN", default=None,
                   help="the thief's frontier per noise design at the --retention levels: the flagged user's "
                   "retention against the strongest thief's (KD at T=1..32, hard labels, prior correction, "
                   "near-duplicates averaged, a thief who knows the class-cycle design); designs default to per-input and "
                   "the served field")
    p.add_argument("--pool-sizes", type=pool_sizes, default=None, metavar="N,N,...",
                   help="the frontier at several campaign sizes (e.g. 500,2000,8000,32000): each size uses the "
                   "pool's first N rows; designs as for --frontier, targets from --retention (default 0.75)")
    return p


def pool_sizes(text: str) -> list[int]:
    """``--pool-sizes``: comma-separated positive integers (``500,2000,8000``).

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    list of int

    Raises
    ------
    argparse.ArgumentTypeError
        An empty list, or a part that is not a positive integer.
    """
    parts = [t.strip().replace("_", "") for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated pool sizes such as 500,2000,8000, got {text!r}")
    return [positive_int(t) for t in parts]


def default_processes() -> int:
    """2 training processes where the machine has at least 2 CPUs, else 1.

    Returns
    -------
    int
    """
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def run(args) -> int:
    """Execute ``extract`` for parsed ``args``: the extraction tables, or the seedings or frontier comparison.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``extract`` options.

    Returns
    -------
    int
        0; the tables go to stdout, progress to stderr.

    Raises
    ------
    ValueError
        A bad archive (:func:`caliber_core.extraction.archive.load_archive`) or
        a combination of options that does not apply (``--key-file`` or
        ``--length-scale`` without ``--seeding``): one line, exit 2.
    OSError
        ``--json`` or ``--out`` cannot be written.
    """
    from ..loading import DEFAULT_MAX_ELEMENTS
    from ..extraction.archive import load_archive
    from ..extraction.experiment import DEFAULT_RETENTION, ExtractionSettings, run_extraction
    from ..extraction.report import format_tables, report_to_json, to_report

    limit = DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements
    archive = load_archive(args.file, eval_path=args.eval_file, max_elements=limit)
    if args.pool_sizes is not None:
        return _run_pool_sizes(archive, args)
    if args.frontier is not None:
        return _run_frontier(args)
    if args.seeding is not None:
        return _run_seedings(archive, args)
    if args.key_file or args.length_scale is not None:
        raise ValueError("--key-file and --length-scale apply with --seeding only")
    settings = ExtractionSettings(
        retention=tuple(DEFAULT_RETENTION if args.retention is None else args.retention),
        surrogate_retention=tuple(args.surrogate_retention), seeds=args.seeds,
        m_values=tuple(sorted(set(args.m))), attack=args.attack, seed=args.seed,
        architecture=args.student, processes=default_processes() if args.processes is None else args.processes,
    )
    result = run_extraction(archive, settings, progress=progress(not args.quiet, "training surrogates"))
    print(format_tables(result))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(report_to_json(to_report(result)))
        print(f"report written to {args.json_out}")
    if args.out:
        from ..extraction.targets import extraction_config
        from ..config import save_config

        save_config(extraction_config(result), args.out)
        print(f"config written to {args.out}")
    print(f"{result.runs} training runs in {result.seconds:.0f} s ("
          + ", ".join(f"{name} {sec:.0f} s" for name, sec in result.timings.items()) + ")")
    return 0


def _run_seedings(archive, args) -> int:
    from ..serving.consistent_noise import DEFAULT_LENGTH_SCALE
    from ..serving.keys import read_key_file
    from ..extraction.seedings import compare_seedings
    from ..extraction.seedings_report import format_seedings, seedings_to_json

    levels = (0.95, 0.85, 0.75) if args.retention is None else tuple(args.retention)
    length = DEFAULT_LENGTH_SCALE if args.length_scale is None else args.length_scale
    if not length > 0:
        raise ValueError(f"--length-scale must be > 0, got {length}")
    key = read_key_file(args.key_file) if args.key_file else None
    result = compare_seedings(archive, levels=levels, keys=args.keys, seeds=args.seeds, length_scale=length,
                              key=key, near_duplicates=max(args.m), seed=args.seed,
                              progress=progress(not args.quiet, "training surrogates"))
    print(format_seedings(result, first=args.seeding))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(seedings_to_json(result))
        print(f"report written to {args.json_out}")
    return 0


def _frontier_designs(args) -> list[str]:
    from ..extraction.noise_designs import DESIGNS, SERVED_DESIGN

    option = "--pool-sizes" if args.pool_sizes is not None else "--frontier"
    if args.seeding is not None or args.key_file or args.length_scale is not None:
        raise ValueError(f"{option} compares noise designs by name: --seeding, --key-file and --length-scale "
                         "do not apply")
    designs = args.frontier or ["per-input", SERVED_DESIGN]
    unknown = [d for d in designs if d not in DESIGNS]
    if unknown:
        raise ValueError(f"--frontier: unknown design {unknown[0]!r}; choose from {', '.join(sorted(DESIGNS))}")
    return designs


def _run_pool_sizes(archive, args) -> int:
    from ..extraction.pool_sizes import check_pool_sizes, measure_pool_sizes, sizes_table, sizes_to_json

    designs = _frontier_designs(args)
    sizes = check_pool_sizes(args.pool_sizes, archive.pool.n_samples, archive.n_classes, name=archive.name)
    levels = (0.75,) if args.retention is None else tuple(args.retention)
    tick = progress(not args.quiet, "frontier cells")
    report = None if tick is None else (lambda done, total: tick(done / total))
    result = measure_pool_sizes(args.file, eval_path=args.eval_file, sizes=sizes, designs=designs, levels=levels,
                                keys=args.keys, seeds=args.seeds, near_duplicates=max(args.m),
                                processes=default_processes() if args.processes is None else args.processes,
                                progress=report)
    print("\n".join(sizes_table(result)))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(sizes_to_json(result))
        print(f"report written to {args.json_out}")
    return 0


def _run_frontier(args) -> int:
    from ..extraction.frontier_report import frontier_summary, frontier_table, frontier_to_json
    from ..extraction.thief_frontier import DEFAULT_LEVELS, measure_frontier

    designs = _frontier_designs(args)
    levels = DEFAULT_LEVELS if args.retention is None else tuple(args.retention)
    tick = progress(not args.quiet, "frontier cells")
    report = None if tick is None else (lambda done, total: tick(done / total))
    frontier = measure_frontier(args.file, eval_path=args.eval_file, designs=designs, levels=levels,
                                keys=args.keys, seeds=args.seeds, near_duplicates=max(args.m),
                                processes=default_processes() if args.processes is None else args.processes,
                                progress=report)
    print("\n".join(frontier_table(frontier) + [""] + frontier_summary([frontier])))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(frontier_to_json([frontier]))
        print(f"report written to {args.json_out}")
    return 0
