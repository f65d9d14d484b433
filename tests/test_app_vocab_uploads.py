"""AppTest: an uploaded large-vocabulary matrix goes through the data root's streamed engine, never dense.

It is reduced once (the sigmas ``caliber calibrate`` writes for the same bytes), stored in the
workspace, exported with a config ``caliber check`` accepts, kept across a reload without being
parsed whole, and removed with its stored bytes; a bad one gets one line and nothing is stored.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.cli.commands import main
from caliber_core.config import config_to_json
from caliber_dashboard.common import state, upload_boundary
from caliber_dashboard.data import vocab_files
from caliber_dashboard.workspace import session as workspace
from caliber_dashboard.workspace.store import UnknownWorkspace

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
K = 8192  # full_vocab.STREAM_MIN_CLASSES


@pytest.fixture()
def dump(tmp_path):
    rng = np.random.default_rng(5)
    n = 200
    y = rng.integers(0, K, n)
    z = rng.standard_normal((n, K), dtype=np.float32)
    z[np.arange(n), y] += 3.0
    np.savez(tmp_path / "next_token.npz", logits=z, labels=y)
    np.save(tmp_path / "bare.npy", z)
    np.save(tmp_path / "bare_labels.npy", y)
    return tmp_path


@pytest.fixture()
def no_dense(monkeypatch):
    def dense(*args, **kwargs):
        raise AssertionError("a large-vocabulary upload was read into a dense matrix")

    monkeypatch.setattr(upload_boundary, "load_logits", dense)


def _text(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def _page(page: str, token: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if token is not None:
        at.query_params["ws"] = token
    at.switch_page(page)
    at.run()
    assert not at.exception, at.exception
    return at


def _upload(at, path: Path) -> None:
    at.file_uploader(key="upload_logits").set_value((path.name, path.read_bytes(), "application/octet-stream")).run()
    assert not at.exception, at.exception


def _members(at) -> dict:
    return at.session_state[vocab_files.MEMBERS][1]


def _stored(token: str) -> set[str]:
    """The digests of the uploads the workspace holds (none before it is first written)."""
    try:
        return {r.model for r in workspace.store().uploads(token)}
    except UnknownWorkspace:
        return set()


def _token(at) -> str:
    token = at.query_params["ws"]
    return token[0] if isinstance(token, list) else token


def test_a_large_upload_is_streamed_stored_exported_and_kept(dump, no_dense, tmp_path, capsys):
    at = _page("pages/data.py")
    models_before = set(at.session_state[state.MODELS])
    _upload(at, dump / "next_token.npz")
    assert any(_text(s.value).startswith(f"Streamed next_token.npz: N=200 K={K:,}, with labels; a vocabulary this "
                                         "large goes through the streamed engine") for s in at.success), \
        [s.value for s in at.success] + [e.value for e in at.error]
    assert set(at.session_state[state.MODELS]) == models_before  # no dense model joined
    (digest, entry), = _members(at).items()
    assert entry["path"] == "next_token.npz" and entry["blob"] == digest and entry["has_labels"]
    assert digest in _stored(_token(at))  # the bytes are in the workspace

    # The command line's engine on the same bytes gives the same config.
    cli_cfg = tmp_path / "cli.json"
    assert main(["calibrate", str(dump / "next_token.npz"), "--out", str(cli_cfg), "--quiet"]) == 0
    cli = json.loads(cli_cfg.read_text())
    assert [t["sigma"] for t in entry["config"]["targets"]] == pytest.approx([t["sigma"] for t in cli["targets"]])
    assert entry["config"]["sha256"] == cli["sha256"] == digest

    # Calibrate: a new choice reduces the stored bytes again (the process let its reduction go).
    vocab_files._CACHE._items.clear()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception, at.exception
    at.text_input(key=f"vocab_targets_{digest[:12]}_retention").set_value("85").run()
    assert not at.exception, at.exception
    entry = _members(at)[digest]
    assert entry["targets"] == [["retention", 0.85]]

    at.switch_page("pages/export.py").run()
    assert not at.exception, at.exception
    assert any("calibrate next_token.npz --retention 0.85" in c.value for c in at.code)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(config_to_json(entry["config"]))  # the download button's bytes
    capsys.readouterr()
    assert main(["check", str(cfg), str(dump / "next_token.npz")]) == 0, capsys.readouterr()

    # A reload: the record comes back and the stored upload is not parsed (no_dense would fail).
    again = _page("pages/calibrate.py", _token(at))
    assert _members(again)[digest]["config"] == entry["config"]
    assert any(s.value == "Large-vocabulary files (streamed engine)" for s in again.subheader)
    assert not [w for w in again.session_state[state.WARNINGS] if "next_token" in w]

    # Removing it takes its stored bytes along.
    again.switch_page("pages/data.py").run()
    again.button(key=f"vocab_remove_{digest[:16]}").click().run()
    assert not _members(again)
    assert digest not in _stored(_token(again))


def test_a_large_upload_takes_a_labels_file_with_as_many_rows(dump, no_dense):
    at = _page("pages/data.py")
    labels = dump / "bare_labels.npy"
    at.file_uploader(key="upload_labels").set_value((labels.name, labels.read_bytes(), "application/octet-stream"))
    _upload(at, dump / "bare.npy")
    assert any(_text(s.value).startswith("Streamed bare.npy (labels from bare_labels.npy): N=200") for s in at.success)
    (entry,) = _members(at).values()
    assert entry["labels"] == "bare_labels.npy" and entry["labels_blob"] and entry["has_labels"]
    assert [t["kind"] for t in entry["config"]["targets"]] == ["retention"] * 4


def test_a_bad_large_upload_gets_one_line_and_nothing_is_stored(dump):
    at = _page("pages/data.py")
    token = _token(at)
    cut = dump / "cut.npy"
    cut.write_bytes((dump / "bare.npy").read_bytes()[:3_000_000])  # the header declares more than the bytes
    _upload(at, cut)
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("cut.npy: "), errors
    assert str(dump) not in errors[0]
    assert not _members(at)
    assert not _stored(token)
