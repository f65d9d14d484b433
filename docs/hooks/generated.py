"""MkDocs hook: text that the build generates instead of a person typing it.

Two markers, each an HTML comment on a line of its own:

``<!-- cli-help: SUBCOMMAND ... -->``
    Replaced by the ``--help`` of that subcommand, run as ``caliber SUBCOMMAND --help``.
    On the page that holds these markers, every subcommand the parser defines must
    have one, so a new subcommand or option cannot go undocumented: the build fails
    and names what is missing.
``<!-- output-of -->`` (or ``<!-- output-of exit=N -->``) on the line above a ````text`` block of one line ``$ COMMAND``
    The block is replaced by the command and what it printed, run with bash in a scratch
    folder that holds a copy of the demo data (one folder per page, so a page's commands
    run in order and see each other's files). The command stays visible in the page's
    source, where a reader of the checkout sees it above the prose that reads its output;
    the old form that held the command inside the comment fails the build. A command that
    exits with another status than N (default 0) fails the build.
    ``<!-- build-setup: COMMAND -->`` runs a command in the same folder without showing
    it (files an example needs).

Commands run with this Python's folder first on PATH, so ``caliber`` is the
project's own command, and with the repository on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
HELP_MARK = re.compile(r"^<!-- cli-help: ([a-z0-9 _-]+?) -->$", re.M)
OUTPUT_MARK = re.compile(r"^<!-- (output-of)(?: exit=(\d+))? -->\n```text\n\$ ([^\n]+)\n```$"
                         r"|^<!-- (build-setup): ([^\n]+?) -->$", re.M)
#: The old form, the command hidden inside the comment: refused.
HIDDEN_MARK = re.compile(r"^<!-- output-of(?: exit=\d+)?: .+ -->$", re.M)
#: A marker that no longer sits above its block (e.g. a blank line between them): refused.
LOOSE_MARK = re.compile(r"^<!-- output-of(?: exit=\d+)? -->$(?!\n```text\n\$ )", re.M)
TIMEOUT_S = 300

_help_cache: dict[tuple[str, ...], str] = {}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env["COLUMNS"] = "100"  # argparse wraps help at this width: the same page on every machine
    env.pop("CALIBER_DEBUG", None)
    return env


def _help(words: tuple[str, ...]) -> str:
    if words not in _help_cache:
        proc = subprocess.run(
            [sys.executable, "-m", "caliber_core", *words, "--help"],
            capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise PluginError(f"caliber {' '.join(words)} --help exited {proc.returncode}: "
                              f"{proc.stderr.strip().splitlines()[-1:]}")
        _help_cache[words] = proc.stdout
    return _help_cache[words]


def _subcommands(words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand path under ``words``, read off argparse's own help."""
    found = []
    match = re.search(r"^positional arguments:\n  \{([a-z0-9_,-]+)\}", _help(words), re.M)
    for name in match.group(1).split(",") if match else []:
        path = (*words, name)
        found.append(path)
        found.extend(_subcommands(path))
    return found


def _help_block(match: re.Match) -> str:
    words = tuple(match.group(1).split())
    return f"```text\n$ caliber {' '.join(words)} --help\n{_help(words).rstrip()}\n```"


def _run_block(match: re.Match, workdir: Path, page: str) -> str:
    kind = match.group(1) or match.group(4)
    expected = int(match.group(2) or 0)
    command = (match.group(3) or match.group(5)).strip()
    proc = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=_env(), cwd=workdir,
        timeout=TIMEOUT_S,
    )
    if proc.returncode != expected:
        raise PluginError(f"{page}: `{command}` exited {proc.returncode}, expected {expected}: "
                          f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    if kind == "build-setup":
        return ""
    shown = (proc.stdout + proc.stderr).rstrip()
    status = f"\n$ echo $?\n{expected}" if expected else ""
    return f"```text\n$ {command}\n{shown}{status}\n```"


def on_page_markdown(markdown: str, page, config, files) -> str:
    name = page.file.src_uri
    for pattern, why in ((HIDDEN_MARK, "holds its command inside the comment"),
                         (LOOSE_MARK, "is not on the line above a ```text block of one line '$ COMMAND'")):
        bad = pattern.search(markdown)
        if bad:
            raise PluginError(f"{name}: {bad.group(0)[:80]!r} {why}; write <!-- output-of --> above a "
                              "```text block holding '$ COMMAND'")
    helps = HELP_MARK.findall(markdown)
    if helps:
        shown = {tuple(h.split()) for h in helps}
        missing = [" ".join(p) for p in _subcommands() if p not in shown]
        if missing:
            raise PluginError(f"{name}: no <!-- cli-help: ... --> for subcommand(s) {', '.join(missing)}")
        markdown = HELP_MARK.sub(_help_block, markdown)
    if OUTPUT_MARK.search(markdown):
        with tempfile.TemporaryDirectory(prefix="caliber-docs-") as tmp:
            workdir = Path(tmp)
            shutil.copytree(ROOT / "data", workdir / "data")
            markdown = OUTPUT_MARK.sub(lambda m: _run_block(m, workdir, name), markdown)
    return markdown
