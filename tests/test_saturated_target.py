"""A saturated target end to end: CLI --saturate -> config file -> Perturber -> the docs' example.

One answer everywhere: an unreachable target serves the largest sigma the
sweep measured, recorded as ``"saturated": true`` with that number, with a
warning from the CLI and from the Perturber in the same words. The docs show
this command's output as the docs build runs it (an ``output-of`` marker in
docs/how-to/calibrate-classifier.md), so the page cannot drift from it.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from caliber_core import Perturber, SaturatedTargetWarning, sigma_to_serve
from caliber_core.calibration.pipeline import calibrate_data
from caliber_core.loading import load_logits

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "how-to" / "calibrate-classifier.md").read_text(encoding="utf-8")


def _docs_example() -> list[str]:
    """The docs' --saturate example: the arguments after ``caliber``."""
    marker = re.search(r"<!-- output-of exit=0 -->\n```text\n\$ caliber (calibrate [^\n]*--saturate[^\n]*)\n```", PAGE)
    assert marker, "docs/how-to/calibrate-classifier.md has no --saturate example"
    return shlex.split(marker.group(1))


@pytest.fixture(scope="module")
def run_example(tmp_path_factory):
    argv = _docs_example()
    out = tmp_path_factory.mktemp("sat") / "sat.json"
    argv = [str(out) if a == "sat.json" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "caliber_core", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc, out, proc.stderr.splitlines()


def test_the_cli_warns_on_one_line_and_writes_the_config(run_example):
    proc, out, warning_lines = run_example
    assert len(warning_lines) == 1 and warning_lines[0].startswith("warning: accuracy target 0.05 is saturated")
    printed = proc.stdout.splitlines()
    assert not any(line.startswith("warning: ") for line in printed)
    assert printed[-1] == f"config written to {out}"


def test_the_config_records_the_largest_sigma_swept(run_example):
    _, out, _ = run_example
    config = json.loads(out.read_text(encoding="utf-8"))
    saturated = [t for t in config["targets"] if t["saturated"]]
    assert len(saturated) == 1
    t = saturated[0]
    assert t["method"] == "saturated-curve" and t["kind"] == "accuracy" and t["requested"] == 0.05
    # The largest sigma actually swept: a number, not null, not an extrapolation.
    assert t["v"] == config["sweep"]["v_max"]
    assert t["sigma"] == pytest.approx(config["scale"] * math.sqrt(config["sweep"]["v_max"]), rel=1e-12)
    cal = calibrate_data(load_logits(ROOT / config["source"]))
    assert t["sigma"] == float(cal.sweep.sigma[-1])
    assert [x["saturated"] for x in config["targets"]] == [False, True]


def test_the_perturber_warns_and_serves_that_sigma(run_example):
    _, out, shown = run_example
    config = json.loads(out.read_text(encoding="utf-8"))
    index = next(i for i, t in enumerate(config["targets"]) if t["saturated"])
    with pytest.warns(SaturatedTargetWarning) as caught:
        p = Perturber.from_config(out, target=index, key=b"test secret, 16+ bytes")
    assert p.sigma == config["targets"][index]["sigma"]
    # The same words as the CLI's warning (and the docs').
    assert [f"warning: {w.message}" for w in caught] == shown
    noisy = p.perturb(np.zeros((2, config["n_classes"])), ["a", "b"])
    assert noisy.shape == (2, config["n_classes"]) and np.std(noisy) > 10  # sigma ~ 176 served
    # A target that is reached serves quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sigma_to_serve(out, target=1 - index) == config["targets"][1 - index]["sigma"]


def test_the_attack_command_warns_on_one_line(run_example, capsys):
    from caliber_core.cli import main

    _, out, _ = run_example
    config = json.loads(out.read_text(encoding="utf-8"))
    index = next(i for i, t in enumerate(config["targets"]) if t["saturated"])
    code = main(["attack", str(ROOT / config["source"]), "--config", str(out), "--target", str(index), "--m", "1"])
    _, err = capsys.readouterr()
    assert code == 0
    assert err.splitlines() == [f"warning: accuracy target 0.05 is saturated: the curve never reaches it, "
                                f"so sigma={config['targets'][index]['sigma']:.5g}, the largest sigma the sweep "
                                "measured, is served"]
