"""Write a benchmark's figures to ``docs/figures/<name>.md`` for the docs to include.

Every measured figure the documentation shows comes from such a file, written by
the script that measured it, never typed by hand. A file is headed by when, where
and how it was measured: the UTC date, the machine (platform, CPU count, the load
average when the script started and when it wrote), and the exact command. The
docs include it with ``--8<-- "docs/figures/<name>.md"`` (pymdownx.snippets).

Use::

    from figure_files import FigureFile          # benchmarks/ is the script's own folder
    fig = FigureFile("runtime-overhead", "Serving overhead per row")
    fig.table(["K", "numpy", ...], rows)
    fig.note("Ratios are best of 100 over plain's best.")
    fig.write()

A benchmark that measures nothing (a missing device, a skipped part) says so in a
note; it never writes a number it did not measure.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES_DIR = ROOT / "docs" / "figures"
_START_LOAD = os.getloadavg() if hasattr(os, "getloadavg") else None


def _load() -> str:
    if _START_LOAD is None:
        return "load average not available"
    end = os.getloadavg()[0]
    return f"load average {_START_LOAD[0]:.1f} at the start, {end:.1f} at the end"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU model unknown"


def machine() -> str:
    """The machine in one line: OS and architecture, CPU model, CPUs usable by this process, Python."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.system()} {platform.machine()}, {_cpu_model()}, "
            f"{usable} usable CPU cores of {os.cpu_count()}, Python {platform.python_version()}")


def command() -> str:
    """The command that ran this script, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def fmt_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; cells are written as given (format numbers before, with their digits)."""
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


class FigureFile:
    """One figures file: a header line, then tables and notes in the order added.

    Parameters
    ----------
    name : str
        File stem under ``docs/figures/`` (``runtime-overhead`` writes
        ``docs/figures/runtime-overhead.md``).
    what : str
        What the figures are, in a few words; written in the header line.
    """

    def __init__(self, name: str, what: str) -> None:
        if not name.replace("-", "").isalnum():
            raise ValueError(f"figure name must be letters, digits and '-', got {name!r}")
        self.path = FIGURES_DIR / f"{name}.md"
        self.what = what
        self.parts: list[str] = []

    def table(self, headers: list[str], rows: list[list], *, caption: str | None = None) -> None:
        if caption:
            self.parts.append(caption)
        self.parts.append(fmt_table(headers, rows))

    def note(self, text: str) -> None:
        self.parts.append(text)

    def write(self) -> Path:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        header = (f"*{self.what}. Measured {when} on {machine()} ({_load()}), by:*\n\n"
                  f"```text\n{command()}\n```")
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n\n".join([header, *self.parts]) + "\n", encoding="utf-8")
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        print(f"figures written to {shown}")
        return self.path


class _Tee:
    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class transcript:  # noqa: N801 (used as a context manager, like a function)
    """Write what a benchmark prints, verbatim, as its figures file.

    For a benchmark whose printed report is its table: everything printed to
    stdout inside the block goes to ``docs/figures/<name>.md`` as a text block,
    under the usual header, when the block ends without an error (a run that
    fails writes nothing, so a file never holds half a run).

    Parameters
    ----------
    name, what : str
        As for :class:`FigureFile`.
    note : str, optional
        A line written after the transcript (how to read it).
    """

    def __init__(self, name: str, what: str, *, note: str | None = None) -> None:
        self.figure = FigureFile(name, what)
        self.note = note

    def __enter__(self) -> FigureFile:
        self._stdout = sys.stdout
        self._tee = _Tee(sys.stdout)
        sys.stdout = self._tee
        return self.figure

    def __exit__(self, exc_type, exc, tb) -> bool:
        sys.stdout = self._stdout
        failed = exc_type is not None and not (exc_type is SystemExit and exc.code in (0, None))
        if not failed:
            self.figure.parts.insert(0, "```text\n" + "".join(self._tee.parts).strip("\n") + "\n```")
            if self.note:
                self.figure.note(self.note)
            self.figure.write()
        return False


def figure_name(base: str, *options: str) -> str:
    """``base`` plus the given options as this run used them, so variants keep files apart.

    ``figure_name("extraction", "--width")`` is ``extraction`` for a plain run and
    ``extraction-width-784`` for ``--width 784``; a flag without a value adds its name.
    """
    parts, argv = [base], sys.argv[1:]
    for i, word in enumerate(argv):
        option, _, inline = word.partition("=")
        if option in options:
            value = inline or (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "")
            parts += [option.lstrip("-"), *value.split()]
    return "-".join(p.replace(".", "_") for p in parts if p)
