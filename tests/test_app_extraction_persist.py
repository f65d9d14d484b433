"""AppTest: a finished extraction run survives a reload and a server restart; damaged entries are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

pytest.importorskip("torch")

from caliber_core.extraction.experiment import ExtractionSettings  # noqa: E402
from caliber_dashboard.extraction import codec  # noqa: E402
from caliber_dashboard.extraction import runs  # noqa: E402
from caliber_dashboard.extraction import view  # noqa: E402
from caliber_dashboard.workspace import SQLiteStore, from_environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
PAGE = "pages/extraction.py"
SETTINGS = ExtractionSettings(retention=(0.75,), seeds=1, attack="fixed", averaging_attacker="frontier")


def _open(token: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    if token is not None:
        at.query_params["ws"] = token
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def _token(at) -> str:
    value = at.query_params["ws"]
    return value[0] if isinstance(value, list) else value


def _restart() -> None:
    """What a server restart forgets: every in-process cache (results, thieves, parsed files)."""
    st.cache_resource.clear()
    st.cache_data.clear()


def _store() -> SQLiteStore:
    cfg = from_environment()
    return SQLiteStore(cfg.data_dir, limits=cfg.limits)


def _run_small(at) -> str:
    at.multiselect(key="extraction_retention").set_value([0.75])
    at.number_input(key="extraction_seeds").set_value(1)
    at.selectbox(key="extraction_attack").set_value("fixed").run()
    at.button(key="extraction_run").click().run()
    assert not at.exception
    return at.selectbox(key="extraction_model").value


@pytest.fixture(scope="module")
def finished():
    """One small run in a fresh workspace: (token, file sha256, its Table-3 analogue)."""
    _restart()
    at = _open()
    sha = _run_small(at)
    assert "Run the extraction" not in [b.label for b in at.button]
    return _token(at), sha, at.dataframe[0].value


def test_reload_and_restart_show_the_last_run_without_training(finished):
    token, sha, table = finished
    _restart()
    at = _open(token)  # a reload after a restart: a new session on the same URL
    assert "Run the extraction" not in [b.label for b in at.button]
    # The page's widgets came back to the last run's choices ...
    assert at.selectbox(key="extraction_model").value == sha
    assert at.multiselect(key="extraction_retention").value == [0.75]
    assert at.number_input(key="extraction_seeds").value == 1
    assert at.selectbox(key="extraction_attack").value == "fixed"
    # ... the tables are the run's own, and nothing trained: the in-process cache is still empty.
    assert at.dataframe[0].value.equals(table)
    assert not view.is_cached(view.demo_archives()[sha], SETTINGS)
    # the run's two charts are back (the campaign-size figure, drawn from docs/figures, is always there)
    assert {c.key for c in at.get("plotly_chart")} == {"fig_extraction_frontier", "fig_extraction_m",
                                                        "fig_extraction_sizes"}
    assert any("kept in this workspace" in c.value for c in at.caption)


def test_another_workspace_does_not_see_the_run(finished):
    _restart()
    at = _open()  # no token: a fresh workspace
    assert "Run the extraction" in [b.label for b in at.button]
    assert not at.dataframe


@pytest.mark.parametrize("payload", [b"J{not json", b"J" + b'{"saved_at": 1.0, "run": {"format": "x"}}'])
def test_a_damaged_stored_run_is_skipped_with_a_warning(finished, payload):
    token, sha, _ = finished
    store = _store()
    key = codec.run_key(sha, SETTINGS)
    good = store.load_result(token, runs.RUN_KIND + sha, key)
    store.save_result(token, runs.RUN_KIND + sha, key, payload)
    try:
        _restart()
        at = _open(token)
        assert not at.exception
        assert any("Skipped" in w.value and "extraction run" in w.value for w in at.warning)
        assert "Run the extraction" in [b.label for b in at.button]  # offered again, nothing crashed
    finally:
        store.save_result(token, runs.RUN_KIND + sha, key, good)
