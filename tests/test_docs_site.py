"""The documentation site builds with ``mkdocs build --strict``, and the README's links resolve.

The strict build fails on any warning: a broken link or anchor, a page missing from
the navigation, a figure file that a page includes but that does not exist, a
docstring the API reference cannot parse, a subcommand without its reference entry,
or a command shown with its output that fails (see ``docs/hooks/generated.py``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    for page in ["index.html", "reference/cli/index.html", "reference/api/index.html", "figures/index.html"]:
        assert (tmp_path / "site" / page).is_file(), page
    cli = (tmp_path / "site" / "reference/cli/index.html").read_text()
    assert "caliber calibrate --help" in cli


def test_every_figure_file_is_shown():
    """A figures file that no page includes is a measurement nobody reads: include it or delete it."""
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md") if "figures" not in p.parent.name)
    figures = sorted((ROOT / "docs" / "figures").glob("*.md"))
    assert figures
    orphans = [f.name for f in figures if f'--8<-- "docs/figures/{f.name}"' not in pages]
    assert not orphans, f"docs/figures files included by no page: {orphans}"


def _relative_links(text: str) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    return [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = _relative_links(readme)
    assert links, "the README links its docs pages"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < 250, f"README.md has {lines} lines; the long form belongs in docs/"


@pytest.mark.parametrize("bad", ["[x](docs/no-such-page.md)", '<img src="docs/assets/none.svg">'])
def test_link_check_can_fail(bad):
    assert [link for link in _relative_links(bad) if not (ROOT / link).exists()]


def test_curve_picture_is_drawn_from_the_demo_data(tmp_path):
    """The README's picture is made by scripts/make_curve_figure.py from data/, not drawn by hand."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_curve_figure

    out = tmp_path / "curve.svg"
    make_curve_figure.draw(out)
    svg = out.read_text()
    models = sorted(p.stem.replace("_", "-") for p in (ROOT / "data").glob("digits_*.npz"))
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("<polyline") == 2 * len(models) + 1  # raw and normalized per model, one shared law
    assert all(name in svg for name in models)
    assert (ROOT / "docs" / "assets" / "normalized-curve.svg").read_text().count("<polyline") == svg.count("<polyline")
