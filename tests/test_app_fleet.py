"""AppTest: the Fleet page — shared fit, leave-one-out, ablation, calibration from S."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import fleet
from caliber_core.calibration import pipeline
from caliber_core.simulation.synthetic import make_synthetic_logits
from caliber_dashboard.common.rounding import decimals_for
from caliber_dashboard.common import state
from caliber_dashboard.fleet import view as fleet_view

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


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


def test_calibrate_from_scale_starts_empty_and_carries_a_leave_one_out_range(demo_cals):
    at = _app()
    assert [at.number_input(key=k).value for k in ("fleet_scale", "fleet_a0", "fleet_k")] == [None] * 3
    assert any("Enter S, A0 and K" in i.value for i in at.info)
    assert not [m for m in at.metric if m.label.startswith("σ")]
    at.number_input(key="fleet_scale").set_value(2.5).run()
    at.number_input(key="fleet_a0").set_value(0.9).run()
    at.number_input(key="fleet_k").set_value(10).run()
    at.slider(key="fleet_retention").set_value(70.0).run()
    assert not at.exception
    shared = fleet.shared_fit(demo_cals, statistic="median")
    want = fleet.calibrate_from_scale(shared, scale=2.5, clean_accuracy=0.9, n_classes=10, value=0.7)
    spread = fleet_view.sigma_spread(demo_cals, statistic="median", value=0.7)
    assert spread.size == len(demo_cals)
    found = fleet_view.from_scale(want.sigma, spread)
    shown = _metric(at, "σ from S alone (leave-one-out range)")
    assert shown == fleet_view.sigma_with_interval(found)
    sigma, low, high = map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)–([\d.]+)\)", shown).groups())
    assert low <= sigma <= high and sigma == pytest.approx(want.sigma, abs=0.5 * (high - low))
    # No more digits than the range supports: the last digit shown is that of its half-width.
    half = max(found.sigma - found.low, found.high - found.sigma)
    decimals = len(shown.split()[0].partition(".")[2])
    assert decimals == decimals_for(half)
    assert _metric(at, "target accuracy") == f"{0.63:.4f}"


def test_mean_row_and_s_column_read_as_text(demo_cals):
    at = _app()
    loo = at.dataframe[1].value
    assert loo["S (median)"].iloc[-1] == "" and "None" not in loo.to_string()
    expected = fleet.leave_one_out(demo_cals, statistic="median")
    assert list(loo["S (median)"][:-1]) == [f"{r['scale']:.4g}" for r in expected]


def test_default_pool_takes_the_most_common_k_and_warns_on_a_mixed_pool():
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    z, y = make_synthetic_logits(300, 4, seed=3)
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y, name=np.array("answer-letters"))
    at.file_uploader(key="upload_logits").set_value(("k4.npz", buf.getvalue(), "application/octet-stream")).run()
    models = at.session_state[state.MODELS]
    k4 = next(sha for sha, d in models.items() if d.name == "answer-letters")
    at.switch_page("pages/fleet.py").run()
    assert not at.exception
    pool = at.multiselect(key="fleet_pool")
    assert k4 not in pool.value and len(pool.value) == len(models) - 1
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in at.caption]
    assert any("answer-letters" in c and "(K=4; the pool's most common K is 10" in c for c in shown), shown
    assert not [w for w in at.warning if "mixes K" in w.value]
    pool.set_value(pool.value + [k4]).run()
    assert not at.exception
    assert _metric(at, "models pooled") == str(len(models))
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in at.caption]
    assert not any(c.startswith("Left out by default") for c in shown), shown  # added back: not listed
    warned = [w.value for w in at.warning]
    assert any("mixes K = 4, 10" in w for w in warned), warned


def test_pool_warning_when_held_out_error_is_large():
    rows = [{"model": "a", "held_out_error": 4.0}, {"model": "b", "held_out_error": 23.5}]
    lines = fleet_view.pool_warnings([], rows)
    assert len(lines) == 1 and "exceeds 10% for 1 of 2 models (worst b: 23.5%)" in lines[0]
    assert fleet_view.pool_warnings([], [{"model": "a", "held_out_error": 9.9}]) == []


def test_fleet_colours_stay_distinct_past_ten_models():
    from caliber_dashboard.common.figures import distinct_colors, fleet_figure

    assert len(set(distinct_colors(23))) == 23 and distinct_colors(3) == list(distinct_colors(10)[:3])
    points = {f"m{i}": ([0.1, 1.0], [0.9, 0.5]) for i in range(14)}
    fig = fleet_figure(points, v_curve=[0.1, 1.0], shared=[0.9, 0.5])
    styles = {(t.marker.color, t.marker.symbol) for t in fig.data if t.mode == "markers"}
    assert len(styles) == 14


def test_sigma_with_interval_rounding():
    found = fleet_view.SigmaFromScale(1.2345, 0.9, 1.6, 5)
    assert fleet_view.sigma_with_interval(found) == "1.2 (0.9–1.6)"
    assert fleet_view.sigma_with_interval(fleet_view.SigmaFromScale(12.345, 11.0, 14.5, 5)) == "12 (11–15)"
    assert fleet_view.sigma_with_interval(fleet_view.SigmaFromScale(12.345, 11.0, 13.5, 5)) == "12.3 (11.0–13.5)"
    assert fleet_view.sigma_with_interval(fleet_view.SigmaFromScale(1.2345, None, None, 1)) == "1.2"
    with pytest.raises(ValueError, match="at least 2 models"):
        fleet_view.sigma_spread([], statistic="median", value=0.8)


def test_range_from_one_sided_held_out_errors_contains_its_point_and_widens():
    # The issue's pool: both held-out sigmas above the models' own (the law overshoots).
    spread = np.array([0.014, 0.025])
    found = fleet_view.from_scale(0.877, spread)
    assert found.low < found.sigma < found.high
    assert found.factor == pytest.approx(1.025)
    assert found.low == pytest.approx(0.877 / 1.025) and found.high == pytest.approx(0.877 * 1.025)
    assert found.low <= 0.857 <= found.high  # the model's own sigma* of the report lies inside
    shown = fleet_view.sigma_with_interval(found)
    sigma, low, high = map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)–([\d.]+)\)", shown).groups())
    assert low <= sigma <= high
    # Negative errors alone: the same width, mirrored in log sigma, still around the point.
    mirrored = fleet_view.from_scale(0.877, 1.0 / (1.0 + spread) - 1.0)
    assert mirrored.low == pytest.approx(found.low) and mirrored.high == pytest.approx(found.high)
    with pytest.raises(ValueError, match="relative errors must be finite and > -1"):
        fleet_view.from_scale(1.0, np.array([0.1, -1.0]))


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
