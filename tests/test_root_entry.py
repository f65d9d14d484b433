"""The checkout's own entry points: ``streamlit run app.py`` and ``pages/`` at the repository root.

The dashboard ships inside the package (``caliber_dashboard/app.py`` and its
``pages/``) so that an installed wheel can start it; the root ``app.py`` and
``pages`` are links to those files, so a checkout runs the same app with the
command Streamlit users expect, and nothing is kept twice.
"""

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent


def test_root_app_and_pages_are_the_packaged_ones():
    assert (ROOT / "app.py").resolve() == (ROOT / "caliber_dashboard" / "app.py").resolve()
    assert (ROOT / "pages").resolve() == (ROOT / "caliber_dashboard" / "pages").resolve()
    assert sorted(p.name for p in (ROOT / "pages").glob("*.py")) == sorted(
        p.name for p in (ROOT / "caliber_dashboard" / "pages").glob("*.py"))


def test_root_app_runs_and_reaches_a_page_by_its_root_path():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert "S (median margin)" in [m.label for m in at.metric]
