"""AppTest: Export's equivalent command runs as shown; its table shows what sigma delivers inside its interval."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_core.config import load_config
from caliber_dashboard.common import state
from caliber_dashboard.export import config as export_config
from caliber_dashboard.export.config import calibrate_command

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
BIN = "application/octet-stream"


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _files(tmp_path):
    rng = np.random.default_rng(29)
    y = rng.integers(0, 5, 600)
    z = rng.normal(size=(600, 5))
    z[np.arange(600), y] += 2.0
    logits, labels = tmp_path / "my answers.npy", tmp_path / "my answers_labels.npy"
    np.save(logits, z)
    np.save(labels, y)
    return logits, labels


def _shown_command(at) -> str:
    assert any(c.value.startswith("Equivalent command") for c in at.caption)
    return [c.value for c in at.code if c.value.startswith("python -m caliber_core calibrate ")][0]


def test_the_equivalent_command_runs_as_shown_with_the_labels_file(tmp_path):
    logits, labels = _files(tmp_path)
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.file_uploader(key="upload_labels").set_value((labels.name, labels.read_bytes(), BIN))
    at.file_uploader(key="upload_logits").set_value((logits.name, logits.read_bytes(), BIN)).run()
    assert not at.exception
    data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
    assert data.has_labels and data.labels_source == labels.name
    at.switch_page("pages/export.py").run()
    assert not at.exception
    command = _shown_command(at)
    assert "--labels 'my answers_labels.npy'" in command
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = load_config((tmp_path / "cfg.json").read_bytes())
    shown = json.loads(at.code[0].value)
    assert [t["sigma"] for t in written["targets"]] == [t["sigma"] for t in shown["targets"]]


def test_table_shows_what_sigma_delivers_inside_its_interval():
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("pages/export.py").run()
    at.text_input(key="export_retention").set_value("80").run()
    at.selectbox(key="export_side").set_value("at-least").run()
    assert not at.exception
    table = at.dataframe[0].value
    row = table.iloc[0]
    assert row["target"] == "retention 80%"
    low, high = (float(x) for x in row["retention 95% interval"].rstrip("%").split("–"))
    assert low <= round(row["retention %"], 1) <= high
    assert row["retention %"] > 80.0  # at least 80% kept: sigma delivers more than the target on the sample
    # Sigma as a readout: rounded to its range, the range around it; the config keeps it in full.
    shown = row["σ (range)"]
    value, low, high = map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)–([\d.]+)\)", shown).groups())
    sigma = json.loads(at.code[0].value)["targets"][0]["sigma"]
    decimals = len(shown.split()[0].partition(".")[2])
    assert low <= sigma <= high and abs(value - sigma) <= 0.5 * 10 ** -decimals + 1e-12


def test_command_leaves_out_defaults_and_quotes_names():
    class Data:
        source, labels_source = "a b.npy", "a b_y.csv"

    cmd = calibrate_command(Data(), [("retention", 0.8), ("retention", 0.7), ("accuracy", 0.5)],
                            side="at-most", confidence=0.9)
    assert cmd == ("python -m caliber_core calibrate 'a b.npy' --labels 'a b_y.csv' --retention 0.8 0.7 "
                   "--target-accuracy 0.5 --side at-most --confidence 0.9 --out cfg.json")
    Data.labels_source = None
    assert "--labels" not in calibrate_command(Data(), [("agreement", 0.9)])
    assert export_config.calibrate_command(Data(), [("agreement", 0.9)], statistic="mean").endswith(
        "--agreement 0.9 --margin-stat mean --out cfg.json")
