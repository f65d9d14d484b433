"""What group descriptors cost the throttle: one-row ``respond`` with two groups against none.

    python benchmarks/bench_throttle_groups.py            # 400 rounds per store
    python benchmarks/bench_throttle_groups.py --rounds 100

Each round serves one row at K = 1,000 four ways in random order: a bare
``Perturber.perturb`` of the same level, and ``respond`` for a flagged
account without groups, and with two (``card`` and ``org``, both flagged
below the account), on SQLite and, when ``redis-server`` is on PATH, Redis
(AOF, appendfsync everysec). Reported: medians, and the median over rounds
of the per-round ratio (with the 25th-75th percentile of those ratios), for
the whole respond and for its overhead over the bare perturb. The target is
a ratio of at most 1.3 with two groups. Writes ``docs/figures/throttle-groups.md``
(with the load average: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core import Perturber  # noqa: E402
from caliber_core.throttle import Throttle, build_policy  # noqa: E402
from caliber_core.throttle.policy import save_policy  # noqa: E402
from figure_files import FigureFile  # noqa: E402  (benchmarks/ is this script's folder)

KEY = bytes(range(32))
K = 1000
GROUPS = {"card": "fp_91c2", "org": "acme"}


def _policy(folder: Path) -> Path:
    targets = [{"kind": "retention", "requested": r, "accuracy": a, "retention": r, "agreement": None,
                "v": s * s / 4, "sigma": s, "sigma_logistic": s, "method": "exact-curve", "saturated": False,
                "side": "point", "interval": None, "attacker": None, "reference": None}
               for s, a, r in ((1.0, 0.8, 0.9), (2.0, 0.6, 0.7), (4.0, 0.4, 0.5))]
    config = {"schema": "caliber.config/v2", "model": "bench", "n_classes": K, "n_samples": 1000,
              "statistic": "median", "scale": 2.0, "clean_accuracy": 0.9, "chance": 1 / K, "fit": {},
              "targets": targets}
    (folder / "cfg.json").write_text(json.dumps(config))
    out = folder / "policy.json"
    save_policy(build_policy(folder / "cfg.json", targets=[0, 1, 2], escalate_after=10**9,
                             groups={"card": (10**9, None), "org": (10**9, None)}, out_path=out), out)
    return out


def _quartiles(values) -> tuple:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def measure(name: str, url: str, policy: Path, rounds: int) -> list:
    perturber = Perturber.from_config(json.loads((policy.parent / "cfg.json").read_text()), target=2, key=KEY)
    logits = np.random.default_rng(0).normal(size=(1, K))
    ids = ["row-0"]
    with Throttle.from_files(policy, key=KEY, store=url, metrics=True) as t:
        t.flag("acct", level=3)
        t.flag_group("card", GROUPS["card"], level=1)
        t.flag_group("org", GROUPS["org"], level=2)
        calls = {"perturb": lambda: perturber.perturb(logits, ids),
                 "no groups": lambda: t.respond("acct", logits, ids),
                 "two groups": lambda: t.respond("acct", logits, ids, groups=GROUPS)}
        for call in calls.values():  # warm: connections, scripts, caches
            for _ in range(20):
                call()
        times = {k: [] for k in calls}
        cpu = {k: [] for k in calls}
        for _ in range(rounds):
            for k in random.sample(list(calls), len(calls)):
                start, start_cpu = time.perf_counter(), time.thread_time()
                calls[k]()
                cpu[k].append(time.thread_time() - start_cpu)
                times[k].append(time.perf_counter() - start)
        assert t.respond("acct", logits, ids, groups=GROUPS).level == 3
    whole = [g / n for g, n in zip(times["two groups"], times["no groups"])]
    over = [(g - p) / (n - p) for g, n, p in zip(times["two groups"], times["no groups"], times["perturb"])
            if n > p]
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    row = [name, f"{med['perturb']:.0f}", f"{med['no groups']:.0f}", f"{med['two groups']:.0f}",
           f"{statistics.median(whole):.2f} ({_quartiles(whole)[0]:.2f}-{_quartiles(whole)[1]:.2f})",
           f"{(med['two groups'] - med['perturb']) / (med['no groups'] - med['perturb']):.2f} "
           f"({_quartiles(over)[0]:.2f}-{_quartiles(over)[1]:.2f})"]
    # This thread's CPU time: the work the request costs the serving process, less sensitive to a loaded
    # machine than the wall clock (it leaves out the Redis server's own work and any wait).
    cpu_med = {k: statistics.median(v) * 1e6 for k, v in cpu.items()}
    cpu_ratio = [g / n for g, n in zip(cpu["two groups"], cpu["no groups"]) if n > 0]
    row += [f"{cpu_med['no groups']:.0f} / {cpu_med['two groups']:.0f}",
            f"{statistics.median(cpu_ratio):.2f} ({_quartiles(cpu_ratio)[0]:.2f}-{_quartiles(cpu_ratio)[1]:.2f})"]
    print("  ".join(row), flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        policy = _policy(folder)
        rows.append(measure("sqlite", f"sqlite:///{folder / 'ledger.db'}", policy, args.rounds))
        try:
            from redis_process import Redis

            server = Redis(folder, fsync="everysec")
        except SystemExit as exc:
            server, note = None, str(exc)
        if server is not None:
            server.start()
            try:
                rows.append(measure("redis", server.url, policy, args.rounds))
            finally:
                server.stop()
    fig = FigureFile("throttle-groups", "The throttle with two group descriptors against none, one row at K = 1,000")
    fig.table(["store", "perturb us", "respond us, no groups", "respond us, two groups",
               "respond ratio (IQR)", "overhead ratio (IQR)", "process CPU us, none / two",
               "CPU ratio (IQR)"], rows,
              caption=f"Medians over {args.rounds} rounds; each round runs the three in random order. Ratios: the "
                      "median over rounds of two groups / no groups (in brackets the 25th-75th percentile of the "
                      "per-round ratios); the overhead ratio is that of respond minus the bare perturb. "
                      "The CPU columns are the serving thread's own CPU time per call (time.thread_time), "
                      "which a busy machine disturbs less than the wall clock.")
    if len(rows) == 1:
        fig.note(f"Redis not measured: {note}.")
    fig.note("Without groups a request is one SQLite transaction writing one account (one Redis script). With "
             "two groups it is still one transaction (one pipelined round trip of three scripts), writing three "
             "ledger rows and two membership rows.")
    fig.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
