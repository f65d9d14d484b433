"""AppTest: the Attack cost page — Proposition 2 curves, simulation, the M bound."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import pipeline
from caliber_core.simulation.attack_estimate import estimate_averaging_attack
from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.calibration.cost import queries_needed
from caliber_dashboard.common import state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/attack_cost.py").run()
    assert not at.exception
    return at


def _metric(at, label):
    return [m.value for m in at.metric if m.label == label][0]

def _shows_sigma(text: str, want: float) -> bool:
    """Whether a σ readout "0.857 (0.842–0.871)" shows ``want`` rounded to its digits, inside its range."""
    value, _, rest = text.partition(" (")
    decimals = len(value.partition(".")[2])
    low, high = (float(x) for x in rest.rstrip(")").split("–"))
    return abs(float(value) - want) <= 0.5 * 10 ** -decimals + 1e-12 and low <= want <= high


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def test_attack_page_curves_simulation_and_bound():
    at = _app()
    data = _selected(at)
    cal = pipeline.calibrate_data(data)
    target = sigma_for_target(cal, 0.8)
    assert _shows_sigma(_metric(at, "σ* (logit units)"), target.sigma)
    v_use = sigma_for_target(cal, 0.95).v  # the usable level on the same curve v* was read from
    assert _metric(at, "v_use (measured curve)") == f"{v_use:.4g}"
    assert _metric(at, "M ≥ v*/v_use") == f"{queries_needed(target.v, v_use):,}"
    bound = [m.value for m in at.markdown if "queries per input" in m.value]
    assert len(bound) == 1 and "**M ≥ v\\*/v_use = " in bound[0]
    # One bold span, its only unescaped asterisks being the two pairs that open and close it.
    assert re.findall(r"(?<!\\)\*+", bound[0]) == ["**", "**"]
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = [t.get("name", "") for t in fig["data"]]
    assert "analytic: measured curve at σ/√M" in names and "analytic: logistic at v/M" in names
    assert sum(n.startswith("simulated") for n in names) == 4
    assert "simulated: fresh noise, hard-label majority vote" in names
    assert fig["layout"]["xaxis"]["type"] == "log"
    sim = at.dataframe[0].value
    expected = estimate_averaging_attack(data.logits, data.labels, sigma=target.sigma,
                                         m_values=(1, 2, 4, 8, 16, 32, 64), repeats=4)
    np.testing.assert_allclose(sim["accuracy"], expected["accuracy"])
    # Per-input seeding: every M gives the single-query answer (Proposition 2(ii)).
    per_input = sim[sim["seeding"] == "per-input"]
    assert per_input["accuracy"].nunique() == 1
    fresh = sim[(sim["seeding"] == "fresh") & (sim["estimator"] == "soft-average")]
    assert fresh["accuracy"].iloc[-1] > fresh["accuracy"].iloc[0] + 0.1
    # The headline carries its 95% Monte-Carlo half-width over every repeat's trials.
    row = per_input.iloc[-1]
    shown = _metric(at, "per-input seeding, M=64")
    assert "±" in shown
    mean, half = (float(x) for x in shown.split(" ± "))
    assert abs(mean - row["accuracy"]) <= 0.5 * 10 ** -len(shown.split(" ± ")[0].split(".")[1])
    assert half > 0 and abs(half - 1.96 * row["accuracy_se"]) < 0.01
    assert row["trials"] == 4 * data.n_samples


def test_attack_follows_the_side_served_on_calibrate():
    at = _app()
    data = _selected(at)
    at.session_state[state.OPTIONS].setdefault(data.sha256, {})["side"] = "at-least"
    at.run()
    assert not at.exception
    cal = pipeline.calibrate_data(data)
    from caliber_core.calibration.target_intervals import interval_estimator, with_interval
    record = with_interval(cal, sigma_for_target(cal, 0.8), interval_estimator(cal), side="at-least")
    assert _shows_sigma(_metric(at, "σ served, at least (logit units)"), record.sigma)
    assert record.sigma < sigma_for_target(cal, 0.8).sigma  # at least 80% kept: less noise


def test_usable_level_moves_the_bound():
    at = _app()
    sha = at.session_state[state.SELECTED]
    low = int(_metric(at, "M ≥ v*/v_use").replace(",", ""))
    at.slider(key=f"attack_usable_{sha[:12]}").set_value(99.0).run()
    assert not at.exception
    high = int(_metric(at, "M ≥ v*/v_use").replace(",", ""))
    assert high > low


def test_more_noise_more_queries_and_m_options():
    at = _app()
    sha = at.session_state[state.SELECTED]
    base = int(_metric(at, "M ≥ v*/v_use").replace(",", ""))
    at.slider(key=f"attack_retention_{sha[:12]}").set_value(50.0).run()
    assert int(_metric(at, "M ≥ v*/v_use").replace(",", "")) > base
    at.selectbox(key="attack_m_max").set_value(16).run()
    at.number_input(key="attack_repeats").set_value(2).run()
    assert not at.exception
    sim = at.dataframe[0].value
    assert sorted(sim["m"].unique()) == [1, 2, 4, 8, 16]
