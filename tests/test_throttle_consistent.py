"""Consistent seeding through the throttle: a config from ``calibrate --seeding consistent``, served by level."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core import Perturber
from caliber_core.cli import main
from caliber_core.serving.keys import key_fingerprint, read_key_file
from caliber_core.serving.runtime import level_increments
from caliber_core.throttle import Throttle, load_policy

ROOT = Path(__file__).resolve().parents[1]
OTHER = bytes(range(100, 132))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A consistent config for a fresh key (through the CLI) and a policy over both its targets."""
    folder = tmp_path_factory.mktemp("consistent")
    key_file = folder / "serving.key"
    assert main(["keygen", "--out", str(key_file)]) == 0
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--retention", "0.9", "0.75", "--seeding", "consistent", "--key-file", str(key_file),
                           "--out", str(folder / "cfg.json"), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "throttle", "init", str(folder / "cfg.json"),
                           "--levels", "0", "1", "--escalate-after", "30", "--out", str(folder / "policy.json")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "pass --key-file" in proc.stdout  # a consistent policy cannot be checked without the key
    return folder, read_key_file(key_file), json.loads((folder / "cfg.json").read_text())


def _throttle(folder, key, name="ledger.db"):
    return Throttle.from_files(folder / "policy.json", key=key, store=f"sqlite:///{folder / name}", metrics=False)


def _logits(n=12, seed=0):
    return np.random.default_rng(seed).normal(scale=8.0, size=(n, 10))


def test_init_writes_the_configs_seeding_and_the_fail_closed_defaults(calibrated):
    folder, _, _ = calibrated
    doc = json.loads((folder / "policy.json").read_text())
    assert doc["seeding"] == "consistent"
    assert doc["on_store_error"] == {"serve": "last-known", "unseen": "refuse", "start": "refuse"}
    assert load_policy(folder / "policy.json").seeding == "consistent"


@pytest.mark.parametrize("level", [1, 2])
def test_a_flagged_account_gets_exactly_the_perturbers_consistent_noise(calibrated, level, tmp_path):
    folder, key, config = calibrated
    logits = _logits()
    with _throttle(folder, key, name=f"l{level}.db") as t:
        t.flag("acct-7", level=level)
        served = t.respond("acct-7", logits)  # no ids: the noise is a function of the logits
        assert served.level == level and served.counted
        expected = Perturber.from_config(config, target=level - 1, seeding="consistent", key=key).perturb(logits)
        np.testing.assert_array_equal(served.logits, expected)
        assert np.array_equal(t.respond("acct-7", logits).logits, expected)  # a repeat: the same answer
        clean = t.respond("stranger", logits)
        assert clean.level == 0 and np.array_equal(clean.logits, logits) and clean.logits is not logits


def test_torch_float32_through_the_throttle_equals_the_perturber(calibrated):
    torch = pytest.importorskip("torch")
    folder, key, config = calibrated
    logits = torch.tensor(_logits(seed=3), dtype=torch.float32)
    with _throttle(folder, key, name="torch.db") as t:
        t.flag("acct-7", level=2)
        out = t.respond("acct-7", logits).logits
    expected = Perturber.from_config(config, target=1, seeding="consistent", key=key).perturb(logits)
    assert out.dtype == torch.float32 and torch.equal(out, expected)


def test_levels_are_nested_and_a_batch_crossing_the_threshold_is_split(calibrated):
    folder, key, config = calibrated
    logits = _logits(n=32, seed=5)
    p1 = Perturber.from_config(config, target=0, seeding="consistent", key=key)
    p2 = Perturber.from_config(config, target=1, seeding="consistent", key=key)
    one, two = p1.perturb(logits) - logits, p2.perturb(logits) - logits
    c = level_increments(p2.levels, 2)
    g2 = p2.unit_draw(2, None, logits, 10)
    np.testing.assert_allclose(two - one, c[1] * g2, rtol=0, atol=1e-9)  # level 2 = level 1 + its own increment
    with _throttle(folder, key, name="split.db") as t:
        t.flag("acct-7", level=1)
        r = t.respond("acct-7", logits)  # escalates after 30 rows: 30 at level 1, 2 at level 2
        assert r.segments == ((1, 30), (2, 2))
        np.testing.assert_allclose(r.logits[:30], logits[:30] + one[:30], rtol=0, atol=1e-9)
        np.testing.assert_allclose(r.logits[30:], logits[30:] + two[30:], rtol=0, atol=1e-9)


def test_every_level_makes_the_same_draws(calibrated, monkeypatch):
    folder, key, _ = calibrated
    calls = []
    original = Perturber.unit_draw

    def counting(self, level, *args, **kw):
        calls.append(level)
        return original(self, level, *args, **kw)

    monkeypatch.setattr(Perturber, "unit_draw", counting)
    with _throttle(folder, key, name="work.db") as t:
        t.flag("acct-1", level=1)
        t.flag("acct-2", level=2)
        seen = []
        for account in ("stranger", "acct-1", "acct-2"):
            calls.clear()
            t.respond(account, _logits(n=3))
            seen.append(list(calls))
    assert seen[0] == seen[1] == seen[2] == [1, 2]


def test_a_wrong_key_is_refused_at_construction_with_both_fingerprints(calibrated, tmp_path, capsys):
    folder, key, _ = calibrated
    with pytest.raises(ValueError, match=f"{key_fingerprint(OTHER)}.*{key_fingerprint(key)}"):
        _throttle(folder, OTHER, name="wrong.db")
    with pytest.raises(ValueError, match="respond needs the seeding key"):
        Throttle.from_files(folder / "policy.json", key=None, store=f"sqlite:///{tmp_path / 'l.db'}",
                            metrics=False).respond("a", _logits())
    (tmp_path / "other.key").write_text(OTHER.hex() + "\n")
    (tmp_path / "other.key").chmod(0o600)  # a key readable by others is refused before its fingerprint
    out = tmp_path / "refused.json"
    code = main(["throttle", "init", str(folder / "cfg.json"), "--levels", "0", "1", "--escalate-after", "8",
                 "--out", str(out), "--key-file", str(tmp_path / "other.key")])
    err = capsys.readouterr().err
    assert code == 2 and key_fingerprint(OTHER) in err and key_fingerprint(key) in err and not out.exists()
    assert OTHER.hex() not in err


def test_a_policy_edited_to_per_input_is_refused_for_a_consistent_config(calibrated, tmp_path):
    folder, _, _ = calibrated
    doc = json.loads((folder / "policy.json").read_text())
    doc["seeding"] = "per-input"
    doc["config"]["path"] = str(folder / "cfg.json")
    from caliber_core.throttle import PolicyError

    with pytest.raises(PolicyError, match="'seeding' is 'per-input' but config .* calibrated for 'consistent'"):
        load_policy(doc)


def test_simulate_says_near_duplicates_gain_nothing_under_consistent_seeding(calibrated, capsys):
    folder, _, _ = calibrated
    assert main(["throttle", "simulate", str(folder / "policy.json"), "--queries", "200", "--sybils", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeding"] == "consistent"
    repeater = next(a for a in result["accounts"] if a["account"] == "repeater")
    sigmas = {str(lv["level"]): lv["sigma"] for lv in result["levels"]}
    assert repeater["effective_sigma_near_duplicates"] == {k: sigmas[k] for k in repeater["effective_sigma_near_duplicates"]}
    assert main(["throttle", "simulate", str(folder / "policy.json"), "--queries", "200", "--sybils", "2"]) == 0
    assert "consistent seeding: near-duplicates get nearly the same noise" in capsys.readouterr().out
