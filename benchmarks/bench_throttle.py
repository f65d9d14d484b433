"""The throttle's costs and guarantees, measured: overhead, timing side channel, concurrency, faults, bad input.

    python benchmarks/bench_throttle.py            # everything (about two minutes on 2 busy cores)
    python benchmarks/bench_throttle.py --quick    # fewer repetitions, 4 x 2,000 requests

1. Overhead: ``respond`` for a flagged account at K = 1,000 against
   ``Perturber.perturb`` of the same level, SQLite and Redis stores, for
   requests of 1, 16 and 256 rows (median of interleaved repetitions).
2. Timing side channel: median latency of clean and flagged requests (each
   level) on the same store, interleaved in random order.
3. Concurrency: 4 processes x 20,000 requests over 4 flagged accounts on one
   store (threshold 10,000): exact counters, one escalation per account.
4. Faults: a worker killed with SIGKILL mid-stream (the ledger against the
   requests it saw answered); a Redis restart (SIGTERM and SIGKILL) and an outage.
5. Bad input: hostile policy files, each refused with one line.

Redis parts need ``redis-server`` on PATH (started here on 127.0.0.1, a free
port, a temporary folder: AOF with appendfsync everysec for speed and
concurrency, appendfsync always for the restart); they are skipped with a
note otherwise. Prints load averages: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core import Perturber  # noqa: E402
from caliber_core.throttle import PolicyError, Throttle, build_policy, load_policy  # noqa: E402
from caliber_core.throttle.policy import save_policy  # noqa: E402
from redis_process import Redis  # noqa: E402  (benchmarks/ is this script's folder)

KEY = bytes(range(32))
K = 1000


def write_config(folder: Path, *, n_classes: int = K) -> Path:
    targets = [{"kind": "retention", "requested": r, "accuracy": a, "retention": r, "agreement": None,
                "v": s * s / 4, "sigma": s, "sigma_logistic": s, "method": "exact-curve", "saturated": False,
                "side": "point", "interval": None, "attacker": None, "reference": None}
               for s, a, r in ((1.0, 0.8, 0.9), (2.0, 0.6, 0.7), (4.0, 0.4, 0.5))]
    config = {"schema": "caliber.config/v2", "model": "bench", "n_classes": n_classes, "n_samples": 1000,
              "statistic": "median", "scale": 2.0, "clean_accuracy": 0.9, "chance": 1 / n_classes, "fit": {},
              "targets": targets}
    path = folder / f"cfg-{n_classes}.json"
    path.write_text(json.dumps(config))
    return path


def write_policy(folder: Path, *, levels=(0, 1), escalate_after=10**9, n_classes=K, name="policy.json") -> Path:
    out = folder / name
    save_policy(build_policy(write_config(folder, n_classes=n_classes), targets=list(levels),
                             escalate_after=escalate_after, out_path=out), out)
    return out


# ---------------------------------------------------------------------- 1, 2
def _median_us(samples):
    return statistics.median(samples) * 1e6


def _paired(samples, reference):
    """Median over rounds of the ratio of two timings taken in the same round (robust to load drifting)."""
    return statistics.median(a / b for a, b in zip(samples, reference))


def overhead(folder: Path, stores: dict, reps: int) -> None:
    print("\n1. overhead at K = 1,000: respond (flagged, top level) against Perturber.perturb (same level); "
          "times are medians, ratios the median of per-round ratios (each round runs all three in random order)")
    policy = write_policy(folder, levels=(0, 1, 2))
    config = json.loads((folder / "cfg-1000.json").read_text())
    perturber = Perturber.from_config(config, target=2, key=KEY)
    throttles = {name: Throttle.from_files(policy, key=KEY, store=url, metrics=True) for name, url in stores.items()}
    for t in throttles.values():
        t.flag("acct", level=3)
    print(f"   {'rows':>5} {'perturb us':>11} " + " ".join(f"{name + ' us':>11} {'ratio':>6}" for name in throttles))
    for rows in (1, 16, 256):
        logits = np.random.default_rng(0).normal(size=(rows, K))
        ids = [f"row-{i}" for i in range(rows)]
        n = max(20, reps // max(1, rows // 8))
        times = {"perturb": [], **{name: [] for name in throttles}}
        for _ in range(n):
            for name in random.sample(list(times), len(times)):
                start = time.perf_counter()
                if name == "perturb":
                    perturber.perturb(logits, ids)
                else:
                    throttles[name].respond("acct", logits, ids)
                times[name].append(time.perf_counter() - start)
        base = _median_us(times["perturb"])
        cells = " ".join(f"{_median_us(times[name]):>11.1f} {_paired(times[name], times['perturb']):>6.2f}"
                         for name in throttles)
        print(f"   {rows:>5} {base:>11.1f} {cells}")
    for t in throttles.values():
        t.close()


def side_channel(folder: Path, stores: dict, reps: int) -> None:
    print(f"\n2. timing side channel: latency by account, {reps} rounds of one request each in random order "
          "(K = 1,000); paired: the median over rounds of (flagged / clean) - 1")
    policy = write_policy(folder, levels=(0, 1, 2), name="side.json")
    for name, url in stores.items():
        with Throttle.from_files(policy, key=KEY, store=url, metrics=True) as t:
            t.flag("level-1", level=1)
            t.flag("level-3", level=3)
            for rows in (1, 16):
                logits = np.random.default_rng(1).normal(size=(rows, K))
                ids = [f"r{i}" for i in range(rows)]
                accounts = ["clean", "level-1", "level-3"]
                times = {a: [] for a in accounts}
                for _ in range(reps):
                    for a in random.sample(accounts, 3):
                        start = time.perf_counter()
                        t.respond(a, logits, ids)
                        times[a].append(time.perf_counter() - start)
                med = {a: _median_us(v) for a, v in times.items()}
                paired = {a: _paired(times[a], times["clean"]) - 1 for a in accounts[1:]}
                worst = max(abs(med[a] - med["clean"]) / med["clean"] for a in accounts[1:])
                print(f"   {name:>6} rows={rows:<3} medians: clean {med['clean']:.1f} us, level 1 "
                      f"{med['level-1']:.1f} us, level 3 {med['level-3']:.1f} us (largest gap {worst:.1%}); "
                      f"paired: level 1 {paired['level-1']:+.1%}, level 3 {paired['level-3']:+.1%} against clean")


# ---------------------------------------------------------------------- 3, 4
_WORKER = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from caliber_core.throttle import Throttle
t = Throttle.from_files(sys.argv[1], key=bytes(range(32)), store=sys.argv[2], metrics=False)
n, tick = int(sys.argv[3]), sys.argv[4] == "tick"
logits = np.zeros((1, 10))
for i in range(n):
    t.respond("acct-%d" % (i % 4), logits, ["x%d" % i])
    if tick:
        sys.stdout.buffer.write(b"."); sys.stdout.buffer.flush()
""".format(root=str(ROOT))


