"""The throttle's ledger through a failover, with real servers: a Sentinel set and a Redis Cluster.

In each, four serving processes drive flagged and unflagged accounts (two
with ``wait=1``, two without, on accounts of their own) while the test kills
the primary with SIGKILL. The bars: no flagged account is ever served clean;
with ``wait=1`` no count a client was told about is missing from the ledger;
every process serves counted answers again within 15 s of the kill, without
a restart. What the processes without ``wait`` lost is printed (run with
``-s`` to see it); ``benchmarks/bench_throttle_failover.py`` measures it
over repeated failovers for the docs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis_topologies import ClusterSet, Missing, SentinelSet
from throttle_support import write_policy

from caliber_core.throttle import Throttle
from caliber_core.throttle.ledger import account_fingerprint
from caliber_core.throttle.redis_keys import scoped_key
from caliber_core.throttle.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("failover_driver.py")
RECOVERY_BAR_S = 15.0


def _up(kind, folder: Path):
    try:
        topology = kind(folder)
    except Missing as exc:
        pytest.skip(str(exc))
    return topology


def _drive_through_a_kill(tmp_path, url, processes, kill, *, after_kill=lambda: None):
    """Run the drivers, kill the primary after a second of traffic, stop once every driver counts again."""
    policy = write_policy(tmp_path, escalate_after=10**9)  # a flagged account stays at level 1
    with Throttle.from_files(policy, store=url + "?wait=1", metrics=False) as admin:
        for _, _, _, flagged in processes:
            for account in flagged:
                admin.flag(account, level=1, reason="detector")
    control = tmp_path / "control"
    control.mkdir()
    procs = []
    for name, query, accounts, flagged in processes:
        log = open(control / f"{name}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, str(DRIVER), str(policy), url + query, str(control), name, ",".join(accounts),
             ",".join(flagged)], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True))
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", (control / "p0.log").read_text()[-2000:]
        time.sleep(1.0)
        killed_at = time.time()
        kill()
        (control / "killed").write_text(repr(killed_at))
        after_kill()
        deadline = time.monotonic() + RECOVERY_BAR_S + 10
        names = [p[0] for p in processes]
        while time.monotonic() < deadline and not all((control / f"recovered-{n}").exists() for n in names):
            time.sleep(0.1)
        (control / "stop").write_text("stop")
        assert all(proc.wait(timeout=90) == 0 for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return {name: json.loads((control / f"{name}.json").read_text()) for name, *_ in processes}


def _check(url, processes, reports) -> dict:
    """Assert the bars; return what the processes without WAIT lost."""
    ledger = open_store(url)
    lost_without_wait = {"answers": 0, "lost": 0, "recovery_s": {}, "not_counted": {}}
    for name, query, accounts, flagged in processes:
        report = reports[name]
        assert not report["pending"], f"{name} still owes the ledger"
        assert not any("CROSSSLOT" in e for e in report["errors"]), report["errors"]
        back = report["counted_again"]
        assert back is not None and back - report["killed_at"] <= RECOVERY_BAR_S, (name, report)
        lost_without_wait["recovery_s"][name] = round(back - report["killed_at"], 2)
        lost_without_wait["not_counted"][name] = sum(a["uncounted"] + a["refused"]
                                                     for a in report["accounts"].values())
        for account in accounts:
            seen = report["accounts"][account]
            assert seen["flagged_clean"] == 0  # a flagged account is never served clean
            state = ledger.get(account_fingerprint(account))
            in_ledger = sum(state.queries.values())
            uncounted = sum(sum(e["queries"].values()) for e in state.uncounted)
            answers = seen["counted"] + seen["uncounted"]
            lost = answers - (in_ledger + uncounted)
            assert lost >= 0, (account, seen, state)
            if "wait=1" in query:
                assert lost == 0 and in_ledger >= seen["counted"], (account, seen, state)
            else:
                lost_without_wait["answers"] += answers
                lost_without_wait["lost"] += lost
    ledger.close()
    return lost_without_wait


def _processes(accounts_of) -> list:
    """Four processes: p0 and p1 with wait=1, p2 and p3 without; each drives six accounts, every other flagged."""
    out = []
    for i in range(4):
        accounts = accounts_of(i)
        out.append((f"p{i}", "?wait=1" if i < 2 else "", accounts, accounts[::2]))
    return out


def test_a_sentinel_failover_never_serves_a_flagged_account_clean_and_loses_nothing_with_wait(tmp_path):
    with _up(SentinelSet, tmp_path / "redis") as sentinel:
        url = sentinel.url()
        processes = _processes(lambda i: [f"s{i}-{j}" for j in range(6)])
        old = sentinel.primary()
        reports = _drive_through_a_kill(tmp_path, url, processes, old.kill)
        assert sentinel.primary() is not old  # a replica was promoted
        lost = _check(url, processes, reports)
    print(f"\nsentinel failover without WAIT: {lost['lost']} of {lost['answers']} answers lost from the ledger; "
          f"counted again after {lost['recovery_s']} s; answers not counted {lost['not_counted']}")


def test_a_cluster_failover_moves_the_slots_and_every_process_counts_again(tmp_path):
    import redis

    with _up(ClusterSet, tmp_path / "redis") as cluster:
        url = cluster.url()
        primaries = cluster.primaries()
        assert len(primaries) == 3

        def owner(account):
            slot = redis.crc.key_slot(scoped_key(account_fingerprint(account), "a").encode())
            return cluster.slot_owner(slot).port

        def accounts_of(i):  # two accounts on each primary, so every process loses some to the kill
            chosen, per = [], {}
            for j in range(1000):
                account = f"c{i}-{j}"
                port = owner(account)
                if per.get(port, 0) < 2:
                    per[port] = per.get(port, 0) + 1
                    chosen.append(account)
                if len(chosen) == 6:
                    return chosen
            raise AssertionError("could not spread the accounts over the primaries")

        processes = _processes(accounts_of)
        assert {owner(a) for _, _, accounts, _ in processes for a in accounts} == {n.port for n in primaries}
        victim = primaries[0]
        victim_slot = next(s for s in range(16384) if cluster.slot_owner(s) is victim)

        def restart_once_promoted():
            # A supervisor restarts the killed node once its replica has taken over (it rejoins as a replica):
            # with one replica per primary, the promoted one has no replica for WAIT until then.
            deadline = time.monotonic() + RECOVERY_BAR_S
            while cluster.slot_owner(victim_slot) is victim and time.monotonic() < deadline:
                time.sleep(0.05)
            victim.start()

        reports = _drive_through_a_kill(tmp_path, url, processes, victim.kill, after_kill=restart_once_promoted)
        assert cluster.slot_owner(victim_slot) is not victim
        lost = _check(url, processes, reports)
    print(f"\ncluster failover without WAIT: {lost['lost']} of {lost['answers']} answers lost from the ledger; "
          f"counted again after {lost['recovery_s']} s; answers not counted {lost['not_counted']}")
