"""The Calibrate page's plot and readout helpers as plain functions: base figures per view,
the target on a copy, the light template, readout text, and the fleet ablation's reuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from caliber_core.calibration import fleet, pipeline
from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.calibration.corridor import model_curves
from caliber_core.calibration.intervals import Interval, IntervalSet
from caliber_core.calibration.target_intervals import interval_estimator
from caliber_core.loading import load_logits
from caliber_dashboard.calibrate import plots as calibrate_plots
from caliber_dashboard.common import figures, readouts
from caliber_dashboard.common.curves import normalized_accuracy, normalized_agreement, sigma_grid

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def cal():
    return pipeline.calibrate_data(load_logits(DATA / "digits_mlp-wide.npz"))


@pytest.fixture(scope="module")
def curves(cal):
    return model_curves(cal.logits, cal.labels, sigma_grid(cal, 20), draws=cal.intervals)


def test_each_view_builds_without_a_target(cal, curves):
    for view in calibrate_plots.VIEWS:
        fig = calibrate_plots.base_figure(cal, curves, view)
        assert figures.TARGET_NAME not in [t.name for t in fig.data]
        assert fig.layout.xaxis.type == "log"
        spec = json.loads(fig.to_json())
        assert set(spec["layout"]["template"]) == {"layout"}  # the light look only
        assert len(fig.to_json()) < 16_000
    with pytest.raises(ValueError, match="view must be one of"):
        calibrate_plots.base_figure(cal, curves, "3d")


def test_with_target_copies_and_leaves_the_base_alone(cal, curves):
    base = calibrate_plots.base_figure(cal, curves, "raw")
    before = json.loads(base.to_json())
    fig = figures.with_target(base, (2.0, 0.7), x_name="σ*")
    assert json.loads(base.to_json()) == before
    assert fig.data[-1].name == figures.TARGET_NAME and fig.data[-1].x == (2.0,)
    assert len(fig.layout.shapes) == len(base.layout.shapes) + 2
    v, h = fig.layout.shapes[-2:]
    assert (v.x0, v.x1, v.yref) == (2.0, 2.0, "y domain")
    assert (h.y0, h.y1, h.xref) == (0.7, 0.7, "x domain")
    hidden = figures.with_target(base, None)
    assert hidden.data[-1].x == () and hidden.data[-1].showlegend is False
    assert [s.visible for s in hidden.layout.shapes[-2:]] == [False, False]
    assert json.loads(base.to_json()) == before
    # A step moves the marker and lines in place, and can hide them again.
    moved = figures.move_target(hidden, (3.0, 0.5), x_name="σ*")
    assert moved is hidden and hidden.data[-1].x == (3.0,) and hidden.layout.shapes[-2].x0 == 3.0
    assert hidden.layout.shapes[-1].y0 == 0.5 and hidden.layout.shapes[-1].visible
    figures.move_target(hidden, None)
    assert hidden.data[-1].x == () and not hidden.layout.shapes[-1].visible
    assert hidden.data[:-1] == fig.data[:-1]  # the rest is the base's


def test_target_sits_on_the_plotted_quantity(cal):
    r = sigma_for_target(cal, 0.8)
    delivered = {"accuracy": 0.75, "agreement": 0.77}
    assert calibrate_plots.target_xy(cal, r, "raw", delivered=delivered) == (r.sigma, 0.75)
    x, y = calibrate_plots.target_xy(cal, r, "normalized", delivered=delivered)
    assert x == pytest.approx(r.v) and y == pytest.approx(float(normalized_accuracy(0.75, cal)))
    a = sigma_for_target(cal, 0.8, kind="agreement")
    x, y = calibrate_plots.target_xy(cal, a, "normalized", delivered=delivered)
    assert y == pytest.approx(float(normalized_agreement(0.77, cal.n_classes)))
    assert calibrate_plots.target_xy(cal, r, "residuals", delivered=delivered) is None
    none = sigma_for_target(cal, 1.0)
    assert none.sigma == 0.0 and calibrate_plots.target_xy(cal, none, "raw", delivered=delivered) is None


def test_legends_say_exact(cal, curves):
    assert curves.method == "exact"
    assert calibrate_plots.corridor_name(curves) == "accuracy corridor (Corollary 1): exact"
    assert calibrate_plots.curve_name(curves, "expected accuracy") == "exact expected accuracy"
    assert "exact quadrature" in calibrate_plots.curves_note(curves, cal.n_samples, cal.n_classes)


def _set(est, lo, hi, n=500):
    iv = Interval(est, lo, hi)
    return IntervalSet(sigma=1.0, level=0.95, method="m", n_samples=n, accuracy=iv, retention=iv,
                       agreement=Interval(0.9, 0.88, 0.92))


def test_readout_text():
    assert readouts.with_interval("retention", Interval(0.8, 0.776, 0.825), 0.95) == \
        "retention 80.0% (95%: 77.6–82.5%)"
    line = readouts.interval_line(_set(0.8, 0.776, 0.825), first="agreement")
    assert line.startswith("agreement 90.0% (95%: 88.0–92.0%) · retention 80.0%")
    text, wide = readouts.advice(_set(0.8, 0.771, 0.829), kind="retention")
    assert wide and text.startswith("Retention interval: ±2.9% at N=500")
    text, wide = readouts.advice(_set(0.8, 0.79, 0.81), kind="retention")
    assert not wide
    with pytest.raises(ValueError, match="first must be one of"):
        readouts.interval_line(_set(0.8, 0.7, 0.9), first="surrogate")


def test_readout_of_a_real_model_matches_its_bootstrap(cal):
    r = sigma_for_target(cal, 0.7)
    iv = interval_estimator(cal).at(r.sigma)
    line = readouts.interval_line(iv, first="retention")
    assert line.startswith(f"retention {100 * iv.retention.estimate:.1f}%")
    assert abs(iv.retention.estimate - 0.7) < 1e-3  # sigma* delivers the target on the sample


def test_ablation_reuses_a_known_leave_one_out(cal):
    cals = [pipeline.calibrate_data(load_logits(p)) for p in sorted(DATA.glob("digits_*.npz"))[:3]]
    loo = fleet.leave_one_out(cals, statistic="median")
    fresh = fleet.margin_ablation(cals)
    assert fleet.margin_ablation(cals, known={"median": loo}) == fresh
    fake = [dict(r, held_out_error=100.0, in_sample_error=50.0) for r in loo]
    reused = fleet.margin_ablation(cals, known={"mean": fake})
    assert reused[1]["held_out_error"] == 100.0  # the table given is the one used
    assert reused[0] == fresh[0]
    with pytest.raises(ValueError, match="known tables must be keyed by"):
        fleet.margin_ablation(cals, known={"max": loo})
