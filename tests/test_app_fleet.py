"""AppTest: the Fleet page — shared fit, leave-one-out, ablation, calibration from S."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import fleet
from caliber_core.calibration import pipeline
from caliber_dashboard import state

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("pages/fleet.py").run()
    assert not at.exception
    return at


@pytest.fixture(scope="module")
def demo_cals():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    return [pipeline.calibrate_data(d) for d in at.session_state[state.MODELS].values()]


def _metric(at, label):
    return [m.value for m in at.metric if m.label == label][0]


def test_fleet_tables_match_the_core(demo_cals):
    at = _app()
    shared = fleet.shared_fit(demo_cals, statistic="median")
    assert _metric(at, "models pooled") == str(len(demo_cals))
    assert _metric(at, "shared R²") == f"{shared.r2:.4f}"
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert len(fig["data"]) == len(demo_cals) + 1  # a trace per model + the shared curve
    assert fig["layout"]["xaxis"]["type"] == "log"
    # The ablation runs on request (unless a cache, e.g. the server's warm-up, has it).
    if [b for b in at.button if b.key == "fleet_ablation_btn"]:
        assert len(at.dataframe) == 2
        at.button(key="fleet_ablation_btn").click().run()
        assert not at.exception
    tables = [df.value for df in at.dataframe]
    models, loo, ablation = tables[0], tables[1], tables[2]
    assert len(models) == len(demo_cals)
    expected = fleet.leave_one_out(demo_cals, statistic="median")
    assert list(loo["model"]) == [r["model"] for r in expected] + ["mean"]
    np.testing.assert_allclose(loo["held-out error %"][:-1], [r["held_out_error"] for r in expected])
    np.testing.assert_allclose(loo["in-sample error %"][:-1], [r["in_sample_error"] for r in expected])
    assert loo["held-out error %"].iloc[-1] == pytest.approx(np.mean([r["held_out_error"] for r in expected]))
    abl = fleet.margin_ablation(demo_cals)
    assert list(ablation["statistic"]) == ["median", "mean", "trimmed"]
    np.testing.assert_allclose(ablation["held-out error %"], [r["held_out_error"] for r in abl])


def test_statistic_switch(demo_cals):
    at = _app()
    at.selectbox(key="fleet_statistic").set_value("trimmed").run()
    assert not at.exception
    shared = fleet.shared_fit(demo_cals, statistic="trimmed")
    assert _metric(at, "shared v50") == f"{shared.v50:.4g}"
    assert "S (trimmed)" in at.dataframe[1].value.columns


def test_calibrate_from_scale(demo_cals):
    at = _app()
    at.number_input(key="fleet_scale").set_value(2.5).run()
    at.number_input(key="fleet_a0").set_value(0.9).run()
    at.number_input(key="fleet_k").set_value(10).run()
    at.slider(key="fleet_retention").set_value(70.0).run()
    assert not at.exception
    shared = fleet.shared_fit(demo_cals, statistic="median")
    want = fleet.calibrate_from_scale(shared, scale=2.5, clean_accuracy=0.9, n_classes=10, value=0.7)
    assert _metric(at, "σ*") == f"{want.sigma:.5g}"
    assert _metric(at, "target accuracy") == f"{0.63:.4f}"


def test_needs_two_labelled_models():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    keep = list(at.session_state[state.MODELS])[0]
    at.multiselect(key="remove_select").set_value([k for k in at.session_state[state.MODELS] if k != keep]).run()
    at.button(key="remove_btn").click().run()
    at.switch_page("pages/fleet.py").run()
    assert not at.exception
    assert any("at least 2 models" in i.value for i in at.info)
    assert not at.get("plotly_chart")
