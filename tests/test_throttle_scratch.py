"""The replay's scratch ledger decides exactly as the production SQLite file store does."""

from __future__ import annotations

import pytest
from throttle_support import write_policy

from caliber_core.throttle import Throttle, load_policy
from caliber_core.throttle import simulate as simulate_module
from caliber_core.throttle.ledger_store import StoreUnavailable
from caliber_core.throttle.scratch_store import ScratchStore
from caliber_core.throttle.sqlite_store import SqliteStore


@pytest.mark.parametrize("escalate_after, expire_after, shadow", [(2_000, None, False), (1_000, 86400.0, True)])
def test_simulate_on_the_scratch_ledger_matches_the_sqlite_file_store(tmp_path, monkeypatch, escalate_after,
                                                                      expire_after, shadow):
    policy = load_policy(write_policy(tmp_path, escalate_after=escalate_after, expire_after=expire_after,
                                      shadow=shadow))
    scratch = simulate_module.simulate(policy, batch=70)
    files = iter(range(10))
    monkeypatch.setattr(simulate_module, "ScratchStore",
                        lambda: SqliteStore(str(tmp_path / f"ledger-{next(files)}.db")))
    on_file = simulate_module.simulate(policy, batch=70)
    assert (tmp_path / "ledger-0.db").exists()  # the comparison really ran on the file store
    assert scratch == on_file
    by = {a["account"]: a for a in scratch["accounts"]}
    assert by["thief"]["max_level"] > 0
    if expire_after:  # the detector re-flags the campaign each time its flag lapses, and only then
        for name in ("thief", "linked"):
            events = by[name]["flag_events"]
            assert events.count("expired") >= 2 and events.count("flagged") == events.count("expired") + 1, events
            assert all(b == "flagged" for a, b in zip(events, events[1:]) if a == "expired"), events


def test_the_scratch_ledger_gives_the_file_stores_decisions_and_states(tmp_path):
    policy = load_policy(write_policy(tmp_path, escalate_after=5, expire_after=50.0))
    seen = []
    for store in (ScratchStore(), SqliteStore(str(tmp_path / "ledger.db"))):
        now = [0.0]
        with Throttle(policy, store=store, clock=lambda: now[0], metrics=False) as t:
            t.flag("acct", level=1, reason="test")
            decisions = []
            for rows in (3, 4, 9, 1):
                now[0] += 20.0
                decisions.append(t.decide("acct", rows).segments)
            seen.append((decisions, t.state("acct"), store.accounts(flagged_only=False)))
    assert seen[0] == seen[1]
    assert seen[0][0][1] == ((1, 2), (2, 2))  # it escalates as the file store does


def test_a_closed_scratch_ledger_says_so_in_one_line():
    store = ScratchStore()
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.get("acct")
