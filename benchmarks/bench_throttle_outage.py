"""The throttle during a ledger outage: what each on_store_error choice costs, and whether counts stay exact.

A real redis-server (started here on a free port, AOF on) holds the ledger.
A serving Throttle sees two accounts before the outage (one flagged at level
2, one clean); the CLI then flags a third it has never seen. Redis is stopped
and every account (the three, plus an unseen clean one) sends ``--requests``
requests. For each choice of the policy's ``on_store_error`` the table gives
the share of requests answered and the level served (availability), how
many answers a flagged account got clean (must be 0), and, once Redis is back,
whether every answer is in the ledger as counted or as served-uncounted.
A last run restarts Redis with SIGTERM and SIGKILL under a stream of requests
and compares answers with counts.

Writes docs/figures/throttle-outage.md (through ``figure_files``: the date, the machine and this command).
Usage: python benchmarks/bench_throttle_outage.py [--requests 50]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core.cli import main as cli  # noqa: E402
from caliber_core.throttle import StoreUnavailable, Throttle  # noqa: E402
from caliber_core.throttle.policy import build_policy, save_policy  # noqa: E402
from figure_files import FigureFile  # noqa: E402  (benchmarks/ is this script's folder)
from redis_process import Redis  # noqa: E402

KEY = bytes(range(32))
CHOICES = (("refuse", None, "serve refuse"), ("last-known", None, "last-known, unseen refuse (default)"),
           ("last-known", 1, "last-known, unseen level 1"))
ACCOUNTS = ("seen, flagged L2", "seen, clean", "unseen, flagged L2", "unseen, clean")


def outage(folder: Path, config: Path, requests: int) -> list[dict]:
    rows = []
    logits, ids = np.zeros((1, 10)), ["x"]
    for mode, unseen, label in CHOICES:
        sub = folder / label.split(",")[0].replace(" ", "-") / str(unseen)
        sub.mkdir(parents=True)
        shutil.copy(config, sub / "cfg.json")
        policy = sub / "policy.json"
        save_policy(build_policy(sub / "cfg.json", targets=[0, 1], escalate_after=10**9, on_store_error=mode,
                                 unseen_level=unseen, out_path=policy), policy)
        redis = Redis(sub)
        redis.start()
        names = [f"{label}-{a}" for a in ACCOUNTS]
        cli(["throttle", "flag", names[0], "--policy", str(policy), "--store", redis.url, "--level", "2"])
        t = Throttle.from_files(policy, key=KEY, store=redis.url, metrics=False)
        answered = {n: 0 for n in names}
        for n in names[:2]:
            t.respond(n, logits, ids)
            answered[n] += 1
        cli(["throttle", "flag", names[2], "--policy", str(policy), "--store", redis.url, "--level", "2"])
        redis.stop()
        out = {"choice": label}
        clean_to_flagged = 0
        for account, n in zip(ACCOUNTS, names):
            served, levels = 0, set()
            for _ in range(requests):
                try:
                    r = t.respond(n, logits, ids)
                except StoreUnavailable:
                    continue
                served += 1
                levels.add(r.level)
                clean_to_flagged += int("flagged" in account and r.level == 0)
            answered[n] += served
            out[account] = f"{served / requests:.0%}" + (f" at L{'/'.join(map(str, sorted(levels)))}" if served else "")
        redis.start()
        t.respond(names[1], logits, ids)  # the store answers again: the outage tally is written back
        answered[names[1]] += 1
        exact = True
        for n in names:
            report = t.audit(n)
            exact &= report["total_queries"] + report["total_served_uncounted"] == answered[n]
        out["flagged served clean"] = clean_to_flagged
        out["answers = counted + served uncounted"] = "yes" if exact else "NO"
        rows.append(out)
        t.close()
        redis.stop()
    return rows


_LOAD = """
import sys, json, logging, numpy as np
logging.getLogger("caliber_core.throttle").setLevel(logging.ERROR)
from caliber_core.throttle import Throttle, StoreUnavailable
t = Throttle.from_files(sys.argv[1], key=bytes(range(32)), store=sys.argv[2], metrics=False)
served = refused = 0
stop = open(sys.argv[3])
print("ready", flush=True)
while True:
    try:
        t.respond("acct", np.zeros((1, 10)), ["x"]); served += 1
    except StoreUnavailable:
        refused += 1
    if stop.read() == "stop":
        break
    stop.seek(0)
while True:
    try:
        t.respond("acct", np.zeros((1, 10)), ["x"]); served += 1; break
    except StoreUnavailable:
        pass
print(json.dumps({"served": served, "refused": refused}))
"""


def restarts(folder: Path, config: Path) -> dict:
    sub = folder / "restarts"
    sub.mkdir()
    shutil.copy(config, sub / "cfg.json")
    policy = sub / "policy.json"
    save_policy(build_policy(sub / "cfg.json", targets=[0], escalate_after=10**9, on_store_error="refuse",
                             out_path=policy), policy)
    redis = Redis(sub)
    redis.start()
    stop = sub / "stop"
    stop.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", _LOAD, str(policy), redis.url, str(stop)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    proc.stdout.readline()
    schedule = ((False, 0.2), (False, 2.5), (True, 0.2), (True, 2.5), (False, 0.2), (True, 0.5))
    for kill, down in schedule:
        time.sleep(0.5)
        redis.stop(kill=kill)
        time.sleep(down)
        redis.start()
    time.sleep(0.3)
    stop.write_text("stop")
    result = json.loads(proc.communicate(timeout=120)[0])
    t = Throttle.from_files(policy, store=redis.url, metrics=False)
    state = t.state("acct")
    redis.stop()
    return {"restarts": len(schedule), "answered": result["served"], "refused": result["refused"],
            "counted": sum(state.queries.values()), "moved to failed": sum(state.failed.values())}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args(argv)
    logging.getLogger("caliber_core.throttle").setLevel(logging.ERROR)  # one warning per degraded decision
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="caliber-outage-") as tmp:
        folder = Path(tmp)
        config = ROOT / "tests" / "reference" / "throttle_config.json"
        if not config.exists():
            subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                            "--retention", "0.9", "0.75", "--out", str(folder / "cfg.json"), "--quiet"], cwd=ROOT,
                           check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
            config = folder / "cfg.json"
        rows = outage(folder, config, args.requests)
        again = restarts(folder, config)
    head = list(rows[0])
    fig = FigureFile("throttle-outage", "The throttle during a Redis outage, by on_store_error choice")
    fig.table(head, [[r[h] for h in head] for r in rows],
              caption=f"Redis stopped under a serving process; {args.requests} requests per account; the share "
                      "answered and the level served (the process had seen the first two accounts; the CLI "
                      "flagged the third during its life):")
    fig.table(["answered", "refused", "counted in the ledger", "counted, then moved to failed"],
              [[f"{again['answered']:,}", f"{again['refused']:,}", f"{again['counted']:,}",
                f"{again['moved to failed']:,}"]],
              caption=f"Redis restarted {again['restarts']} times (SIGTERM and SIGKILL, down 0.2 to 2.5 s) under "
                      "one stream of requests, policy `serve: refuse`:")
    fig.note(f"{time.time() - start:.0f} s in all.")
    fig.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
