"""The throttle's ledger on one server, on Sentinel and on a cluster: speed, and what a failover costs.

    python benchmarks/bench_throttle_failover.py             # about 3 minutes on 2 busy cores
    python benchmarks/bench_throttle_failover.py --quick     # fewer requests, one failover per topology

1. ``respond`` (one process, one row, K = 10, a flagged account) on one
   server, on a Sentinel set (primary, two replicas, three sentinels) without
   and with ``wait=1``, and on a cluster (three primaries, one replica each)
   without and with ``wait=1``: requests/s, p50 and p99 latency, the
   topologies interleaved in rounds so that load drifting hits them alike.
2. One server, ``respond`` through this release's store against the
   previous release's (``git show 1331081:caliber_core/throttle/redis_store.py``),
   interleaved: the median of per-round ratios of median latencies, and of
   this process's CPU time per request (less moved by a busy machine).
3. Failovers: the primary killed with SIGKILL under four serving processes
   (two with ``wait=1``, two without, six accounts each, half flagged), a new
   topology each time. Per failover: each process's outage (its first answer
   not counted to its first counted answer after its last one), the kill to
   counted answers again, answers lost from the ledger with and without WAIT.
   On the cluster the killed node is restarted once its replica has taken
   over (as a supervisor would): until then its shard has no replica to WAIT for.

No persistence on any node here (replicas are the durability under test).
Needs ``redis-server`` and ``redis-cli`` on PATH. Writes
docs/figures/throttle-failover.md (through ``figure_files``: the date, the
machine and this command, with the load average).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the topologies and the serving processes the tests use

from failover_run import GIVE_UP_S, compare_with_ledger, drive_through_a_kill, four_processes  # noqa: E402
from figure_files import FigureFile  # noqa: E402  (benchmarks/ is this script's folder)
from redis_topologies import ClusterSet, Missing, Node, SentinelSet, free_ports, redis_executables  # noqa: E402
from throttle_support import KEY, write_policy  # noqa: E402

from caliber_core.throttle import Throttle  # noqa: E402
from caliber_core.throttle.redis_store import RedisStore  # noqa: E402

PREVIOUS = "1331081"


def _percentile(sorted_values, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _rate(lost: int, answers: int) -> str:
    """Lost answers with an exact (Clopper-Pearson) 95% interval on the rate."""
    from scipy.stats import beta

    low = 0.0 if lost == 0 else beta.ppf(0.025, lost, answers - lost + 1)
    high = beta.ppf(0.975, lost + 1, answers - lost) if lost < answers else 1.0
    return (f"{lost} of {answers:,} answers lost from the ledger (95% interval on the rate "
            f"{100 * low:.2f}% to {100 * high:.2f}%)")


def speed(folder: Path, *, rounds: int, per_round: int) -> list[list]:
    """respond on each store URL, interleaved; rows of the speed table."""
    exe, _ = redis_executables(cli=True)
    single = Node(exe, folder / "single", free_ports(1)[0])
    single.start()
    try:
        with SentinelSet(folder / "sentinel") as sentinel, ClusterSet(folder / "cluster") as cluster:
            urls = {"one server": f"redis://127.0.0.1:{single.port}/0",
                    "Sentinel": sentinel.url(), "Sentinel, wait=1": sentinel.url("wait=1"),
                    "cluster": cluster.url(), "cluster, wait=1": cluster.url("wait=1")}
            policy = write_policy(folder, escalate_after=10**9)
            throttles = {name: Throttle.from_files(policy, key=KEY, store=url, metrics=False)
                         for name, url in urls.items()}
            for t in throttles.values():
                t.flag("acct-1", level=1)
            logits, ids = np.zeros((1, 10)), ["x"]
            times = {name: [] for name in urls}
            spent = {name: 0.0 for name in urls}
            order = list(urls)
            for _ in range(rounds):
                random.shuffle(order)
                for name in order:
                    t = throttles[name]
                    t.respond("acct-1", logits, ids)  # a warm connection
                    start_round = time.perf_counter()
                    for _ in range(per_round):
                        start = time.perf_counter()
                        r = t.respond("acct-1", logits, ids)
                        times[name].append(time.perf_counter() - start)
                        assert r.counted and r.level == 1
                    spent[name] += time.perf_counter() - start_round
            for t in throttles.values():
                t.close()
    finally:
        single.stop()
    rows = []
    for name in urls:
        lat = sorted(times[name])
        rows.append([name, f"{len(lat) / spent[name]:,.0f}", f"{_percentile(lat, 0.5) * 1e3:.2f}",
                     f"{_percentile(lat, 0.99) * 1e3:.2f}"])
    return rows


def _previous_store():
    source = subprocess.run(["git", "show", f"{PREVIOUS}:caliber_core/throttle/redis_store.py"], cwd=ROOT,
                            capture_output=True, text=True)
    if source.returncode != 0:
        return None
    spec = importlib.util.spec_from_loader("caliber_core.throttle._previous_redis_store", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source.stdout, "previous_redis_store.py", "exec"), module.__dict__)
    return module.RedisStore


def against_previous(folder: Path, *, rounds: int, per_round: int):
    """respond on one server through this release's store and the previous release's (a database each):
    for latency and for CPU per request, (this us, previous us, median per-round ratio, its quartiles)."""
    previous = _previous_store()
    if previous is None:
        return None
    exe, _ = redis_executables()
    node = Node(exe, folder / "previous", free_ports(1)[0])
    node.start()
    policy = write_policy(folder, escalate_after=10**9)
    try:
        throttles = {"this": Throttle.from_files(policy, key=KEY, metrics=False,
                                                 store=RedisStore(host="127.0.0.1", port=node.port, db=0)),
                     "previous": Throttle.from_files(policy, key=KEY, metrics=False,
                                                     store=previous(host="127.0.0.1", port=node.port, db=1))}
        for t in throttles.values():
            t.flag("acct-1", level=1)
        logits, ids = np.zeros((1, 10)), ["x"]
        medians, cpu = {name: [] for name in throttles}, {name: [] for name in throttles}
        for _ in range(rounds):
            for name in random.sample(list(throttles), 2):
                t, samples = throttles[name], []
                cpu_start = time.process_time()  # this process's CPU: less moved by other processes than wall time
                for _ in range(per_round):
                    start = time.perf_counter()
                    t.respond("acct-1", logits, ids)
                    samples.append(time.perf_counter() - start)
                cpu[name].append((time.process_time() - cpu_start) / per_round)
                medians[name].append(statistics.median(samples))
        for t in throttles.values():
            t.close()
    finally:
        node.stop()
    out = []
    for series in (medians, cpu):
        ratios = sorted(a / b for a, b in zip(series["this"], series["previous"]))
        out.append((statistics.median(series["this"]) * 1e6, statistics.median(series["previous"]) * 1e6,
                    statistics.median(ratios), ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]))
    return out


def failover(folder: Path, topology: str) -> dict:
    """One failover under four serving processes; the comparison with the ledger."""
    import redis

    from caliber_core.throttle.ledger import account_fingerprint
    from caliber_core.throttle.redis_keys import scoped_key

    policy = write_policy(folder, escalate_after=10**9)
    if topology == "Sentinel":
        with SentinelSet(folder / "redis") as sentinel:
            processes = four_processes(lambda i: [f"s{i}-{j}" for j in range(6)])
            reports = drive_through_a_kill(folder, policy, sentinel.url(), processes,
                                           lambda: sentinel.primary().kill())  # the primary at that moment
            out = compare_with_ledger(sentinel.url(), processes, reports)["processes"]
            return out, sentinel.events()
    with ClusterSet(folder / "redis") as cluster:
        victim = cluster.primaries()[0]
        owners = {}

        def owner(account):
            slot = redis.crc.key_slot(scoped_key(account_fingerprint(account), "a").encode())
            return owners.setdefault(slot, cluster.slot_owner(slot))

        def accounts_of(i):  # two on the primary to be killed, four on the others
            on, off = [], []
            for j in range(1000):
                account = f"c{i}-{j}"
                (on if owner(account) is victim else off).append(account)
                if len(on) >= 2 and len(off) >= 4:
                    return on[:2] + off[:4]
            raise RuntimeError("could not place the accounts")

        processes = four_processes(accounts_of)
        victim_slot = next(s for s in range(16384) if cluster.slot_owner(s) is victim)

        def restart_once_promoted():
            deadline = time.monotonic() + 20
            while cluster.slot_owner(victim_slot) is victim and time.monotonic() < deadline:
                time.sleep(0.05)
            victim.start()

        reports = drive_through_a_kill(folder, policy, cluster.url(), processes, victim.kill,
                                       after_kill=restart_once_promoted)
        return compare_with_ledger(cluster.url(), processes, reports)["processes"], None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, one failover per topology")
    parser.add_argument("--failovers", type=int, default=None, help="failovers per topology (default 3; 1 quick)")
    args = parser.parse_args(argv)
    try:
        redis_executables(cli=True)
    except Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failovers = args.failovers or (1 if args.quick else 3)
    rounds, per_round = (4, 100) if args.quick else (8, 250)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores", flush=True)
    fig = FigureFile("throttle-failover", "The throttle's Redis ledger on one server, Sentinel and a cluster: "
                     "speed, and what a primary's SIGKILL costs")
    with tempfile.TemporaryDirectory() as tmp:
        rows = speed(Path(tmp), rounds=rounds, per_round=per_round)
    print(rows, flush=True)
    if load > (os.cpu_count() or 1):
        fig.note(f"The machine was busy (load average {load:.1f} on {os.cpu_count()} cores at the start): these are "
                 "loaded figures, slower and more spread than a quiet machine's; the stores were interleaved, so "
                 "they compare with each other.")
    fig.table(["store", "requests/s", "p50 ms", "p99 ms"], rows,
              caption=f"`respond`, one process, one row at K = 10, a flagged account; {rounds} rounds of "
              f"{per_round} requests per store, interleaved in random order (every node on this machine, "
              "no persistence):")
    with tempfile.TemporaryDirectory() as tmp:
        previous = against_previous(Path(tmp), rounds=rounds * 2, per_round=per_round)
    if previous is None:
        fig.note(f"The previous release's store ({PREVIOUS}) is not in this checkout's history: not compared.")
    else:
        (this_us, prev_us, ratio, low, high), (this_cpu, prev_cpu, cpu_ratio, cpu_low, cpu_high) = previous
        print(previous, flush=True)
        fig.note(f"One server, `respond` through this release's store (hash-tagged keys) against the previous "
                 f"release's ({PREVIOUS}), {rounds * 2} interleaved rounds of {per_round}: median latency "
                 f"{this_us:.0f} against {prev_us:.0f} us, per-round ratio median {ratio:.2f} (interquartile "
                 f"{low:.2f} to {high:.2f}); this process's CPU per request {this_cpu:.0f} against {prev_cpu:.0f} us, "
                 f"ratio median {cpu_ratio:.2f} (interquartile {cpu_low:.2f} to {cpu_high:.2f}).")
    table, totals = [], {True: [0, 0], False: [0, 0]}  # wait -> [lost, answers] over every failover
    for topology in ("Sentinel", "cluster"):
        for n in range(failovers):
            with tempfile.TemporaryDirectory() as tmp:
                out, events = failover(Path(tmp), topology)
            print(topology, n, {k: {x: v[x] for x in ("outage_s", "counted_again_s", "lost", "answers")}
                                for k, v in out.items()}, flush=True)
            for p in out.values():
                totals[p["wait"]][0] += p["lost"]
                totals[p["wait"]][1] += p["answers"]
            waited = [p for p in out.values() if p["wait"]]
            plain = [p for p in out.values() if not p["wait"]]
            outage = [p["outage_s"] for p in out.values()]
            again = [p["counted_again_s"] for p in out.values()]
            late = sum(a is None for a in again)  # a process that had not counted again when it was stopped
            shown_outage = [x for x in outage if x is not None]
            table.append([topology, str(n + 1),
                          (f"{min(shown_outage):.2f} to {max(shown_outage):.2f}" if shown_outage else "-")
                          + (f"; {late} not counting after {GIVE_UP_S:.0f} s" if late else ""),
                          f"{max(a for a in again if a is not None):.2f}" if late < len(again) else "-",
                          "-" if events is None else f"{events['failovers']} ({events['tilt']} tilt)",
                          f"{sum(p['lost'] for p in waited)} of {sum(p['answers'] for p in waited):,}",
                          f"{sum(p['lost'] for p in plain)} of {sum(p['answers'] for p in plain):,}",
                          str(sum(p["flagged_clean"] for p in out.values()))])
    fig.table(["topology", "failover", "outage per process, s", "kill to counted again (slowest), s",
               "switches the sentinels logged", "lost, wait=1", "lost, no WAIT", "flagged served clean"], table,
              caption="The primary killed with SIGKILL under four serving processes (two with `wait=1`, two "
              "without; six accounts each, half flagged; policy `last-known`). Outage: a process's first answer "
              "not counted to its first counted answer after its last one. Lost: answers neither in the "
              "ledger's count nor in its served-uncounted record, after the processes settled. More than one "
              "switch means the sentinels also replaced a primary that was alive (answering slower than "
              "down-after-milliseconds on a loaded machine, or a sentinel in TILT); WAIT does not cover that:")
    for waited, (lost, answers) in sorted(totals.items(), reverse=True):
        fig.note(f"{'With' if waited else 'Without'} WAIT, over {2 * failovers} failovers: {_rate(lost, answers)}.")
    print(table, totals, flush=True)
    fig.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
