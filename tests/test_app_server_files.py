"""AppTest: a file opened from the data root joins the workspace by path, survives a reload, exports."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.cli.commands import main
from caliber_dashboard.common import state
from caliber_dashboard.data import server_panel
from caliber_dashboard.workspace import SQLiteStore, from_environment

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


@pytest.fixture()
def root(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    n, k = 400, 40  # a small stand-in for a 2,000 x 32,000 dump with its labels
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)).astype(np.float32)
    z[np.arange(n), y] += 3.0
    base = tmp_path / "dumps"
    (base / "run1").mkdir(parents=True)
    np.save(base / "run1" / "next_token.npy", z)
    np.save(base / "run1" / "next_token_labels.npy", y)
    np.save(tmp_path / "outside.npy", z)
    os.symlink(tmp_path / "outside.npy", base / "link_out.npy")
    monkeypatch.setenv("CALIBER_DATA_ROOT", str(base))
    return base


def _data_page(token: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if token is not None:
        at.query_params["ws"] = token
    at.switch_page("pages/data.py")
    at.run()
    assert not at.exception
    return at


def _token(at) -> str:
    value = at.query_params["ws"]
    return value[0] if isinstance(value, list) else value


def _text(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)  # ui.plain escapes Markdown


def _messages(at) -> list[str]:
    return [_text(m.value) for m in (*at.success, *at.error, *at.info)]


def _open(at, path=None, labels=None, typed=None) -> None:
    if path is not None:
        at.selectbox(key=server_panel.FILE_KEY).set_value(path)
    if labels is not None:
        at.selectbox(key=server_panel.LABELS_KEY).set_value(labels)
    if typed is not None:
        at.text_input(key=server_panel.TYPED_KEY).set_value(typed)
    at.button(key="server_open_btn").click().run()
    assert not at.exception


def test_the_panel_lists_the_root_and_opens_a_file_in_place(root):
    at = _data_page()
    assert any(s.value == "Files on this server" for s in at.subheader)
    options = at.selectbox(key=server_panel.FILE_KEY).options
    assert [o.split("  (")[0] for o in options] == ["run1/next_token.npy", "run1/next_token_labels.npy"]  # never the link out
    before = set(at.session_state[state.MODELS])
    _open(at, "run1/next_token.npy", "run1/next_token_labels.npy")
    data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
    assert data.source == "run1/next_token.npy" and data.has_labels and data.n_classes == 40
    assert any(m.startswith("Opened next_token: N=400, K=40, labels yes") for m in _messages(at))
    # No blob: the workspace holds the path, not the bytes.
    cfg = from_environment()
    store = SQLiteStore(cfg.data_dir, limits=cfg.limits)
    assert store.uploads(_token(at)) == []
    assert set(at.session_state[state.MODELS]) == before | {data.sha256}


@pytest.mark.parametrize("typed", ["../outside.npy", "link_out.npy", "/etc/passwd", "run1/missing.npy"])
def test_a_path_out_of_the_root_changes_nothing_and_reads_like_a_missing_one(root, typed):
    at = _data_page()
    before = set(at.session_state[state.MODELS])
    _open(at, typed=typed)
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].endswith("no such file in the data root (a path is relative to "
                                                   "the root, without '..', and may not lead out of it)")
    assert set(at.session_state[state.MODELS]) == before


def test_a_reload_reopens_the_file_then_it_calibrates_and_exports_a_checked_config(root, tmp_path):
    at = _data_page()
    _open(at, "run1/next_token.npy", "run1/next_token_labels.npy")
    sha = at.session_state[state.SELECTED]
    again = _data_page(_token(at))
    assert sha in again.session_state[state.MODELS]
    assert again.session_state[state.MODELS][sha].source == "run1/next_token.npy"
    again.switch_page("pages/calibrate.py").run()
    assert not again.exception
    again.switch_page("pages/export.py").run()
    assert not again.exception
    config = json.loads(again.code[0].value)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path), str(root / "run1" / "next_token.npy"),
                 "--labels", str(root / "run1" / "next_token_labels.npy")]) == 0


def test_removing_the_file_forgets_its_record(root):
    at = _data_page()
    _open(at, "run1/next_token.npy", "run1/next_token_labels.npy")
    sha = at.session_state[state.SELECTED]
    at.multiselect(key="remove_select").set_value([sha])
    at.button(key="remove_btn").click().run()
    assert sha not in at.session_state[state.MODELS]
    assert sha not in _data_page(_token(at)).session_state[state.MODELS]


def test_a_file_gone_from_the_root_is_skipped_with_a_warning(root):
    at = _data_page()
    _open(at, "run1/next_token.npy", "run1/next_token_labels.npy")
    sha = at.session_state[state.SELECTED]
    (root / "run1" / "next_token.npy").unlink()
    again = _data_page(_token(at))
    assert sha not in again.session_state[state.MODELS]
    assert any("run1/next_token.npy: no such file in the data root" in w
               for w in again.session_state[state.WARNINGS])


def test_without_a_root_the_panel_is_absent(monkeypatch):
    monkeypatch.delenv("CALIBER_DATA_ROOT", raising=False)
    at = _data_page()
    assert not any(s.value == "Files on this server" for s in at.subheader)
