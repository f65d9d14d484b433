"""The stored form of an extraction run: exact JSON round trip, keys, and refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from caliber_core.extraction.archive import load_archive  # noqa: E402
from caliber_core.extraction.experiment import ExtractionSettings, run_extraction  # noqa: E402
from caliber_core.extraction.report import report_to_json, to_report  # noqa: E402
from caliber_dashboard.extraction import codec  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data"
SETTINGS = ExtractionSettings(retention=(0.75,), surrogate_retention=(0.9,), seeds=2, attack="fixed",
                              averaging_attacker="frontier", m_values=(1, 4))


@pytest.fixture(scope="module")
def run():
    archive = load_archive(DATA / "digits_cnn.npz")
    return archive, run_extraction(archive, SETTINGS)


def test_round_trip_is_exact_through_json_text(run):
    archive, result = run
    document = codec.encode_result(result)
    text = json.dumps(document, allow_nan=False)  # what the workspace writes
    back = codec.decode_result(json.loads(text), archive)
    assert codec.encode_result(back) == document
    assert report_to_json(to_report(back)) == report_to_json(to_report(result))
    assert back.settings == result.settings and back.calibration is None
    root = back.targets[-1].root
    assert back.targets[-1].kind == "surrogate-retention" and isinstance(root.bracket, tuple)
    for (s0, v0), (s1, v1) in zip(root.evaluations, result.targets[-1].root.evaluations):
        assert s0 == s1 and isinstance(v0, np.ndarray) and np.array_equal(v0, v1)


def test_nan_spreads_are_tagged_not_lost(run):
    archive, result = run
    assert result.clean.best.drop_recovered.n == 0  # a NaN mean: clean answers drop nothing
    text = json.dumps(codec.encode_result(result), allow_nan=False)
    back = codec.decode_result(json.loads(text), archive)
    assert np.isnan(back.clean.best.drop_recovered.mean)


def test_run_key_names_file_and_every_setting_that_changes_a_number(run):
    archive, _ = run
    key = codec.run_key(archive.sha256, SETTINGS)
    assert key.startswith(archive.sha256 + ".") and len(key) == 64 + 1 + 40
    assert codec.run_key(archive.sha256, replace(SETTINGS, processes=4)) == key  # no number changes
    for changed in (replace(SETTINGS, seeds=3), replace(SETTINGS, seed=1), replace(SETTINGS, attack="all"),
                    replace(SETTINGS, retention=(0.85,)), replace(SETTINGS, surrogate_retention=()),
                    replace(SETTINGS, schedule=replace(SETTINGS.schedule, epochs=31))):
        assert codec.run_key(archive.sha256, changed) != key
    assert codec.run_key("0" * 64, SETTINGS) != key
    with pytest.raises(ValueError, match="archive_sha256 must be 64 hex digits, got 'abc'"):
        codec.run_key("abc", SETTINGS)


def test_settings_round_trip():
    assert codec.decode_settings(json.loads(json.dumps(codec.encode_settings(SETTINGS)))) == SETTINGS
    with pytest.raises(codec.StoredRunError, match="not settings"):
        codec.decode_settings({"a": 1})


def test_refuses_documents_that_are_not_its_own(run):
    archive, result = run
    document = json.loads(json.dumps(codec.encode_result(result), allow_nan=False))
    with pytest.raises(codec.StoredRunError, match="not a stored extraction run"):
        codec.decode_result({"format": "other"}, archive)
    other = load_archive(DATA / "digits_mlp-wide.npz")
    with pytest.raises(codec.StoredRunError, match="the stored run is for file"):
        codec.decode_result(document, other)
    # Only the listed result classes can be built, never a named callable.
    hostile = json.loads(json.dumps(document))
    hostile["result"]["clean"] = {"__type__": "system", "command": "true"}
    with pytest.raises(codec.StoredRunError, match="unknown stored type 'system'"):
        codec.decode_result(hostile, archive)
    hostile = json.loads(json.dumps(document))
    hostile["result"]["targets"][-1]["root"]["evaluations"][0]["__tuple__"][1]["dtype"] = "object"
    with pytest.raises(codec.StoredRunError, match="stored arrays must be numeric"):
        codec.decode_result(hostile, archive)
    hostile = json.loads(json.dumps(document))
    hostile["result"]["unexpected_field"] = 1
    with pytest.raises(codec.StoredRunError, match="does not fit this version"):
        codec.decode_result(hostile, archive)
