"""``python -m caliber_core throttle ...``: init, flag, unflag, status, audit, simulate."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from throttle_support import KEY, SIGMAS, write_config, write_policy

from caliber_core.cli import main
from caliber_core.throttle import Throttle, load_policy
from caliber_core.throttle.simulate import simulate, surrogate_at

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys, *argv):
    code = main(["throttle", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_init_writes_a_policy_whose_level_j_serves_target_ij(tmp_path, capsys):
    config = write_config(tmp_path)
    out_path = tmp_path / "sub" / "p.json"
    out_path.parent.mkdir()
    code, out, _ = _run(capsys, "init", config, "--levels", 0, 2, "--escalate-after", 500,
                        "--expire-after", 86400, "--shadow", "--out", out_path)
    assert code == 0 and "level 2: config target 2, sigma 2" in out
    policy = load_policy(out_path)
    assert [lv.target for lv in policy.levels[1:]] == [0, 2] and policy.shadow
    assert (policy.escalate_after, policy.expire_after) == (500, 86400.0)
    assert json.loads(out_path.read_text())["config"]["path"] == "../cfg.json"


@pytest.mark.parametrize("argv, message", [
    (["--levels", "5", "--escalate-after", "3"], "target 5 is not a target index"),
    (["--levels", "2", "1", "--escalate-after", "3"], "not above level 1's"),
    (["--levels", "0", "--escalate-after", "-3"], "must be >= 1, got -3"),
    (["--levels", "0", "--escalate-after", "3", "--expire-after", "inf"], "finite number of seconds"),
])
def test_init_refuses_bad_levels_and_thresholds_with_exit_2(tmp_path, capsys, argv, message):
    config = write_config(tmp_path)
    try:
        code = main(["throttle", "init", str(config), *argv, "--out", str(tmp_path / "p.json")])
    except SystemExit as exc:  # argparse's own refusal of an option value
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.strip().splitlines()[-1].count("error") == 1
    assert not (tmp_path / "p.json").exists()


def test_flag_status_audit_unflag_round_trip(tmp_path, capsys):
    policy = write_policy(tmp_path, escalate_after=4)
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    common = ["--policy", policy, "--store", store]
    code, out, _ = _run(capsys, "flag", "sk-acct-7", *common, "--level", 1, "--reason", "detector 0.93")
    assert code == 0 and "flagged at level 1 (sigma 0.5), reason: detector 0.93" in out and "sk-acct-7" not in out
    with Throttle.from_files(policy, key=KEY, store=store, metrics=False) as t:
        for _ in range(3):
            t.respond("sk-acct-7", np.zeros((2, 10)), ["a", "b"])
    code, out, _ = _run(capsys, "status", *common)
    assert code == 0 and "flagged at level 2" in out and "L1:4, L2:2" in out
    code, out, _ = _run(capsys, "audit", "sk-acct-7", *common, "--json")
    report = json.loads(out)
    assert [e["event"] for e in report["history"]] == ["flagged", "escalated"]
    assert [(lv["level"], lv["queries"]) for lv in report["levels"]] == [(1, 4), (2, 2)]
    loss = report["loss_vs_clean"]["accuracy"]
    # 4 rows at accuracy 0.85 (interval 0.83-0.86), 2 at 0.70 (0.68-0.71), against A0 = 0.95
    assert loss["value"] == pytest.approx((4 * 0.10 + 2 * 0.25) / 6)
    assert loss["interval"] == pytest.approx([(4 * 0.09 + 2 * 0.24) / 6, (4 * 0.12 + 2 * 0.27) / 6])
    code, out, _ = _run(capsys, "audit", "sk-acct-7", *common)
    assert code == 0 and "escalated level 2" in out and "lost against clean service: accuracy 15.0%" in out
    code, out, _ = _run(capsys, "unflag", "sk-acct-7", *common, "--reason", "appeal upheld")
    assert code == 0 and "not flagged" in out
    code, out, _ = _run(capsys, "status", *common)
    assert out.strip() == "no flagged accounts"


def test_the_cli_runs_as_a_module_and_refuses_a_bad_store_with_one_line(tmp_path):
    policy = write_policy(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "throttle", "status", "--policy", str(policy),
                           "--store", "postgres://u:hunter2@db/0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "sqlite:///, redis://" in proc.stderr and "hunter2" not in proc.stderr


def test_simulate_separates_the_scenarios(tmp_path, capsys):
    policy = load_policy(write_policy(tmp_path, escalate_after=1000))
    result = simulate(policy, queries=6000, detect_after=1000, batch=100)
    by = {a["account"]: a for a in result["accounts"]}
    assert len([a for a in by if a.startswith("sybil-")]) == 20
    assert by["thief"]["max_level"] == 3 and by["thief"]["queries_per_level"] == {0: 1000, 1: 1000, 2: 1000,
                                                                                   3: 3000}
    assert all(by[f"sybil-{i:02d}"]["max_level"] == 0 for i in range(1, 21))  # 300 each: never detected
    assert by["sybil-01"]["accuracy_lost"]["value"] == 0.0
    benign = by["benign"]["accuracy_lost"]
    assert benign["interval"][0] <= benign["value"] <= benign["interval"][1]
    eff = by["repeater"]["effective_sigma_near_duplicates"]
    assert eff[3] == pytest.approx(SIGMAS[2] / 2)
    code, out, _ = _run(capsys, "simulate", tmp_path / "policy.json", "--queries", 2000, "--sybils", 4)
    assert code == 0 and "sybil-04" in out and "thief" in out


def test_the_surrogate_retention_is_interpolated_in_log_sigma():
    report = {"frontier": [{"sigma": 1.0, "surrogate_retention": {"mean": 0.9, "sd": 0.01, "n": 3}},
                           {"sigma": 4.0, "surrogate_retention": {"mean": 0.5, "sd": 0.03, "n": 3}}]}
    assert surrogate_at(report, 2.0)["mean"] == pytest.approx(0.7)  # log 2 is halfway from log 1 to log 4
    assert surrogate_at(report, 2.0)["sd"] == 0.03
    assert surrogate_at(report, 8.0) is None and surrogate_at(report, 0.0)["mean"] == 1.0
    assert math.isclose(surrogate_at(report, 4.0)["mean"], 0.5)


def test_simulate_reads_an_extraction_report_and_refuses_other_files(tmp_path, capsys):
    policy = write_policy(tmp_path, escalate_after=100)
    report = {"schema": "caliber.extraction/v1", "model": "toy", "frontier": [
        {"sigma": 0.25, "surrogate_retention": {"mean": 0.97, "sd": 0.01, "n": 3}},
        {"sigma": 4.0, "surrogate_retention": {"mean": 0.30, "sd": 0.04, "n": 3}}]}
    (tmp_path / "run.json").write_text(json.dumps(report))
    code, out, _ = _run(capsys, "simulate", policy, "--extraction", tmp_path / "run.json", "--json")
    levels = json.loads(out)["levels"]
    assert code == 0 and levels[0]["surrogate_retention"]["mean"] == 1.0
    expected = 0.97 + (0.30 - 0.97) * (math.log(SIGMAS[1]) - math.log(0.25)) / (math.log(4.0) - math.log(0.25))
    assert levels[2]["surrogate_retention"]["mean"] == pytest.approx(expected)
    (tmp_path / "other.json").write_text('{"schema": "caliber.config/v2"}')
    code, _, err = _run(capsys, "simulate", policy, "--extraction", tmp_path / "other.json")
    assert code == 2 and "not a caliber.extraction/v1 report" in err


def test_status_says_when_a_flag_has_lapsed(tmp_path):
    now = [1000.0]
    t = Throttle.from_files(write_policy(tmp_path, expire_after=60.0), store=f"sqlite:///{tmp_path / 'l.db'}",
                            clock=lambda: now[0], metrics=False)
    t.flag("acct-7", level=2, reason="detector")
    assert t.status("acct-7")["expires_at"] == 1060.0 and "flag_lapsed" not in t.status("acct-7")
    now[0] = 1061.0
    assert t.status("acct-7")["flag_lapsed"] is True and t.audit("acct-7")["flagged"] is False
    assert t.decide("acct-7", 1).segments == ((0, 1),)
    assert [e.event for e in t.state("acct-7").history] == ["flagged", "expired"]
