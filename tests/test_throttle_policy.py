"""caliber.policy/v1: writing, reading, and refusing hostile policy files with one line each."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from throttle_support import SIGMAS, write_config, write_policy

from caliber_core.cli import main
from caliber_core.throttle.policy import PolicyError, build_policy, load_policy


def test_a_written_policy_reads_back_with_the_configs_sigmas(tmp_path, monkeypatch):
    path = write_policy(tmp_path, levels=(0, 2), escalate_after=7, expire_after=3600.0, shadow=True)
    policy = load_policy(path)
    assert [lv.sigma for lv in policy.levels] == [0.0, SIGMAS[0], SIGMAS[2]]
    assert [lv.target for lv in policy.levels] == [None, 0, 2]
    assert (policy.escalate_after, policy.expire_after, policy.shadow, policy.top) == (7, 3600.0, True, 2)
    monkeypatch.chdir(tmp_path)  # JSON text: its config path is relative to the current folder
    assert load_policy(path.read_text()).levels == policy.levels


def test_the_config_path_is_relative_to_the_policy_so_the_pair_can_move(tmp_path):
    write_policy(tmp_path)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(tmp_path / "cfg.json", moved / "cfg.json")
    shutil.copy(tmp_path / "policy.json", moved / "policy.json")
    (tmp_path / "cfg.json").unlink()
    assert load_policy(moved / "policy.json").config["model"] == "toy"


def _hostile(tmp_path, change):
    path = write_policy(tmp_path)
    doc = json.loads(path.read_text())
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return bad


HOSTILE = {
    "wrong digest": (lambda d: d["config"].update(sha256="0" * 64), "config changed since the policy"),
    "unknown level target": (lambda d: d["levels"][1].update(target=9), "target 9 is not a target index"),
    "negative threshold": (lambda d: d["escalation"].update(after_queries=-5), "after_queries must be"),
    "zero threshold": (lambda d: d["escalation"].update(after_queries=0), "after_queries must be"),
    "huge threshold": (lambda d: d["escalation"].update(after_queries=10**40), "after_queries must be"),
    "huge expiry": (lambda d: d["expiry"].update(after_seconds=1e308), "after_seconds must be"),
    "negative expiry": (lambda d: d["expiry"].update(after_seconds=-1), "after_seconds must be"),
    "another K": (lambda d: d["config"].update(n_classes=1000), "n_classes is 1000 but the config has K=10"),
    "too many levels": (lambda d: d.update(levels=d["levels"] + [dict(d["levels"][-1])] * 100), "'levels' must"),
    "level out of order": (lambda d: d["levels"].reverse(), "levels[0] must be"),
    "sigma not increasing": (lambda d: (d["levels"][1].update(target=1, sigma=1.0),
                                        d["levels"][2].update(target=0, sigma=0.5)),
                             "levels must add noise as they go up"),
    "sigma edited": (lambda d: d["levels"][1].update(sigma=0.01), "levels[1].sigma is 0.01 but config target 0"),
    "noisy level 0": (lambda d: d["levels"][0].update(sigma=1.0), "level 0 is clean service"),
    "bool threshold": (lambda d: d["escalation"].update(after_queries=True), "after_queries must be"),
    "unknown field": (lambda d: d.update(backdoor=1), "unknown field(s): backdoor"),
    "other schema": (lambda d: d.update(schema="caliber.policy/v9"), "schema must be 'caliber.policy/v1'"),
    "bad seeding": (lambda d: d.update(seeding="none"), "'seeding' must be one of"),
    "fresh seeding": (lambda d: d.update(seeding="fresh"), "'seeding' must be one of ('per-input', 'consistent'), "
                      "got 'fresh'"),
    "consistent seeding on a per-input config": (lambda d: d.update(seeding="consistent"),
                                                 "'seeding' is 'consistent' but config cfg.json was calibrated "
                                                 "for 'per-input' seeding"),
    "unknown field in escalation": (lambda d: d["escalation"].update(after_querys=5),
                                    "policy escalation has unknown field(s): after_querys"),
    "unknown field in expiry": (lambda d: d["expiry"].update(after_second=5), "policy expiry has unknown field(s)"),
    "unknown field in a level": (lambda d: d["levels"][2].update(sigmaa=1.0),
                                 "policy levels[2] has unknown field(s): sigmaa"),
    "unknown field in level 0": (lambda d: d["levels"][0].update(x=1), "policy levels[0] has unknown field(s): x"),
    "unknown field in config": (lambda d: d["config"].update(sha512="0"), "policy config has unknown field(s): sha512"),
    "unknown field in on_store_error": (lambda d: d["on_store_error"].update(retry=3),
                                       "policy on_store_error has unknown field(s): retry"),
    "clean for unseen accounts": (lambda d: d["on_store_error"].update(unseen=0),
                                  "on_store_error.unseen must be \"refuse\" or a flagged level in 1..3"),
    "unseen above the top": (lambda d: d["on_store_error"].update(unseen=4), "on_store_error.unseen must be"),
    "bad start": (lambda d: d["on_store_error"].update(start="open"), "on_store_error.start must be one of"),
    "NUL in the config path": (lambda d: d["config"].update(path="cfg.json\x00.txt"),
                               "policy config.path holds a NUL character"),
    "shadow as string": (lambda d: d.update(shadow="yes"), "'shadow' must be true or false"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_policies_are_refused_with_one_line(tmp_path, name, capsys):
    change, message = HOSTILE[name]
    bad = _hostile(tmp_path, change)
    with pytest.raises(PolicyError, match=re.escape(message)):
        load_policy(bad)
    code = main(["throttle", "status", "--policy", str(bad), "--store", f"sqlite:///{tmp_path / 'l.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("field, where", [("after_queries", "escalation.after_queries"),
                                          ("after_seconds", "expiry.after_seconds"),
                                          ("n_classes", "config.n_classes"), ("level", "levels[1]")])
def test_a_5000_digit_number_is_refused_naming_its_field(tmp_path, field, where, capsys):
    path = write_policy(tmp_path)
    text = path.read_text()
    number = "9" * 5000
    if field == "level":
        text = text.replace('"level": 1', f'"level": {number}')
    else:
        text = re.sub(f'"{field}": [^,}}\n]+', f'"{field}": {number}', text, count=1)
    bad = tmp_path / "digits.json"
    bad.write_text(text)
    with pytest.raises(PolicyError, match=re.escape(where) + ".*a 5,000-digit integer"):
        load_policy(bad)
    assert main(["throttle", "status", "--policy", str(bad), "--store", f"sqlite:///{tmp_path / 'l.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and where in err and "9999" not in err


def test_the_old_string_form_of_on_store_error_reads_fail_closed(tmp_path):
    path = write_policy(tmp_path)
    doc = json.loads(path.read_text())
    doc["on_store_error"] = "last-known"
    policy = load_policy(json.dumps(doc).replace('"cfg.json"', json.dumps(str(tmp_path / "cfg.json"))))
    assert (policy.on_store_error, policy.unseen_level, policy.start_degraded) == ("last-known", None, False)
    written = load_policy(path)
    assert written.to_dict()["on_store_error"] == {"serve": "last-known", "unseen": "refuse", "start": "refuse"}


def test_non_json_constants_and_oversized_files_are_refused(tmp_path):
    path = write_policy(tmp_path)
    text = path.read_text().replace('"after_queries": 10', '"after_queries": NaN')
    (tmp_path / "nan.json").write_text(text)
    with pytest.raises(PolicyError, match="NaN, which is not a number"):
        load_policy(tmp_path / "nan.json")
    (tmp_path / "big.json").write_text(" " * (1 << 20) + "{}")
    with pytest.raises(PolicyError, match="larger than 1048576 bytes"):
        load_policy(tmp_path / "big.json")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(PolicyError, match="nested too deeply|must be a JSON object"):
        load_policy(tmp_path / "deep.json")


def test_init_refuses_levels_that_do_not_add_noise_and_missing_targets(tmp_path):
    config = write_config(tmp_path)
    with pytest.raises(PolicyError, match="level 2 serves sigma 0.5, not above level 1's 1"):
        build_policy(config, targets=[1, 0], escalate_after=5)
    with pytest.raises(PolicyError, match="level 1: target 3 is not a target index of the config: use 0..2"):
        build_policy(config, targets=[3], escalate_after=5)
    with pytest.raises(PolicyError, match="cannot read config"):
        build_policy(tmp_path / "missing.json", targets=[0], escalate_after=5)
    with pytest.raises(PolicyError, match="config path holds a NUL character"):
        build_policy(str(config) + "\x00", targets=[0], escalate_after=5)
    with pytest.raises(PolicyError, match="'seeding' must be one of .* got 'fresh'"):
        build_policy(config, targets=[0], escalate_after=5, seeding="fresh")


@pytest.mark.parametrize("change, shown", [
    (lambda d: d["escalation"].update(after_querys=5), "policy escalation has unknown field(s): after_querys = 5"),
    (lambda d: d.update(note="x" * 500), "policy has unknown field(s): note = '" + "x" * 36 + "..."),
    (lambda d: d["levels"][1].update(extra={"a": 1, "b": 2}), "levels[1] has unknown field(s): extra = an object of 2"),
    (lambda d: d.update(redis_password="hunter2"), "redis_password = withheld: it may be a credential"),
    (lambda d: d.update(store="redis://admin:hunter2@cache:6379/0"), "store = withheld: it may be a credential"),
    (lambda d: d.update(a=1, b="two\nlines"), "policy has unknown field(s): a = 1, b = 'two\\\\nlines'"),
])
def test_an_unknown_field_is_refused_naming_the_field_and_its_value(tmp_path, change, shown, capsys):
    """As the policy reference says: one line naming the field and the value, cut short, and
    never a value that may be a credential."""
    bad = _hostile(tmp_path, change)
    with pytest.raises(PolicyError) as info:
        load_policy(bad)
    assert shown in str(info.value)
    assert "hunter2" not in str(info.value) and "x" * 40 not in str(info.value)
    assert main(["throttle", "status", "--policy", str(bad), "--store", f"sqlite:///{tmp_path / 'l.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hunter2" not in err
