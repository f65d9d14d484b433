"""The Redis store against a real redis-server: the Lua rule, concurrency, restarts and outages."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from throttle_support import KEY, RedisServer, redis_server, write_policy

from caliber_core.cli import main
from caliber_core.throttle import StoreUnavailable, Throttle
from caliber_core.throttle.redis_store import RedisStore
from caliber_core.throttle.sqlite_store import SqliteStore
from caliber_core.throttle.stores import open_store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(tmp_path):
    with redis_server(tmp_path) as s:
        yield s


def test_the_lua_script_follows_the_same_rule_as_sqlite(server, tmp_path):
    stores = [open_store(server.url), SqliteStore(str(tmp_path / "l.db"))]
    assert isinstance(stores[0], RedisStore)
    rng = random.Random(3)
    now, results = 0.0, [[], []]
    for step in range(300):
        now += rng.choice([0.5, 5.0, 40.0])
        account = rng.choice(["a", "b", "c"])
        action = rng.random()
        shadow = step % 7 == 0
        for store, out in zip(stores, results):
            if action < 0.05:
                store.set_flag(account, flagged=True, level=random.Random(step).randint(1, 3), reason="r|x", now=now,
                               expire_after=300.0)
            elif action < 0.08:
                store.set_flag(account, flagged=False, level=0, reason="appeal", now=now, expire_after=300.0)
            else:
                d = store.record(account, rows=random.Random(step).randint(1, 9), now=now, escalate_after=12, top=3,
                                 expire_after=300.0, shadow=shadow)
                out.append((d.segments, [(e.event, e.level, e.reason) for e in d.events]))
    assert results[0] == results[1]
    for account in "abc":
        r, s = stores[0].get(account), stores[1].get(account)
        assert (r.flagged, r.level, r.at_level, r.queries, r.shadow, r.reason) == \
               (s.flagged, s.level, s.at_level, s.queries, s.shadow, s.reason)
        assert [(e.event, e.level, e.reason) for e in r.history] == [(e.event, e.level, e.reason) for e in s.history]
    assert stores[0].accounts() == stores[1].accounts()


_WORKER = """
import sys
from caliber_core.throttle.stores import open_store
store = open_store(sys.argv[1])
for i in range(int(sys.argv[2])):
    store.record("shared", rows=1, now=float(i), escalate_after=2000, top=2, expire_after=None, shadow=False)
