"""The command line: ``caliber {calibrate,check,fleet,attack,extract,keygen,throttle,gateway,dashboard} ...``.

A user error (a bad file, an impossible target) prints one line on stderr and
exits with status 2; an unexpected failure prints one line and exits 1 (set
CALIBER_DEBUG=1 for the traceback). ``check`` exits 3 when new traffic no
longer fits a config.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import attack, calibrate, check, dashboard, extract, fleet, gateway, keygen, throttle

EXIT_USER_ERROR = 2
EXIT_INTERNAL = 1

#: Every subcommand's module, in the order ``--help`` lists them: each has
#: ``add_parser(subparsers)`` and ``run(args) -> int``.
SUBCOMMANDS = {"calibrate": calibrate, "fleet": fleet, "attack": attack, "check": check,
               "extract": extract, "keygen": keygen, "throttle": throttle, "gateway": gateway,
               "dashboard": dashboard}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        prog="python -m caliber_core",
        description="Calibrate Gaussian logit noise against model extraction (Caliber).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command line; returns the exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 for a user error, 3 for drift (``check``), 130 when
        interrupted, 1 for an unexpected failure.
    """
    from ..config import ConfigError
    from ..loading import LogitsFileError

    args = build_parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command].run(args)
    except (LogitsFileError, ConfigError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the user; the traceback on request
        if os.environ.get("CALIBER_DEBUG"):
            raise
        print(f"error: unexpected {type(exc).__name__}: {_one_line(exc)} "
              "(set CALIBER_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
