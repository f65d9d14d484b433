"""The Throttle API: what respond serves on numpy and torch, what it hides, what it counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from throttle_support import KEY, SIGMAS, write_policy

from caliber_core import Perturber
from caliber_core.serving import runtime
from caliber_core.throttle import StoreUnavailable, Throttle, load_policy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def throttle(tmp_path):
    t = Throttle.from_files(write_policy(tmp_path, levels=(0, 1, 2), escalate_after=10), key=KEY,
                            store=f"sqlite:///{tmp_path / 'ledger.db'}", metrics=False)
    yield t
    t.close()


def _batch(n=4, k=10, seed=0):
    return np.random.default_rng(seed).normal(size=(n, k)), [f"input-{i}" for i in range(n)]


def _reference(tmp_path, target, logits, ids):
    config = json.loads((tmp_path / "cfg.json").read_text())
    return Perturber.from_config(config, target=target, key=KEY).perturb(logits, ids)


def test_an_unknown_account_is_served_clean_as_a_copy(throttle):
    logits, ids = _batch()
    r = throttle.respond("stranger", logits, ids)
    assert r.level == 0 and r.sigma == 0.0 and not r.shadow and r.counted
    assert np.array_equal(r.logits, logits) and r.logits is not logits


def test_a_flagged_account_gets_exactly_its_levels_perturber_noise(throttle, tmp_path):
    logits, ids = _batch()
    throttle.flag("acct-7", level=2, reason="detector 0.93")
    r = throttle.respond("acct-7", logits, ids)
    assert (r.level, r.sigma) == (2, SIGMAS[1])
    np.testing.assert_array_equal(r.logits, _reference(tmp_path, 1, logits, ids))


def test_torch_in_torch_out_with_the_same_values(throttle, tmp_path):
    torch = pytest.importorskip("torch")
    logits, ids = _batch()
    throttle.flag("acct-7", level=1)
    out = throttle.respond("acct-7", torch.tensor(logits, dtype=torch.float32), ids).logits
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (4, 10)
    expected = _reference(tmp_path, 0, logits.astype(np.float32), ids)
    np.testing.assert_array_equal(out.numpy(), expected)
    clean = throttle.respond("other", torch.tensor(logits), ids).logits
    assert isinstance(clean, torch.Tensor) and torch.equal(clean, torch.tensor(logits))


def test_a_batch_crossing_the_threshold_is_served_row_by_row(throttle, tmp_path):
    throttle.flag("acct-7", level=1)
    logits, ids = _batch(n=14)
    r = throttle.respond("acct-7", logits, ids)
    assert r.segments == ((1, 10), (2, 4)) and r.level == 2
    np.testing.assert_array_equal(r.logits[:10], _reference(tmp_path, 0, logits[:10], ids[:10]))
    np.testing.assert_array_equal(r.logits[10:], _reference(tmp_path, 1, logits[10:], ids[10:]))
    assert throttle.state("acct-7").queries == {1: 10, 2: 4}


def test_every_level_does_the_same_noise_work(throttle, monkeypatch):
    """The response time cannot tell levels apart: each request makes the same keyed draws."""
    from caliber_core.serving import keyed_noise

    seeds, draws = [], []
    real_seeds, real_add = keyed_noise.row_seeds, keyed_noise.add_keyed_noise

    def counting_seeds(key, binding, level, digests, n_classes):
        seeds.append((level, len(digests), n_classes))
        return real_seeds(key, binding, level, digests, n_classes)

    def counting_add(logits, level_seeds, increments):
        draws.append(logits.shape[0] * len(level_seeds))
        return real_add(logits, level_seeds, increments)

    real_seeder = keyed_noise.RowSeeder.seeds

    def counting_seeder(seeder, digests, n_classes):  # every drawn level's seeds in one call
        out = real_seeder(seeder, digests, n_classes)
        seeds.extend((level, out.shape[1], n_classes) for level in seeder._levels)
        return out

    monkeypatch.setattr(keyed_noise, "row_seeds", counting_seeds)
    monkeypatch.setattr(keyed_noise.RowSeeder, "seeds", counting_seeder)
    monkeypatch.setattr(keyed_noise, "add_keyed_noise", counting_add)
    logits, ids = _batch()
    work = []
    for account, level in (("clean", None), ("one", 1), ("three", 3), ("crossing", 1)):
        if level:
            throttle.flag(account, level=level)
        seeds.clear()
        draws.clear()
        rows = 14 if account == "crossing" else 4
        throttle.respond(account, *_batch(n=rows))
        work.append((sorted(seeds), sum(draws) // rows))
    # Three ladder levels' seeds and three draws per row: what the top level's own Perturber makes.
    assert {w[1] for w in work} == {3}
    assert work[0][0] == work[1][0] == work[2][0] == [(i, 4, 10) for i in (1, 2, 3)]


def test_the_response_never_shows_the_level(throttle):
    logits, ids = _batch()
    throttle.flag("acct-7", level=2)
    clean, noisy = throttle.respond("a", logits, ids).logits, throttle.respond("acct-7", logits, ids).logits
    assert type(clean) is type(noisy) and clean.dtype == noisy.dtype and clean.shape == noisy.shape
    assert "key" not in repr(throttle) and KEY.hex() not in repr(throttle)


def test_shadow_mode_decides_and_counts_but_serves_clean(tmp_path):
    t = Throttle.from_files(write_policy(tmp_path, shadow=True, escalate_after=3), key=KEY,
                            store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    t.flag("acct-7", level=1)
    logits, ids = _batch(n=5)
    r = t.respond("acct-7", logits, ids)
    assert r.shadow and r.level == 2 and r.segments == ((1, 3), (2, 2))
    assert np.array_equal(r.logits, logits)
    state = t.state("acct-7")
    assert state.shadow == {1: 3, 2: 2} and state.level == 2
    audit = t.audit("acct-7")
    assert audit["loss_vs_clean"]["accuracy"]["value"] == 0.0  # everything was served clean


def test_bad_requests_are_refused_before_anything_is_counted(throttle):
    with pytest.raises(ValueError, match=r"logits must be \(n_samples, 10\) or \(10,\) .* got \(2, 7\)"):
        throttle.respond("a", np.zeros((2, 7)), ["x", "y"])
    with pytest.raises(ValueError, match="per-input seeding needs ids"):
        throttle.respond("a", np.zeros((2, 10)))
    with pytest.raises(ValueError, match="need one id per row: got 1 ids for 2 rows"):
        throttle.respond("a", np.zeros((2, 10)), ["x"])
    with pytest.raises(ValueError, match="level 4 is not a flagged level of this policy: use 1..3"):
        throttle.flag("a", level=4)
    assert throttle.state("a").queries == {}


def test_flag_admin_works_without_the_key_but_respond_needs_it(tmp_path):
    t = Throttle.from_files(write_policy(tmp_path), store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    assert t.flag("acct-7", level=1)["level"] == 1
    with pytest.raises(ValueError, match="respond needs the seeding key"):
        t.respond("acct-7", np.zeros((1, 10)), ["x"])


def test_the_ledger_file_holds_no_account_id(throttle, tmp_path):
    throttle.flag("sk-live-0123456789", level=1, reason="detector")
    throttle.respond("sk-live-0123456789", *_batch())
    throttle.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.db*"))
    assert b"sk-live" not in raw and b"0123456789" not in raw


def test_an_unreachable_store_serves_the_last_known_level_uncounted(tmp_path):
    from throttle_support import free_port

    policy = load_policy(write_policy(tmp_path))
    t = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    t.flag("acct-7", level=2)
    t.store = __import__("caliber_core.throttle.stores", fromlist=["open_store"]).open_store(
        f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    logits, ids = _batch()
    r = t.respond("acct-7", logits, ids)
    assert (r.level, r.counted) == (2, False)
    assert not np.array_equal(r.logits, logits)
    with pytest.raises(StoreUnavailable, match="ConnectionError"):  # never clean for an unseen account
        t.respond("never-seen", logits, ids)

    with pytest.raises(StoreUnavailable, match=r"redis store redis://127\.0\.0\.1:\d+/0: ConnectionError.*"
                                               r"refusing to start: the policy's on_store_error.start"):
        Throttle(load_policy(write_policy(tmp_path, on_store_error="refuse", name="p2.json")), key=KEY,
                 store=t.store, metrics=False)
    refusing = Throttle(load_policy(write_policy(tmp_path, on_store_error="refuse", start_degraded=True,
                                                 name="p3.json")), key=KEY, store=t.store, metrics=False)
    with pytest.raises(StoreUnavailable, match=r"redis store redis://127\.0\.0\.1:\d+/0: ConnectionError"):
        refusing.respond("acct-7", logits, ids)


def test_metrics_count_requests_by_level_shadow_decisions_and_flags(tmp_path):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    t = Throttle.from_files(write_policy(tmp_path, escalate_after=2), key=KEY,
                            store=f"sqlite:///{tmp_path / 'l.db'}", registry=registry)
    t.flag("acct-7", level=1)
    for _ in range(3):
        t.respond("acct-7", *_batch(n=1))
    t.respond("someone", *_batch(n=1))

    def value(name, **labels):
        return registry.get_sample_value(name, labels) or 0.0

    assert value("caliber_throttle_requests_total", level="1") == 2
    assert value("caliber_throttle_requests_total", level="2") == 1
    assert value("caliber_throttle_requests_total", level="0") == 1
    assert value("caliber_throttle_flags_total", action="flag") == 1
    assert value("caliber_throttle_flags_total", action="escalate") == 1


def test_importing_the_throttle_loads_no_heavy_library():
    code = ("import sys, json\nfrom caliber_core.throttle import Throttle\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'scipy', 'pandas', 'torch', 'redis', 'prometheus_client', 'streamlit'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout) == []