"""


def test_four_processes_lose_no_increment_and_escalate_once(server):
    open_store(server.url).set_flag("shared", flagged=True, level=1, reason="", now=0.0)
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, server.url, "1000"], cwd=ROOT) for _ in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    state = open_store(server.url).get("shared")
    assert state.queries == {1: 2000, 2: 2000}
    assert [e.event for e in state.history] == ["flagged", "escalated"]


def _throttle(tmp_path, url, **policy):
    return Throttle.from_files(write_policy(tmp_path, **policy), key=KEY, store=url, metrics=False)


@pytest.mark.parametrize("kill", [False, True], ids=["restart", "sigkill-restart"])
def test_a_restart_keeps_the_ledger_and_loses_only_uncounted_requests(tmp_path, kill):
    server = RedisServer(tmp_path)
    server.start()
    try:
        t = _throttle(tmp_path, server.url, escalate_after=1000)
        t.flag("acct-7", level=2, reason="detector")
        logits, ids = np.zeros((1, 10)), ["x"]
        counted = sum(t.respond("acct-7", logits, ids).counted for _ in range(50))
        server.stop(kill=kill)
        server.start()
        responses = [t.respond("acct-7", logits, ids) for _ in range(5)]
        assert all(r.level == 2 for r in responses)  # served at its level throughout
        counted += sum(r.counted for r in responses)
        assert responses[-1].counted  # counting resumed
        state = t.state("acct-7")
        assert state.flagged and state.level == 2 and state.queries == {2: counted}
    finally:
        server.stop()


def test_an_outage_follows_the_policy_then_counting_resumes(tmp_path, capsys):
    server = RedisServer(tmp_path)
    server.start()
    try:
        policy = write_policy(tmp_path, escalate_after=1000)
        t = _throttle(tmp_path, server.url, escalate_after=1000)
        t.flag("acct-7", level=1)
        logits, ids = np.ones((2, 10)), ["a", "b"]
        assert t.respond("acct-7", logits, ids).counted
        server.stop()
        r = t.respond("acct-7", logits, ids)
        assert (r.level, r.counted) == (1, False) and not np.array_equal(r.logits, logits)
        with pytest.raises(StoreUnavailable, match="refusing to start"):
            _throttle(tmp_path, server.url, on_store_error="refuse", name="refuse.json")
        refusing = _throttle(tmp_path, server.url, on_store_error="refuse", start_degraded=True, name="refuse.json")
        with pytest.raises(StoreUnavailable, match="ConnectionError"):
            refusing.respond("acct-7", logits, ids)
        assert main(["throttle", "status", "acct-7", "--policy", str(policy), "--store", server.url]) == 2
        assert capsys.readouterr().err.startswith("error: store unreachable: redis store redis://127.0.0.1:")
        server.start()
        after = [t.respond("acct-7", logits, ids) for _ in range(3)]
        assert after[-1].counted  # at most the first request on a stale connection is not counted
        assert t.state("acct-7").queries == {1: 2 * (1 + sum(r.counted for r in after))}
    finally:
        server.stop()


def test_the_cli_drives_a_redis_ledger(server, tmp_path, capsys):
    policy = str(write_policy(tmp_path))
    assert main(["throttle", "flag", "acct-9", "--policy", policy, "--store", server.url, "--level", "3",
                 "--reason", "manual review"]) == 0
    assert main(["throttle", "status", "--policy", policy, "--store", server.url, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"level": 3' in out and "acct-9" not in out and '"reason": "manual review"' in out


def _legacy_store_class(commit: str = "1331081"):
    """The RedisStore of a release before the hash-tagged layout, read from git history."""
    import importlib.util

    source = subprocess.run(["git", "show", f"{commit}:caliber_core/throttle/redis_store.py"], cwd=ROOT,
                            capture_output=True, text=True)
    if source.returncode != 0:
        pytest.skip("the earlier release's redis_store.py is not in this checkout's git history")
    path = ROOT / "caliber_core" / "throttle" / "_legacy_redis_store_for_test.py"
    spec = importlib.util.spec_from_loader("caliber_core.throttle._legacy_redis_store_for_test", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    exec(compile(source.stdout, str(path), "exec"), module.__dict__)
    return module.RedisStore


def test_a_ledger_of_the_single_server_layout_is_refused_until_one_command_moves_it(server, tmp_path, capsys):
    old = _legacy_store_class()(host="127.0.0.1", port=server.port)
    request = dict(now=1.0, escalate_after=5, top=2, expire_after=None, shadow=False)
    old.set_flag("f1", flagged=True, level=1, reason="detector", now=0.5)
    for _ in range(3):
        old.record("f1", rows=4, **request)
    old.record("f2", rows=2, **request)
    old.add_uncounted("f2", process="h:1", first=0.0, last=1.0, queries={0: 3})
    expected = {fp: old.get(fp) for fp in ("f1", "f2")}
    assert old.accounts() == ["f1"] and expected["f1"].level == 2
    old.close()

    policy = str(write_policy(tmp_path))
    with pytest.raises(StoreUnavailable, match="single-server key layout.*migrate-store"):
        Throttle.from_files(policy, key=KEY, store=server.url, metrics=False)
    assert main(["throttle", "status", "--policy", policy, "--store", server.url]) == 2
    assert "caliber throttle migrate-store --store URL" in capsys.readouterr().err

    assert main(["throttle", "migrate-store", "--store", server.url]) == 0
    assert "moved 2 account(s) (4 keys, 1 flagged)" in capsys.readouterr().out
    store = open_store(server.url)
    assert store.accounts() == ["f1"] and store.accounts(flagged_only=False) == ["f1", "f2"]
    for fp, state in expected.items():
        assert store.get(fp) == state
    d = store.record("f1", rows=1, **request)  # counting goes on where it stopped
    assert d.state.level == 2 and store.get("f1").queries[2] == expected["f1"].queries[2] + 1
    assert main(["throttle", "migrate-store", "--store", server.url]) == 0  # again: nothing left
    assert "moved 0 account(s)" in capsys.readouterr().out


def test_the_migration_keeps_the_groups_of_a_single_server_ledger_and_their_flags(server):
    from caliber_core.throttle.groups import group_fingerprint
    from caliber_core.throttle.redis_migrate import migrate_layout

    # e7540cf: the release with campaign groups, accounts still in the single-server layout
    old = _legacy_store_class("e7540cf")(host="127.0.0.1", port=server.port)
    card, org = group_fingerprint("card", "c1"), group_fingerprint("org", "o1")
    old.set_flag(card, flagged=True, level=1, reason="linked", now=0.5)
    request = dict(rows=3, now=1.0, top=2, shadow=False)
    old.record_request([("f1", 5, None, None), (card, 5, None, "f1"), (org, 5, None, "f1")], **request)
    expected = {name: old.get(name) for name in ("f1", card, org)}
    members = old.members(card)
    assert old.groups() == [card] and expected["f1"].lifted == {(0, 1): 3}
    old.close()

    store = RedisStore.from_url(server.url)
    assert migrate_layout(store) == {"accounts": 1, "keys": 1, "flagged": 1}  # f1 has no history; the card's marker
    assert store.groups() == [card] and store.groups(flagged_only=False) == sorted([card, org])
    assert store.accounts(flagged_only=False) == ["f1"] and store.accounts() == []
    assert {name: store.get(name) for name in expected} == expected and store.members(card) == members
    d = store.record_request([("f1", 5, None, None), (card, 5, None, "f1")], **request)
    assert [x.segments for x in d] == [((0, 3),), ((1, 2), (2, 1))]  # the card escalates after 5 at level 1
    store.set_flag(card, flagged=False, level=0, reason="appeal", now=2.0)
    assert store.groups() == [] and store.get("f1").lifted == {(0, 1): 5, (0, 2): 1}
    store.close()


def test_wait_on_a_server_without_replicas_fails_closed_and_leaves_the_request_in_doubt(server):
    store = open_store(server.url + "?wait=1&wait_timeout_ms=10")
    with pytest.raises(StoreUnavailable, match="fewer than 1 replica") as caught:
        store.record("acct", rows=1, now=1.0, escalate_after=10, top=2, expire_after=None, shadow=False)
    assert caught.value.in_doubt is not None  # counted on the primary, not acknowledged by a replica
    plain = open_store(server.url)
    assert plain.resolve("acct", caught.value.in_doubt, served=False) is True
    assert (plain.get("acct").queries, plain.get("acct").failed) == ({0: 0}, {0: 1})
