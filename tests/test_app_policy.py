"""AppTest: the Policy page builds levels from the model's targets, simulates, exports, remembers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.throttle.policy import parse_policy
from caliber_dashboard.common import state
from caliber_dashboard.policy import view as policy_view

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/policy.py").run()
    assert not at.exception
    return at


def _policy_json(at) -> dict:
    return json.loads([c.value for c in at.code if '"caliber.policy/v1"' in c.value][0])


def _selected(at):
    return at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def test_the_page_builds_levels_simulates_and_exports_a_valid_policy():
    at = _app()
    sha = _selected(at).sha256[:12]
    at.text_input(key=f"policy_retention_{sha}").set_value("80, 60").run()
    at.number_input(key=f"policy_escalate_{sha}").set_value(2000).run()
    at.checkbox(key=f"policy_shadow_{sha}").check().run()
    assert not at.exception
    assert "groups" not in _policy_json(at)  # accounts only until the provider declares a kind
    at.text_input(key=f"policy_groups_{sha}").set_value("card").run()
    assert not at.exception
    doc = _policy_json(at)
    assert doc["escalation"]["after_queries"] == 2000 and doc["shadow"] is True
    assert [lv["level"] for lv in doc["levels"]] == [0, 1, 2]
    sigmas = [lv["sigma"] for lv in doc["levels"]]
    assert sigmas == sorted(sigmas) and sigmas[1] > 0
    levels = at.dataframe[0].value
    assert list(levels["level"]) == [0, 1, 2] and "accuracy a wrongly flagged user gets" in levels
    outcomes = at.dataframe[1].value
    assert len(outcomes) == 24 and set(outcomes["account"]) >= {"benign", "thief", "repeater", "sybil-20"}
    assert doc["groups"]["card"]["escalation"]["after_queries"] == 2000  # a kind alone: the accounts' rule
    linked = outcomes[outcomes["account"].str.startswith("linked")].iloc[0]
    assert linked["highest level"] == 2
    reach = at.dataframe[2].value
    assert list(reach["thief reaches it after"]) == list(reach["linked campaign after (all accounts)"])
    thief = outcomes[outcomes["account"] == "thief"].iloc[0]
    assert thief["highest level"] == 2
    assert doc["config"]["path"].endswith(".caliber.json")
    assert [b.label for b in at.get("download_button")] == ["Download the policy JSON", "Download its config JSON"]


def test_the_choices_are_kept_for_the_model():
    at = _app()
    data = _selected(at)
    sha = data.sha256[:12]
    at.number_input(key=f"policy_escalate_{sha}").set_value(1234).run()
    options = at.session_state[state.OPTIONS][data.sha256]["policy"]
    assert options["escalate_after"] == 1234 and options["retention"] == "90, 70, 50"


def test_a_malformed_group_kind_is_one_error_line():
    at = _app()
    sha = _selected(at).sha256[:12]
    for bad in ("Card", "card=lots"):
        at.text_input(key=f"policy_groups_{sha}").set_value(bad).run()
        assert not at.exception and len(at.error) == 1


def test_a_bad_target_list_is_one_error_line():
    at = _app()
    sha = _selected(at).sha256[:12]
    at.text_input(key=f"policy_retention_{sha}").set_value("90, banana").run()
    assert not at.exception and len(at.error) == 1


def test_level_table_and_trajectories_are_plain_functions(tmp_path):
    from caliber_core.throttle.policy import policy_for_config_text
    from caliber_core.throttle.simulate import simulate

    config = {"schema": "caliber.config/v2", "model": "m", "n_classes": 10, "n_samples": 100,
              "statistic": "median", "scale": 1.0, "clean_accuracy": 0.9, "fit": {},
              "targets": [{"kind": "retention", "requested": r, "accuracy": a, "retention": r, "v": s * s,
                           "sigma": s} for r, a, s in ((0.5, 0.45, 2.0), (0.9, 0.81, 1.0))]}
    text = json.dumps(config)
    assert policy_view.level_targets(config) == [1, 0]  # ascending sigma
    doc, policy = policy_for_config_text(text, config_name="m.json", targets=[1, 0], escalate_after=100)
    assert parse_policy(doc, config_text=text).levels == policy.levels
    report = {"frontier": [{"sigma": 0.5, "surrogate_retention": {"mean": 0.95, "sd": 0.01, "n": 3}},
                           {"sigma": 4.0, "surrogate_retention": {"mean": 0.4, "sd": 0.02, "n": 3}}]}
    table = policy_view.level_table(policy, report)
    assert list(table["σ"]) == [0.0, 1.0, 2.0]
    assert table["thief's surrogate keeps"].iloc[0] == "100.0%"
    result = simulate(policy, queries=400, batch=50)
    fig = policy_view.trajectory_figure(result)
    assert len(fig.data) == 24 and sum(t.showlegend for t in fig.data) == 5
    assert max(max(t.y) for t in fig.data) == 2
    with pytest.raises(Exception, match="changed since the policy was written"):
        parse_policy(doc, config_text=text + " ")


def test_a_consistent_config_uploaded_serves_both_seedings_on_the_page(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    key = tmp_path / "k.key"
    key.write_text(bytes(range(32)).hex() + "\n")
    key.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(root / "data" / "digits_mlp-wide.npz"),
                           "--retention", "0.9", "0.75", "--seeding", "consistent", "--key-file", str(key),
                           "--out", str(tmp_path / "c.json"), "--quiet"], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    at = _app()
    assert any(c.value.startswith("Per\\-input seeding") for c in at.caption)
    at.file_uploader(key="policy_config_upload").set_value(
        ("c.json", (tmp_path / "c.json").read_bytes(), "application/json")).run()
    assert not at.exception and not at.error
    doc = _policy_json(at)
    assert doc["seeding"] == "consistent" and doc["config"]["path"] == "c.json" and len(doc["levels"]) == 3
    assert any(c.value.startswith("Consistent seeding") for c in at.caption)
    at.file_uploader(key="policy_config_upload").set_value(("bad.json", b"{not json", "application/json")).run()
    assert at.error and "config is not valid JSON" in at.error[0].value.replace("\\", "")
    assert at.error[0].value.replace("\\", "").startswith("bad.json: ")


def test_group_kinds_are_read_from_one_line():
    assert policy_view.group_kinds("card, org=500", escalate_after=100, expire_after=None) == {
        "card": (100, None), "org": (500, None)}
    assert policy_view.group_kinds(" ", escalate_after=100, expire_after=None) == {}
    for bad, message in (("card=lots", "whole number"), ("card, card", "listed twice")):
        with pytest.raises(ValueError, match=message):
            policy_view.group_kinds(bad, escalate_after=100, expire_after=None)
