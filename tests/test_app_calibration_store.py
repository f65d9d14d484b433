"""AppTest: a calibration kept in the workspace is not computed again after a server restart."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibration_arrays import calibration_from_bytes
from caliber_dashboard.common import calibration_store, state
from caliber_dashboard.workspace import SQLiteStore, from_environment

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
SIGMA = "σ* (logit units)"


def _npz(seed: int, *, n: int = 400, k: int = 6) -> bytes:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += 2.0
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y)
    return buf.getvalue()


def _store() -> SQLiteStore:
    cfg = from_environment()
    return SQLiteStore(cfg.data_dir, limits=cfg.limits)


def _token(at) -> str:
    value = at.query_params["ws"]
    return value[0] if isinstance(value, list) else value


def _metric(at, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}; have {[m.label for m in at.metric]}"
    return found[0]


@pytest.fixture
def spy(monkeypatch):
    """The uploads the dashboard sweeps, by digest (pipeline.calibrate_data's calls).

    The demo set is left out: the server's warm-up calibrates it in its own thread. A shared
    calibration is built without the visitor's names, so the digest tells the files apart.
    """
    calls = []
    real = pipeline.calibrate_data
    demo = {d.sha256 for d in state.demo_models()}

    def counted(data, *args, **kwargs):
        if data.sha256 not in demo:
            calls.append(data.sha256)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(pipeline, "calibrate_data", counted)
    return calls


def _calibrated(name: str, content: bytes, token: str | None = None) -> tuple[AppTest, str]:
    """Upload ``content`` (unless the workspace has it), open Calibrate on it; (app, its sha256)."""
    at = AppTest.from_file(APP, default_timeout=60)
    if token is not None:
        at.query_params["ws"] = token
    at.run()
    if token is None:
        at.file_uploader(key="upload_logits").set_value((name, content, "application/octet-stream")).run()
    sha = next(k for k, d in at.session_state[state.MODELS].items() if d.source == name)
    at.session_state[state.SELECTED] = sha
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="calibrate_model").value == sha
    return at, sha


def _restart() -> None:
    # Every process-wide cache gone: slots, parsed uploads, the store object.
    st.cache_resource.clear()
    st.cache_data.clear()


def test_restart_reads_the_calibration_back_instead_of_sweeping(spy):
    content = _npz(21)
    at, sha = _calibrated("restart.npz", content)
    assert spy == [sha]
    sigma, scale, draws = _metric(at, SIGMA), _metric(at, "S (median margin)"), _metric(at, "noise draws / input")
    first_warnings = [w.value for w in at.warning]
    assert not any("calibration of" in w for w in first_warnings)
    token = _token(at)
    stored = _store().results(token, calibration_store.KIND + sha)
    assert len(stored) == 1
    payload = next(iter(stored.values()))
    assert payload[:1] == b"B"  # bytes, not JSON: the .npz itself

    _restart()
    again, _ = _calibrated("restart.npz", content, token)
    assert spy == [sha], "the restarted server swept again"
    assert (_metric(again, SIGMA), _metric(again, "S (median margin)"),
            _metric(again, "noise draws / input")) == (sigma, scale, draws)
    assert [w.value for w in again.warning] == first_warnings  # the page's own advice, nothing more
    data = again.session_state[state.MODELS][sha]
    cal = calibration_from_bytes(payload[1:], logits=data.logits, labels=data.labels)
    assert cal.statistic == "median" and cal.seed == 0

    # Another statistic is another calibration: swept once, then kept too.
    again.selectbox(key="calibrate_statistic").set_value("mean").run()
    assert not again.exception and spy == [sha, sha]
    assert len(_store().results(token, calibration_store.KIND + sha)) == 2


def test_damaged_stored_calibration_is_skipped_with_a_warning_and_recomputed(spy):
    content = _npz(22)
    at, sha = _calibrated("damaged.npz", content)
    sigma = _metric(at, SIGMA)
    token = _token(at)
    store = _store()
    (key, payload), = store.results(token, calibration_store.KIND + sha).items()
    store.save_result(token, calibration_store.KIND + sha, key, payload[: len(payload) // 2])

    _restart()
    again, _ = _calibrated("damaged.npz", content, token)
    assert spy == [sha, sha]
    assert _metric(again, SIGMA) == sigma
    warnings = [w.value for w in again.warning]
    assert any("stored calibration of" in w and "computed again" in w for w in warnings), warnings
    # The fresh result replaced the damaged entry: the next restart reads it.
    assert store.results(token, calibration_store.KIND + sha)[key] == payload
    _restart()
    third, _ = _calibrated("damaged.npz", content, token)
    assert spy == [sha, sha] and _metric(third, SIGMA) == sigma


def test_cap_refusal_shows_the_result_and_says_it_was_not_kept(spy, monkeypatch):
    content = _npz(23)
    # Room for the upload (~20 kB) but not for its calibration (~1 MB of intervals).
    monkeypatch.setenv("CALIBER_WORKSPACE_MAX_MB", "0.2")
    _restart()
    at, sha = _calibrated("capped.npz", content)
    assert spy == [sha]
    assert _metric(at, SIGMA)
    warnings = [w.value for w in at.warning]
    assert any("shown but was not kept" in w for w in warnings), warnings
    assert _store().results(_token(at), calibration_store.KIND + sha) == {}
    _restart()


def test_demo_models_are_not_stored(spy):
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    demo = at.session_state[state.SELECTED]
    assert demo in {d.sha256 for d in state.demo_models()}
    assert _store().results(_token(at), calibration_store.KIND + demo) == {}


def test_key_names_every_option():
    at = AppTest.from_file(APP, default_timeout=60).run()
    data = next(iter(at.session_state[state.MODELS].values()))
    base = calibration_store.store_key(data, statistic="median", seed=0, realizations=None)
    assert base[0] == calibration_store.KIND + data.sha256
    others = {calibration_store.store_key(data, statistic="mean", seed=0, realizations=None),
              calibration_store.store_key(data, statistic="median", seed=1, realizations=None),
              calibration_store.store_key(data, statistic="median", seed=0, realizations=8)}
    assert base not in others and len(others) == 3
    from caliber_core.calibration.sweep import default_realizations
    r = default_realizations(data.n_samples, data.n_classes)
    assert calibration_store.store_key(data, statistic="median", seed=0, realizations=r) == base
