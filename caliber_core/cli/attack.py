"""``caliber attack FILE``: the averaging attack simulated at one sigma."""

from __future__ import annotations

import argparse
import sys
import warnings

from .arguments import add_max_elements, load


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``attack`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``attack`` parser.
    """
    att = sub.add_parser("attack", help="simulate the averaging attack at a sigma")
    att.add_argument("file")
    att.add_argument("--labels")
    group = att.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma", type=float)
    group.add_argument("--config", help="a config JSON; uses its --target entry's sigma")
    att.add_argument("--target", type=int, default=0, help="index into the config's targets")
    att.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    att.add_argument("--seed", type=int, default=0)
    add_max_elements(att)
    return att


def run(args) -> int:
    """Run ``attack``: print the averaging attack's table at one sigma.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``attack`` options: the file, ``--sigma`` or ``--config`` with
        ``--target``, ``--m``, ``--seed``, ``--labels``, ``--max-elements``.

    Returns
    -------
    int
        0 (a saturated target's warning goes to stderr).

    Raises
    ------
    caliber_core.loading.LogitsFileError
        A logits or labels file the loader refuses.
    caliber_core.config.ConfigError
        A config that does not load, or a target index out of range.
    ValueError
        A bad sigma or M (the CLI's handler makes each one line, exit 2).

    Notes
    -----
    Proposition cost: averaging M fresh draws divides v by M.
    """
    from ..config import SaturatedTargetWarning, sigma_to_serve
    from ..simulation.attack import format_attack_table, simulate_averaging_attack

    data = load(args.file, args, labels_path=args.labels)
    if args.config:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SaturatedTargetWarning)
            sigma = sigma_to_serve(args.config, target=args.target)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    else:
        sigma = args.sigma
    table = simulate_averaging_attack(data.logits, data.labels, sigma=sigma, m_values=tuple(args.m),
                                      seed=args.seed)
    print(f"{data.name}: averaging attack at sigma={sigma:.5g} (N={data.n_samples}, K={data.n_classes})")
    print(format_attack_table(table))
    return 0
