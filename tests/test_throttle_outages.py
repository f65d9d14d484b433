"""Fail closed and count exactly: stores that go away (Redis stopped, SQLite files deleted or truncated).

Faults are injected by the tests themselves: a real redis-server stopped,
killed and restarted; ledger files deleted, re-created by the CLI, and a
``-shm`` file truncated or made unwritable.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from throttle_support import KEY, RedisServer, write_policy

from caliber_core import Perturber
from caliber_core.cli import main
from caliber_core.throttle import StoreUnavailable, Throttle
from caliber_core.throttle.levels import LevelNoise
from caliber_core.throttle.redis_store import RedisStore
from caliber_core.throttle.sqlite_store import SqliteStore

ROOT = Path(__file__).resolve().parents[1]


def _batch(n=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 10)), [f"input-{i}" for i in range(n)]


def _reference(folder, target, logits, ids):
    config = json.loads((folder / "cfg.json").read_text())
    return Perturber.from_config(config, target=target, key=KEY).perturb(logits, ids)


def _no_secrets(text: str, *accounts: str) -> None:
    assert KEY.hex() not in text
    for account in accounts:
        assert account not in text


# ---------------------------------------------------------------------------- fail closed (Redis)

@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def test_a_throttle_built_while_redis_is_down_refuses_to_start_by_default(redis, tmp_path, caplog):
    policy = write_policy(tmp_path)
    assert main(["throttle", "flag", "acct-7", "--policy", str(policy), "--store", redis.url, "--level", "2"]) == 0
    redis.stop()
    with pytest.raises(StoreUnavailable, match=r"ConnectionError.*refusing to start: the policy's "
                                               r"on_store_error.start is \"refuse\""):
        Throttle.from_files(policy, key=KEY, store=redis.url, metrics=False)
    # A typo in the URL is the same outage.
    with pytest.raises(StoreUnavailable, match="refusing to start"):
        Throttle.from_files(policy, key=KEY, store=f"redis://127.0.0.1:{redis.port + 1}/0", metrics=False)


@pytest.mark.parametrize("unseen", [None, 1])
def test_started_degraded_an_account_flagged_in_redis_is_never_served_clean(redis, tmp_path, caplog, unseen):
    policy = write_policy(tmp_path, start_degraded=True, unseen_level=unseen, name=f"p{unseen}.json")
    assert main(["throttle", "flag", "acct-7", "--policy", str(policy), "--store", redis.url, "--level", "2"]) == 0
    redis.stop()
    caplog.set_level(logging.WARNING, logger="caliber_core.throttle")
    t = Throttle.from_files(policy, key=KEY, store=redis.url, metrics=False)
    logits, ids = _batch()
    for _ in range(20):
        if unseen is None:
            with pytest.raises(StoreUnavailable, match="ConnectionError"):
                t.respond("acct-7", logits, ids)
        else:
            r = t.respond("acct-7", logits, ids)
            assert (r.level, r.counted) == (1, False)
            np.testing.assert_array_equal(r.logits, _reference(tmp_path, 0, logits, ids))
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "caliber_core.throttle"]
    assert len(warnings) == 21 and "serving degraded" in warnings[0]  # the start, then one per decision
    assert all("ledger store unreachable" in w for w in warnings)
    _no_secrets("\n".join(warnings), "acct-7")
    if unseen is not None:
        # Redis comes back: counting resumes, the flag reaches the server, the outage is in the audit.
        redis.start()
        r = t.respond("acct-7", logits, ids)
        assert (r.level, r.counted) == (2, True)
        report = t.audit("acct-7")
        assert report["total_served_uncounted"] == 80 and report["total_queries"] == 4
        [entry] = report["served_uncounted"]
        assert entry["queries"] == {"1": 80} and entry["process"].endswith(f":{os.getpid()}")
        assert entry["first"] <= entry["last"]
        assert main(["throttle", "audit", "acct-7", "--policy", str(policy), "--store", redis.url]) == 0


def test_the_audit_cli_prints_the_rows_served_uncounted(redis, tmp_path, capsys):
    policy = write_policy(tmp_path, start_degraded=True)
    t = Throttle.from_files(policy, key=KEY, store=redis.url, metrics=False)
    t.flag("acct-7", level=1)
    logits, ids = _batch()
    redis.stop()
    served = [t.respond("acct-7", logits, ids) for _ in range(5)]
    assert [r.counted for r in served] == [False] * 5 and t.pending_uncounted()
    redis.start()
    assert t.respond("acct-7", logits, ids).counted and not t.pending_uncounted()
    capsys.readouterr()
    assert main(["throttle", "audit", "acct-7", "--policy", str(policy), "--store", redis.url]) == 0
    out = capsys.readouterr().out
    assert "served while the ledger was unreachable, not in the counts above: 20 queries" in out
    assert f":{os.getpid()}:" in out and "L1:20" in out


# ---------------------------------------------------------------------------- counted means counted

@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_request_that_fails_after_counting_is_not_counted(tmp_path, monkeypatch, store, request):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    if store == "redis":
        url = request.getfixturevalue("redis").url
    t = Throttle.from_files(write_policy(tmp_path, escalate_after=1000), key=KEY, store=url, metrics=False)
    t.flag("acct-7", level=1)
    logits, ids = _batch()
    assert t.respond("acct-7", logits, ids).counted

    def broken(*args, **kwargs):
        raise MemoryError("no room for the answer")

    with monkeypatch.context() as m:
        m.setattr(LevelNoise, "assemble", broken)
        with pytest.raises(MemoryError):
            t.respond("acct-7", logits, ids)
    state = t.state("acct-7")
    assert state.queries == {1: 4} and state.failed == {1: 4}
    # The caller's own failure (say, the HTTP body could not be written): void the response.
    r = t.respond("acct-7", logits, ids)
    t.void(r)
    t.void(r)  # twice: once
    state = t.state("acct-7")
    assert state.queries == {1: 4} and state.failed == {1: 8}
    assert t.audit("acct-7")["failed"] == {"1": 8}


def test_a_redis_token_counts_once_and_a_lost_one_is_settled(redis):
    store = RedisStore(host="127.0.0.1", port=redis.port)
    request = dict(rows=3, now=1.0, escalate_after=100, top=2, expire_after=None, shadow=False)
    first = store.record("acct", token="t1", **request)
    again = store.record("acct", token="t1", **request)  # a retry of the same request: its reply, not a new count
    assert first.segments == again.segments == ((0, 3),)
    assert store.get("acct").queries == {0: 3}
    assert store.resolve("acct", "t1", served=True) is True and store.get("acct").queries == {0: 3}
    store.record("acct", token="t2", **request)
    assert store.resolve("acct", "t2", served=False) is True  # the caller was told it failed
    assert store.resolve("acct", "t2", served=False) is True  # settled once
    assert (store.get("acct").queries, store.get("acct").failed) == ({0: 3}, {0: 3})
    assert store.resolve("acct", "t3", served=False) is False  # never ran: voided, so it never can
    with pytest.raises(StoreUnavailable, match="voided"):
        store.record("acct", token="t3", **request)
    assert store.get("acct").queries == {0: 3}


_LOAD = """
import sys, json, numpy as np
from caliber_core.throttle import Throttle, StoreUnavailable
t = Throttle.from_files(sys.argv[1], key=bytes(range(32)), store=sys.argv[2], metrics=False)
logits, ids = np.zeros((1, 10)), ["x"]
served = refused = 0
stop = open(sys.argv[3])
print("ready", flush=True)
while True:
    try:
        r = t.respond("acct-7", logits, ids)
        served += 1
        assert r.counted
    except StoreUnavailable:
        refused += 1
    if stop.read() == "stop":
        break
    stop.seek(0)
