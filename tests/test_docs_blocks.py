"""Every ```python and ```bash block of the README and the docs runs as shown.

Each page runs in a fresh temporary folder that holds a copy of the shipped demo
data (``data/``), its blocks in page order: the Python blocks share one namespace
(Sybil's document namespace), and the shell blocks run with ``bash -e -o pipefail``
in the same folder with the project's Python first on PATH (so ``caliber`` is this
checkout's command). A block preceded by a line ``<!-- not-run: REASON -->`` is not
run; the reason is shown on the page. The counts are printed at the end of the
module and kept in each test's properties.

On the tutorial's pages every Python block claims to be whole: it runs in a fresh
namespace, unless the line above it is ``<!-- continues: WHAT -->``, and then the
paragraph above must say so to the reader too (a sentence with "continues").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "figures" not in p.relative_to(ROOT / "docs").parts)]
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->\s*$")
CONTINUES = re.compile(r"^<!--\s*continues:\s*(\S.*?)\s*-->\s*$")
#: Pages whose Python blocks each run on their own unless marked as continuing.
WHOLE_BLOCK_PAGES = ROOT / "docs" / "tutorial"
# The hook's markers: a generated block's command must be visible in the page source.
OUTPUT_OF = re.compile(r"^<!-- output-of(?: exit=\d+)?(:| -->)", re.M)
VISIBLE_OUTPUT_OF = re.compile(r"^<!-- output-of(?: exit=\d+)? -->\n```text\n\$ [^\n]+\n```$", re.M)
# Fences that look runnable but that no parser here would run: refused, so a block
# cannot escape the test by its spelling.
EVASIVE_FENCE = re.compile(r"^\s*```\s*(py|sh|shell|console|zsh|python3|pycon)\s*$", re.M)
BLOCK_TIMEOUT_S = 600


def _not_run_reason(example) -> str | None:
    before = example.document.text[: example.start].rstrip("\n").splitlines()
    match = NOT_RUN.match(before[-1]) if before else None
    return match.group(1) if match else None


def _continues(example) -> str | None:
    """What a block says it continues from (the marker on the line above it), else None.

    The marker alone is not enough: the paragraph above the block must tell the reader.
    """
    before = example.document.text[: example.start].rstrip("\n").splitlines()
    match = CONTINUES.match(before[-1]) if before else None
    if match is None:
        return None
    paragraph = "\n".join(before[:-1]).rstrip().split("\n\n")[-1]
    assert "continues" in paragraph.lower(), (
        f"block at line {example.line}: the paragraph above a <!-- continues --> block must say what it "
        "continues from")
    return match.group(1)


def _claims_to_be_whole(example) -> bool:
    """A Python block that is run and does not say it continues an earlier one."""
    return (example.document.text.startswith("```python", example.start)
            and _not_run_reason(example) is None and _continues(example) is None)


def _shell_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("CALIBER_DEBUG", None)
    return env


def _run_bash(example) -> str | None:
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", example.parsed],
        cwd=os.getcwd(), env=_shell_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
    )
    if proc.returncode != 0:
        return (f"bash block at line {example.line} exited {proc.returncode}:\n"
                f"{example.parsed}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}")
    return None


SYBIL = Sybil(parsers=[CodeBlockParser("python", PythonEvaluator()), CodeBlockParser("bash", _run_bash)])


@pytest.fixture(scope="module")
def counts(request):
    totals: Counter = Counter()
    reasons: Counter = Counter()
    yield totals, reasons
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None or not (totals["run"] or totals["not-run"]):
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(f"docs blocks: {totals['run']} run, {totals['not-run']} not run")
        for reason, n in sorted(reasons.items()):
            reporter.write_line(f"  not run ({n}): {reason}")


def test_no_block_escapes_by_its_fence():
    offenders = [f"{p.relative_to(ROOT)}:{p.read_text().count(chr(10), 0, m.start()) + 1}"
                 for p in PAGES for m in EVASIVE_FENCE.finditer(p.read_text())]
    assert not offenders, f"fence a runnable block as python or bash: {offenders}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page, tmp_path, monkeypatch, counts, record_property):
    totals, reasons = counts
    shutil.copytree(ROOT / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    document = SYBIL.parse(page)
    page_counts: Counter = Counter()

    def not_run(example):
        reason = _not_run_reason(example)
        if reason is None:
            raise NotEvaluated()
        page_counts["not-run"] += 1
        reasons[f"{page.relative_to(ROOT)}: {reason}"] += 1

    document.push_evaluator(not_run)
    whole_blocks = WHOLE_BLOCK_PAGES in page.parents
    for example in document.examples():
        if whole_blocks and _claims_to_be_whole(example):
            document.namespace.clear()  # a block that claims to be whole sees no earlier block's names
        example.evaluate()
        if _not_run_reason(example) is None:
            page_counts["run"] += 1
    totals.update(page_counts)
    record_property("blocks_run", page_counts["run"])
    record_property("blocks_not_run", page_counts["not-run"])


def test_not_run_marker_needs_a_reason(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- not-run: needs a GPU -->\n```bash\nexit 1\n```\n\n```bash\ntrue\n```\n")
    document = SYBIL.parse(page)
    found = [(_not_run_reason(e), e.parsed.strip()) for e in document.examples()]
    assert found == [("needs a GPU", "exit 1"), (None, "true")]
    assert NOT_RUN.match("<!-- not-run: -->") is None


def test_a_failing_block_fails_its_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    page.write_text("```bash\ncaliber calibrate no-such-file.npz\n```\n")
    (example,) = SYBIL.parse(page).examples()
    with pytest.raises(Exception, match="exited 2"):
        example.evaluate()


def test_generated_blocks_show_their_command_in_the_source():
    """An output-of block (docs/hooks/generated.py) keeps its command in a visible block of the
    page source, not only inside the comment the build replaces."""
    markers = {p: len(OUTPUT_OF.findall(p.read_text())) for p in PAGES}
    assert sum(markers.values()) >= 4
    hidden = [str(p.relative_to(ROOT)) for p, n in markers.items() if len(VISIBLE_OUTPUT_OF.findall(p.read_text())) != n]
    assert not hidden, f"output-of markers without their '$ COMMAND' block below them: {hidden}"


def test_a_tutorial_block_that_leans_on_an_earlier_one_fails_unless_it_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = "```python\nx = 1\n```\n\n```python\nassert x == 1\n```\n"

    def run(markdown):
        path = tmp_path / "page.md"
        path.write_text(markdown)
        document = SYBIL.parse(path)
        for example in document.examples():
            if _claims_to_be_whole(example):
                document.namespace.clear()
            example.evaluate()

    with pytest.raises(NameError):
        run(text)
    marked = "\n\n<!-- continues: the block above -->\n```python\nassert"
    with pytest.raises(AssertionError, match="must say what it continues from"):
        run(text.replace("\n\n```python\nassert", marked))  # the marker without a word to the reader
    run(text.replace("\n\n```python\nassert", "\n\nThis block continues the one above." + marked))
