"""Command lines the dashboard shows: every word shell-quoted by one function.

A shown command carries names a visitor chose (an upload's file name, a model
name), and whoever copies it pastes it into a shell. :func:`shell_command`
quotes every word with :func:`shlex.quote`, so ``$()``, backticks, quotes,
spaces and newlines stay literal text; :func:`file_argument` prefixes ``./``
to a file name that starts with a dash, so the command reads it as a file,
never as an option. Pages draw commands with ``st.code`` (no Markdown), so the
text shown is the text that runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

#: How every shown command starts: the project's CLI through the interpreter on PATH.
CLI = ("python", "-m", "caliber_core")


def file_argument(name: str) -> str:
    """A file name as a command-line word: ``./`` before a leading dash, so it is never an option.

    Parameters
    ----------
    name : str
        The file name as uploaded.

    Returns
    -------
    str
        The name, or ``./name`` when it starts with ``-``.
    """
    name = str(name)
    return f"./{name}" if name.startswith("-") else name


def shell_command(words: Iterable[str]) -> str:
    """One command line, each word quoted with :func:`shlex.quote` and joined by spaces.

    Parameters
    ----------
    words : iterable of str
        The program and its arguments, unquoted (file names through :func:`file_argument`).

    Returns
    -------
    str
        Text that a POSIX shell splits back into exactly ``words``, running nothing else.
    """
    return " ".join(shlex.quote(str(w)) for w in words)


def cli_command(subcommand: str, *args: str) -> str:
    """``python -m caliber_core SUBCOMMAND ARGS...`` quoted by :func:`shell_command`.

    Returns
    -------
    str
    """
    return shell_command([*CLI, subcommand, *args])
