"""The one curve engine: a sample validated once, one cost policy, the clean model at sigma = 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from caliber_core import validation
from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import calibrate_model, measured_accuracy, measured_agreement
from caliber_core.calibration.engine import EXACT_BUDGET, CurveEngine, choose_method, exact_cost
from caliber_core.calibration.sample import LogitSample
from caliber_core.loading import load_logits
from caliber_core.simulation.synthetic import make_synthetic_logits

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize("method", ["exact", "monte-carlo"])
def test_ties_at_zero_noise_give_the_clean_accuracy(method):
    # Rows 0 and 1 tie at the top (argmax takes the lower index); row 2 is wrong.
    z = np.array([[2.0, 2.0, 0.0], [1.0, 1.0, 1.0], [0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    y = np.array([0, 1, 0, 0])
    a0 = float(np.mean(np.argmax(z, 1) == y))
    assert a0 == 0.5
    engine = CurveEngine(z, y, method=method, seed=1)
    assert engine.accuracy(0.0)[0] == a0
    assert engine.agreement(0.0)[0] == 1.0
    rows = engine.at([0.0, 0.5])
    np.testing.assert_array_equal(rows.accuracy[0], [1.0, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(rows.agreement[0], 1.0)
    lower, upper = engine.corridor([0.0])
    assert lower[0] == upper[0] == a0
    # Just above 0 the tie is split by the noise: the curve is not continuous there.
    assert engine.accuracy(1e-9)[0] < a0


def test_one_policy_decides_every_consumer():
    assert choose_method(500, 10) == "exact" and choose_method(2000, 1000) == "monte-carlo"
    assert exact_cost(2000, 1000) > EXACT_BUDGET >= exact_cost(500, 10)
    z, y = make_synthetic_logits(300, 1000, seed=11)
    cal = calibrate_model(z, y, realizations=16)
    engine = cal.engine
    assert cal.curve_method == engine.method == "monte-carlo"
    assert engine.draws is cal.intervals and engine.sample is cal.sample
    s = np.geomspace(*cal.sigma_range(), 5)
    np.testing.assert_array_equal(measured_accuracy(cal, s), cal.intervals.accuracy(s))
    np.testing.assert_array_equal(measured_agreement(cal, s), cal.intervals.agreement(s))
    np.testing.assert_allclose(engine.at(s).accuracy.mean(axis=1), cal.intervals.accuracy(s), atol=1e-12)
    small = calibrate_model(*_demo())
    assert small.curve_method == small.engine.method == "exact"


def _demo():
    data = load_logits(DATA / "digits_mlp-narrow.npz")
    return data.logits, data.labels


def test_the_sample_keeps_what_it_derived():
    z, y = _demo()
    s = LogitSample(z, y)
    assert s.agreement_gaps is s.agreement_gaps and s.margins is s.margins
    assert s.clean_accuracy == float(np.mean(np.argmax(z, 1) == y))
    assert s.label_gaps.shape == (s.wrong_rows.size, z.shape[1] - 1)
    assert np.all(s.deficits > 0)
    assert LogitSample.of(s) is s
    with pytest.raises(ValueError, match="labels come with the LogitSample"):
        LogitSample.of(s, y)
    with pytest.raises(ValueError, match=r"margins must have shape \(500,\)"):
        LogitSample(z, y, margins=np.ones(3))
    with pytest.raises(ValueError, match="labels are required"):
        LogitSample(z).correct  # noqa: B018


def test_config_for_validates_the_logits_once(monkeypatch):
    # The loader checks the file; from there the pipeline builds one sample and every
    # consumer (sweep, sigma*, intervals, drift reference) reads it.
    data = load_logits(DATA / "digits_cnn.npz")
    calls = {"as_logits": 0, "top_two": 0}
    real_as_logits = validation.as_logits

    def counting(logits, **kw):
        calls["as_logits"] += 1
        return real_as_logits(logits, **kw)

    import caliber_core.calibration.margins as margins_mod
    import caliber_core.calibration.sample as sample_mod

    real_top_two = margins_mod.top_two_margins

    def counting_top_two(logits, **kw):
        calls["top_two"] += 1
        return real_top_two(logits, **kw)

    monkeypatch.setattr(sample_mod, "as_logits", counting)
    monkeypatch.setattr(sample_mod, "top_two_margins", counting_top_two)
    for name in ("margins", "survival", "sweep", "engine", "calibrate", "intervals", "drift"):
        mod = __import__(f"caliber_core.calibration.{name}", fromlist=["x"])
        if hasattr(mod, "as_logits"):
            monkeypatch.setattr(mod, "as_logits", counting)
    cal, results, config = pipeline.config_for(data, [("retention", 0.9), ("agreement", 0.8)])
    assert calls == {"as_logits": 0, "top_two": 0}  # the loader's checks and margins are the sample's
    assert config["targets"][0]["reference"]["retention"] == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("name", ["digits_cnn.npz", "synthetic"])
def test_following_the_data_through_config_for_visits_each_module_at_most_twice(name):
    # Every call in caliber_core that is handed the file's logits (the array itself or the
    # sample carrying it) is a stop, except the sample's own code (its cached arrays).
    import sys

    if name == "synthetic":
        from caliber_core.loading import load_logits_bytes
        import io

        z, y = make_synthetic_logits(400, 1000, seed=2)
        buf = io.BytesIO()
        np.savez(buf, logits=z, labels=y)
        data = load_logits_bytes(buf.getvalue(), "synthetic.npz")
    else:
        data = load_logits(DATA / name)

    def carries(v):
        return v is data.logits or (isinstance(v, LogitSample) and getattr(v, "logits", None) is data.logits)

    stops = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("caliber_core") or module == LogitSample.__module__:
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(carries(frame.f_locals.get(a)) for a in names):
            stops.append((module, code.co_name))

    sys.setprofile(profile)
    try:
        pipeline.config_for(data, [("retention", 0.9), ("retention", 0.7), ("agreement", 0.8)])
    finally:
        sys.setprofile(None)
    visits = {}
    previous = None
    for module, _ in stops:
        if module != previous:
            visits[module] = visits.get(module, 0) + 1
        previous = module
    assert stops and max(visits.values()) <= 2, stops
    assert [f for _, f in stops].count("as_logits") == 0, stops  # the loader's checks are the sample's


def test_the_review_recomputes_a_config_on_its_own_model():
    from caliber_core.calibration.review import review_config

    data = load_logits(DATA / "digits_cnn.npz")
    targets = [("retention", 0.9), ("agreement", 0.8), ("accuracy", 0.7)]
    cal, _, config = pipeline.config_for(data, targets, side="at-least")
    rows = review_config(cal, config)
    assert [r["target"] for r in rows] == ["retention 0.9", "agreement 0.8", "accuracy 0.7"]
    for row, t in zip(rows, config["targets"]):
        assert row["note"] == "" and row["sigma_now"] == t["sigma"] and row["delta_percent"] == 0.0
        assert row["accuracy_at_file_sigma"] == pytest.approx(t["reference"]["accuracy"], abs=1e-9)
    assert rows[1]["agreement_at_file_sigma"] == pytest.approx(config["targets"][1]["reference"]["agreement"])
    bad = review_config(cal, {"targets": [{"kind": "surrogate-retention", "requested": 0.5, "sigma": 1.0}]})
    assert bad[0]["sigma_now"] is None and "not recomputed" in bad[0]["note"]
