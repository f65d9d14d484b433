"""AppTest: a large-vocabulary file from the data root goes through the streamed engine, never a dense copy.

It is reduced once when opened, calibrated from the reduction (the sigmas ``caliber calibrate``
writes for the same file), shown on Calibrate with its certified bounds, exported with a config
``caliber check`` accepts, served by Policy, and kept across a reload.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.cli.commands import main
from caliber_core.config import config_to_json
from caliber_dashboard.common import state
from caliber_dashboard.data import server_files, server_panel, vocab_files

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
K = 8192  # full_vocab.STREAM_MIN_CLASSES


@pytest.fixture()
def root(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    n = 240
    y = rng.integers(0, K, n)
    z = rng.standard_normal((n, K), dtype=np.float32)
    z[np.arange(n), y] += 3.0
    base = tmp_path / "dumps"
    (base / "lm").mkdir(parents=True)
    np.save(base / "lm" / "next_token.npy", z)
    np.save(base / "lm" / "next_token_labels.npy", y)
    np.save(base / "lm" / "short_labels.npy", y[:-1])
    (base / "lm" / "cut.npy").write_bytes((base / "lm" / "next_token.npy").read_bytes()[:3_000_000])
    monkeypatch.setenv("CALIBER_DATA_ROOT", str(base))
    return base


@pytest.fixture()
def no_dense(monkeypatch):
    def dense(*args, **kwargs):
        raise AssertionError("a large-vocabulary file was read into a dense matrix")

    monkeypatch.setattr(server_files, "open_in_place", dense)


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


def _open(at, path, labels=None) -> None:
    at.selectbox(key=server_panel.FILE_KEY).set_value(path)
    if labels is not None:
        at.selectbox(key=server_panel.LABELS_KEY).set_value(labels)
    at.button(key="server_open_btn").click().run()
    assert not at.exception, at.exception


def _members(at) -> dict:
    return at.session_state[vocab_files.MEMBERS][1]


def test_a_large_file_is_streamed_calibrated_checked_and_kept(root, no_dense, tmp_path, capsys):
    at = _page("pages/data.py")
    models_before = set(at.session_state[state.MODELS])
    _open(at, "lm/next_token.npy", "lm/next_token_labels.npy")
    assert any(_text(s.value).startswith("Streamed lm/next_token.npy (labels from lm/next_token_labels.npy): "
                                         f"N=240 K={K:,}") for s in at.success), [s.value for s in at.success]
    assert set(at.session_state[state.MODELS]) == models_before  # no dense model joined
    (entry,) = _members(at).values()
    assert entry["path"] == "lm/next_token.npy" and entry["has_labels"]
    assert [t["requested"] for t in entry["config"]["targets"]] == [0.9, 0.8, 0.7, 0.6]
    assert any("lm/next_token.npy (240 x 8,192, point)" in _text(m.value) for m in at.markdown)

    # The command line's engine on the same file gives the same config.
    cli_cfg = tmp_path / "cli.json"
    assert main(["calibrate", str(root / "lm" / "next_token.npy"), "--labels",
                 str(root / "lm" / "next_token_labels.npy"), "--out", str(cli_cfg), "--quiet"]) == 0
    cli = json.loads(cli_cfg.read_text())
    assert [t["sigma"] for t in entry["config"]["targets"]] == pytest.approx([t["sigma"] for t in cli["targets"]])
    assert entry["config"]["sha256"] == cli["sha256"]

    at.switch_page("pages/calibrate.py").run()
    assert not at.exception, at.exception
    assert any(s.value == "Large-vocabulary files (streamed engine)" for s in at.subheader)
    table = at.dataframe[0].value
    assert list(table["target"]) == ["retention 90%", "retention 80%", "retention 70%", "retention 60%"]
    assert "accuracy (certified bounds)" in table.columns
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [tr["name"] for tr in spec["data"][:2]] == ["upper bound of the accuracy", "lower bound of the accuracy"]
    # A new choice is solved on the reduction and stored.
    digest = entry["sha256"]
    at.selectbox(key=f"vocab_side_{digest[:12]}").set_value("at-least")
    at.text_input(key=f"vocab_targets_{digest[:12]}_retention").set_value("85").run()
    assert not at.exception, at.exception
    entry = _members(at)[digest]
    assert entry["targets"] == [["retention", 0.85]] and entry["side"] == "at-least"
    (target,) = entry["config"]["targets"]
    assert target["interval"]["retention"][0] >= 0.85 - 1e-12  # the side's bound keeps the target

    at.switch_page("pages/export.py").run()
    assert not at.exception, at.exception
    codes = [c.value for c in at.code]
    assert any("calibrate lm/next_token.npy --labels lm/next_token_labels.npy --retention 0.85 --side at-least"
               in c for c in codes), codes
    cfg = tmp_path / "cfg.json"
    cfg.write_text(config_to_json(entry["config"]))  # the download button's bytes
    capsys.readouterr()
    assert main(["check", str(cfg), str(root / "lm" / "next_token.npy"), "--labels",
                 str(root / "lm" / "next_token_labels.npy")]) == 0, capsys.readouterr()

    # A reload reads the record back: Calibrate, Export and Policy read its config, the file is not streamed.
    token = at.query_params["ws"]
    token = token[0] if isinstance(token, list) else token
    vocab_files._CACHE._items.clear()
    again = _page("pages/calibrate.py", token)
    assert _members(again)[digest]["config"] == entry["config"]
    again.switch_page("pages/policy.py").run()
    assert not again.exception, again.exception
    again.selectbox(key="policy_vocab").set_value(digest).run()
    assert not again.exception, again.exception
    policy = json.loads(again.code[-1].value)
    assert policy["config"] == {"path": "next_token.caliber.json", "n_classes": K,
                                "sha256": hashlib.sha256(config_to_json(entry["config"]).encode()).hexdigest()}


def test_a_bad_large_file_gets_one_line_with_its_relative_path(root):
    at = _page("pages/data.py")
    _open(at, "lm/cut.npy")  # its header cannot be streamed: the ordinary reader refuses it, before any read
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("lm/cut.npy: "), errors
    assert str(root) not in errors[0]
    assert not _members(at)
    _open(at, "lm/next_token.npy", "lm/short_labels.npy")  # the streamed engine's own check
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("lm/short_labels.npy: ") and str(root) not in errors[0], errors
    assert not _members(at)
    at.text_input(key=server_panel.TYPED_KEY).set_value("../dumps/lm/next_token.npy")
    at.button(key="server_open_btn").click().run()
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1 and "no such file in the data root" in errors[0]


def test_removing_a_streamed_file_forgets_its_record(root, no_dense):
    at = _page("pages/data.py")
    _open(at, "lm/next_token.npy")  # no labels: agreement targets
    (digest, entry), = _members(at).items()
    assert [t["kind"] for t in entry["config"]["targets"]] == ["agreement", "agreement"]
    at.button(key=f"vocab_remove_{digest[:16]}").click().run()
    assert not _members(at)
    token = at.query_params["ws"]
    again = _page("pages/data.py", token[0] if isinstance(token, list) else token)
    assert not _members(again)
