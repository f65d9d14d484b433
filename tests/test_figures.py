"""Figure builders and plot series of the dashboard, tested as plain functions (no Streamlit)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import measured_accuracy, sigma_for_target
from caliber_core.calibration.corridor import model_curves
from caliber_core.calibration.margins import normalized_noise
from caliber_core.calibration.fleet import normalized_points
from caliber_core.loading import load_logits
from caliber_core.calibration.cost import analytic_attack, query_bound
from caliber_dashboard.calibrate import verification
from caliber_dashboard.common import cache, figures, tables, targets
from caliber_dashboard.common import curves as plot

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def data():
    return load_logits(DATA / "digits_logreg-raw.npz")


@pytest.fixture(scope="module")
def cal(data):
    return pipeline.calibrate_data(data)


@pytest.fixture(scope="module")
def curves(cal):
    return model_curves(cal.logits, cal.labels, plot.sigma_grid(cal, 24), draws=cal.intervals,
                        method="exact")


def _v(curves, cal):
    return normalized_noise(curves.sigma, cal.scale)


def _by_name(fig: go.Figure) -> dict:
    return {t.name: t for t in fig.data}


def _shapes_y(fig: go.Figure) -> list[float]:
    return [s.y0 for s in fig.layout.shapes if s.y0 == s.y1 and s.yref != "paper"]


# ------------------------------------------------------------------ margin histogram


def test_margin_histogram_one_overlaid_trace_per_model():
    rng = np.random.default_rng(0)
    margins = {"a": rng.exponential(2.0, 300), "b": rng.exponential(5.0, 200)}
    fig = figures.margin_histogram(margins)
    assert [t.type for t in fig.data] == ["histogram", "histogram"]
    assert [t.name for t in fig.data] == ["a", "b"]
    np.testing.assert_array_equal(fig.data[0].x, margins["a"])
    np.testing.assert_array_equal(fig.data[1].x, margins["b"])
    assert all(t.histnorm == "percent" for t in fig.data)  # models with different N compare
    assert fig.layout.barmode == "overlay"
    assert "logit units" in fig.layout.xaxis.title.text
    assert "%" in fig.layout.yaxis.title.text
    assert "%{y" in fig.data[0].hovertemplate


# ------------------------------------------------------------------ normalized view


def test_normalized_figure_traces_band_and_log_axis(cal, curves):
    v_pts, u_pts, u_se = plot.fitted_points(cal)
    lower = plot.normalized_accuracy(curves.lower, cal)
    upper = plot.normalized_accuracy(curves.upper, cal)
    agreement = plot.normalized_agreement(curves.agreement, cal.n_classes)
    fig = figures.normalized_figure(
        v_points=v_pts, u_points=u_pts, u_se=u_se, v_curve=_v(curves, cal),
        logistic=cal.fit.predict(_v(curves, cal)), corridor_lower=lower, corridor_upper=upper,
        agreement=agreement, target=(0.5, 0.6))
    assert fig.layout.xaxis.type == "log"
    assert "v = σ²/S²" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.title.text == figures.UTILITY_AXIS
    # The band: the upper bound first (no line), then the lower bound filled to it.
    fills = [i for i, t in enumerate(fig.data) if t.fill == "tonexty"]
    assert len(fills) == 1
    lo_trace, up_trace = fig.data[fills[0]], fig.data[fills[0] - 1]
    assert up_trace.line.width == 0
    np.testing.assert_allclose(up_trace.y, upper)
    np.testing.assert_allclose(lo_trace.y, lower)
    np.testing.assert_allclose(lo_trace.x, _v(curves, cal))
    assert all(t.type == "scatter" for t in fig.data)  # never scattergl: fills break there
    named = _by_name(fig)
    np.testing.assert_allclose(named["fitted logistic Ã(v)"].y, cal.fit.predict(_v(curves, cal)))
    np.testing.assert_allclose(named["exact agreement π(σ), normalized"].y, agreement)
    sweep = named["Monte-Carlo sweep (±1 s.e.)"]
    np.testing.assert_allclose(sweep.x, v_pts)
    np.testing.assert_allclose(sweep.y, u_pts)
    np.testing.assert_allclose(sweep.error_y.array, u_se)
    star = named["target σ*"]
    assert (star.x[0], star.y[0]) == (0.5, 0.6)
    assert 0.6 in _shapes_y(fig)
    json.loads(fig.to_json())  # serializable as Streamlit sends it


def test_normalized_figure_without_corridor_has_no_band():
    fig = figures.normalized_figure(v_points=[0.1, 1.0, 10.0], u_points=[1.0, 0.5, 0.1])
    assert [t.fill for t in fig.data if t.fill] == []
    assert len(fig.data) == 1
    assert fig.data[0].error_y.array is None


def test_corridor_contains_exact_accuracy(cal, curves):
    """Corollary 1 on the plotted series: lower <= exact accuracy <= upper, lower decreasing."""
    assert np.all(curves.lower <= curves.accuracy + 1e-12)
    assert np.all(curves.accuracy <= curves.upper + 1e-12)
    assert np.all(np.diff(curves.lower) < 0)
    assert np.all(np.diff(curves.agreement) < 0)
    np.testing.assert_allclose(_v(curves, cal), (curves.sigma / cal.scale) ** 2)
    assert curves.sigma[0] == pytest.approx(cal.sweep.sigma[0])
    assert curves.sigma[-1] == pytest.approx(cal.sweep.sigma[-1])


def test_curves_report_progress_to_one(cal):
    seen = []
    model_curves(cal.logits, cal.labels, plot.sigma_grid(cal, 12), draws=cal.intervals, chunk=5,
                 progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 3


def test_normalized_axes_endpoints(cal):
    assert plot.normalized_accuracy(cal.clean_accuracy, cal) == pytest.approx(1.0)
    assert plot.normalized_accuracy(cal.chance, cal) == pytest.approx(0.0)
    assert plot.normalized_agreement(1.0, 10) == pytest.approx(1.0)
    assert plot.normalized_agreement(0.1, 10) == pytest.approx(0.0)


# ------------------------------------------------------------------ raw view, residuals


def test_raw_figure_values_lines_and_band(cal, curves):
    fig = figures.raw_figure(
        sigma_points=cal.sweep.sigma, y_points=cal.sweep.accuracy, y_se=cal.sweep.accuracy_se,
        sigma_curve=curves.sigma, exact=curves.accuracy, corridor_lower=curves.lower,
        corridor_upper=curves.upper, clean=cal.clean_accuracy, chance=cal.chance,
        target=(2.0, 0.7))
    assert fig.layout.xaxis.type == "log"
    assert "logit units" in fig.layout.xaxis.title.text
    assert "accuracy" in fig.layout.yaxis.title.text
    named = _by_name(fig)
    np.testing.assert_allclose(named["exact expected accuracy"].y, curves.accuracy)
    np.testing.assert_allclose(named["Monte-Carlo sweep (±1 s.e.)"].x, cal.sweep.sigma)
    assert sum(t.fill == "tonexty" for t in fig.data) == 1
    ys = _shapes_y(fig)
    assert cal.clean_accuracy in ys and cal.chance in ys and 0.7 in ys


def test_residual_figure(cal):
    v, res = plot.residuals(cal)
    np.testing.assert_allclose(res, plot.fitted_points(cal)[1] - cal.fit.predict(v))
    # The fit's rmse is the rms of exactly these residuals.
    assert math.sqrt(np.mean(res**2)) == pytest.approx(cal.fit.rmse, rel=1e-9)
    fig = figures.residual_figure(v, res, rmse=cal.fit.rmse)
    assert fig.layout.xaxis.type == "log"
    np.testing.assert_allclose(fig.data[0].y, res)
    assert sorted(_shapes_y(fig)) == pytest.approx([-cal.fit.rmse, 0.0, cal.fit.rmse])
    texts = [a.text for a in fig.layout.annotations]
    assert "new text" not in texts and any("rmse" in t for t in texts)


# ------------------------------------------------------------------ fleet and attack


def test_fleet_figure_one_trace_per_model_and_shared_curve(cal):
    pts = {"m1": normalized_points(cal, "median"), "m2": normalized_points(cal, "mean")}
    np.testing.assert_allclose(pts["m1"][0], (cal.sweep.sigma / cal.scales["median"]) ** 2)
    v_curve = np.geomspace(1e-3, 100, 50)
    fig = figures.fleet_figure(pts, v_curve=v_curve, shared=cal.fit.predict(v_curve), statistic="mean")
    assert [t.name for t in fig.data[:2]] == ["m1", "m2"]
    np.testing.assert_allclose(fig.data[1].x, pts["m2"][0])
    np.testing.assert_allclose(fig.data[-1].y, cal.fit.predict(v_curve))
    assert "mean" in fig.data[-1].name and "mean" in fig.layout.xaxis.title.text
    assert fig.layout.xaxis.type == "log"


def test_attack_figure_simulation_groups_and_bound():
    sim = pd.DataFrame([
        (s, e, m, 0.9, 0.01, 0.8 + 0.01 * m, 0.01)
        for s in ("fresh", "per-input") for e in ("soft-average", "majority-vote") for m in (1, 2, 4)
    ], columns=["seeding", "estimator", "m", "agreement", "agreement_se", "accuracy", "accuracy_se"])
    m = np.arange(1, 5)
    fig = figures.attack_figure(m_curve=m, measured=0.8 + 0.02 * m, logistic=0.79 + 0.02 * m,
                                simulation=sim, clean=0.95, chance=0.1, target=0.8, usable=0.9,
                                m_bound=3)
    names = [t.name for t in fig.data]
    assert names[:2] == ["analytic: measured curve at σ/√M", "analytic: logistic at v/M"]
    assert sum(n.startswith("simulated") for n in names) == 4
    assert any("majority vote" in n for n in names)
    per_input_vote = _by_name(fig)["simulated: per-input seeding, majority vote"]
    np.testing.assert_allclose(per_input_vote.y, [0.81, 0.82, 0.84])
    assert fig.layout.xaxis.type == "log"
    lo, hi = fig.layout.xaxis.range
    assert 10**lo < 1 and 10**hi > 4
    assert any(s.x0 == 3 for s in fig.layout.shapes)  # the M >= v/v_use line
    assert "0.9" in " ".join(a.text for a in fig.layout.annotations)


def test_chart_config_names_png():
    cfg = figures.chart_config("my model/raw")
    assert cfg["toImageButtonOptions"]["format"] == "png"
    assert cfg["toImageButtonOptions"]["filename"] == "my_model_raw"


# ------------------------------------------------------------------ page helpers


def test_parse_percent_list_and_targets():
    assert targets.parse_percent_list("90, 80 70%;60") == [0.9, 0.8, 0.7, 0.6]
    assert targets.parse_percent_list("") == []
    with pytest.raises(ValueError, match="not a number: 'abc'"):
        targets.parse_percent_list("90, abc")
    with pytest.raises(ValueError, match=r"percentage in \(0, 100\]"):
        targets.parse_percent_list("150")
    with pytest.raises(ValueError, match="accuracy targets"):
        targets.target_list("90", "0")
    assert targets.target_list("80", "70", "95") == [("retention", 0.8), ("accuracy", 0.7),
                                                     ("agreement", 0.95)]
    # The CLI reads --retention 80 as 80 / 100: the same float.
    assert targets.percent_to_fraction(80) == 0.8 == 80 / 100.0


@pytest.mark.parametrize("kind", ["retention", "accuracy", "agreement"])
def test_slider_range_is_reachable_on_every_demo_model(kind):
    for path in sorted(DATA.glob("digits_*.npz")):
        d = load_logits(path)
        c = pipeline.calibrate_data(d)
        rng = targets.slider_range(kind, clean_accuracy=c.clean_accuracy, n_classes=c.n_classes)
        assert rng.lo < rng.default <= rng.hi
        for pct in (rng.lo, rng.default):
            r = sigma_for_target(c, targets.percent_to_fraction(pct), kind=kind)  # must not raise
            assert r.sigma > 0


def test_verify_sigma_reproducible_and_near_prediction(data, cal):
    r = sigma_for_target(cal, 0.8)
    seen = []
    a = verification.verify_sigma(data.logits, data.labels, r.sigma, realizations=200, seed=5,
                            progress=seen.append)
    b = verification.verify_sigma(data.logits, data.labels, r.sigma, realizations=200, seed=5)
    c = verification.verify_sigma(data.logits, data.labels, r.sigma, realizations=200, seed=6)
    assert a == b and a.accuracy != c.accuracy
    assert seen[-1] == 1.0 and len(seen) == 10
    predicted = float(measured_accuracy(cal, r.sigma)[0])
    # Binomial s.e. over 100k draws is ~0.0013; the exact curve must sit within 4 of them.
    assert abs(a.accuracy - predicted) < 4 * a.accuracy_se
    assert verification.verify_realizations(500) == 200
    assert verification.verify_realizations(10_000, 1_000) == 5  # at most 5e7 noise values a click
    assert verification.verify_realizations(100_000, 1_000) == 4


def test_verify_sigma_does_not_depend_on_its_threads(data, cal):
    sigma = sigma_for_target(cal, 0.8).sigma
    # Fewer realizations than pieces: each realization is cut into blocks of rows (as at 10,000 x 1,000).
    seen = []
    one = verification.verify_sigma(data.logits, data.labels, sigma, realizations=3, seed=9, workers=1)
    two = verification.verify_sigma(data.logits, data.labels, sigma, realizations=3, seed=9, workers=2,
                                    progress=seen.append)
    assert one == two and seen == [i / 12 for i in range(1, 13)]  # 3 realizations x 4 blocks of rows
    unlabelled = verification.verify_sigma(data.logits, None, sigma, realizations=3, seed=9, workers=2)
    assert unlabelled.accuracy is None and unlabelled.agreement == one.agreement


def test_query_bound_matches_proposition_2(cal):
    r = sigma_for_target(cal, 0.7)
    b = query_bound(cal, r.v, 0.95)
    # v_use on the same curve v* was solved on (sigma_for_target's default)
    assert b.inversion == "curve" and b.v_use == sigma_for_target(cal, 0.95).v
    assert b.queries == math.ceil(r.v / b.v_use)
    assert query_bound(cal, r.v, 1.0).queries is None  # only the clean model is that good
    # The law's v* with the law's v_use
    law = sigma_for_target(cal, 0.7, inversion="logistic")
    bl = query_bound(cal, law.v, 0.95, inversion="logistic")
    u = (0.95 * cal.clean_accuracy - cal.chance) / (cal.clean_accuracy - cal.chance)
    assert bl.v_use == pytest.approx(cal.fit.inverse(u))
    assert bl.queries == math.ceil(law.v / bl.v_use)
    with pytest.raises(ValueError, match="inversion must be one of"):
        query_bound(cal, r.v, 0.95, inversion="exact")


def test_analytic_attack_recovers_with_m(cal):
    r = sigma_for_target(cal, 0.7)
    m = plot.m_grid(64)
    assert m[0] == 1 and m[-1] == 64 and np.all(np.diff(m) > 0)
    measured, logistic = analytic_attack(cal, r.sigma, m)
    assert measured[0] == pytest.approx(float(measured_accuracy(cal, r.sigma)[0]))
    assert np.all(np.diff(measured) > -1e-9) and measured[-1] > measured[0] + 0.1
    assert logistic[-1] > logistic[0]
    assert plot.powers_of_two(64) == (1, 2, 4, 8, 16, 32, 64)


def test_model_table_and_digest(data):
    df = tables.model_table([data])
    row = df.iloc[0]
    assert (row["model"], row["N"], row["K"], row["labels"]) == (data.name, 500, 10, "yes")
    assert row["file"] == "digits_logreg-raw.npz"
    assert row["sha256"] == data.sha256[:12]
    assert row["A0"] == pytest.approx(0.962)
    assert row["S median"] == pytest.approx(3.541, abs=1e-3)
    unlabelled = dataclasses.replace(data, labels=None)
    assert cache.data_digest(unlabelled) != cache.data_digest(data)
    assert cache.data_digest(data) == cache.data_digest(load_logits(DATA / "digits_logreg-raw.npz"))


def test_with_mean_row():
    df = tables.with_mean_row([{"model": "a", "scale": 1.0, "e": 2.0},
                               {"model": "b", "scale": 3.0, "e": 4.0}], "model")
    assert list(df["model"]) == ["a", "b", "mean"]
    assert df["e"].iloc[-1] == 3.0 and math.isnan(df["scale"].iloc[-1])


def test_margin_histogram_one_row_each_past_three_models():
    rng = np.random.default_rng(2)
    margins = {f"model {i}": rng.gamma(2.0, size=200 + i) for i in range(7)}
    fig = figures.margin_histogram(margins, nbins=30)
    assert [t.type for t in fig.data] == ["scatter"] * 7
    assert {t.xaxis for t in fig.data} == {None} and {t.yaxis for t in fig.data} == {None}  # one axis pair
    assert list(fig.layout.yaxis.ticktext) == list(margins)  # first model on the top row
    assert list(fig.layout.yaxis.tickvals) == [6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    for row, (trace, m) in enumerate(zip(fig.data, margins.values())):
        counts, edges = np.histogram(m, bins=30)
        bins = np.asarray(trace.customdata)[:-2:2]  # (bin centre, % of inputs) once per bin
        np.testing.assert_allclose(bins[:, 0], (edges[:-1] + edges[1:]) / 2)
        np.testing.assert_allclose(bins[:, 1], 100 * counts / m.size)
        y = np.asarray(trace.y)
        base = 6 - row
        assert y.min() == base and y.max() == pytest.approx(base + figures.RIDGE_HEIGHT)  # scaled to its tallest bin
        assert trace.x[0] == edges[0] and trace.x[-2] == edges[-1] and trace.fill == "toself"


def test_log_axis_labels_every_decade_over_a_long_span():
    import plotly.graph_objects as go

    short = figures._layout(go.Figure(go.Scatter(x=[0.1, 2.0], y=[0, 1])), title=None, x_title="x", y_title="y",
                            x_log=True)
    long = figures._layout(go.Figure(go.Scatter(x=[1e-4, 10.0], y=[0, 1])), title=None, x_title="x", y_title="y",
                           x_log=True)
    assert short.layout.xaxis.dtick == "D2" and long.layout.xaxis.dtick == 1


def test_a_thin_band_draws_its_edges():
    import plotly.graph_objects as go

    fig = go.Figure()
    figures._band(fig, [1, 2], [0.95, 0.951], [0.952, 0.953], name="corridor", hover_x="v", hover_y="A")
    assert all(t.line.width > 0 for t in fig.data)
    wide = go.Figure()
    figures._band(wide, [1, 2], [0.5, 0.6], [0.7, 0.8], name="corridor", hover_x="v", hover_y="A")
    assert all(t.line.width == 0 for t in wide.data)


def test_check_verification_band_is_the_levels_normal_quantile():
    check = verification.check_verification(0.80, 0.01, 0.818)
    assert check.confidence == 0.95
    assert check.half_width == pytest.approx(1.959964 * 0.01, rel=1e-6)  # the 97.5% normal quantile
    assert check.within and check.relative_error == pytest.approx(-0.018 / 0.818)
    assert not verification.check_verification(0.80, 0.01, 0.818, confidence=0.9).within  # 1.645 x 0.01 < 0.018
    assert verification.check_verification(0.80, 0.01, 0.8257, confidence=0.99).within  # 2.576 x 0.01
    assert not verification.check_verification(0.80, 0.01, 0.8257).within
    edge = verification.check_verification(0.5, 0.1, 0.5 + 0.1 * 1.959963984540054)
    assert edge.within  # on the band's edge counts as within
    assert not verification.check_verification(0.5, 0.0, 0.5 + 1e-9).within


def test_check_verification_refuses_what_has_no_band():
    with pytest.raises(ValueError, match=r"confidence must be in \[0.5, 1\), got 1.0"):
        verification.check_verification(0.8, 0.01, 0.8, confidence=1.0)
    with pytest.raises(ValueError, match=r"standard_error must be finite and >= 0, got -0.01"):
        verification.check_verification(0.8, -0.01, 0.8)
    with pytest.raises(ValueError, match=r"wanted must be finite and non-zero .* got 0"):
        verification.check_verification(0.8, 0.01, 0)
