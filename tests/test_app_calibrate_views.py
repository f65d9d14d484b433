"""AppTest: the Calibrate page's view switch, the target on a cached base figure, the
interval readout and side selector, and the corridor on a model too large for quadrature."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.calibration.engine import choose_method
from caliber_core.calibration.target_intervals import interval_estimator, side_sigma
from caliber_core.simulation.synthetic import make_synthetic_logits
from caliber_dashboard.common import readouts, state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    return at


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def _charts(at) -> dict:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _only_chart(at, key: str) -> dict:
    charts = _charts(at)
    assert len(charts) == 1, list(charts)
    (cid, spec), = charts.items()
    assert key in cid
    return spec


def _metric(at, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}; have {[m.label for m in at.metric]}"
    return found[0]


def _readout(at) -> str:
    lines = [m.value for m in at.markdown if m.value.startswith(readouts.QUANTITY_ORDER)]
    assert len(lines) == 1
    return lines[0]


def _array(spec) -> np.ndarray:
    if isinstance(spec, dict):
        return np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"])
    return np.asarray(spec, dtype=float)


def _slider(at):
    return at.slider(key=f"calibrate_retention_{_selected(at).sha256[:12]}")


def test_view_switch_draws_one_view_at_a_time():
    at = _app()
    sigma = _metric(at, "σ* (logit units)")
    _only_chart(at, "fig_normalized")
    for view, key in (("raw", "fig_raw"), ("residuals", "fig_residuals"), ("normalized", "fig_normalized")):
        at.radio(key="calibrate_view").set_value(view).run()
        assert not at.exception
        _only_chart(at, key)
        assert _metric(at, "σ* (logit units)") == sigma  # the readout does not depend on the view
    at.radio(key="calibrate_view").set_value("residuals").run()
    assert at.toggle(key="calibrate_bands").disabled


def test_a_step_moves_only_the_target_on_the_cached_base():
    at = _app()
    cal = pipeline.calibrate_data(_selected(at))
    before = _only_chart(at, "fig_normalized")
    _slider(at).set_value(65.0).run()
    assert not at.exception
    after = _only_chart(at, "fig_normalized")
    assert before["data"][:-1] == after["data"][:-1]  # everything but the marker is the base
    star_before, star = before["data"][-1], after["data"][-1]
    assert star["name"] == star_before["name"] == "target σ*"
    want = sigma_for_target(cal, 0.65)
    assert _array(star["x"])[0] == pytest.approx(want.v)
    # The guide lines are the last two shapes, at the marker.
    vline, hline = after["layout"]["shapes"][-2:]
    assert vline["x0"] == vline["x1"] == pytest.approx(want.v)
    assert hline["y0"] == hline["y1"] == pytest.approx(_array(star["y"])[0])
    assert after["layout"]["shapes"][:-2] == before["layout"]["shapes"][:-2]


def test_interval_readout_is_the_configs():
    at = _app()
    data = _selected(at)
    cal, records, config = pipeline.config_for(data, [("retention", 0.8)])
    record = sigma_for_target(cal, 0.8)
    intervals = interval_estimator(cal).at(record.sigma)
    line = _readout(at)
    assert line == readouts.interval_line(intervals, first="retention")
    assert line.startswith("retention 80.0% (95%: ")
    lo, hi = config["targets"][0]["interval"]["retention"]
    assert f"(95%: {100 * lo:.1f}–{100 * hi:.1f}%)" in line
    advice = readouts.advice(intervals, kind="retention")[0]
    assert any(advice in c.value for c in list(at.caption) + list(at.warning))
    assert f"at N={cal.n_samples:,}" in advice


def test_side_selector_serves_the_bound():
    at = _app()
    cal = pipeline.calibrate_data(_selected(at))
    point = float(_metric(at, "σ* (logit units)").split()[0])
    at.segmented_control(key="calibrate_side").set_value("at-least").run()
    assert not at.exception
    shown = _metric(at, "σ served, at least (logit units)")
    served = float(shown.split()[0])
    assert not [m for m in at.metric if m.label.startswith(("σ*", "v*"))]  # σ* is not what is served
    est = interval_estimator(cal)
    want, _ = side_sigma(cal, sigma_for_target(cal, 0.8), est, side="at-least")
    decimals = len(shown.split()[0].partition(".")[2])
    assert served == pytest.approx(want, abs=0.5 * 10 ** -decimals + 1e-12)
    assert served < point  # a lower bound that keeps the target needs less noise
    # There the one-sided lower bound of retention is the target, and the readout says so first.
    bound = float(est.bound(want, kind="retention", side="at-least")[0])
    assert bound == pytest.approx(0.8, abs=2e-3) and bound >= 0.8 - 1e-9
    bold = [m.value for m in at.markdown if m.value.startswith("**retention")]
    assert bold == ["**retention ≥ 80.0% (one-sided 95%)**"]
    two_sided = [c.value for c in at.caption if c.value.startswith("Two-sided, at the σ served: retention ")]
    assert len(two_sided) == 1 and readouts.interval_line(est.at(want), first="retention") in two_sided[0]
    at.segmented_control(key="calibrate_side").set_value("at-most").run()
    bold = [m.value for m in at.markdown if m.value.startswith("**retention")]
    assert bold == ["**retention ≤ 80.0% (one-sided 95%)**"]
    assert float(_metric(at, "σ served, at most (logit units)").split()[0]) > point


def test_export_this_sigma_opens_export_on_that_target_and_side():
    at = _app()
    sha = _selected(at).sha256
    at.slider(key=f"calibrate_retention_{sha[:12]}").set_value(75.0).run()
    at.segmented_control(key="calibrate_side").set_value("at-least").run()
    at.button(key="export_this_btn").click().run()
    assert not at.exception
    assert at.session_state[state.SELECTED] == sha
    assert [t.value for t in at.title] == ["Export"]
    assert at.text_input(key="export_retention").value == "75"
    assert at.text_input(key="export_accuracy").value == at.text_input(key="export_agreement").value == ""
    assert at.selectbox(key="export_side").value == "at-least"
    config = json.loads(at.code[0].value)
    assert [(t["kind"], t["requested"], t["side"]) for t in config["targets"]] == [("retention", 0.75, "at-least")]
    # Export's own edit is kept; Calibrate unchanged does not overwrite it. (AppTest reruns the
    # page it last switched to, not the one st.switch_page opened: name it.)
    at.switch_page("pages/export.py").run()
    assert at.text_input(key="export_retention").value == "75"
    at.text_input(key="export_retention").set_value("70, 60").run()
    at.switch_page("pages/calibrate.py").run()
    at.switch_page("pages/export.py").run()
    assert at.text_input(key="export_retention").value == "70, 60"
    assert at.selectbox(key="export_side").value == "at-least"
    # A new choice on Calibrate starts Export from it again.
    at.switch_page("pages/calibrate.py").run()
    at.segmented_control(key="calibrate_side").set_value("point").run()
    at.switch_page("pages/export.py").run()
    assert at.text_input(key="export_retention").value == "75"
    assert at.selectbox(key="export_side").value == "point"


def test_interval_band_toggle():
    at = _app()
    at.toggle(key="calibrate_bands").set_value(True).run()
    assert not at.exception
    spec = _only_chart(at, "fig_normalized")
    names = [t.get("name", "") for t in spec["data"]]
    assert any(n.startswith("95% interval of the population accuracy") for n in names)
    assert [t.get("fill") for t in spec["data"]].count("tonexty") == 2  # corridor + interval


def test_corridor_on_a_model_too_large_for_quadrature_is_shown_and_labelled():
    n, k = 300, 1000
    assert choose_method(n, k) == "monte-carlo"
    z, y = make_synthetic_logits(n, k, seed=5)
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y, name=np.array("synthetic-big"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.file_uploader(key="upload_logits").set_value(("big.npz", buf.getvalue(), "application/octet-stream")).run()
    assert not at.exception
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert _selected(at).name == "synthetic-big"
    assert not at.checkbox  # nothing to tick: the corridor is on by default
    spec = _only_chart(at, "fig_normalized")
    names = [t.get("name", "") for t in spec["data"]]
    corridor = [t["name"] for t in spec["data"]  # the legend entry (its upper edge has none)
                if t.get("name", "").startswith("accuracy corridor") and t.get("showlegend", True)]
    assert len(corridor) == 1 and "estimated, Monte Carlo ±" in corridor[0]
    assert any("agreement π(σ), normalized (Monte Carlo ±" in x for x in names)
    assert any("estimated from the sweep's own noise draws" in c.value for c in at.caption)
    at.radio(key="calibrate_view").set_value("raw").run()
    names = [t.get("name", "") for t in _only_chart(at, "fig_raw")["data"]]
    assert any(x.startswith("expected accuracy (Monte Carlo ±") for x in names)
