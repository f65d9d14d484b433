"""AppTest: the Extraction page -- run, frontier, Table 3/4 analogues, M-curves, surrogate slider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytest.importorskip("torch")

from caliber_core.extraction.archive import load_archive  # noqa: E402
from caliber_core.extraction.experiment import ExtractionSettings, run_extraction  # noqa: E402
from caliber_dashboard.extraction import view  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")


def _metric(at, label):
    return [m.value for m in at.metric if m.label == label][0]


def test_extraction_page_runs_and_shows_every_view():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("pages/extraction.py").run()
    assert not at.exception
    assert "Run the extraction" in [b.label for b in at.button]  # nothing trains before asked
    assert not at.dataframe
    at.multiselect(key="extraction_retention").set_value([0.75])
    at.number_input(key="extraction_seeds").set_value(2)
    at.selectbox(key="extraction_attack").set_value("fixed").run()
    sha = at.selectbox(key="extraction_model").value
    at.button(key="extraction_run").click().run()
    assert not at.exception

    archive = load_archive(next(p for p in sorted((ROOT / "data").glob("digits_*.npz"))
                                if load_archive(p).sha256 == sha))
    expected = run_extraction(archive, ExtractionSettings(retention=(0.75,), seeds=2, attack="fixed",
                                                          averaging_attacker="frontier"))
    table = at.dataframe[0].value
    assert list(table["condition"]) == ["clean answers", "teacher retention 75%"]
    assert table["strongest"].iloc[1] == expected.targets[0].headline
    assert table[f"surrogate {expected.targets[0].headline} %"].iloc[1] == view.pm(expected.targets[0].best.accuracy)

    frontier = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert frontier["layout"]["xaxis"]["title"]["text"].startswith("teacher accuracy")
    curve = [t for t in frontier["data"] if t.get("name", "").startswith("surrogate (")][0]
    assert len(curve["x"]) == len(expected.frontier) and "array" in curve["error_y"]

    m_fig = json.loads(at.get("plotly_chart")[1].proto.spec)
    names = [t.get("name", "") for t in m_fig["data"]]
    assert any(n.startswith("clean-answer surrogate") for n in names)
    assert "fresh seeding, soft answers" in names and "per-input seeding, soft answers" in names
    per_input = [t for t in m_fig["data"] if t.get("name") == "per-input seeding, soft answers"][0]
    assert len(set(per_input["y"])) == 1  # identical answers, identical surrogate, every M

    readout = view.surrogate_readout(expected, 0.9)
    assert _metric(at, "σ (read off the frontier)") == f"{readout['sigma']:.4g}"
    at.slider(key=f"extraction_surrogate_{sha[:12]}").set_value(80.0).run()
    assert not at.exception
    lower = view.surrogate_readout(expected, 0.8)
    assert _metric(at, "σ (read off the frontier)") == f"{lower['sigma']:.4g}"
    assert lower["sigma"] > readout["sigma"]
    assert "Run the extraction" not in [b.label for b in at.button]  # cached: no second run


def test_extraction_page_refuses_an_upload_without_inputs(tmp_path):
    import numpy as np

    with np.load(ROOT / "data" / "digits_cnn.npz") as f:
        arrays = {k: f[k] for k in f.files if k != "inputs"}
    path = tmp_path / "no_inputs.npz"
    np.savez(path, **arrays)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/extraction.py").run()
    at.file_uploader(key="extraction_upload").set_value(("no_inputs.npz", path.read_bytes(),
                                                         "application/octet-stream")).run()
    assert not at.exception
    assert any("without inputs" in e.value for e in at.error)
