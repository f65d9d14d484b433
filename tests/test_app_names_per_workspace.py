"""Names are per workspace: one file uploaded under two names, each workspace sees only its own.

Results cached by content (calibrations, configs, fleet fits, extraction runs)
are shared by every workspace holding the same bytes, so they carry no name;
what a page shows or exports names the file as this visitor uploaded it. Two
workspaces (two AppTest sessions in one process, sharing its caches) upload the
same bytes as ``acme_secret_model_v7.npz`` and ``mine.npz``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from caliber_core.config import config_to_json
from caliber_core.loading import load_logits_bytes
from caliber_dashboard.common import cache, state
from caliber_dashboard.export import config as export_config

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
SECRET = "acme_secret_model_v7"
BIN = "application/octet-stream"


def _without_name(path: Path, *, keep_inputs: bool = True) -> bytes:
    """A demo file's arrays re-saved without its ``name`` entry (so the upload's name is the model's)."""
    z = np.load(path)
    arrays = {k: z[k] for k in z.files if k != "name" and (keep_inputs or k in ("logits", "labels"))}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


WIDE = _without_name(ROOT / "data" / "digits_mlp-wide.npz")
OTHER = _without_name(ROOT / "data" / "digits_logreg-raw.npz", keep_inputs=False)


def _visitor(files: list[tuple[str, bytes]]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    for name, content in files:
        at.file_uploader(key="upload_logits").set_value((name, content, BIN)).run()
        assert not at.exception
    return at


def _everything_shown(at) -> str:
    """The page's text: Markdown, captions, code, alerts, tables (as CSV) and figure specs."""
    parts = [e.value for kind in ("markdown", "caption", "code", "success", "info", "warning", "error", "title",
                                  "subheader") for e in getattr(at, kind)]
    parts += [df.value.to_csv() for df in at.dataframe]
    parts += [json.dumps(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    parts += [str(w.options) for w in at.selectbox] + [str(w.options) for w in at.multiselect]
    return "\n".join(parts).replace("\\", "")


def test_the_cache_functions_hand_each_caller_its_own_names():
    a = load_logits_bytes(WIDE, f"{SECRET}.npz")
    b = load_logits_bytes(WIDE, "mine.npz")
    assert a.sha256 == b.sha256
    cal_a, cal_b = cache.calibration(a), cache.calibration(b)
    assert (cal_a.name, cal_b.name) == (SECRET, "mine")
    assert cache.calibration(a).name == SECRET  # the shared entry was not renamed by b
    targets = [("retention", 0.8)]
    _, config_a = export_config.config(cal_a, a, targets)
    results_b, config_b = export_config.config(cal_b, b, targets)
    assert (config_a["model"], config_a["source"]) == (SECRET, f"{SECRET}.npz")
    text = config_to_json(config_b)
    assert SECRET not in text and json.loads(text)["model"] == "mine" and json.loads(text)["source"] == "mine.npz"
    assert SECRET not in config_to_json(export_config.with_surrogate(cal_b, results_b, b, []))
    assert SECRET not in export_config.calibrate_command(b, targets)


def test_two_workspaces_one_file_two_names_on_calibrate_export_and_fleet():
    st.cache_resource.clear()  # a server start: both visitors meet the same empty caches
    first = _visitor([(f"{SECRET}.npz", WIDE), (f"{SECRET}_twin.npz", OTHER)])
    second = _visitor([("mine.npz", WIDE), ("mine_twin.npz", OTHER)])
    assert first.query_params["ws"] != second.query_params["ws"]
    for page in ("pages/calibrate.py", "pages/export.py", "pages/fleet.py"):
        first.switch_page(page).run()
        second.switch_page(page).run()
        assert not first.exception and not second.exception, page
        shown = _everything_shown(second)
        assert "mine" in shown and SECRET not in shown, page
        assert SECRET in _everything_shown(first)
    # Export's download is the same config with this visitor's names.
    second.switch_page("pages/export.py").run()
    config = json.loads([c.value for c in second.code if c.value.lstrip().startswith("{")][0])
    selected = second.session_state[state.MODELS][second.session_state[state.SELECTED]]
    assert config["source"] == selected.source and config["model"] == selected.name
    assert SECRET not in json.dumps(config)


@pytest.mark.filterwarnings("ignore")
def test_extraction_runs_and_seedings_are_shown_under_each_visitors_name():
    pytest.importorskip("torch")
    from caliber_core.extraction.experiment import ExtractionSettings
    from caliber_core.extraction.report import report_to_json, to_report
    from caliber_dashboard.extraction import view

    settings = ExtractionSettings(retention=(0.75,), seeds=1, attack="fixed", averaging_attacker="frontier")
    first = view.archive_from_upload(WIDE, f"{SECRET}.npz")
    second = view.archive_from_upload(WIDE, "mine.npz")
    assert first.sha256 == second.sha256 and first.name == SECRET
    ran = view.run(first, settings)
    assert ran.archive.name == SECRET
    again = view.run(second, settings)  # the shared run, not a second training
    assert view.is_cached(second, settings)
    report = report_to_json(to_report(again))
    assert SECRET not in report and json.loads(report)["model"] == "mine"
    assert again.calibration is None or again.calibration.name == "mine"
    settings_b = export_config.extract_command(second.source, again, 0.9)
    assert SECRET not in settings_b