while True:  # settle what was in doubt
    try:
        t.respond("acct-7", logits, ids)
        served += 1
        break
    except StoreUnavailable:
        pass
print(json.dumps({"served": served, "refused": refused}))
"""


def test_redis_counts_exactly_across_sigterm_and_sigkill_restarts(redis, tmp_path):
    policy = write_policy(tmp_path, on_store_error="refuse", escalate_after=10**9)
    main(["throttle", "flag", "acct-7", "--policy", str(policy), "--store", redis.url])
    stop = tmp_path / "stop"
    stop.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", _LOAD, str(policy), redis.url, str(stop)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "ready"
        # Short restarts (the retries with the same token ride them out) and one longer than the
        # retry window (requests refused, one of them possibly in doubt until the server is back).
        for kill, down in ((False, 0.2), (False, 2.5), (True, 0.2), (True, 2.5), (False, 0.2)):
            time.sleep(0.4)
            redis.stop(kill=kill)
            time.sleep(down)
            redis.start()
        time.sleep(0.3)
        stop.write_text("stop")
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    result = json.loads(out)
    assert result["served"] > 20 and result["refused"] > 0
    t = Throttle.from_files(policy, store=redis.url, metrics=False)
    state = t.state("acct-7")
    # Every answered request is counted once; every refused one is not (or was moved to failed).
    assert state.queries == {1: result["served"]}, (state.queries, state.failed, result)


# ---------------------------------------------------------------------------- one ledger (SQLite)

def _files(path: Path):
    return [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", ".lock")]


def test_a_deleted_ledger_is_never_written_and_a_recreated_one_is_reopened(tmp_path, caplog):
    db = tmp_path / "ledger.db"
    url = f"sqlite:///{db}"
    policy = write_policy(tmp_path, escalate_after=1000)
    t = Throttle.from_files(policy, key=KEY, store=url, metrics=False)
    t.flag("acct-1", level=1)
    logits, ids = _batch()
    assert t.respond("acct-1", logits, ids).counted
    for f in _files(db):
        f.unlink(missing_ok=True)
    # Deleted: nothing is written anywhere, the outage rule applies (acct-1 was seen at level 1).
    r = t.respond("acct-1", logits, ids)
    assert (r.level, r.counted) == (1, False)
    with pytest.raises(StoreUnavailable, match="the ledger file was deleted"):
        t.respond("acct-2", logits, ids)
    assert not db.exists()
    # The CLI re-creates it and flags another account: the live server reads the same file.
    assert main(["throttle", "flag", "acct-2", "--policy", str(policy), "--store", url, "--level", "2"]) == 0
    r = t.respond("acct-2", logits, ids)
    assert (r.level, r.counted) == (2, True)
    np.testing.assert_array_equal(r.logits, _reference(tmp_path, 1, logits, ids))
    assert main(["throttle", "unflag", "acct-2", "--policy", str(policy), "--store", url]) == 0
    assert t.respond("acct-2", logits, ids).level == 0
    with Throttle.from_files(policy, store=url, metrics=False) as admin:
        assert admin.state("acct-2").queries == {2: 4, 0: 4}
        assert admin.audit("acct-1")["total_served_uncounted"] == 4  # written back to the new file


def test_a_replaced_ledger_file_is_reopened(tmp_path):
    db = tmp_path / "ledger.db"
    store = SqliteStore(str(db))
    store.set_flag("a", flagged=True, level=1, reason="", now=0.0)
    other = SqliteStore(str(tmp_path / "other.db"))
    other.set_flag("b", flagged=True, level=2, reason="", now=0.0)
    other.close()
    for f in _files(db)[:3]:
        f.unlink(missing_ok=True)
    shutil.copy(tmp_path / "other.db", db)  # a restore from a backup, say
    assert store.get("a") is None and store.get("b").level == 2
    store.record("b", rows=2, now=1.0, escalate_after=10, top=2, expire_after=None, shadow=False)
    assert SqliteStore(str(db)).get("b").queries == {2: 2}


_TRUNCATE = """
import os, sys
from caliber_core.throttle.sqlite_store import SqliteStore
store = SqliteStore(sys.argv[1])
request = dict(rows=1, now=1.0, escalate_after=10, top=2, expire_after=None, shadow=False)
store.record("a", **request)
os.truncate(sys.argv[1] + "-shm", 0)   # under the live mapping: a bare sqlite3 connection dies of SIGBUS here
store.record("a", **request)
print(store.get("a").queries)
"""


def test_a_truncated_shm_under_a_live_store_does_not_kill_the_process(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _TRUNCATE, str(tmp_path / "l.db")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert proc.stdout.strip() == "{0: 2}"


def test_an_unwritable_shm_raises_store_unavailable(tmp_path):
    db = tmp_path / "l.db"
    store = SqliteStore(str(db))
    store.record("a", rows=1, now=1.0, escalate_after=10, top=2, expire_after=None, shadow=False)
    shm = Path(str(db) + "-shm")
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(shm)]).returncode != 0:
            pytest.skip("running as root without chattr +i here: cannot make the -shm unwritable")
        undo = ["chattr", "-i", str(shm)]
    else:
        shm.chmod(0o444)
        undo = None
    try:
        with pytest.raises(StoreUnavailable, match="its -shm file is not writable"):
            store.record("a", rows=1, now=2.0, escalate_after=10, top=2, expire_after=None, shadow=False)
        with pytest.raises(StoreUnavailable, match="its -shm file is not writable"):
            SqliteStore(str(db))
    finally:
        if undo:
            subprocess.run(undo, check=True)
        else:
            shm.chmod(0o644)
    store.record("a", rows=1, now=3.0, escalate_after=10, top=2, expire_after=None, shadow=False)
    assert store.get("a").queries == {0: 2}


def test_a_500_from_the_example_is_not_counted(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from examples.serve_fastapi import create_app, linear_model

    t = Throttle.from_files(write_policy(tmp_path, escalate_after=1000), key=KEY,
                            store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    t.flag("acct-7", level=1)
    client = TestClient(create_app(t, linear_model(8, 10)), raise_server_exceptions=False)
    body = {"inputs": np.random.default_rng(0).normal(size=(3, 8)).tolist()}
    assert client.post("/v1/classify", json=body, headers={"Authorization": "Bearer acct-7"}).status_code == 200

    def broken(*args, **kwargs):
        raise RuntimeError("the answer could not be built")

    monkeypatch.setattr(LevelNoise, "assemble", broken)
    assert client.post("/v1/classify", json=body, headers={"Authorization": "Bearer acct-7"}).status_code == 500
    state = t.state("acct-7")
    assert state.queries == {1: 3} and state.failed == {1: 3}


def test_requests_in_doubt_are_settled_once_the_store_answers(redis, tmp_path, caplog):
    """A script that ran but whose reply was lost: counted if the caller was served, moved to failed if not."""
    from caliber_core.throttle import account_fingerprint

    t = Throttle.from_files(write_policy(tmp_path, escalate_after=1000), key=KEY, store=redis.url, metrics=False)
    t.flag("acct-7", level=1)
    seen, unseen = account_fingerprint("acct-7"), account_fingerprint("stranger")
    request = dict(rows=4, now=1.0, escalate_after=1000, top=3, expire_after=None, shadow=False)
    for fp, token in ((seen, "tok-served"), (unseen, "tok-refused")):
        t.store.record(fp, token=token, **request)  # Redis ran it; the reply "was lost"
        error = StoreUnavailable("redis store: reply lost")
        error.in_doubt = token
        if fp == seen:
            assert t._degraded(fp, 4, error) == ((1, 4),)  # served uncounted, at the level last seen
        else:
            with pytest.raises(StoreUnavailable):
                t._degraded(fp, 4, error)  # an unseen account: refused
    assert t.pending_uncounted() == {seen: {1: 4}}
    logits, ids = _batch()
    assert t.respond("acct-7", logits, ids).counted  # the store answers: both are settled
    assert not t.pending_uncounted() and not t._outages.in_doubt
    served, refused = t.state("acct-7"), t.state("stranger")
    assert served.queries == {1: 8} and served.uncounted == () and served.failed == {}
    assert refused.queries == {0: 0} and refused.failed == {0: 4}
