"""Names are text everywhere: escaped for Markdown and Plotly, defused in CSV, made safe in file names."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from caliber_dashboard.common import figures, names

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
HOSTILE = '=HYPERLINK("http://evil.example/x","go")<a href="http://evil.example">a</a><b>b</b>![i](http://evil.example/p.png)[l](http://evil.example)'


def test_markdown_text_escapes_every_construct():
    text = names.markdown_text(HOSTILE + "\n# heading\n&lt;")
    assert "\n" not in text
    # every Markdown/HTML character is preceded by a backslash, so none opens a construct
    for ch in "![]()<>#&`*_":
        assert not re.search(r"(?<!\\)" + re.escape(ch), text), ch


def test_plotly_text_shows_tags_as_text():
    text = names.plotly_text(HOSTILE)
    assert "<" not in text and ">" not in text and "&lt;a href" in text


@pytest.mark.parametrize("cell", ["=1+1", "+1", "-2", "@SUM(A1)", "\tx", "\rx", HOSTILE])
def test_csv_cells_that_would_run_get_a_quote(cell):
    assert names.csv_cell(cell) == "'" + cell
    df = pd.DataFrame({"model": [cell], "A0": [-0.5], cell: [1]})
    out = names.csv_text(df)
    header, row = list(csv.reader(io.StringIO(out, newline="")))
    assert header[-1] == "'" + cell and row[0] == "'" + cell
    assert ",-0.5," in out  # numbers stay numbers (unquoted)
    assert df["model"][0] == cell  # the table shown is untouched


def test_csv_leaves_plain_text_alone():
    assert names.csv_cell("model a") == "model a" and names.csv_cell(3) == 3 and names.csv_cell(-3.0) == -3.0


@pytest.mark.parametrize("name, stem", [
    ("../../../../etc/caliber/x\" y=\".html", "etc_caliber_x_y_.html"),
    ("", "model"), ("...", "model"), ("-rf", "rf"), ("a b", "a_b"), ("x" * 300, "x" * 100),
])
def test_file_stem_is_never_a_path(name, stem):
    assert names.file_stem(name) == stem
    assert "/" not in names.file_stem(name) and not names.file_stem(name).startswith(".")


def test_figures_show_names_as_text():
    margins = {HOSTILE: np.linspace(0, 1, 50), "plain": np.linspace(0, 2, 50)}
    spec = figures.margin_histogram(margins).to_plotly_json()
    assert all("<" not in t["name"] for t in spec["data"])
    assert all(t["name"] not in t["hovertemplate"] for t in spec["data"])  # the name is not a template
    many = {f"{HOSTILE}{i}": np.linspace(0, 1, 20) for i in range(9)}  # one row each: names on the y axis
    spec = figures.margin_histogram(many).to_plotly_json()
    assert len(spec["layout"]["yaxis"]["ticktext"]) == 9
    assert all("<a" not in t for t in spec["layout"]["yaxis"]["ticktext"])
    assert all(t["name"] not in t["hovertemplate"] for t in spec["data"])


def _npz(name: str, *, inputs: bool) -> bytes:
    z = np.load(ROOT / "data" / "digits_mlp-wide.npz")
    arrays = {k: z[k] for k in z.files if k != "name" and (inputs or k in ("logits", "labels"))}
    arrays["name"] = np.array(name)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_pages_show_a_hostile_model_name_as_text():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.file_uploader(key="upload_logits").set_value(("m.npz", _npz(HOSTILE, inputs=False),
                                                     "application/octet-stream")).run()
    assert not at.exception
    success = [s.value for s in at.success]
    assert success and "\\!\\[i\\]\\(http" in success[0] and "\\<a" in success[0]
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    legend = [t.get("name", "") for spec in specs for t in spec["data"]]
    assert any("&lt;b&gt;b&lt;/b&gt;" in n for n in legend) and not any("<b>" in n for n in legend)
    (link,) = [e.proto.label for e in at.get("page_link")]  # the new model's link to Calibrate
    assert link.startswith("Calibrate ") and "\\!\\[i\\]\\(http" in link and "\\<a" in link
    at.switch_page("pages/extraction.py").run()
    at.file_uploader(key="extraction_upload").set_value(("a.npz", _npz(HOSTILE, inputs=True),
                                                         "application/octet-stream")).run()
    assert not at.exception
    loaded = [s.value for s in at.success if "queries" in s.value]
    assert loaded and "\\!\\[i\\]" in loaded[0] and "![i](" not in loaded[0]


def test_the_policy_names_its_config_file_as_export_does():
    raw = '../../../../etc/caliber/x" y=".html'
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.file_uploader(key="upload_logits").set_value(("p.npz", _npz(raw, inputs=False),
                                                     "application/octet-stream")).run()
    at.switch_page("pages/policy.py").run()
    assert not at.exception and not at.error
    doc = json.loads([c.value for c in at.code if '"caliber.policy/v1"' in c.value][0])
    assert doc["config"]["path"] == f"{names.file_stem(raw)}.caliber.json" == "etc_caliber_x_y_.html.caliber.json"
