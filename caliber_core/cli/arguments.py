"""The argument types and options every subcommand shares: one rule each.

Each type turns a command-line word into a checked value or raises
``argparse.ArgumentTypeError``, which argparse prints as one usage line with
exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from ..target_record import DEFAULT_CONFIDENCE, check_confidence

__all__ = ["DEFAULT_CONFIDENCE", "add_confidence", "add_max_elements", "confidence", "fraction", "load",
           "non_negative_int", "positive_int", "progress", "seconds"]


def fraction(text: str) -> float:
    """A fraction in (0, 1], or a percentage in (1, 100] (``80`` is 0.8).

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    float
        The value as a fraction in (0, 1].

    Raises
    ------
    argparse.ArgumentTypeError
        Not a number, or outside both ranges.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if 1.0 < value <= 100.0:
        value /= 100.0  # accept 80 as 80%
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1] or a percentage, got {text}")
    return value


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1.

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        Not an integer, or < 1.
    """
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a seed).

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        Not an integer, or < 0.
    """
    return _integer(text, 0)


def confidence(text: str) -> float:
    """A confidence level, by the one rule of :func:`caliber_core.target_record.check_confidence`.

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    float
        A level in [0.5, 1).

    Raises
    ------
    argparse.ArgumentTypeError
        Not a number, or outside [0.5, 1).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_confidence(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a confidence level in [0.5, 1), got {text}") from exc


def seconds(text: str) -> float:
    """A finite number of seconds > 0.

    Parameters
    ----------
    text : str
        The command-line word.

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        Not a number, not finite, or <= 0.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def add_confidence(parser: argparse.ArgumentParser, help_text: str) -> None:
    """Add ``--confidence LEVEL`` (type :func:`confidence`, default :data:`DEFAULT_CONFIDENCE`).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The subcommand's parser.
    help_text : str
        What the level applies to; the default is appended.
    """
    parser.add_argument("--confidence", type=confidence, default=DEFAULT_CONFIDENCE,
                        help=f"{help_text} (default {DEFAULT_CONFIDENCE:g})")


def add_max_elements(parser: argparse.ArgumentParser, what: str = "logits files") -> None:
    """Add ``--max-elements N``: the loader's element limit (default None: the loader's own).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The subcommand's parser.
    what : str, default "logits files"
        What the limit refuses, for the help text.
    """
    parser.add_argument("--max-elements", type=int, default=None, metavar="N",
                        help=f"refuse {what} declaring more elements than this "
                        "(default: caliber_core.loading.DEFAULT_MAX_ELEMENTS)")


def load(path, args, labels_path=None):
    """The logits file at ``path`` through the loader, under ``args.max_elements``.

    Returns
    -------
    caliber_core.loading.LogitsData

    Raises
    ------
    caliber_core.loading.LogitsFileError
        A file the loader refuses (one line, naming the file).
    """
    from ..loading import DEFAULT_MAX_ELEMENTS, load_logits

    limit = DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements
    return load_logits(path, labels_path=labels_path, max_elements=limit)


def progress(enabled: bool, what: str):
    """A progress callback printing ``what: NN%`` on a terminal's stderr, or None.

    Parameters
    ----------
    enabled : bool
        False under ``--quiet``.
    what : str
        The work being done ("sweeping noise").
    """
    if not enabled or not sys.stderr.isatty():
        return None

    def report(done: float) -> None:
        print(f"\r{what}: {done:5.0%}", end="" if done < 1 else "\n", file=sys.stderr)

    return report
