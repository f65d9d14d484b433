"""AppTest: the Export page's side and confidence (the CLI's config_for), and a surrogate-retention
target from a finished extraction run, downloaded, loaded and served by the Perturber."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.config import config_to_json, load_config, sigma_to_serve
from caliber_core.serving.runtime import Perturber
from caliber_dashboard.common import readouts, state

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")


@pytest.fixture
def downloads(monkeypatch):
    """The bytes behind each download button, by file id (AppTest drops its media store after a run)."""
    files: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, path_or_data, mimetype, kind, filename=None):
        file_id = original(self, path_or_data, mimetype, kind, filename)
        if isinstance(path_or_data, bytes):
            files[file_id] = path_or_data
        return file_id

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)

    def content(at) -> bytes:
        button = [b for b in at.get("download_button") if b.proto.label == "Download config JSON"][0]
        return files[os.path.splitext(os.path.basename(button.proto.url))[0]]
    return content


def _export(token: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    if token is not None:
        at.query_params["ws"] = token
    at.run()
    at.switch_page("pages/export.py").run()
    assert not at.exception
    return at


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


@pytest.mark.parametrize("side, confidence", [("at-least", 0.9), ("at-most", 0.95), ("point", 0.8)])
def test_side_and_confidence_give_config_for_s_config(downloads, side, confidence):
    at = _export()
    at.text_input(key="export_retention").set_value("80, 70").run()
    at.selectbox(key="export_side").set_value(side)
    at.number_input(key="export_confidence").set_value(confidence).run()
    assert not at.exception
    data = _selected(at)
    _, _, config = pipeline.config_for(data, [("retention", 0.8), ("retention", 0.7)], side=side,
                                       confidence=confidence)
    assert downloads(at).decode() == config_to_json(config)  # byte for byte
    saved = load_config(downloads(at))
    assert [t["side"] for t in saved["targets"]] == [side, side]
    assert [t["interval"]["level"] for t in saved["targets"]] == [confidence, confidence]
    table = at.dataframe[0].value
    column = f"retention {100 * confidence:g}% interval"
    for shown, t in zip(table[column], saved["targets"]):
        lo, hi = t["interval"]["retention"]
        assert shown == f"{math.floor(1000 * lo + 1e-6) / 10:.1f}–{math.ceil(1000 * hi - 1e-6) / 10:.1f}%"
    assert list(table["side"]) == [readouts.SIDE_LABELS[side]] * 2
    command = [c.value for c in at.code if c.value.startswith("python -m caliber_core calibrate ")][0]
    assert ("--side" in command) == (side != "point") and ("--confidence" in command) == (confidence != 0.95)


def test_side_export_equals_the_cli(downloads, tmp_path):
    at = _export()
    at.text_input(key="export_retention").set_value("80").run()
    at.selectbox(key="export_side").set_value("at-least")
    at.number_input(key="export_confidence").set_value(0.9).run()
    data = _selected(at)
    out = tmp_path / "cfg.json"
    proc = subprocess.run(
        [sys.executable, "-m", "caliber_core", "calibrate", data.source, "--retention", "0.8",
         "--side", "at-least", "--confidence", "0.9", "--out", str(out), "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(downloads(at)) == json.loads(out.read_text())


def test_no_extraction_run_no_surrogate_option():
    at = _export()
    assert not [c for c in at.checkbox if c.key == "export_surrogate"]
    assert any("No finished extraction run" in c.value for c in at.caption)


def test_surrogate_target_from_the_extraction_run_is_served(downloads):
    pytest.importorskip("torch")
    from caliber_core.extraction.targets import surrogate_records
    from caliber_dashboard.extraction import runs
    from caliber_dashboard.export.config import sigma_text

    # A finished run on the Extraction page: the model the Export page shows first.
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    sha = list(at.session_state[state.MODELS])[0]  # what the Export page's selector starts on
    token = at.query_params["ws"][0] if isinstance(at.query_params["ws"], list) else at.query_params["ws"]
    at.switch_page("pages/extraction.py").run()
    at.selectbox(key="extraction_model").set_value(sha)
    at.multiselect(key="extraction_retention").set_value([0.75])
    at.number_input(key="extraction_seeds").set_value(2)
    at.selectbox(key="extraction_attack").set_value("fixed").run()
    at.button(key="extraction_run").click().run()
    at.slider(key=f"extraction_surrogate_{sha[:12]}").set_value(85.0).run()
    assert not at.exception

    # Calibrate shows the thief beside the sigma it serves, read off this run's frontier.
    from caliber_dashboard.calibrate import thief

    at.switch_page("pages/calibrate.py").run()
    at.selectbox(key="calibrate_model").set_value(sha).run()
    assert not at.exception
    # The readout rounds sigma to its range; the thief line is read at sigma* itself.
    from caliber_core.calibration.calibrate import sigma_for_target

    shown = float([m.value for m in at.metric if m.label == "σ* (logit units)"][0].split()[0])
    sigma = sigma_for_target(pipeline.calibrate_data(at.session_state[state.MODELS][sha]), 0.8).sigma
    assert abs(shown - sigma) < 0.05 * sigma
    (latest,) = [r for k, (_, r) in at.session_state[runs.RUNS].items() if k.startswith(sha)]  # the one run
    found = thief.surrogate_at(latest, sigma)
    assert found is not None and found.bracket[0] <= sigma <= found.bracket[1]
    lines = [m.value for m in at.markdown if m.value.startswith("Thief:")]
    assert len(lines) == 1 and lines[0].startswith("Thief: the strongest surrogate")
    assert f"keeps {100 * found.accuracy:.1f}" in lines[0]

    # Export offers it; the value starts at the Extraction slider's; a config needs the searched sigma.
    at.switch_page("pages/export.py").run()
    at.text_input(key="export_retention").set_value("80").run()
    at.checkbox(key="export_surrogate").check().run()
    assert not at.exception
    r_input = at.number_input(key=f"export_surrogate_r_{sha[:12]}")
    assert r_input.value == 85.0
    assert len(load_config(downloads(at))["targets"]) == 1  # nothing added before the search
    at.button(key="export_surrogate_run").click().run()
    assert not at.exception

    config = load_config(downloads(at))
    kinds = [t["kind"] for t in config["targets"]]
    assert kinds == ["retention", "surrogate-retention"]
    entry = config["targets"][1]
    # The record is caliber_core's own, against the exported file's calibration (the CLI's defaults).
    cal, _, _ = pipeline.config_for(_selected(at), [("retention", 0.8)])
    stored = [v for k, v in at.session_state[runs.RUNS].items() if k.startswith(sha)]
    searched = [r for _, r in stored if r.settings.surrogate_retention == (0.85,)][0]
    from dataclasses import replace
    expected = surrogate_records(replace(searched, calibration=cal))[0].to_dict()
    assert entry == json.loads(json.dumps(expected))
    assert entry["attacker"]["seeds"] == searched.seeds and entry["attacker"]["recipe"]["name"]
    assert entry["requested"] == 0.85 and entry["sigma"] > 0 and entry["side"] == "point"

    # Precision shown: sigma with its standard error, the thief's retention with its spread.
    metric = [m for m in at.metric if m.label.startswith("σ ± s.e.")][0]
    condition = [c for c in searched.targets if c.kind == "surrogate-retention"][0]
    assert metric.value == sigma_text(condition.sigma, condition.sigma_se)
    assert any("replicate seeds" in c.value and "attacker" in c.value for c in at.caption)
    assert "thief keeps" in at.dataframe[0].value.columns

    # The Perturber serves the downloaded file's surrogate target.
    assert sigma_to_serve(config, target=1) == entry["sigma"]
    perturber = Perturber.from_config(downloads(at), target=1, seeding="fresh",
                                      generator=np.random.default_rng(0))
    assert perturber.sigma == entry["sigma"]
    logits = np.zeros((6000, config["n_classes"]))  # the config's K (another K is refused)
    noisy = np.asarray(perturber.perturb(logits))
    assert np.std(noisy) == pytest.approx(entry["sigma"], rel=0.03)  # 3 se of an sd from 60,000 draws

    # A restart later, the same URL: the run and its search come back from the workspace.
    st.cache_resource.clear()
    again = _export(token)
    again.text_input(key="export_retention").set_value("80").run()
    again.checkbox(key="export_surrogate").check().run()
    again.number_input(key=f"export_surrogate_r_{sha[:12]}").set_value(85.0).run()
    assert not again.exception
    assert load_config(downloads(again))["targets"][1] == entry
