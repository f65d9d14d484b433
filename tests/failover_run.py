"""Running serving processes through a primary's SIGKILL and comparing what they served with the ledger.

Shared by ``tests/test_throttle_failover.py`` (which asserts the bars) and
``benchmarks/bench_throttle_failover.py`` (which measures them over repeated
failovers). Each process is ``tests/failover_driver.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from caliber_core.throttle import Throttle
from caliber_core.throttle.ledger import account_fingerprint
from caliber_core.throttle.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("failover_driver.py")
#: How long after the kill the processes may take to count again before they are stopped anyway.
GIVE_UP_S = 25.0


def four_processes(accounts_of) -> list:
    """p0 and p1 with ``wait=1``, p2 and p3 without; ``accounts_of(i)`` names each one's accounts, every other flagged.

    Returns
    -------
    list of (name, query, accounts, flagged)
    """
    out = []
    for i in range(4):
        accounts = accounts_of(i)
        out.append((f"p{i}", "?wait=1" if i < 2 else "", accounts, accounts[::2]))
    return out


def drive_through_a_kill(folder: Path, policy: Path, url: str, processes, kill, *, after_kill=lambda: None,
                         traffic_s: float = 1.0) -> dict:
    """Flag the flagged accounts, start the processes, kill the primary after ``traffic_s`` of traffic,
    stop once every process counts again (or ``GIVE_UP_S`` after the kill); return each process's report.

    Parameters
    ----------
    folder : Path
        Where the control files and the processes' logs go.
    policy : Path
        The policy the processes serve (flagged accounts are flagged at level 1).
    url : str
        The store URL, without a query.
    processes : list
        From :func:`four_processes`.
    kill, after_kill : callable
        Kill the primary; then what a supervisor would do (restart it once it was replaced).

    Returns
    -------
    dict
        ``{name: report}`` (``failover_driver.py``'s JSON).
    """
    with Throttle.from_files(policy, store=url + "?wait=1", metrics=False) as admin:
        for _, _, _, flagged in processes:
            for account in flagged:
                admin.flag(account, level=1, reason="detector")
    control = folder / "control"
    control.mkdir()
    procs = []
    for name, query, accounts, flagged in processes:
        with open(control / f"{name}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(DRIVER), str(policy), url + query, str(control), name, ",".join(accounts),
                 ",".join(flagged)], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True))
    try:
        for (name, *_), proc in zip(processes, procs):
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{name} did not start: {(control / f'{name}.log').read_text()[-2000:]}")
        time.sleep(traffic_s)
        killed_at = time.time()
        kill()
        (control / "killed").write_text(repr(killed_at))
        after_kill()
        deadline = time.monotonic() + GIVE_UP_S
        names = [p[0] for p in processes]
        while time.monotonic() < deadline and not all((control / f"recovered-{n}").exists() for n in names):
            time.sleep(0.1)
        (control / "stop").write_text("stop")
        codes = [proc.wait(timeout=90) for proc in procs]
        if any(codes):
            raise RuntimeError(f"a process failed ({codes}): {(control / 'p0.log').read_text()[-2000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {name: json.loads((control / f"{name}.json").read_text()) for name, *_ in processes}


def compare_with_ledger(url: str, processes, reports: dict) -> dict:
    """What each process served against what the ledger holds for its accounts.

    Returns
    -------
    dict
        ``{"processes": {name: {...}}}`` with, per process: ``wait`` (bool),
        ``answers`` (counted and uncounted), ``counted`` (answers the client
        was told were counted), ``lost`` (answers neither counted nor
        recorded as served uncounted in the ledger), ``acknowledged_missing``
        (counted answers beyond the ledger's count), ``flagged_clean``,
        ``crossslot`` (requests refused with a cross-slot error),
        ``pending`` (what the process still owed the ledger),
        ``outage_s`` (first answer not counted to the first counted answer
        after the last one) and ``counted_again_s`` (the kill to that answer).
    """
    ledger = open_store(url)
    out = {}
    try:
        for name, query, accounts, _ in processes:
            report = reports[name]
            row = {"wait": "wait=" in query, "answers": 0, "counted": 0, "lost": 0, "acknowledged_missing": 0,
                   "flagged_clean": 0, "pending": report["pending"], "requests": report["requests"],
                   "crossslot": sum(n for e, n in report["errors"].items() if "CROSSSLOT" in e)}
            for account in accounts:
                seen = report["accounts"][account]
                state = ledger.get(account_fingerprint(account))
                in_ledger = sum(state.queries.values()) if state else 0
                uncounted = sum(sum(e["queries"].values()) for e in state.uncounted) if state else 0
                answers = seen["counted"] + seen["uncounted"]
                row["answers"] += answers
                row["counted"] += seen["counted"]
                row["lost"] += answers - (in_ledger + uncounted)
                row["acknowledged_missing"] += max(0, seen["counted"] - in_ledger)
                row["flagged_clean"] += seen["flagged_clean"]
            back, first, killed = report["counted_again"], report["first_bad"], report["killed_at"]
            row["counted_again_s"] = None if back is None else round(back - killed, 3)
            row["outage_s"] = 0.0 if first is None else (None if back is None else round(back - first, 3))
            row["latency_ms"] = report["latency_ms"]
            out[name] = row
    finally:
        ledger.close()
    return {"processes": out}