def _worker(policy, url, n, *, tick=False):
    return subprocess.Popen([sys.executable, "-c", _WORKER, str(policy), url, str(n), "tick" if tick else "-"],
                            stdout=subprocess.PIPE)


def concurrency(folder: Path, stores: dict, per_process: int) -> None:
    threshold = per_process * 4 // 4 // 2  # each account gets per_process requests in all; escalate halfway
    print(f"\n3. concurrency: 4 processes x {per_process:,} requests over 4 flagged accounts "
          f"(threshold {threshold:,} queries at level 1)")
    policy = write_policy(folder, levels=(0, 1), escalate_after=threshold, n_classes=10, name="conc.json")
    for name, url in stores.items():
        if name == "sqlite":
            url = f"sqlite:///{folder / 'conc.db'}"
        with Throttle.from_files(policy, store=url, metrics=False) as t:
            for a in range(4):
                t.flag(f"acct-{a}", level=1)
        start = time.perf_counter()
        procs = [_worker(policy, url, per_process) for _ in range(4)]
        codes = [p.wait() for p in procs]
        seconds = time.perf_counter() - start
        with Throttle.from_files(policy, store=url, metrics=False) as t:
            states = [t.state(f"acct-{a}") for a in range(4)]
        exact = all(s.queries == {1: threshold, 2: per_process - threshold} for s in states)
        once = all([e.event for e in s.history] == ["flagged", "escalated"] for s in states)
        print(f"   {name:>6}: exit codes {codes}, {4 * per_process / seconds:,.0f} requests/s; counters exact: "
              f"{exact}; each account escalated exactly once, at its threshold: {once}")


def _ticks(proc, until, timeout=60.0):
    os.set_blocking(proc.stdout.fileno(), False)
    acked, deadline = 0, time.monotonic() + timeout
    while acked < until and time.monotonic() < deadline:
        acked += len(proc.stdout.read() or b"")
        time.sleep(0.005)
    return acked


