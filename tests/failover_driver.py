"""One serving process under a failover: drives its accounts through ``respond`` and reports what it served.

    python tests/failover_driver.py POLICY STORE_URL CONTROL_DIR NAME ACCOUNTS FLAGGED

``ACCOUNTS`` and ``FLAGGED`` are comma-separated account ids. The process
prints ``ready`` once its Throttle is built, then sends one-row requests
round-robin until ``CONTROL_DIR/stop`` exists. ``CONTROL_DIR/killed`` holds
the Unix time the primary was killed; once the process has answered 50
counted requests in a row after its first uncounted or refused one (or 3 s
after the kill passed without any), it writes ``CONTROL_DIR/recovered-NAME``.
After ``stop`` it keeps requesting until nothing it owes the ledger is left
(requests in doubt, rows served uncounted), then writes
``CONTROL_DIR/NAME.json``: per account the answers counted and uncounted, the
refusals and the answers a flagged account got at level 0; the errors seen;
and the times of the first bad answer after the kill and of the first counted
answer after the last bad one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caliber_core.throttle import StoreUnavailable, Throttle  # noqa: E402

KEY = bytes(range(32))
RECOVERED_AFTER = 50


def main(argv: list[str]) -> int:
    policy, url, control, name, accounts, flagged = argv
    control = Path(control)
    accounts, flagged = accounts.split(","), set(filter(None, flagged.split(",")))
    t = Throttle.from_files(policy, key=KEY, store=url, metrics=False)
    logits, ids = np.zeros((1, 10)), ["x"]
    tally = {a: {"counted": 0, "uncounted": 0, "refused": 0, "flagged_clean": 0} for a in accounts}
    errors, events, latencies = {}, [], []
    killed_at = None
    streak, seen_bad, recovered = 0, False, False
    print("ready", flush=True)

    def one(account: str) -> str:
        start = time.perf_counter()
        try:
            r = t.respond(account, logits, ids)
        except StoreUnavailable as exc:
            text = str(exc).split(": ", 1)[-1][:80]
            errors[text] = errors.get(text, 0) + 1
            tally[account]["refused"] += 1
            return "r"
        latencies.append(time.perf_counter() - start)
        tally[account]["counted" if r.counted else "uncounted"] += 1
        if account in flagged and r.level == 0:
            tally[account]["flagged_clean"] += 1
        return "c" if r.counted else "u"

    i = 0
    stop, killed = control / "stop", control / "killed"
    while not stop.exists():
        code = one(accounts[i % len(accounts)])
        i += 1
        now = time.time()
        if killed_at is None and killed.exists():
            killed_at = float(killed.read_text() or now)
        if killed_at is not None:
            events.append((now, code))
            if code != "c":
                seen_bad, streak = True, 0
            else:
                streak += 1
            if not recovered and ((seen_bad and streak >= RECOVERED_AFTER) or (not seen_bad and now > killed_at + 3)):
                recovered = True
                (control / f"recovered-{name}").write_text("1")
    deadline = time.monotonic() + 30
    while t._outages.pending() and time.monotonic() < deadline:  # settle what is owed to the ledger
        one(accounts[i % len(accounts)])
        i += 1
    bad = [at for at, code in events if code != "c"]
    first_bad = bad[0] if bad else None
    back = next((at for at, code in events if code == "c" and (not bad or at > bad[-1])), None)
    report = {"accounts": tally, "errors": errors, "killed_at": killed_at, "first_bad": first_bad,
              "counted_again": back, "pending": t._outages.pending(), "requests": i,
              "latency_ms": sorted(round(x * 1e3, 3) for x in latencies)}
    (control / f"{name}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
