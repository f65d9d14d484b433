"""A one-sided guarantee is printed and exported only where the data's own bound supports it.

"at-least" promises the population at least the target with the stated confidence,
"at-most" no more than it. Either promise is true of the sigma served only when the
one-sided bound at that sigma is on the target's side, and that holds for sigma = 0
too: a target that asks for no degradation is still a claim about the population,
which the clean model's own bound may refute (e.g. accuracy >= 99% on a model whose
clean 95% lower bound is 96.6%). Otherwise the target is refused with one line.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from caliber_core.calibration import pipeline
from caliber_core.calibration.target_intervals import exact_clean_bound, interval_estimator
from caliber_core.cli import main
from caliber_core.cli.calibrate import _target_table
from caliber_core.loading import load_logits

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT / "data").glob("digits_*.npz"))
CNN = ROOT / "data" / "digits_cnn.npz"
SIGN = {"at-least": ">=", "at-most": "<="}


@functools.cache
def _calibrated(path: Path):
    data = load_logits(path)
    return data, pipeline.calibrate_data(data)


@functools.cache
def _estimator(path: Path, confidence: float):
    _, cal = _calibrated(path)
    return interval_estimator(cal, confidence=confidence, seed=cal.seed)  # the one the pipeline builds


def _clean_bound(path: Path, kind: str, side: str, confidence: float) -> float:
    """The clean model's one-sided bound: the bootstrap's, and for accuracy the more cautious of it and
    the exact binomial (Clopper-Pearson) bound, checked here against scipy's own exact interval."""
    data, cal = _calibrated(path)
    boot = float(_estimator(path, confidence).bound(0.0, kind=kind, side=side)[0])
    if kind != "accuracy":
        return boot
    k = round(cal.clean_accuracy * cal.n_samples)
    ci = binomtest(k, cal.n_samples).proportion_ci(confidence_level=2 * confidence - 1, method="exact")
    exact = ci.low if side == "at-least" else ci.high
    assert exact_clean_bound(k / cal.n_samples, cal.n_samples, side=side, confidence=confidence) == \
        pytest.approx(exact, abs=1e-12)
    return min(boot, exact) if side == "at-least" else max(boot, exact)


def _keeps(bound: float, value: float, side: str) -> bool:
    return bound >= value if side == "at-least" else bound <= value


def _check(path: Path, kind: str, target: float, side: str, confidence: float) -> str:
    """Calibrate one one-sided target through the Python API; check what it guarantees. "refused" or "served"."""
    data, cal = _calibrated(path)
    est = _estimator(path, confidence)
    clean = _clean_bound(path, kind, side, confidence)
    try:
        _, config = pipeline.config_from_calibration(cal, data, [(kind, target)], side=side,
                                                     confidence=confidence)
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and "cannot be guaranteed" in message
        if side == "at-least":
            # Refused exactly when the clean model's own lower bound is below the target.
            assert clean < target, (path.name, kind, target, clean, message)
            assert f"{clean:.4f}" in message
        return "refused"
    (t,) = config["targets"]
    assert t["side"] == side and not t["saturated"]
    assert side != "at-least" or clean >= target, (path.name, kind, target, clean)
    sigma = t["sigma"]
    bound = float(est.bound(sigma, kind=kind, side=side)[0])
    assert _keeps(bound, target, side), (path.name, kind, target, side, sigma, bound)
    if sigma == 0.0:
        assert _keeps(clean, target, side), (path.name, kind, target, side, clean)
    # What the table prints is that guarantee, at that level.
    table = _target_table(config)
    assert f"{kind} {SIGN[side]} {100 * target:.1f}% (one-sided {confidence:.0%})" in table
    return "served"


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(MODELS), kind=st.sampled_from(("accuracy", "retention")),
       side=st.sampled_from(("at-least", "at-most")),
       target=st.integers(500, 999).map(lambda i: i / 1000),
       confidence=st.sampled_from((0.8, 0.9, 0.95, 0.99)))
