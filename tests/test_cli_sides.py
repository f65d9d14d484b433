"""The calibrate table on a one-sided side: the guarantee first, the two-sided interval below it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from caliber_core.calibration.target_intervals import describe_interval, interval_estimator
from caliber_core.calibration import pipeline
from caliber_core.cli import main
from caliber_core.loading import load_logits

NARROW = Path(__file__).resolve().parents[1] / "data" / "digits_mlp-narrow.npz"


@pytest.mark.parametrize("side, sign", [("at-least", ">="), ("at-most", "<=")])
def test_one_sided_row_states_the_guarantee_and_then_the_interval(tmp_path, capsys, side, sign):
    out = tmp_path / "c.json"
    assert main(["calibrate", str(NARROW), "--retention", "0.8", "--side", side, "--quiet", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    target = json.loads(out.read_text())["targets"][0]
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("retention 0.8"))
    assert f"retention {sign} 80.0% (one-sided 95%)" in lines[row]
    assert f"{target['sigma']:.5g}" in lines[row]
    assert lines[row + 1].strip() == f"two-sided: {describe_interval(target)}"
    assert "sigma*" not in lines[1] and any(line.startswith("sigma: the sigma served") for line in lines)
    # The guarantee is true of the served sigma: its one-sided bound is on the target's safe side.
    data = load_logits(NARROW)
    cal = pipeline.calibrate_data(data)
    bound = float(interval_estimator(cal).bound(target["sigma"], kind="retention", side=side)[0])
    assert (bound >= 0.8 - 1e-9) if side == "at-least" else (bound <= 0.8 + 1e-9)
    assert bound == pytest.approx(0.8, abs=2e-3)


def test_point_row_keeps_the_interval_readout(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["calibrate", str(NARROW), "--retention", "0.8", "--quiet", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    row = next(line for line in stdout.splitlines() if line.strip().startswith("retention 0.8"))
    assert "retention 80.0% (95%: " in row and "one-sided 95%" not in stdout and "two-sided:" not in stdout
