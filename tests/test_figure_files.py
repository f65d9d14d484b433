"""benchmarks/figure_files.py: the header every figures file carries, and no half-written run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import figure_files  # noqa: E402


@pytest.fixture
def figures_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(figure_files, "FIGURES_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "bench_x.py"), "--repeats", "7"])
    return tmp_path


def test_header_names_date_machine_and_command(figures_dir):
    fig = figure_files.FigureFile("speed", "Speed of x")
    fig.table(["K", "µs"], [[10, "1.5 ± 0.1"]])
    fig.note("best of 7")
    text = fig.write().read_text()
    assert text.startswith("*Speed of x. Measured 20")
    assert "UTC on " in text and "usable CPU cores" in text and "load average" in text
    assert "python benchmarks/bench_x.py --repeats 7" in text
    assert "| K | µs |\n|---|---|\n| 10 | 1.5 ± 0.1 |" in text
    assert text.rstrip().endswith("best of 7")


def test_transcript_writes_what_was_printed(figures_dir, capsys):
    with figure_files.transcript("run", "A run", note="read it so"):
        print("line one")
        print("line two")
    text = (figures_dir / "run.md").read_text()
    assert "```text\nline one\nline two\n```" in text
    assert text.rstrip().endswith("read it so")
    assert "line one" in capsys.readouterr().out  # still printed as usual


def test_transcript_exit_zero_writes(figures_dir):
    with pytest.raises(SystemExit):
        with figure_files.transcript("ok", "A run"):
            print("done")
            raise SystemExit(0)
    assert (figures_dir / "ok.md").is_file()


@pytest.mark.parametrize("error", [RuntimeError("boom"), SystemExit(1), KeyboardInterrupt()])
def test_a_failed_run_writes_nothing(figures_dir, error):
    with pytest.raises(type(error)):
        with figure_files.transcript("failed", "A run"):
            print("half a table")
            raise error
    assert not (figures_dir / "failed.md").exists()


def test_figure_name_keeps_variants_apart(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["b.py", "--width", "784", "--quick", "--seeds", "3"])
    assert figure_files.figure_name("extraction", "--width", "--quick") == "extraction-width-784-quick"
    monkeypatch.setattr(sys, "argv", ["b.py", "--width=0.5"])
    assert figure_files.figure_name("x", "--width") == "x-width-0_5"
    monkeypatch.setattr(sys, "argv", ["b.py"])
    assert figure_files.figure_name("extraction", "--width") == "extraction"


def test_bad_name_is_refused():
    with pytest.raises(ValueError, match="figure name must be letters, digits and '-', got '../x'"):
        figure_files.FigureFile("../x", "escape")
