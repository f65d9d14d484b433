"""The ledger rule, and the SQLite store under several processes and a killed worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caliber_core.throttle.ledger import AccountState, account_fingerprint, advance
from caliber_core.throttle.sqlite_store import SqliteStore

ROOT = Path(__file__).resolve().parents[1]
RULE = dict(escalate_after=10, top=3, expire_after=None, shadow=False)


def _flagged(level=1, at=0.0):
    return AccountState(flagged=True, level=level, flagged_at=at, reason="r")


def test_an_account_escalates_after_exactly_the_threshold_and_stops_at_the_top():
    state, served = _flagged(), []
    for i in range(45):
        d = advance(state, rows=1, now=float(i), **RULE)
        served.append(d.segments[0][0])
        state = d.state
    assert served == [1] * 10 + [2] * 10 + [3] * 25
    assert [e.event for e in state.history] == ["escalated", "escalated"]
    assert state.queries == {1: 10, 2: 10, 3: 25}


def test_a_batch_that_crosses_thresholds_is_split_row_by_row():
    d = advance(_flagged(), rows=25, now=0.0, **RULE)
    assert d.segments == ((1, 10), (2, 10), (3, 5))
    assert d.state.level == 3 and d.state.at_level == 5


def test_unflagged_rows_count_at_level_zero_and_never_escalate():
    d = advance(AccountState(), rows=1000, now=5.0, **RULE)
    assert d.segments == ((0, 1000),) and d.state.level == 0 and d.events == ()
    assert d.state.first_seen == d.state.last_seen == 5.0


def test_an_expired_flag_lapses_at_the_next_request():
    rule = RULE | {"expire_after": 100.0}
    assert advance(_flagged(at=0.0), rows=1, now=99.0, **rule).segments == ((1, 1),)
    d = advance(_flagged(at=0.0), rows=1, now=100.0, **rule)
    assert d.segments == ((0, 1),) and not d.state.flagged and [e.event for e in d.events] == ["expired"]


def test_shadow_mode_counts_the_flagged_rows_it_served_clean():
    d = advance(_flagged(), rows=12, now=0.0, **(RULE | {"shadow": True}))
    assert d.state.queries == {1: 10, 2: 2} and d.state.shadow == {1: 10, 2: 2}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.integers(1, 20), st.integers(1, 4))
def test_counts_are_exact_and_escalations_match_the_total(batches, threshold, top):
    state = _flagged()
    for i, rows in enumerate(batches):
        d = advance(state, rows=rows, now=float(i), escalate_after=threshold, top=top, expire_after=None,
                    shadow=False)
        assert sum(n for _, n in d.segments) == rows
        state = d.state
    total = sum(batches)
    assert sum(state.queries.values()) == total
    escalations = sum(e.event == "escalated" for e in state.history)
    assert escalations == min(top - 1, total // threshold)


def test_the_fingerprint_hides_the_account_and_refuses_bad_ids():
    fp = account_fingerprint("sk-live-secret")
    assert len(fp) == 32 and "secret" not in fp and fp == account_fingerprint(b"sk-live-secret")
    with pytest.raises(ValueError, match="1..4096 bytes, got 0 bytes"):
        account_fingerprint("")
    with pytest.raises(TypeError, match="must be str or bytes, got int"):
        account_fingerprint(7)


def test_the_sqlite_store_replays_the_rule_and_keeps_history(tmp_path):
    store = SqliteStore(str(tmp_path / "l.db"))
    store.set_flag("a", flagged=True, level=1, reason="why", now=1.0)
    for i in range(3):
        d = store.record("a", rows=7, now=2.0 + i, **RULE)
    assert d.segments == ((2, 6), (3, 1))  # 7 at level 1; then 3 at 1 and 4 at 2; then 6 at 2 and 1 at 3
    state = store.get("a")
    assert state.queries == {1: 10, 2: 10, 3: 1} and state.level == 3 and state.at_level == 1
    assert [(e.event, e.level) for e in state.history] == [("flagged", 1), ("escalated", 2), ("escalated", 3)]
    store.set_flag("a", flagged=False, level=0, reason="appeal", now=9.0)
    assert store.get("a").flagged is False and store.accounts() == []
    assert store.accounts(flagged_only=False) == ["a"]
    store.close()


_WORKER = """
import sys
from caliber_core.throttle.sqlite_store import SqliteStore
store = SqliteStore(sys.argv[1])
n, tick = int(sys.argv[2]), sys.argv[3] == "tick"
for i in range(n):
    store.record("shared", rows=1, now=float(i), escalate_after=int(sys.argv[4]), top=2,
                 expire_after=None, shadow=False)
    if tick:
        sys.stdout.buffer.write(b"."); sys.stdout.buffer.flush()
"""


def _worker(path, n, *, tick=False, threshold=10**9):
    return subprocess.Popen([sys.executable, "-c", _WORKER, str(path), str(n), "tick" if tick else "-",
                             str(threshold)], cwd=ROOT, stdout=subprocess.PIPE)


def test_four_processes_lose_no_increment_and_escalate_once(tmp_path):
    path = tmp_path / "l.db"
    SqliteStore(str(path)).set_flag("shared", flagged=True, level=1, reason="", now=0.0)
    procs = [_worker(path, 1500, threshold=3000) for _ in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    state = SqliteStore(str(path)).get("shared")
    assert state.queries == {1: 3000, 2: 3000}
    assert [e.event for e in state.history] == ["flagged", "escalated"]


def test_a_worker_killed_mid_request_loses_at_most_that_request(tmp_path):
    path = tmp_path / "l.db"
    SqliteStore(str(path))
    proc = _worker(path, 10**7, tick=True)
    os.set_blocking(proc.stdout.fileno(), False)
    acked, deadline = 0, time.monotonic() + 30
    while acked < 300 and time.monotonic() < deadline:
        acked += len(proc.stdout.read() or b"")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    acked += len(proc.stdout.read() or b"")
    state = SqliteStore(str(path)).get("shared")  # readable after the kill
    assert acked >= 300
    assert state.queries[0] in (acked, acked + 1)  # the one in flight may or may not have committed


def test_a_new_flag_over_a_lapsed_one_records_the_expiry_first(tmp_path):
    store = SqliteStore(str(tmp_path / "l.db"))
    store.set_flag("a", flagged=True, level=2, reason="first", now=0.0, expire_after=100.0)
    store.set_flag("a", flagged=True, level=1, reason="second", now=150.0, expire_after=100.0)
    assert [(e.event, e.level, e.reason) for e in store.get("a").history] == [
        ("flagged", 2, "first"), ("expired", 0, "first"), ("flagged", 1, "second")]
