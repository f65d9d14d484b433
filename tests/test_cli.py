"""The command line: configs written in the requested order, one-line errors, exit codes."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import load_config
from caliber_core.loading import load_logits
from caliber_core.calibration.pipeline import config_for

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "data" / "digits_mlp-narrow.npz"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, match):
    assert code == EXIT_USER_ERROR
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    assert match in lines[0], lines[0]


def test_calibrate_keeps_the_requested_target_order(tmp_path, capsys):
    out = tmp_path / "cfg.json"
    code, stdout, _ = run(["calibrate", DIGITS, "--retention", "0.9", "--agreement", "0.7",
                           "--target-accuracy", "0.5", "--retention", "60", "--out", out], capsys)
    assert code == 0
    cfg = load_config(out)
    kinds = [(t["kind"], t["requested"]) for t in cfg["targets"]]
    assert kinds == [("retention", 0.9), ("agreement", 0.7), ("accuracy", 0.5), ("retention", 0.6)]
    assert "config written to" in stdout and "retention 0.9" in stdout
    # The file is the one the shared pipeline builds (the dashboard exports the same).
    _, _, expected = config_for(load_logits(DIGITS), [("retention", 0.9), ("agreement", 0.7),
                                                      ("accuracy", 0.5), ("retention", 0.6)])
    assert cfg["targets"] == json.loads(json.dumps(expected["targets"]))


def test_calibrate_prints_json_without_out_and_defaults_to_four_retentions(capsys):
    code, stdout, _ = run(["calibrate", DIGITS, "--quiet"], capsys)
    assert code == 0
    cfg = json.loads(stdout)
    assert [t["retention"] for t in cfg["targets"]] == [0.9, 0.8, 0.7, 0.6]
    sigmas = [t["sigma"] for t in cfg["targets"]]
    assert sigmas == sorted(sigmas) and sigmas[0] > 0


@pytest.mark.parametrize("argv, match", [
    (["--target-accuracy", "0.05"], "out of reach"),
    (["--agreement", "0.05"], "out of reach"),
    (["--max-elements", "100"], "more than max_elements=100"),
])
def test_calibrate_user_errors_are_one_line(argv, match, capsys):
    code, _, err = run(["calibrate", DIGITS, "--quiet", *argv], capsys)
    assert_one_line_error(code, err, match)


def test_unlabelled_file_allows_agreement_only(tmp_path, capsys):
    logits = np.load(DIGITS)["logits"]
    path = tmp_path / "plain.npy"
    np.save(path, logits)
    code, _, err = run(["calibrate", path, "--retention", "0.8"], capsys)
    assert_one_line_error(code, err, "labels")
    code, stdout, _ = run(["calibrate", path, "--agreement", "0.8", "--quiet"], capsys)
    assert code == 0
    target = json.loads(stdout)["targets"][0]
    assert target["agreement"] == 0.8 and target["accuracy"] is None and target["sigma"] > 0


def test_bad_files_exit_2_with_one_line(tmp_path, capsys):
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    cases = {}
    nan = np.random.default_rng(0).normal(size=(20, 4))
    nan[3, 2] = np.nan
    np.savez(tmp_path / "nan.npz", logits=nan, labels=np.zeros(20, dtype=int))
    cases["nan.npz"] = "row 3, column 2"
    np.save(tmp_path / "pickled.npy", np.array([Payload()], dtype=object), allow_pickle=True)
    cases["pickled.npy"] = "object array"
    (tmp_path / "raw.pt").write_bytes(pickle.dumps(Payload()))
    cases["raw.pt"] = "raw.pt"
    (tmp_path / "logits.pkl").write_bytes(b"x")
    cases["logits.pkl"] = "unsupported"
    cases["missing.npz"] = "missing.npz"
    for name, match in cases.items():
        code, _, err = run(["calibrate", tmp_path / name], capsys)
        assert_one_line_error(code, err, match)
    assert not marker.exists()


def test_fleet_writes_the_shared_fit_and_leave_one_out(tmp_path, capsys):
    files = sorted((ROOT / "data").glob("digits_*.npz"))[:3]
    out = tmp_path / "fleet.json"
    code, stdout, _ = run(["fleet", *files, "--out", out], capsys)
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "caliber.fleet/v1"
    assert len(doc["leave_one_out"]) == 3
    assert {r["statistic"] for r in doc["margin_ablation"]} == {"median", "mean", "trimmed"}
    assert 0.5 < doc["shared_fit"]["r2"] <= 1.0
    code, _, err = run(["fleet", files[0]], capsys)
    assert_one_line_error(code, err, "at least 2")


def test_attack_reads_sigma_from_a_config(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    assert run(["calibrate", DIGITS, "--retention", "0.7", "--out", cfg], capsys)[0] == 0
    code, stdout, _ = run(["attack", DIGITS, "--config", cfg, "--m", "1", "16"], capsys)
    assert code == 0
    rows = [line.split() for line in stdout.splitlines() if line.startswith(("fresh", "per-input"))]
    soft = {(r[0], int(r[2])): float(r[3]) for r in rows if r[1] == "soft-average"}
    assert soft[("fresh", 16)] > soft[("fresh", 1)] + 0.1  # averaging fresh noise recovers
    assert soft[("per-input", 16)] == soft[("per-input", 1)]  # per-input seeding: nothing
    code, _, err = run(["attack", DIGITS, "--config", cfg, "--target", "5"], capsys)
    assert_one_line_error(code, err, "out of range")


def test_module_entry_point_has_no_traceback_on_a_bad_file(tmp_path):
    bad = tmp_path / "random.npz"
    bad.write_bytes(np.random.default_rng(1).bytes(3000))
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == EXIT_USER_ERROR
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "random.npz" in proc.stderr and "not a valid npz" in proc.stderr
