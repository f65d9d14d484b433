"""The thief beside σ on Calibrate: the frontier read at a sigma, and the line without a run."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.extraction.experiment import FrontierPoint
from caliber_core.extraction.spread import Spread
from caliber_dashboard.calibrate import thief

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _run():
    def point(sigma, acc, sd, ret):
        return FrontierPoint(sigma=sigma, teacher_accuracy=0.9, surrogate_accuracy=Spread(acc, sd, 3),
                             surrogate_agreement=Spread(acc, sd, 3), surrogate_retention=Spread(ret, sd, 3))
    frontier = [point(0.0, 0.90, 0.01, 1.0), point(1.0, 0.80, 0.02, 0.8 / 0.9), point(4.0, 0.50, 0.04, 0.5 / 0.9)]
    return SimpleNamespace(frontier=frontier, frontier_attacker=SimpleNamespace(name="kd-soft"))


def test_surrogate_at_interpolates_in_log_sigma_and_says_where():
    run = _run()
    at1 = thief.surrogate_at(run, 1.0)
    assert (at1.accuracy, at1.accuracy_sd, at1.bracket) == (0.80, 0.02, (0.0, 1.0))
    mid = thief.surrogate_at(run, 2.0)  # halfway between 1 and 4 in log sigma
    assert mid.accuracy == pytest.approx(0.65) and mid.accuracy_sd == pytest.approx(0.03)
    assert mid.bracket == (1.0, 4.0) and mid.recipe == "kd-soft" and mid.seeds == 3
    assert thief.surrogate_at(run, 0.5).accuracy == pytest.approx(0.85)  # linear next to the clean point
    assert thief.surrogate_at(run, 5.0) is None
    line = thief.describe(mid)
    assert line == ("Thief: the strongest surrogate (kd-soft) keeps 65.0 ± 3.0% accuracy at this σ, 72.2 ± 3.0% "
                    "of what it gets from clean answers (mean ± sd over 3 seeds, interpolated between the "
                    "run's σ = 1 and 4).")
    with pytest.raises(ValueError, match="sigma must be a finite value >= 0, got nan"):
        thief.surrogate_at(run, math.nan)


def test_calibrate_says_how_to_measure_the_thief_without_a_run():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    lines = [m.value for m in at.markdown if m.value.startswith("Thief:")]
    assert lines == ["Thief: not measured yet — run an extraction on the Extraction page to see what a "
                     "distilled surrogate keeps at this σ."]
    assert [(p.proto.label, p.proto.page) for p in at.get("page_link")] == [("Extraction", "extraction")]
