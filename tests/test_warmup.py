"""The server warm-up fills the demo caches the first visits read, and never starts under AppTest."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from caliber_dashboard import warmup
from caliber_dashboard.common import cache, calibration_store, state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def test_no_warm_up_without_a_server():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert warmup.start() is False  # no server runtime here
    assert warmup._thread is None  # noqa: SLF001  (this module's own state)


def test_warm_demo_fills_the_first_visits_caches(monkeypatch):
    from caliber_dashboard.extraction import view as extraction_view

    extraction_view.demo_archives.clear()  # an earlier test may have read them
    warmup.warm_demo()
    demo = [d for d in state.demo_models() if d.has_labels]
    assert len(demo) >= 2

    def no_second_calibration(*args, **kwargs):
        raise AssertionError("the warm-up left a demo model uncalibrated")

    # Filled: a page's first ask neither sweeps nor reads the workspace's copy.
    monkeypatch.setattr(calibration_store, "stored_or_computed", no_second_calibration)
    assert all(cache.calibration(d).n_samples == d.n_samples for d in demo)
    first = demo[0]
    cal = cache.calibration(first)
    kind, value = warmup.DEFAULT_TARGET
    record, intervals = cache.served(first, cal, kind, value)
    assert record.kind == kind and record.retention == value
    assert intervals.retention.low < value < intervals.retention.high
    # Filled, so a second ask returns the very same objects.
    assert cache.served(first, cal, kind, value)[0] is record
    assert cache.figure(first, cal, "normalized") is cache.figure(first, cal, "normalized")
    # The readout's thief line looks every model up among the demo archives: read already.
    monkeypatch.setattr("caliber_dashboard.extraction.view.load_archive", no_second_calibration)
    assert extraction_view.demo_archives()  # from the cache: reading a file again would raise


def test_streamlit_run_serves_app_py_with_the_start_up_warm_up():
    """`streamlit run app.py` finds `app` (an st.App whose lifespan starts the warm-up)."""
    from streamlit.web.server.app_discovery import discover_asgi_app

    found = discover_asgi_app(Path(APP))
    assert found.is_asgi_app and found.app_name == "app"
    source = Path(APP).read_text()
    assert "warmup.start(server=True)" in source and 'if __name__ == "__main__":' in source


def test_the_warm_up_imports_every_module_a_page_imports_before_it_freezes():
    """What a page imports after the freeze stays in the post-run collection's view on every step."""
    import sys

    package = Path(warmup.__file__).resolve().parent
    files = {p for p in package.rglob("*.py") if "pages" not in p.relative_to(package).parts}
    expected = {".".join(("caliber_dashboard",) + p.relative_to(package).with_suffix("").parts)
                .removesuffix(".__init__") for p in files} - {"caliber_dashboard", "caliber_dashboard.app"}
    names = warmup.import_modules()
    assert expected <= set(names)
    assert not [n for n in names if n.startswith("caliber_dashboard.pages") or n == "caliber_dashboard.app"]
    assert all(name in sys.modules for name in names)
    assert "caliber_dashboard.calibrate.thief" in names  # the Calibrate page's (reads extraction results)


_IMPORT_ALL = """
import gc, sys
from caliber_dashboard import warmup
warmup.import_modules()
warmup.done.set()
print("torch" in sys.modules, warmup.freeze_late_imports(), gc.get_freeze_count())
from caliber_core.extraction import attacker  # what a training run imports
print("torch" in sys.modules, warmup.freeze_late_imports(), gc.get_freeze_count() > 0, warmup.freeze_late_imports())
"""


def test_no_page_imports_torch_until_a_training_run_does():
    """torch (about 180 MB resident) is the thief's alone: every module a page imports leaves it out;
    once a run has imported it, the run's end moves its objects out of the collector's view, once."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=300,
                         cwd=Path(warmup.__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "0", "True", "True", "True", "False"]


def test_every_module_a_page_file_imports_is_imported_by_the_warm_up():
    """A page's own import of a module the warm-up misses would leave it outside the freeze."""
    import ast
    import subprocess
    import sys

    pages = sorted((Path(warmup.__file__).resolve().parent / "pages").glob("*.py"))
    assert pages
    wanted = set()
    for page in pages:
        for node in ast.walk(ast.parse(page.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                wanted.add(node.module)
            elif isinstance(node, ast.Import):
                wanted.update(alias.name for alias in node.names)
    # A fresh interpreter: this test process has imported much more already.
    code = ("import sys; from caliber_dashboard import warmup; warmup.import_modules(); "
            f"print(sorted(m for m in {sorted(wanted)!r} if m not in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(APP).parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
