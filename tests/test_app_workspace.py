"""AppTest: the workspace behind the dashboard (token, restore, options, caps, damage, delete)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
import streamlit as st
from streamlit.testing.v1 import AppTest

from caliber_dashboard.common import state
from caliber_dashboard.workspace import SQLiteStore, from_environment

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
N_DEMO = len(list((Path(APP).parents[1] / "data").glob("digits_*.npz")))


def _npz(seed: int, *, n: int = 300, k: int = 5, labels: bool = True) -> bytes:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += 2.0
    buf = io.BytesIO()
    np.savez(buf, **({"logits": z, "labels": y} if labels else {"logits": z}))
    return buf.getvalue()


def _open(token: str | None = None, page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if token is not None:
        at.query_params["ws"] = token
    if page is not None:
        at.switch_page(page)
    at.run()
    assert not at.exception
    return at


def _token(at) -> str:
    value = at.query_params["ws"]
    return value[0] if isinstance(value, list) else value


def _upload(at, name: str, content: bytes) -> None:
    at.file_uploader(key="upload_logits").set_value((name, content, "application/octet-stream")).run()
    assert not at.exception


def _store() -> SQLiteStore:
    cfg = from_environment()
    return SQLiteStore(cfg.data_dir, limits=cfg.limits)


def _sidebar_text(at) -> str:
    return " ".join(str(c.value) for c in at.sidebar.caption)


def test_first_visit_gets_a_token_and_the_privacy_notice():
    at = _open()
    token = _token(at)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
    assert not _store().exists(token)  # nothing kept yet: the workspace is stored by its first write
    assert len(at.session_state[state.MODELS]) == N_DEMO
    assert "sharing the URL shares the workspace" in _sidebar_text(at)
    assert at.button(key="ws_new") is not None and at.button(key="ws_delete") is not None
    other = _open()
    assert _token(other) != token


def test_upload_and_options_survive_a_new_session_on_the_same_url():
    at = _open()
    token = _token(at)
    _upload(at, "kept.npz", _npz(1))
    sha = [k for k, d in at.session_state[state.MODELS].items() if d.source == "kept.npz"][0]
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    at.selectbox(key="calibrate_statistic").set_value("trimmed").run()
    slider = next(s for s in at.slider if s.key.startswith(f"calibrate_retention_{sha[:12]}"))
    slider.set_value(75.0).run()
    assert not at.exception

    again = _open(token, "pages/calibrate.py")  # a reload: a new session, same URL
    models = again.session_state[state.MODELS]
    assert len(models) == N_DEMO + 1 and models[sha].source == "kept.npz"
    assert np.array_equal(models[sha].logits, at.session_state[state.MODELS][sha].logits)
    assert again.session_state[state.SELECTED] == sha
    assert again.selectbox(key="calibrate_model").value == sha
    assert again.selectbox(key="calibrate_statistic").value == "trimmed"
    slider = next(s for s in again.slider if s.key.startswith(f"calibrate_retention_{sha[:12]}"))
    assert slider.value == 75.0
    assert _token(again) == token


def test_export_inputs_and_calibrate_side_survive_a_reload():
    at = _open()
    token = _token(at)
    at.switch_page("pages/calibrate.py").run()
    at.segmented_control(key="calibrate_side").set_value("at-most").run()
    at.switch_page("pages/export.py").run()
    assert at.text_input(key="export_retention").value == "80"  # Calibrate's default target, its side
    assert at.selectbox(key="export_side").value == "at-most"
    at.text_input(key="export_retention").set_value("85, 70").run()
    at.text_input(key="export_agreement").set_value("60").run()
    at.number_input(key="export_confidence").set_value(0.9).run()
    assert not at.exception

    again = _open(token, "pages/export.py")  # a reload: a new session, same URL
    assert not again.exception
    assert again.text_input(key="export_retention").value == "85, 70"
    assert again.text_input(key="export_agreement").value == "60"
    assert again.selectbox(key="export_side").value == "at-most"
    assert again.number_input(key="export_confidence").value == 0.9
    again.switch_page("pages/calibrate.py").run()
    assert again.segmented_control(key="calibrate_side").value == "at-most"


def test_unknown_token_gets_a_fresh_workspace_and_a_new_token():
    owner = _open()
    _upload(owner, "private.npz", _npz(2))
    for asked in ("made-up-token", _token(owner)[:-1] + ("A" if _token(owner)[-1] != "A" else "B"),
                  "x" * 500):
        visitor = _open(asked)
        assert _token(visitor) not in (asked, _token(owner))
        assert all(d.source != "private.npz" for d in visitor.session_state[state.MODELS].values())
        assert len(visitor.session_state[state.MODELS]) == N_DEMO
        assert not visitor.warning and not visitor.error  # nothing says whether it existed


def test_removed_models_stay_removed_and_demo_is_not_copied():
    at = _open()
    token = _token(at)
    _upload(at, "temp.npz", _npz(3))
    demo_sha = next(iter(at.session_state[state.MODELS]))
    new_sha = [k for k, d in at.session_state[state.MODELS].items() if d.source == "temp.npz"][0]
    assert [r.model for r in _store().uploads(token)] == [new_sha]  # the demo set is not stored
    at.multiselect(key="remove_select").set_value([demo_sha, new_sha]).run()
    at.button(key="remove_btn").click().run()
    assert not at.exception
    assert _store().uploads(token) == []
    again = _open(token)
    assert set(again.session_state[state.MODELS]) == {
        k for k in at.session_state[state.MODELS]} and len(again.session_state[state.MODELS]) == N_DEMO - 1
    again.button(key="demo_btn").click().run()
    assert len(_open(token).session_state[state.MODELS]) == N_DEMO


def test_cap_refuses_an_upload_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("CALIBER_WORKSPACE_MAX_MB", "0.01")  # 10 kB
    at = _open()
    _upload(at, "big.npz", _npz(4, n=2000))
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "over its cap of 0" in errors[0] and "Remove models" in errors[0]
    assert len(at.session_state[state.MODELS]) == N_DEMO
    assert _store().uploads(_token(at)) == []


def test_damaged_entry_is_skipped_with_a_warning_and_the_rest_restored():
    at = _open()
    token = _token(at)
    _upload(at, "good.npz", _npz(5))
    _upload(at, "doomed.npz", _npz(6))
    store = _store()
    good, doomed = (r.model for r in store.uploads(token))
    path = store.root / "blobs" / doomed[:2] / doomed
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    st.cache_resource.clear()  # as after a server restart: nothing parsed in memory

    again = _open(token)
    models = again.session_state[state.MODELS]
    assert good in models and doomed not in models
    warnings = [w.value for w in again.sidebar.warning]
    assert any("doomed" in w and "damaged" in w for w in warnings), warnings
    assert _token(again) == token


def test_new_and_delete_workspace_buttons():
    at = _open()
    first = _token(at)
    _upload(at, "first.npz", _npz(7))
    at.button(key="ws_new").click().run()
    assert not at.exception
    second = _token(at)
    assert second != first and len(at.session_state[state.MODELS]) == N_DEMO
    assert len(_store().uploads(first)) == 1  # the old one stays at its own URL
    _upload(at, "second.npz", _npz(8))
    at.button(key="ws_delete").click().run()
    assert not at.exception
    assert not _store().exists(second) and _token(at) not in (first, second)
    assert len(at.session_state[state.MODELS]) == N_DEMO
    assert _store().exists(first)
    assert os.environ["CALIBER_DATA_DIR"]  # the tests never touch the real data directory


def _result_script():
    import streamlit as st

    from caliber_dashboard.workspace import session

    session.open_session()
    if st.button("save", key="save"):
        session.save_result("extraction", "run-1", {"accuracy": 0.91, "draws": [1, 2]})
        session.save_result("extraction", "weights", b"\x00raw")
    if st.button("nan", key="nan"):
        try:
            session.save_result("extraction", "bad", {"x": float("nan")})
        except ValueError as exc:
            st.error(f"refused: {exc}")
    st.text(repr(session.load_result("extraction", "run-1")))
    st.text(repr(session.load_result("extraction", "weights")))
    st.text(repr(session.load_result("extraction", "missing", "absent")))


def test_save_and_load_result_api():
    at = AppTest.from_function(_result_script, default_timeout=30).run()
    at.button(key="save").click().run()
    at.button(key="nan").click().run()
    assert not at.exception
    assert "refused" in at.error[0].value
    token = _token(at)
    again = AppTest.from_function(_result_script, default_timeout=30)
    again.query_params["ws"] = token
    again.run()
    assert [t.value for t in again.text] == [
        "{'accuracy': 0.91, 'draws': [1, 2]}", "b'\\x00raw'", "'absent'"]
    assert set(_store().results(token, "extraction")) == {"run-1", "weights"}
    other = AppTest.from_function(_result_script, default_timeout=30).run()
    assert [t.value for t in other.text] == ["None", "None", "'absent'"]


def test_a_visit_that_keeps_nothing_stores_no_workspace():
    at = _open()
    token = _token(at)
    for page in ("pages/fleet.py", "pages/extraction.py", "pages/data.py"):  # pages that only read
        at.switch_page(page).run()
        assert not at.exception, page
    assert _token(at) == token and not _store().exists(token)
    _upload(at, "kept.npz", _npz(11))
    assert _token(at) == token and _store().exists(token)  # the same URL now names the stored workspace
    assert [r.filename for r in _store().uploads(token)] == ["kept.npz"]
    again = _open(token)
    assert any(d.source == "kept.npz" for d in again.session_state[state.MODELS].values())


def test_choices_are_written_after_the_run_by_the_background_worker(monkeypatch):
    # Inside a server a choice's durable write (a disk sync) no longer holds up the end of the
    # run the visitor waits for: the background worker makes it, and a reload still finds it.
    import threading

    from caliber_dashboard import warmup
    from caliber_dashboard.common import background
    from caliber_dashboard.workspace import session as workspace

    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    writers = []
    real = workspace.save_result

    def save_result(kind, key, payload):
        writers.append((kind, threading.current_thread().name))
        return real(kind, key, payload)

    monkeypatch.setattr(workspace, "save_result", save_result)
    at = _open()
    _upload(at, "deferred.npz", _npz(2))
    at.switch_page("pages/calibrate.py").run()
    at.selectbox(key="calibrate_statistic").set_value("trimmed").run()
    assert not at.exception
    background.drain()  # everything queued before it is written
    choices = [thread for kind, thread in writers if kind in (state.OPTIONS_KIND, state.SETTINGS_KIND)]
    assert choices and all(thread.startswith("caliber-after-run") for thread in choices)
    again = _open(_token(at), "pages/calibrate.py")
    assert again.selectbox(key="calibrate_statistic").value == "trimmed"


def test_leaving_a_workspace_first_writes_what_is_queued_for_it(monkeypatch):
    # A choice still queued for the old workspace is written before the switch (or the deletion,
    # which a late write would undo), never after it.
    import threading
    import time

    from caliber_dashboard.common import background

    monkeypatch.setattr(background, "serving", lambda: True)
    written, order = threading.Event(), []

    def slow_write():
        time.sleep(0.3)
        order.append("write")
        written.set()

    background._worker.submit(slow_write)
    background.drain()
    order.append("switch")
    assert written.is_set() and order == ["write", "switch"]
