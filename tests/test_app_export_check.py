"""AppTest: the Export page's review shows the verdict of ``python -m caliber_core check``.

The loaded models are the bundled digits files; a config saved from one model and
reviewed against the same model's logits is consistent (the calibration sample
itself), against another model's logits it is not, and a side target is
recomputed on its own side.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.calibration.drift import check_drift
from caliber_core.config import config_to_json
from caliber_dashboard.common import state

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("pages/export.py").run()
    assert not at.exception
    return at


def _text(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def _import(at, config: dict) -> AppTest:
    content = config_to_json(config).encode()
    return at.file_uploader(key="import_config").set_value(("saved.caliber.json", content, "application/json")).run()


def test_review_of_the_same_model_is_consistent():
    at = _app()
    data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
    _, _, config = pipeline.config_for(data)
    _import(at, config)
    assert not at.exception
    verdict = [_text(s.value) for s in at.success if _text(s.value).startswith("check:")]
    assert len(verdict) == 1 and "consistent with the config" in verdict[0]
    table = at.dataframe[2].value
    report = check_drift(config, data.logits, data.labels)
    assert list(table["consistent"]) == [f.consistent for f in report.findings]
    # Each finding named by its target, in percent (S in logit units).
    shown = {f"{100 * t['requested']:g}%" for t in config["targets"]}
    for target, observed, f in zip(table["target"], table["this model"], report.findings):
        if f.target is None:
            assert target == "—"
        else:
            assert target == f"{config['targets'][f.target]['kind']} {100 * config['targets'][f.target]['requested']:g}%"
        assert observed == (f"{f.observed:.4g} (logit units)" if f.quantity == "scale" else f"{100 * f.observed:.2f}%")
    assert {r.split()[1] for r in table["target"] if r != "—"} <= shown
    assert "None" not in table.to_string()


def test_review_against_another_model_says_recalibrate():
    at = _app()
    models = at.session_state[state.MODELS]
    selected = at.session_state[state.SELECTED]
    other = next(sha for sha in models if sha != selected)
    _, _, config = pipeline.config_for(models[other])
    _import(at, config)
    at.selectbox(key="import_model").set_value(selected).run()
    assert not at.exception
    errors = [_text(e.value) for e in at.error]
    assert len(errors) == 1
    lines = errors[0].split("  \n")
    expected = check_drift(config, models[selected].logits, models[selected].labels).problems
    assert lines == [f.message for f in expected] and all(line.endswith("recalibrate") for line in lines)


def test_side_targets_are_recomputed_on_their_side():
    at = _app()
    data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
    _, results, config = pipeline.config_for(data, [("retention", 0.8)], side="at-least")
    _import(at, config)
    assert not at.exception
    review = at.dataframe[1].value
    assert list(review["σ recomputed now"]) == [results[0].sigma]
    assert list(review["Δσ %"]) == [0.0]