def faults(folder: Path, stores: dict) -> None:
    print("\n4. faults")
    policy = write_policy(folder, levels=(0, 1), escalate_after=10**9, n_classes=10, name="fault.json")
    for name, url in stores.items():
        url = f"sqlite:///{folder / 'fault.db'}" if name == "sqlite" else url[: url.rindex("/")] + "/1"
        proc = _worker(policy, url, 10**8, tick=True)
        acked = _ticks(proc, 2000)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked += len(proc.stdout.read() or b"")
        with Throttle.from_files(policy, store=url, metrics=False) as t:
            total = sum(sum(t.state(f"acct-{a}").queries.values()) for a in range(4))
        print(f"   {name:>6} SIGKILL mid-stream: {acked:,} requests answered, {total:,} in the ledger "
              f"(lost {acked - total if total <= acked else 0}, in flight counted {max(0, total - acked)})")


def redis_restart(folder: Path, server: Redis) -> None:
    policy = write_policy(folder, levels=(0, 1), escalate_after=10**9, n_classes=10, name="restart.json")
    logits = np.zeros((1, 10))
    with Throttle.from_files(policy, key=KEY, store=server.url, metrics=False) as t:
        t.flag("acct", level=1)
        for kill in (False, True):
            counted = served_at_level = 0
            before = sum(t.state("acct").queries.values())
            for i in range(200):
                if i == 100:
                    server.stop(kill=kill)
                if i == 150:
                    server.start()
                r = t.respond("acct", logits, [f"x{i}"])
                counted += r.counted
                served_at_level += r.level == 1
            after = sum(t.state("acct").queries.values())
            print(f"   redis {'SIGKILL' if kill else 'SIGTERM'} restart (AOF, appendfsync always), 50 requests "
                  f"during the outage: 200 served at level 1: {served_at_level == 200}; counted {counted}, "
                  f"ledger grew by {after - before}; flag kept: {t.state('acct').flagged}")


# ---------------------------------------------------------------------- 5
def hostile(folder: Path) -> None:
    print("\n5. hostile policy files, each refused with one line:")
    good = json.loads(write_policy(folder, n_classes=10, name="good.json").read_text())
    cases = {
        "wrong digest": lambda d: d["config"].update(sha256="f" * 64),
        "unknown level": lambda d: d["levels"][1].update(target=42),
        "negative threshold": lambda d: d["escalation"].update(after_queries=-1),
        "config of another K": lambda d: d["config"].update(n_classes=1000),
        "huge numbers": lambda d: d["escalation"].update(after_queries=10**100),
        "huge expiry": lambda d: d["expiry"].update(after_seconds=1e300),
        "thousands of levels": lambda d: d.update(levels=d["levels"] * 1000),
    }
    for name, change in cases.items():
        doc = json.loads(json.dumps(good))
        change(doc)
        path = folder / "hostile.json"
        path.write_text(json.dumps(doc))
        try:
            load_policy(path)
            print(f"   {name}: ACCEPTED (a defect)")
        except PolicyError as exc:
            text = str(exc)
            print(f"   {name}: {'one line' if chr(10) not in text else 'SEVERAL LINES'}: {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps, per_process = (200, 2000) if args.quick else (1000, 20000)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-throttle-") as tmp:
        folder = Path(tmp)
        stores = {"sqlite": f"sqlite:///{folder / 'ledger.db'}"}
        server = durable = None
        if shutil.which("redis-server"):
            # Speed and concurrency on Redis's usual AOF setting (fsync once a second);
            # the restart test on appendfsync always, so that nothing acknowledged can be lost.
            (folder / "fast").mkdir()
            (folder / "durable").mkdir()
            server, durable = Redis(folder / "fast", fsync="everysec", log=True), Redis(folder / "durable", fsync="always", log=True)
            server.start()
            durable.start()
            stores["redis"] = server.url
        else:
            print("redis-server not found: the Redis parts are skipped")
        try:
            overhead(folder, stores, reps)
            side_channel(folder, stores, reps)
            concurrency(folder, stores, per_process)
            faults(folder, stores)
            if durable is not None:
                redis_restart(folder, durable)
            hostile(folder)
        finally:
            for s in (server, durable):
                if s is not None:
                    s.stop()
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("throttle", "--quick"), "The throttle: overhead, timing side channel, concurrency, faults, hostile policies"):
        main()
