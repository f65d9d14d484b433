"""The throttle's ledger through a failover, with real servers: a Sentinel set and a Redis Cluster.

In each, four serving processes drive flagged and unflagged accounts (two
with ``wait=1``, two without, on accounts of their own) while the test kills
the primary with SIGKILL. The bars: no flagged account is ever served clean;
with ``wait=1`` no count a client was told about is missing from the ledger;
every process serves counted answers again within 15 s of the kill, without
a restart; no request meets a cross-slot error. What the processes without
``wait`` lost is printed (run with ``-s``);
``benchmarks/bench_throttle_failover.py`` measures it over repeated
failovers for the docs.
"""

from __future__ import annotations

import time

import pytest
from failover_run import compare_with_ledger, drive_through_a_kill, four_processes
from redis_topologies import ClusterSet, Missing, SentinelSet
from throttle_support import write_policy

from caliber_core.throttle.ledger import account_fingerprint
from caliber_core.throttle.redis_keys import scoped_key
from caliber_core.throttle.stores import open_store

RECOVERY_BAR_S = 15.0


def _up(kind, folder):
    try:
        return kind(folder)
    except Missing as exc:
        pytest.skip(str(exc))


def _check(url, processes, reports) -> dict:
    """Assert the bars; return the comparison (what the processes without WAIT lost, when each counted again)."""
    out = compare_with_ledger(url, processes, reports)["processes"]
    for name, seen in out.items():
        assert not seen["pending"], f"{name} still owes the ledger"
        assert seen["crossslot"] == 0, reports[name]["errors"]
        assert seen["flagged_clean"] == 0  # a flagged account is never served clean
        assert seen["lost"] >= 0, (name, seen)
        assert seen["counted_again_s"] is not None and seen["counted_again_s"] <= RECOVERY_BAR_S, (name, seen)
        if seen["wait"]:
            assert seen["lost"] == 0 and seen["acknowledged_missing"] == 0, (name, seen)
    return out


def _say(topology: str, out: dict) -> None:
    without = [p for p in out.values() if not p["wait"]]
    print(f"\n{topology} failover without WAIT: {sum(p['lost'] for p in without)} of "
          f"{sum(p['answers'] for p in without)} answers lost from the ledger; counted again after "
          f"{ {n: p['counted_again_s'] for n, p in out.items()} } s")


def test_a_sentinel_failover_never_serves_a_flagged_account_clean_and_loses_nothing_with_wait(tmp_path):
    with _up(SentinelSet, tmp_path / "redis") as sentinel:
        url = sentinel.url()
        processes = four_processes(lambda i: [f"s{i}-{j}" for j in range(6)])
        killed = []

        def kill():  # whichever node is the primary at the moment of the kill
            killed.append(sentinel.primary())
            killed[0].kill()

        reports = drive_through_a_kill(tmp_path, write_policy(tmp_path, escalate_after=10**9), url, processes, kill)
        assert sentinel.primary() is not killed[0]  # a replica was promoted
        # One failover, the one the kill caused: a second means the sentinels also replaced a live primary
        # (an overloaded machine answering slower than down-after-milliseconds), which WAIT cannot cover.
        assert sentinel.events()["failovers"] == 1, sentinel.events()
        out = _check(url, processes, reports)
    _say("sentinel", out)


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
                account, port = f"c{i}-{j}", owner(f"c{i}-{j}")
                if per.get(port, 0) < 2:
                    per[port] = per.get(port, 0) + 1
                    chosen.append(account)
                if len(chosen) == 6:
                    return chosen
            raise AssertionError("could not spread the accounts over the primaries")

        processes = four_processes(accounts_of)
        assert {owner(a) for _, _, accounts, _ in processes for a in accounts} == {n.port for n in primaries}
        victim = primaries[0]
        victim_slot = next(s for s in range(16384) if cluster.slot_owner(s) is victim)

        def restart_once_promoted():
            # A supervisor restarts the killed node once its replica has taken over (it rejoins as a replica):
            # with one replica per primary, the promoted one has no replica to WAIT for until then.
            deadline = time.monotonic() + RECOVERY_BAR_S
            while cluster.slot_owner(victim_slot) is victim and time.monotonic() < deadline:
                time.sleep(0.05)
            victim.start()

        reports = drive_through_a_kill(tmp_path, write_policy(tmp_path, escalate_after=10**9), url, processes,
                                       victim.kill, after_kill=restart_once_promoted)
        assert cluster.slot_owner(victim_slot) is not victim
        assert cluster.events()["failovers"] == 1, cluster.events()  # only the one the kill caused
        out = _check(url, processes, reports)
    _say("cluster", out)


