"""``caliber keygen --out KEYFILE``: a new serving key (32 random bytes, hex, mode 0600)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``keygen`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``keygen`` parser.
    """
    keygen = sub.add_parser("keygen", help="write a new per-input seeding key (32 random bytes, hex, mode 0600)")
    keygen.add_argument("--out", required=True, metavar="KEYFILE", help="where to write it (never overwritten)")
    return keygen


def run(args) -> int:
    """Write a new key; a file already there is a user error (exit 2).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``keygen`` options (``out``).

    Returns
    -------
    int
        0; the key's fingerprint (never the key) is printed.

    Raises
    ------
    ValueError
        The file exists already, or cannot be written.
    """
    from ..serving.keys import key_fingerprint, write_key_file

    try:
        key = write_key_file(args.out)
    except FileExistsError:
        raise ValueError(f"{args.out} already exists; a key is never overwritten (rotating it changes all "
                         f"served noise): remove it first or choose another path") from None
    except OSError as exc:
        raise ValueError(f"{args.out}: cannot write the key ({exc.strerror})") from None
    print(f"wrote a new key to {args.out} (mode 0600), fingerprint {key_fingerprint(key)}")
    return 0
