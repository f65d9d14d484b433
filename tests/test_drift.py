"""The drift check: a config against a new sample of the same model's logits.

Real classifiers: the bundled digits models have logits for a calibration split
and a disjoint held-out split of the same distribution, and every model sees
the same images, so "a different model's logits for the same inputs" is the
held-out split of another file. Pass and catch rates are also measured over
many samples of a SYNTHETIC population. The check's ranges are simultaneous at
95%, so a same-distribution sample passes with probability >= 0.95; rates
over M samples are compared with 3 binomial standard errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.calibrate import calibrate_model, sigma_for_target
from caliber_core.calibration.drift import check_drift, target_reference
from caliber_core.calibration.engine import CurveEngine
from caliber_core.calibration.config_build import build_config
from caliber_core.simulation.synthetic import make_synthetic_logits

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
MODELS = ["cnn", "logreg-pool", "logreg-raw", "mlp-brief", "mlp-narrow", "mlp-smooth", "mlp-wide"]
RETENTIONS = (0.9, 0.8, 0.7)


def _split(name, split=""):
    with np.load(DATA_DIR / f"digits_{name}.npz", allow_pickle=False) as d:
        return d[f"{split}logits"].astype(np.float64), d[f"{split}labels"]


def _config(z, y, *, reference=True):
    cal = calibrate_model(z, y)
    config = build_config(cal, [sigma_for_target(cal, r, kind="retention") for r in RETENTIONS])
    if reference:
        rows = CurveEngine(z, y, method="exact")
        for t in config["targets"]:
            t["reference"] = target_reference(rows, t["sigma"])
    return config


@pytest.fixture(scope="module")
def configs():
    return {name: _config(*_split(name)) for name in MODELS}


def test_same_distribution_heldout_passes(configs):
    verdicts = {name: check_drift(configs[name], *_split(name, "heldout_")) for name in MODELS}
    passed = [n for n, r in verdicts.items() if r.consistent]
    # Each passes with probability >= 0.95; P(5 or fewer of 7) = 0.044.
    assert len(passed) >= 6, {n: [f.message for f in r.problems] for n, r in verdicts.items()}
    r = verdicts[passed[0]]
    # 3 targets x (retention + agreement) + A0 + S
    assert len(r.findings) == 8 and all(f.message.endswith("consistent") for f in r.findings)


@pytest.mark.parametrize("temperature", [0.6, 1.6])
@pytest.mark.parametrize("name", ["mlp-narrow", "logreg-pool", "cnn"])
def test_temperature_scaled_sample_fails(configs, name, temperature):
    z, y = _split(name, "heldout_")
    report = check_drift(configs[name], z * temperature, y)
    assert not report.consistent
    kinds = {f.quantity for f in report.problems}
    assert "scale" in kinds  # argmax is unchanged, so A0 is not what catches it
    assert "clean_accuracy" not in kinds
    for f in report.problems:
        assert f.message.endswith("recalibrate") and not f.low <= f.observed <= f.high


@pytest.mark.parametrize("pair", [("mlp-narrow", "mlp-wide"), ("cnn", "mlp-brief"),
                                  ("logreg-raw", "logreg-pool"), ("mlp-smooth", "mlp-narrow")])
def test_different_models_logits_for_the_same_inputs_fail(configs, pair):
    calibrated, served = pair
    z, y = _split(served, "heldout_")
    report = check_drift(configs[calibrated], z, y)
    assert not report.consistent
    assert all(f.message.endswith("recalibrate") for f in report.problems)


def test_without_labels_only_agreement_and_scale(configs):
    z, _ = _split("mlp-brief", "heldout_")
    report = check_drift(configs["mlp-brief"], z)
    assert sorted({f.quantity for f in report.findings}) == ["agreement", "scale"]
    assert len(report.findings) == 4
    assert not check_drift(configs["mlp-brief"], z * 1.6).consistent


def test_config_without_reference_uses_the_target_values():
    z, y = _split("mlp-wide")
    bare = _config(z, y, reference=False)
    report = check_drift(bare, *_split("mlp-wide", "heldout_"))
    # Without a reference the agreement at a retention target is unknown: retention, A0, S only.
    assert sorted(f.quantity for f in report.findings) == ["clean_accuracy", "retention", "retention",
                                                           "retention", "scale"]
    assert [f.expected for f in report.findings[:3]] == pytest.approx(list(RETENTIONS))
    assert not check_drift(bare, *_split("mlp-narrow", "heldout_")).consistent


def test_report_json_and_ranges(configs):
    z, y = _split("cnn", "heldout_")
    report = check_drift(configs["cnn"], z, y)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema"] == "caliber.check/v1" and doc["n_samples"] == 500 and doc["n_calibration"] == 500
    assert doc["comparisons"] == len(doc["findings"]) == 8
    for f in report.findings:
        assert f.low < f.expected < f.high
    # Bonferroni: more comparisons, wider ranges.
    wide = check_drift(configs["cnn"], z, y, confidence=0.99).findings[0]
    assert wide.high - wide.low > report.findings[0].high - report.findings[0].low


def test_pass_and_catch_rates_on_a_synthetic_population():
    z_pop, y_pop = make_synthetic_logits(12_000, 10, clean_accuracy=0.7, seed=21)
    z_pop = z_pop.astype(np.float64)
    rng = np.random.default_rng(4)
    passes = catches = trials = 0
    for _ in range(15):
        idx = rng.permutation(z_pop.shape[0])
        config = _config(z_pop[idx[:500]], y_pop[idx[:500]])
        for j in range(2):
            new = idx[500 + 500 * j:1000 + 500 * j]
            passes += check_drift(config, z_pop[new], y_pop[new]).consistent
            catches += not check_drift(config, 1.3 * z_pop[new], y_pop[new]).consistent
            trials += 1
    band = 3 * math.sqrt(0.95 * 0.05 / trials)
    assert passes / trials >= 0.95 - band, passes / trials
    assert catches / trials >= 0.9, catches / trials


def test_input_errors(configs):
    z, y = _split("cnn", "heldout_")
    with pytest.raises(ValueError, match=r"must have the config's 10 classes, got logits of shape \(500, 9\)"):
        check_drift(configs["cnn"], z[:, :9], y)
    with pytest.raises(ValueError, match="confidence must be in"):
        check_drift(configs["cnn"], z, y, confidence=1.5)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        check_drift(configs["cnn"], z, y[:-1])
