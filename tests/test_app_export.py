"""AppTest: the Export page — the config equals pipeline.config_for / the CLI; config review."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import measured_accuracy, sigma_for_target
from caliber_core.config import config_to_json
from caliber_dashboard.common import state

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/export.py").run()
    assert not at.exception
    return at


def _text(markdown: str) -> str:
    """What the browser shows for Markdown the app escaped with ui.plain."""
    return re.sub(r"\\(.)", r"\1", markdown)


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def _preview(at) -> str:
    """The JSON preview; st.code drops the file's final newline, put it back."""
    return at.code[0].value + "\n"


def test_default_export_equals_config_for():
    at = _app()
    data = _selected(at)
    _, _, config = pipeline.config_for(data)  # the CLI's defaults: 90/80/70/60% retention
    assert _preview(at) == config_to_json(config)  # byte for byte
    assert [t["requested"] for t in json.loads(_preview(at))["targets"]] == [0.9, 0.8, 0.7, 0.6]
    button = at.get("download_button")[0]
    assert button.proto.label == "Download config JSON"
    assert button.proto.ignore_rerun  # on_click="ignore"
    assert button.proto.url.endswith(".json")


def test_custom_targets_and_other_model():
    at = _app()
    models = at.session_state[state.MODELS]
    other = list(models)[2]
    at.selectbox(key="export_model").set_value(other).run()
    at.text_input(key="export_retention").set_value("85, 65").run()
    at.text_input(key="export_accuracy").set_value("50").run()
    at.text_input(key="export_agreement").set_value("75").run()
    assert not at.exception
    targets = [("retention", 0.85), ("retention", 0.65), ("accuracy", 0.5), ("agreement", 0.75)]
    _, _, config = pipeline.config_for(models[other], targets)
    assert _preview(at) == config_to_json(config)
    table = at.dataframe[0].value
    assert list(table["target"]) == ["retention 85%", "retention 65%", "accuracy 50%", "agreement 75%"]
    # Percent where a person reads it: the delivered values beside their percent intervals.
    assert list(table["retention %"][:2]) == pytest.approx([100 * t["retention"] for t in config["targets"][:2]])
    assert "retention" not in table.columns and "σ served" in table.columns


def test_export_matches_the_cli(tmp_path):
    at = _app()
    at.text_input(key="export_retention").set_value("80").run()
    data = _selected(at)
    out = tmp_path / "cfg.json"
    proc = subprocess.run(
        [sys.executable, "-m", "caliber_core", "calibrate", data.source, "--retention", "0.8",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(out.read_text())
    page = json.loads(_preview(at))
    assert page["targets"][0]["sigma"] == cli["targets"][0]["sigma"]  # exactly equal
    assert page == cli


@pytest.mark.parametrize("text, message", [
    ("90, abc", "retention targets: not a number: 'abc'"),
    ("120", "retention targets: a target must be a percentage in (0, 100], got '120'"),
])
def test_bad_targets_text(text, message):
    at = _app()
    at.text_input(key="export_retention").set_value(text).run()
    assert not at.exception
    assert [_text(e.value) for e in at.error] == [message]
    assert not at.get("download_button")


def test_unreachable_target_is_an_error_not_an_exception():
    at = _app()
    at.text_input(key="export_retention").set_value("").run()
    at.text_input(key="export_accuracy").set_value("5").run()  # below chance 1/K = 10%
    assert not at.exception
    assert at.error and "out of reach" in _text(at.error[0].value)


def _import(at, content: bytes, name: str = "saved.caliber.json") -> AppTest:
    return at.file_uploader(key="import_config").set_value((name, content, "application/json")).run()


def test_import_review_matches_loaded_model():
    at = _app()
    text = _preview(at)
    data = _selected(at)
    _import(at, text.encode())
    assert not at.exception
    assert any("schema caliber.config/v2 OK" in _text(s.value) for s in at.success)
    assert any("sha256 matches" in _text(s.value) for s in at.success)
    review = at.dataframe[1].value
    saved = json.loads(text)
    assert list(review["σ in file"]) == [t["sigma"] for t in saved["targets"]]
    assert list(review["σ recomputed now"]) == [t["sigma"] for t in saved["targets"]]
    assert all(review["Δσ %"] == 0.0)
    cal = pipeline.calibrate_data(data)
    assert list(review["target"]) == ["retention 90%", "retention 80%", "retention 70%", "retention 60%"]
    for got, t in zip(review["predicted accuracy at file σ %"], saved["targets"]):
        assert got == pytest.approx(100 * float(measured_accuracy(cal, t["sigma"])[0]))
        assert got == pytest.approx(100 * t["accuracy"], abs=1e-2)  # curve inversion lands on target


def test_review_recomputes_a_saturated_logistic_target_with_the_logistic():
    """The review reads the inversion from the recorded method: "saturated-logistic" is logistic.

    The target lies below the fitted law's floor (so the logistic saturates) but
    within the measured curve's reach: inverting the curve instead would give a
    different sigma and report a spurious difference.
    """
    at = _app()
    data = _selected(at)
    cal = pipeline.calibrate_data(data)
    floor = cal.chance + cal.fit.c * (cal.clean_accuracy - cal.chance)
    target = round(floor - 0.003, 4)
    _, results, config = pipeline.config_for(data, [("accuracy", target)], inversion="logistic", saturate=True)
    assert results[0].method == "saturated-logistic" and results[0].sigma == cal.sweep.sigma[-1]
    curve = sigma_for_target(cal, target, kind="accuracy", inversion="curve", saturate=True)
    assert curve.method == "exact-curve" and abs(curve.sigma / results[0].sigma - 1) > 0.1
    _import(at, config_to_json(config).encode())
    assert not at.exception
    review = at.dataframe[1].value
    assert list(review["σ recomputed now"]) == [results[0].sigma]
    assert list(review["Δσ %"]) == [0.0]


def test_import_mismatched_sha_warns():
    at = _app()
    saved = json.loads(_preview(at))
    saved["sha256"] = "0" * 64
    _import(at, json.dumps(saved).encode())
    assert not at.exception
    assert any("sha256 mismatch" in _text(w.value) for w in at.warning)
    assert len(at.dataframe) == 3  # still reviewed and checked, recomputed on the loaded model


@pytest.mark.parametrize("content, message", [
    (b"{not json", "config is not valid JSON"),
    (json.dumps({"schema": "other/v0"}).encode(), "config schema must be 'caliber.config/v2'"),
    (b"\x00\x01binary", "config is not valid JSON"),
])
def test_import_bad_config_shows_config_error(content, message):
    at = _app()
    _import(at, content, "bad.json")
    assert not at.exception
    assert len(at.error) == 1 and _text(at.error[0].value).startswith("bad.json: " + message)
    assert len(at.dataframe) == 1  # no review table
