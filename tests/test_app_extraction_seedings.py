"""AppTest: the Extraction page's upload confirmation, compact tables and the seedings side by side."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

pytest.importorskip("torch")

from caliber_core.extraction.archive import load_archive  # noqa: E402
from caliber_core.extraction.seedings import compare_seedings  # noqa: E402
from caliber_dashboard.extraction import seedings  # noqa: E402
from caliber_dashboard.extraction import view  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")


def test_an_uploaded_archive_is_confirmed_and_selected(tmp_path):
    with np.load(ROOT / "data" / "digits_cnn.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["name"] = np.array("my-upload")
    path = tmp_path / "mine.npz"
    np.savez(path, **arrays)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/extraction.py").run()
    at.file_uploader(key="extraction_upload").set_value(("mine.npz", path.read_bytes(),
                                                         "application/octet-stream")).run()
    assert not at.exception
    assert any("Loaded my-upload" in s.value.replace("\\", "") and "Selected" in s.value for s in at.success)
    sha = at.selectbox(key="extraction_model").value
    assert load_archive(path).sha256 == sha
    # the user may still pick another model: the upload is selected once, not forced on every rerun
    other = [o for o in at.selectbox(key="extraction_model").options if not o.startswith("my-upload")][0]
    at.selectbox(key="extraction_model").select(other).run()
    assert not at.exception and at.selectbox(key="extraction_model").value != sha


def test_compact_columns_shorten_every_wide_header():
    table = pd.DataFrame({"condition": ["x"], "σ": ["1"], "teacher accuracy %": ["1"], "surrogate light %": ["1"],
                          "surrogate strong %": ["1"], "surrogate tuned %": ["1"], "strongest": ["light"],
                          "agreement with teacher %": ["1"], "drop recovered %": ["1"]})
    config = view.compact_columns(table)
    labels = [c["label"] for c in config.values()]
    assert labels == ["condition", "σ", "teacher %", "light %", "strong %", "tuned %", "strongest",
                      "agreement %", "recovered %"]
    assert [c["width"] for c in config.values()].count("small") == 8


def test_seedings_side_by_side_on_the_page():
    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    at.switch_page("pages/extraction.py").run()
    at.multiselect(key="extraction_retention").set_value([0.75])
    at.number_input(key="extraction_seeds").set_value(1)
    at.selectbox(key="extraction_attack").set_value("fixed").run()
    at.button(key="extraction_run").click().run()
    at.number_input(key="extraction_keys").set_value(1).run()
    at.button(key="extraction_seedings_run").click().run()
    assert not at.exception
    sha = at.selectbox(key="extraction_model").value
    archive = next(a for a in (load_archive(p) for p in sorted((ROOT / "data").glob("digits_*.npz")))
                   if a.sha256 == sha)
    expected = compare_seedings(archive, levels=(0.75,), keys=1, seeds=1, length_scale=4.0, near_duplicates=16)
    specs = {json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"]: json.loads(c.proto.spec)
             for c in at.get("plotly_chart")}
    frontier = next(v for k, v in specs.items() if k.startswith("thief retention"))
    lines = {t["name"]: t for t in frontier["data"]}
    cons = expected.at("consistent")[0]
    assert lines["consistent (ℓ = 4 S)"]["y"] == [pytest.approx(cons.thief_retention.mean * 100)]
    assert lines["per-input"]["x"] == [pytest.approx(expected.at("per-input")[0].teacher_retention.mean * 100)]
    assert any(k.startswith("teacher retention on held-out") for k in specs)
    assert seedings.sigma_spread(expected)[0]["σ (key mean)"] == f"{cons.sigma.mean:.4g}"


def test_an_uploaded_archive_keeps_its_name_after_a_reload(tmp_path):
    with np.load(ROOT / "data" / "digits_cnn.npz") as f:
        arrays = {k: f[k] for k in f.files if k != "name"}
    path = tmp_path / "my_thief_pool.npz"  # no name inside: the file name is the model's name
    np.savez(path, **arrays)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/extraction.py").run()
    at.file_uploader(key="extraction_upload").set_value((path.name, path.read_bytes(),
                                                         "application/octet-stream")).run()
    assert not at.exception
    sha = load_archive(path).sha256
    again = AppTest.from_file(APP, default_timeout=60)
    again.query_params["ws"] = at.query_params["ws"]
    again.run()
    again.switch_page("pages/extraction.py").run()
    assert not again.exception
    label = [o for o in again.selectbox(key="extraction_model").options if sha[:8] in o]
    assert label and label[0].startswith("my_thief_pool · "), label
    assert not [w for w in again.warning if "extraction_retention" in w.value]
