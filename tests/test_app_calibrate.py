"""AppTest: the Calibrate page — plots, the target slider, verify, other models."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import measured_accuracy, sigma_for_target
from caliber_core.calibration.target_intervals import interval_estimator
from caliber_dashboard.common import figures, state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    return at


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def _metric(at, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}; have {[m.label for m in at.metric]}"
    return found[0]

def _shows_sigma(text: str, want: float) -> bool:
    """Whether a σ readout "0.857 (0.842–0.871)" shows ``want`` rounded to its digits, inside its range."""
    value, _, rest = text.partition(" (")
    decimals = len(value.partition(".")[2])
    low, high = (float(x) for x in rest.rstrip(")").split("–"))
    return abs(float(value) - want) <= 0.5 * 10 ** -decimals + 1e-12 and low <= want <= high


def _figure(at, key: str) -> dict:
    for chart in at.get("plotly_chart"):
        if chart.proto.id.endswith(key) or key in chart.proto.id:
            return json.loads(chart.proto.spec)
    raise AssertionError(f"no chart {key}")


def _array(spec) -> np.ndarray:
    if isinstance(spec, dict):
        return np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"])
    return np.asarray(spec, dtype=float)


def _readout(at) -> str:
    lines = [m.value for m in at.markdown if m.value.startswith(("retention ", "accuracy ", "agreement "))]
    assert len(lines) == 1, [m.value for m in at.markdown]
    return lines[0]


def _slider_key(at, kind: str) -> str:
    return f"calibrate_{kind}_{_selected(at).sha256[:12]}"


def _view(at, view: str) -> None:
    at.radio(key="calibrate_view").set_value(view).run()
    assert not at.exception


def _intervals(at, cal, sigma: float):
    return interval_estimator(cal).at(sigma)


def test_first_visit_plots_and_readout():
    at = _app()
    data = _selected(at)
    cal = pipeline.calibrate_data(data)
    # One view at a time: only the normalized one is built and sent at first.
    assert [c.proto.id for c in at.get("plotly_chart")] and len(at.get("plotly_chart")) == 1
    norm = _figure(at, "fig_normalized")
    assert norm["layout"]["xaxis"]["type"] == "log"
    assert set(norm["layout"].get("template", {})) <= {"layout"}  # a light layout, no trace templates
    names = [t.get("name") for t in norm["data"]]
    assert "fitted logistic Ã(v)" in names and "exact agreement π(σ), normalized" in names
    assert "accuracy corridor (Corollary 1): exact" in names
    assert [t.get("fill") for t in norm["data"]].count("tonexty") == 1
    sweep = [t for t in norm["data"] if t.get("name", "").startswith("Monte-Carlo")][0]
    np.testing.assert_allclose(_array(sweep["x"]), cal.sweep.v)
    np.testing.assert_allclose(_array(sweep["y"]), cal.sweep.utility)
    _view(at, "raw")
    assert len(at.get("plotly_chart")) == 1
    raw = _figure(at, "fig_raw")
    assert raw["layout"]["xaxis"]["type"] == "log"
    assert "σ" in raw["layout"]["xaxis"]["title"]["text"]
    # Every log-axis label written in full ("0.05 0.1 0.2"), not the bare digit of a 2 or a 5.
    assert raw["layout"]["xaxis"]["tickformat"] == norm["layout"]["xaxis"]["tickformat"] == "~g"
    # Ticks at 1, 2 and 5 of each decade over a short span; every decade over a long one (labels would collide).
    xs = np.concatenate([_array(t["x"]) for t in raw["data"] if "x" in t])
    xs = xs[np.isfinite(xs) & (xs > 0)]
    decades = np.log10(xs.max() / xs.min())
    assert raw["layout"]["xaxis"]["dtick"] == ("D2" if decades <= figures.LOG_LABELS_125_DECADES else 1)
    _view(at, "residuals")
    assert _figure(at, "fig_residuals")["data"]
    # Default target: 80% retention; the readout is the core's sigma*.
    expected = sigma_for_target(cal, 0.8)
    assert _shows_sigma(_metric(at, "σ* (logit units)"), expected.sigma)
    shown_v = _metric(at, "v* = σ*²/S²")
    assert float(shown_v) == pytest.approx(expected.v, abs=0.5 * 10 ** -len(shown_v.partition(".")[2]) + 1e-12)
    assert _metric(at, "R²") == f"{cal.fit.r2:.4f}" == _metric(at, "logistic R² (accuracy)")
    assert _metric(at, "rmse") == f"{cal.fit.rmse:.4f}"
    assert len(at.get("download_button")) == 1


def test_slider_moves_change_sigma():
    at = _app()
    cal = pipeline.calibrate_data(_selected(at))
    before = _metric(at, "σ* (logit units)")
    seen = {before}
    for pct in (60.0, 90.0, 72.5):
        at.slider(key=_slider_key(at, "retention")).set_value(pct).run()
        assert not at.exception
        want = sigma_for_target(cal, pct / 100.0)
        got = _metric(at, "σ* (logit units)")
        assert _shows_sigma(got, want.sigma)
        delivered = _intervals(at, cal, want.sigma)
        assert f"accuracy {100 * float(measured_accuracy(cal, want.sigma)[0]):.1f}%" in _readout(at)
        assert delivered.accuracy.estimate == pytest.approx(float(measured_accuracy(cal, want.sigma)[0]))
        seen.add(got)
        # The target marker moved with it.
        star = [t for t in _figure(at, "fig_normalized")["data"] if t.get("name") == "target σ*"][0]
        assert _array(star["x"])[0] == pytest.approx(want.v)
    assert len(seen) == 4
    # Less retention needs more noise.
    at.slider(key=_slider_key(at, "retention")).set_value(50.0).run()
    at_50 = float(_metric(at, "σ* (logit units)").split()[0])
    at.slider(key=_slider_key(at, "retention")).set_value(95.0).run()
    assert float(_metric(at, "σ* (logit units)").split()[0]) < at_50


@pytest.mark.parametrize("kind", ["accuracy", "agreement"])
def test_other_target_kinds(kind):
    at = _app()
    cal = pipeline.calibrate_data(_selected(at))
    at.radio(key="calibrate_kind").set_value(kind).run()
    assert not at.exception
    at.slider(key=_slider_key(at, kind)).set_value(70.0).run()
    want = sigma_for_target(cal, 0.7, kind=kind)
    assert _shows_sigma(_metric(at, "σ* (logit units)"), want.sigma)


def test_verify_measures_fresh_noise_each_click():
    at = _app()
    cal = pipeline.calibrate_data(_selected(at))
    at.button(key="verify_btn").click().run()
    assert not at.exception
    target = sigma_for_target(cal, 0.8)
    assert _metric(at, "target accuracy") == f"{target.accuracy:.4f}"
    first = float(_metric(at, "measured accuracy"))
    assert abs(first - target.accuracy) < 0.02  # 200 x 500 draws: s.e. ~0.0013
    rel = _metric(at, "relative error")
    assert re.fullmatch(r"[+-]\d+\.\d\d%", rel)
    assert float(rel[:-1]) == pytest.approx((first - target.accuracy) / target.accuracy * 100, abs=0.02)
    assert _metric(at, "draws") == "200 × 500"
    seed_1 = at.session_state[state.VERIFY_COUNTER]
    at.button(key="verify_btn").click().run()
    assert at.session_state[state.VERIFY_COUNTER] == seed_1 + 1  # a fresh seed
    # Moving the target hides the stale verification.
    at.slider(key=_slider_key(at, "retention")).set_value(60.0).run()
    assert not [m for m in at.metric if m.label == "measured accuracy"]


def test_switch_model_and_statistic():
    at = _app()
    models = at.session_state[state.MODELS]
    other = list(models)[3]
    at.selectbox(key="calibrate_model").set_value(other).run()
    assert not at.exception
    cal = pipeline.calibrate_data(models[other])
    assert _shows_sigma(_metric(at, "σ* (logit units)"), sigma_for_target(cal, 0.8).sigma)
    at.selectbox(key="calibrate_statistic").set_value("mean").run()
    assert not at.exception
    cal_mean = pipeline.calibrate_data(models[other], statistic="mean")
    assert _metric(at, "S (mean margin)") == f"{cal_mean.scale:.4g}"


def test_unlabelled_model_offers_agreement_only():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 6)) * 2
    buf = io.BytesIO()
    np.save(buf, z)
    at.file_uploader(key="upload_logits").set_value(("nolabels.npy", buf.getvalue(), "application/octet-stream")).run()
    sha = [k for k, d in at.session_state[state.MODELS].items() if d.source == "nolabels.npy"][0]
    at.switch_page("pages/calibrate.py").run()
    at.selectbox(key="calibrate_model").set_value(sha).run()
    assert not at.exception
    assert not [r for r in at.radio if r.key == "calibrate_kind"]  # a single kind: no choice to make
    assert any("no labels" in i.value for i in at.info)
    slider = at.slider(key=f"calibrate_agreement_{sha[:12]}")
    slider.set_value(75.0).run()
    assert not at.exception
    data = at.session_state[state.MODELS][sha]
    want = sigma_for_target(pipeline.calibrate_data(data), 0.75, kind="agreement")
    assert _shows_sigma(_metric(at, "σ* (logit units)"), want.sigma)
    at.button(key="verify_btn").click().run()
    assert not at.exception
    assert float(_metric(at, "measured agreement")) == pytest.approx(0.75, abs=0.03)


def test_target_is_remembered_across_pages():
    at = _app()
    at.slider(key=_slider_key(at, "retention")).set_value(70.0).run()
    at.switch_page("pages/attack_cost.py").run()
    assert not at.exception
    sha = at.session_state[state.SELECTED]
    assert at.slider(key=f"attack_retention_{sha[:12]}").value == 70.0
    at.switch_page("pages/calibrate.py").run()
    assert at.slider(key=_slider_key(at, "retention")).value == 70.0


def test_two_class_model_is_exact_without_draws():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=400)
    z = rng.normal(size=(400, 2))
    z[np.arange(400), y] += 1.5
    buf = io.BytesIO()
    np.savez(buf, logits=z.astype(np.float32), labels=y)
    at.file_uploader(key="upload_logits").set_value(("pair.npz", buf.getvalue(), "application/octet-stream")).run()
    sha = [k for k, d in at.session_state[state.MODELS].items() if d.source == "pair.npz"][0]
    at.switch_page("pages/calibrate.py").run()
    at.selectbox(key="calibrate_model").set_value(sha).run()
    assert not at.exception
    assert _metric(at, "noise draws / input") == "exact (K = 2)"
    cal = pipeline.calibrate_data(at.session_state[state.MODELS][sha])
    assert cal.intervals.realizations == 0
    assert _shows_sigma(_metric(at, "σ* (logit units)"), sigma_for_target(cal, 0.8).sigma)