def test_every_one_sided_guarantee_is_supported_by_the_data(model, kind, side, target, confidence):
    _check(model, kind, target, side, confidence)


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_refusal_starts_at_the_clean_lower_bound(model):
    """Around sigma* = 0 the refusal starts exactly at the clean one-sided bound, on every bundled
    model: the two targets (in steps of 0.001) above it are refused, and so is every target from the
    clean accuracy up (sigma* = 0), while the two below it are served."""
    _, cal = _calibrated(model)
    clean = _clean_bound(model, "accuracy", "at-least", 0.95)
    below = int(clean * 1000)  # the largest target in steps of 0.001 that the bound keeps
    below -= below / 1000 > clean
    for t in (below - 1, below):
        assert _check(model, "accuracy", t / 1000, "at-least", 0.95) == "served"
    a0 = round(cal.clean_accuracy * 1000)  # sigma* = 0 from here up: the case once served unchecked
    for t in sorted({below + 1, below + 2, *range(a0, min(999, a0 + 3) + 1), 999}):
        assert _check(model, "accuracy", t / 1000, "at-least", 0.95) == "refused"


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_at_most_above_the_clean_upper_bound_needs_no_noise(model):
    """An at-most target the clean model's upper bound already keeps is served at sigma 0 (it was refused);
    one just below that bound needs noise."""
    data, cal = _calibrated(model)
    upper = _clean_bound(model, "accuracy", "at-most", 0.95)
    above = min(0.999, round(upper + 0.0015, 3))
    if above >= upper:
        _, config = pipeline.config_from_calibration(cal, data, [("accuracy", above)], side="at-most")
        assert config["targets"][0]["sigma"] == 0.0
    below = round(upper - 0.0015, 3)
    _, config = pipeline.config_from_calibration(cal, data, [("accuracy", below)], side="at-most")
    assert config["targets"][0]["sigma"] > 0.0
    assert _check(model, "accuracy", below, "at-most", 0.95) == "served"


@pytest.mark.parametrize("target", ["0.99", "0.977", "0.999"])
def test_cli_refuses_an_at_least_target_the_clean_bound_refutes(tmp_path, monkeypatch, capsys, target):
    monkeypatch.chdir(tmp_path)
    code = main(["calibrate", str(CNN), "--target-accuracy", target, "--side", "at-least", "--out", "g.json"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line == (f"error: accuracy target {float(target):g} cannot be guaranteed at-least at 95% confidence: "
                    "even without noise the lower bound is 0.9614 (N=500; more rows raise it)")
    assert not (tmp_path / "g.json").exists()


def test_cli_serves_an_at_most_target_the_clean_bound_keeps(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["calibrate", str(CNN), "--target-accuracy", "0.99", "--side", "at-most", "--quiet",
                 "--out", str(out)]) == 0
    target = json.loads(out.read_text())["targets"][0]
    assert target["sigma"] == 0.0 and target["side"] == "at-most"
    assert "accuracy <= 99.0% (one-sided 95%)" in capsys.readouterr().out


def test_an_at_most_target_no_noise_reaches_is_refused_or_marked_without_a_guarantee(tmp_path, capsys):
    """Below chance (1/K = 0.1) no sigma's upper bound gets there: one line and exit 2, or with
    --saturate the largest sigma swept, printed as no guarantee."""
    out = tmp_path / "g.json"
    assert main(["calibrate", str(CNN), "--target-accuracy", "0.05", "--side", "at-most", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and not out.exists()
    assert main(["calibrate", str(CNN), "--target-accuracy", "0.05", "--side", "at-most", "--saturate",
                 "--quiet", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    target = json.loads(out.read_text())["targets"][0]
    assert target["saturated"] and "no guarantee (saturated)" in stdout and "<= 5.0%" not in stdout


@pytest.mark.parametrize("side", ["point", "at-least", "at-most"])
def test_a_held_bootstrap_gives_the_config_a_fresh_one_gives(side):
    # The dashboard passes the bootstrap its pages already hold (and have queried); the config is the same.
    data, cal = _calibrated(CNN)
    targets = [("retention", 0.8), ("agreement", 0.7)]
    fresh = pipeline.config_from_calibration(cal, data, targets, side=side)[1]
    held = interval_estimator(cal, seed=cal.seed)
    held.at(0.3)
    given = pipeline.config_from_calibration(cal, data, targets, side=side, estimator=held)[1]
    assert json.dumps({**given, "created": None}) == json.dumps({**fresh, "created": None})
    with pytest.raises(ValueError, match="not this calibration's bootstrap at this confidence"):
        pipeline.config_from_calibration(cal, data, targets, side=side, confidence=0.9, estimator=held)