def test_a_slot_in_migration_is_an_outage_for_its_accounts_and_a_moved_slot_is_followed(tmp_path):
    import redis

    from caliber_core.throttle.ledger_store import StoreUnavailable

    with _up(ClusterSet, tmp_path / "redis") as cluster:
        store = open_store(cluster.url())
        request = dict(rows=1, now=1.0, escalate_after=100, top=2, expire_after=None, shadow=False)
        slot_of = lambda fp: redis.crc.key_slot(scoped_key(fp, "a").encode())  # noqa: E731
        first = "m0"
        second = next(f"m{j}" for j in range(1, 10**6) if slot_of(f"m{j}") == slot_of(first))
        slot = slot_of(first)
        store.record(first, **request)
        source = cluster.slot_owner(slot)
        target = next(n for n in cluster.primaries() if n is not source)
        src, dst = (redis.Redis(port=n.port) for n in (source, target))
        src_id, dst_id = (c.execute_command("CLUSTER", "MYID") for c in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        # While the slot moves, a script over keys on both sides (or on neither) is refused (ASK, then
        # TRYAGAIN): nothing ran, so the request is not in doubt, and the outage rule serves it.
        for account in (first, second):
            with pytest.raises(StoreUnavailable) as caught:
                store.record(account, **request)
            assert caught.value.in_doubt is None and "TryAgainError" in str(caught.value)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for node in cluster.primaries():
            redis.Redis(port=node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        # The store's slot map still names the source: MOVED, the map is read again, the request runs.
        assert store.record(second, **request).segments == ((0, 1),)
        assert store.record(first, **request).segments == ((0, 1),)
        assert dst.exists(scoped_key(second, "a"), scoped_key(first, "a")) == 2  # both on the target now
        assert store.get(first).queries == {0: 2} and store.get(second).queries == {0: 1}
        # The flagged list is read by SCAN on each primary: accounts on every primary, no cross-slot command.
        spread = [next(f"f{j}" for j in range(10**6) if cluster.slot_owner(slot_of(f"f{j}")) is node)
                  for node in cluster.primaries()]
        for account in spread:
            store.set_flag(account, flagged=True, level=1, reason="", now=2.0)
        assert store.accounts() == sorted(spread)
        assert set(store.accounts(flagged_only=False)) == {first, second, *spread}
        store.close()


def test_a_count_acknowledged_without_wait_can_be_lost_and_with_wait_it_is_never_acknowledged(tmp_path):
    """The window WAIT closes, opened on purpose: the replicas are cut off, then the primary is killed."""
    import signal

    import redis

    from caliber_core.throttle.ledger_store import StoreUnavailable

    with _up(SentinelSet, tmp_path / "redis") as sentinel:
        plain, waiting = open_store(sentinel.url()), open_store(sentinel.url("wait=1&wait_timeout_ms=20"))
        request = dict(rows=1, now=1.0, escalate_after=100, top=2, expire_after=None, shadow=False)
        plain.record("plain", **request)
        waiting.record("waiting", **request)  # replicated: WAIT said so
        primary = sentinel.primary()
        replicas = [n for n in sentinel.nodes if n is not primary]
        for node in replicas:  # stopped first, so that they cannot reconnect before the kill
            node.proc.send_signal(signal.SIGSTOP)
        try:
            redis.Redis(port=primary.port).execute_command("CLIENT", "KILL", "TYPE", "replica")
            assert plain.record("plain", **request).segments == ((0, 1),)  # acknowledged, on the primary only
            with pytest.raises(StoreUnavailable, match="fewer than 1 replica") as caught:
                waiting.record("waiting", **request)
            token = caught.value.in_doubt
            assert token is not None  # counted on the primary, not acknowledged: in doubt
            primary.kill()
        finally:
            for node in replicas:
                node.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + RECOVERY_BAR_S
        while time.monotonic() < deadline:
            try:
                if sentinel.primary() is not primary:
                    break
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.1)

        def eventually(call):  # the new primary answers, and has a replica for WAIT, a moment after its promotion
            for _ in range(100):
                try:
                    return call()
                except StoreUnavailable:
                    time.sleep(0.1)
            return call()

        # Without WAIT the client was told 2 and the promoted replica holds 1: an acknowledged count lost.
        assert eventually(lambda: plain.get("plain")).queries == {0: 1}
        # With WAIT the lost request had never been acknowledged; settled, it is voided, not counted.
        assert eventually(lambda: waiting.resolve("waiting", token, served=False)) is False
        assert waiting.get("waiting").queries == {0: 1}
        plain.close()
        waiting.close()


def test_a_groups_counter_and_flag_survive_a_failover_of_its_own_node_apart_from_its_members(tmp_path):
    import redis

    from caliber_core.throttle.groups import group_fingerprint
    from caliber_core.throttle.ledger_store import StoreUnavailable

    with _up(ClusterSet, tmp_path / "redis") as cluster:
        slot_of = lambda name: redis.crc.key_slot(scoped_key(name, "a").encode())  # noqa: E731
        group = group_fingerprint("card", "c1")
        victim = cluster.slot_owner(slot_of(group))
        account = next(f"a{j}" for j in range(10**6) if cluster.slot_owner(slot_of(f"a{j}")) is not victim)
        waiting, plain = open_store(cluster.url("wait=1&wait_timeout_ms=1000")), open_store(cluster.url())
        waiting.set_flag(group, flagged=True, level=1, reason="linked", now=1.0)
        entries = [(account, 100, None, None), (group, 4, None, account)]
        request = dict(rows=1, now=2.0, top=2, shadow=False)
        for _ in range(6):  # one script per slot, on two nodes; each acknowledged by a replica
            decisions = waiting.record_request(entries, **request)
        assert [d.segments for d in decisions] == [((0, 1),), ((2, 1),)]
        before = {name: plain.get(name) for name in (group, account)}
        assert before[group].queries == {1: 4, 2: 2} and before[group].level == 2
        assert plain.groups() == [group] and plain.accounts(flagged_only=False) == [account]
        members = plain.members(group)

        victim.kill()
        deadline = time.monotonic() + RECOVERY_BAR_S
        while cluster.slot_owner(slot_of(group)) is victim and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.slot_owner(slot_of(group)) is not victim
        while True:  # the promoted replica answers reads before this request is tried
            try:
                plain.get(group)
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline + RECOVERY_BAR_S
                time.sleep(0.1)
        failed = 0
        while True:  # the store follows the new slot map without a restart
            try:
                decisions = plain.record_request(entries, **request)
                break
            except StoreUnavailable:  # a new request each time: its account part may have run (over, never under)
                failed += 1
                assert time.monotonic() < deadline + RECOVERY_BAR_S
                time.sleep(0.1)
        # The promoted replica holds the group's count, level and flag: the member is still served level 2.
        assert [d.segments for d in decisions] == [((0, 1),), ((2, 1),)]
        after = plain.get(group)
        assert after.flagged and after.level == 2 and after.queries == {1: 4, 2: 3}
        counted = plain.get(account).queries[0]
        assert 7 <= counted <= 7 + failed and 7 <= plain.members(group)[account]["queries"] <= 7 + failed
        assert members[account]["queries"] == 6 and plain.groups() == [group]
        if not failed:
            assert plain.get(account).lifted == {(0, 1): 4, (0, 2): 3}
        waiting.close()
        plain.close()
