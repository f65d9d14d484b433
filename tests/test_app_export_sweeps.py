"""AppTest: the Export page builds its config on the calibration the Calibrate page holds.

One visit to Calibrate then Export runs the noise sweep exactly once: Export
solves the targets on that calibration (``pipeline.config_from_calibration``)
instead of calibrating the file again.
"""

from __future__ import annotations

import json
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from caliber_core.calibration import calibrate, engine, pipeline
from caliber_dashboard.common import state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _count_sweeps(monkeypatch) -> list:
    """Every call of the sweep (the survival intervals of the noise draws), from wherever it is made."""
    calls = []
    sweep = calibrate.survival_intervals

    def counted(*args, **kwargs):
        calls.append(args[0].n_samples if args else None)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(calibrate, "survival_intervals", counted)
    monkeypatch.setattr(engine, "survival_intervals", counted)
    return calls


def test_export_after_calibrate_runs_one_sweep(monkeypatch):
    st.cache_resource.clear()  # no calibration left from another test in this process
    calls = _count_sweeps(monkeypatch)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert len(calls) == 1  # the Calibrate page calibrates the selected model
    at.switch_page("pages/export.py").run()
    assert not at.exception
    assert len(calls) == 1, f"Export swept again: {len(calls)} sweeps"

    # And the config it shows is the CLI's for the same file (the sweep the CLI runs is its own).
    data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
    shown = json.loads(at.code[0].value)
    _, _, expected = pipeline.config_for(data, [(t["kind"], t["requested"]) for t in shown["targets"]])
    assert len(calls) == 2
    assert [t["sigma"] for t in shown["targets"]] == [t["sigma"] for t in expected["targets"]]
