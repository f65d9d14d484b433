"""Intervals and sides on the command line, and ``check``: exit 0 / 3 / 2.

Real classifiers: the bundled digits models' calibration split is calibrated,
and their held-out split (same distribution, disjoint images) is the "new
traffic"; another model's held-out logits are the same inputs through a
different model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.calibration.pipeline import calibrate_data, config_for
from caliber_core.cli.check import EXIT_DRIFT
from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import config_to_json, load_config
from caliber_core.loading import load_logits

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
NARROW = DATA / "digits_mlp-narrow.npz"
TARGETS = [("retention", 0.9), ("retention", 0.8), ("agreement", 0.7)]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _heldout(tmp_path, name="mlp-narrow", scale=1.0):
    with np.load(DATA / f"digits_{name}.npz", allow_pickle=False) as d:
        path = tmp_path / f"{name}-x{scale:g}-heldout.npz"
        np.savez(path, logits=d["heldout_logits"] * scale, labels=d["heldout_labels"])
    return path


@pytest.fixture(scope="module")
def narrow_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "narrow.json"
    assert main(["calibrate", str(NARROW), "--retention", "0.9", "0.8", "0.7", "--out", str(path), "--quiet"]) == 0
    return path


# --------------------------------------------------------------------------- calibrate


def test_point_side_is_unchanged(tmp_path, capsys):
    """--side point (the default) serves exactly the sigma* of sigma_for_target; only interval,
    reference and side are added to each target."""
    data = load_logits(NARROW)
    cal = calibrate_data(data)
    _, results, config = config_for(data, TARGETS)
    for (kind, value), rec, entry in zip(TARGETS, results, config["targets"]):
        before = sigma_for_target(cal, value, kind=kind).to_dict()
        after = dict(entry)
        assert after.pop("side") == "point" and after.pop("interval") and after.pop("reference")
        assert {k: v for k, v in before.items() if k not in ("side", "interval", "reference")} == after
    explicit = tmp_path / "explicit.json"
    default = tmp_path / "default.json"
    assert run(["calibrate", NARROW, "--retention", "0.8", "--out", default], capsys)[0] == 0
    assert run(["calibrate", NARROW, "--retention", "0.8", "--side", "point", "--out", explicit], capsys)[0] == 0
    assert default.read_text() == explicit.read_text()


def test_sides_order_the_sigma_and_keep_the_target(tmp_path, capsys):
    sigmas = {}
    for side in ("point", "at-least", "at-most"):
        out = tmp_path / f"{side}.json"
        code, stdout, err = run(["calibrate", NARROW, "--retention", "0.8", "--side", side, "--out", out], capsys)
        assert code == 0, err
        t = json.loads(out.read_text())["targets"][0]
        assert t["side"] == side and t["interval"]["level"] == 0.95
        assert "bootstrap" in t["interval"]["method"]
        lo, hi = t["interval"]["retention"]
        if side == "at-least":  # the one-sided 95% bound is the target; the two-sided 2.5% end below it
            assert lo < 0.8 < t["reference"]["retention"]
        if side == "at-most":
            assert t["reference"]["retention"] < 0.8 < hi
        sigmas[side] = t["sigma"]
        assert f"{side:>8}" in stdout and "retention 0.8:" in stdout  # table row and advice line
    assert sigmas["at-least"] < sigmas["point"] < sigmas["at-most"]


def test_confidence_widens_the_interval(tmp_path, capsys):
    widths = []
    for level in ("0.8", "0.99"):
        out = tmp_path / f"{level}.json"
        assert run(["calibrate", NARROW, "--retention", "0.8", "--confidence", level, "--out", out], capsys)[0] == 0
        iv = json.loads(out.read_text())["targets"][0]["interval"]
        assert iv["level"] == float(level)
        widths.append(iv["retention"][1] - iv["retention"][0])
    assert widths[1] > 1.5 * widths[0]


def test_table_shows_intervals_advice_and_warns_when_wide(tmp_path, capsys):
    code, stdout, err = run(["calibrate", NARROW, "--retention", "0.8", "--out", tmp_path / "c.json"], capsys)
    assert code == 0
    row = next(line for line in stdout.splitlines() if "retention 0.8" in line and "point" in line)
    assert "retention 80.0% (95%: " in row
    advice = next(line for line in stdout.splitlines() if line.startswith("interval half-width"))
    assert "at N=500; about" in advice and "rows for ±1.0%" in advice
    # N=500 on this model gives about ±2.3 points: wider than 2, so a warning names the rows for ±2.
    assert "warning: 1 of 1 target intervals (95%) are wider than ±2%" in err and "rows for ±2.0%" in err


def test_no_labels_gives_null_accuracy_intervals(tmp_path, capsys):
    with np.load(NARROW, allow_pickle=False) as d:
        bare = tmp_path / "bare.npz"
        np.savez(bare, logits=d["logits"])
    out = tmp_path / "c.json"
    code, _, err = run(["calibrate", bare, "--agreement", "0.8", "--side", "at-least", "--out", out], capsys)
    assert code == 0, err
    t = json.loads(out.read_text())["targets"][0]
    assert t["interval"]["accuracy"] is None and t["interval"]["retention"] is None
    assert t["interval"]["agreement"][0] < 0.8 < t["reference"]["agreement"]


def test_an_accuracy_that_cannot_be_guaranteed_is_a_one_line_error(capsys):
    # A0 = 0.744 on 500 rows: even the clean model's lower bound is below 0.74.
    code, _, err = run(["calibrate", NARROW, "--target-accuracy", "0.74", "--side", "at-least"], capsys)
    assert code == EXIT_USER_ERROR and len(err.strip().splitlines()) == 1
    assert "cannot be guaranteed at-least at 95% confidence" in err


@pytest.mark.parametrize("argv, message", [
    (["--confidence", "1.2"], "must be a confidence level in [0.5, 1), got 1.2"),
    (["--side", "both"], "invalid choice: 'both'"),
])
def test_bad_side_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", str(NARROW), "--retention", "0.8", *argv])
    assert exc.value.code == EXIT_USER_ERROR and message in capsys.readouterr().err


# --------------------------------------------------------------------------- check


def test_check_passes_on_same_distribution_traffic(narrow_config, tmp_path, capsys):
    code, out, err = run(["check", narrow_config, _heldout(tmp_path)], capsys)
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) == 9 and all(line.endswith("consistent") for line in lines[:-1])
    assert lines[-1].startswith(f"consistent with {narrow_config}: 8 comparisons at 95%")


@pytest.mark.parametrize("name, scale", [("mlp-narrow", 1.5), ("mlp-narrow", 0.6), ("mlp-wide", 1.0),
                                         ("logreg-pool", 1.0)])
def test_check_exits_3_with_one_line_per_finding(narrow_config, tmp_path, capsys, name, scale):
    code, out, err = run(["check", narrow_config, _heldout(tmp_path, name, scale)], capsys)
    assert code == EXIT_DRIFT == 3
    lines = out.strip().splitlines()
    assert lines and all(line.endswith("; recalibrate") for line in lines)
    assert all("moved" in line or "->" in line for line in lines)


def test_check_json_and_without_labels(narrow_config, tmp_path, capsys):
    code, out, _ = run(["check", narrow_config, _heldout(tmp_path, "mlp-narrow", 1.5), "--json"], capsys)
    report = json.loads(out)
    assert code == 3 and report["consistent"] is False and report["schema"] == "caliber.check/v1"
    with np.load(_heldout(tmp_path)) as d:
        bare = tmp_path / "bare.npz"
        np.savez(bare, logits=d["logits"])
    code, out, _ = run(["check", narrow_config, bare, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and {f["quantity"] for f in report["findings"]} == {"agreement", "scale"}


def test_check_reads_v1_configs(narrow_config, tmp_path, capsys):
    config = json.loads(Path(narrow_config).read_text())
    config["schema"] = "caliber.config/v1"
    for t in config["targets"]:
        for key in ("side", "interval", "reference"):
            t.pop(key)
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(config))
    assert run(["check", v1, _heldout(tmp_path)], capsys)[0] == 0
    assert run(["check", v1, _heldout(tmp_path, "mlp-narrow", 1.5)], capsys)[0] == 3


@pytest.mark.parametrize("case, message", [
    ("classes", "must have the config's 10 classes"),
    ("config", "config is not valid JSON"),
    ("missing", "cannot read config"),
])
def test_check_bad_input_exits_2(narrow_config, tmp_path, capsys, case, message):
    logits, config = _heldout(tmp_path), narrow_config
    if case == "classes":
        logits = tmp_path / "k9.npz"
        np.savez(logits, logits=np.random.default_rng(0).normal(size=(600, 9)))
    elif case == "config":
        config = tmp_path / "bad.json"
        config.write_text("{nope")
    else:
        config = tmp_path / "absent.json"
    code, out, err = run(["check", config, logits], capsys)
    assert code == EXIT_USER_ERROR and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_config_round_trip_keeps_interval_and_reference():
    _, _, config = config_for(load_logits(NARROW), TARGETS, side="at-most")
    again = load_config(config_to_json(config))
    assert again["targets"] == json.loads(config_to_json(config))["targets"]
    assert all(t["side"] == "at-most" and set(t["reference"]) == {"accuracy", "retention", "agreement", "row_sd"}
               for t in again["targets"])
