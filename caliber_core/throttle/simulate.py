"""Synthetic accounts replayed through a policy: who reaches which level, and what each receives.

Four scenarios, each account sending its queries in requests of ``batch``
rows spread evenly over ``duration`` simulated seconds, through a real
:class:`~caliber_core.throttle.Throttle` on a scratch ledger (the SQLite store's
own statements on an in-memory database: the same decisions, no fsync):

* ``benign``  a heavy legitimate user flagged by mistake before its first query;
* ``thief``   one account running the whole campaign, flagged by the detector
  once it has sent ``detect_after`` queries (and flagged again, at level 1,
  whenever an expired flag leaves it unflagged);
* ``sybil-NN`` the same campaign split over ``sybils`` accounts, each flagged
  only if its own share reaches ``detect_after``;
* ``linked`` the same campaign split over ``sybils`` accounts that share one
  group descriptor (a payment card, say): the accounts take turns, and the
  detector flags the *group* once the group's total reaches
  ``detect_after``; every member is served the group's level. Its
  trajectory is plotted against the group's total queries, so it reaches
  each level after the thief's number of queries when the kind's threshold
  is the accounts' (within one request). A policy that declares no group
  kind is simulated with one, ``link``, at the accounts' threshold and
  expiry. The other accounts each carry a descriptor of their own, so the
  benign user shows that nobody else's traffic moves an unlinked account.
* ``repeater`` the campaign sent as ``repeats`` copies of each input. Exact
  repeats get identical answers under both seedings (no gain, but they
  count towards escalation). Near-duplicates differ by seeding: under
  per-input seeding each is a fresh draw, and averaging ``repeats`` of them
  cuts a level's sigma to sigma / sqrt(repeats) (Proposition 2(i)); under
  consistent seeding they get nearly the same noise, and the effective
  sigma stays the level's sigma. Reported as its effective sigma.

What each account received comes from the audit (the config's values and
intervals). With an extraction report (``caliber.extraction/v1``), each
level's sigma also gets the surrogate retention its frontier measured there
(interpolated in log sigma between the two nearest frontier points, with the
spread over seeds), or None outside the measured range.
"""

from __future__ import annotations

import json
import math
import os

from dataclasses import replace

from .audit import audit_report
from .ledger import AccountState, account_fingerprint, expired
from .policy_schema import GroupKind
from .scratch_store import ScratchStore
from .throttle import Throttle

DEFAULT_SYBILS = 20
DEFAULT_REPEATS = 4
DEFAULT_DURATION = 7 * 86400.0


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def surrogate_at(report: dict, sigma: float) -> dict | None:
    """Surrogate retention at ``sigma`` from an extraction report's frontier.

    Parameters
    ----------
    report : dict
        A ``caliber.extraction/v1`` report (:func:`load_extraction_report`).
    sigma : float
        The noise of a level (0: clean, where the surrogate keeps everything).

    Returns
    -------
    dict or None
        ``{"mean", "sd", "n"}``: linear in log sigma between the two measured
        sigmas around ``sigma`` (the larger sd, the smaller seed count); None
        outside the measured range.
    """
    if sigma == 0:
        return {"mean": 1.0, "sd": 0.0, "n": None}
    points = sorted((p["sigma"], p["surrogate_retention"]) for p in report.get("frontier", [])
                    if p.get("sigma") and (p.get("surrogate_retention") or {}).get("mean") is not None)
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if s0 <= sigma <= s1:
            w = 0.0 if s1 == s0 else (math.log(sigma) - math.log(s0)) / (math.log(s1) - math.log(s0))
            sd = [x for x in (r0.get("sd"), r1.get("sd")) if x is not None]
            return {"mean": (1 - w) * r0["mean"] + w * r1["mean"], "sd": max(sd) if sd else None,
                    "n": min(r0.get("n") or 0, r1.get("n") or 0) or None}
    return None


def load_extraction_report(path) -> dict:
    """Read a ``caliber.extraction/v1`` JSON report (from ``extract --json``).

    Parameters
    ----------
    path : str or os.PathLike
        The report file.

    Returns
    -------
    dict
        The parsed report.

    Raises
    ------
    ValueError
        The file cannot be read, is not JSON, or is not such a report (one line naming the path).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{os.fspath(path)}: cannot read the extraction report ({exc})") from None
    if not isinstance(report, dict) or report.get("schema") != "caliber.extraction/v1":
        raise ValueError(f"{os.fspath(path)}: not a caliber.extraction/v1 report")
    return report


def _in_force(state, now, expire_after) -> bool:
    return state.flagged and not expired(state, now, expire_after)


def _run_account(throttle, name, *, queries, batch, duration, detect_after, flag_first, clock, start, kind):
    """Send ``queries`` rows for ``name`` (with a descriptor of its own); return its trajectory
    [(queries so far, level of last row)] and the queries it had sent before its first row at each level."""
    n_requests = max(1, math.ceil(queries / batch))
    sent, trajectory, first_at = 0, [(0, 0)], {}
    # The account's flag as the ledger holds it, from the state each decision wrote rather than a read per
    # request: a flag is always followed by a decision before the next check.
    state, expire_after = AccountState(), throttle.policy.expire_after
    if flag_first:
        clock.now = start
        throttle.flag(name, level=1, reason="simulated: flagged by mistake")
    for i in range(n_requests):
        clock.now = start + duration * i / n_requests
        # The detector (re-)flags a campaign account whose flag is not in force; a mistake is made once.
        if not flag_first and sent >= detect_after and not _in_force(state, clock.now, expire_after):
            throttle.flag(name, level=1, reason="simulated detector")
        rows = min(batch, queries - sent)
        decision = throttle.decide(name, rows, groups={kind: f"own-{name}"})
        state = decision.state
        offset = sent
        for level, n in decision.segments:
            first_at.setdefault(level, offset)
            offset += n
        sent += rows
        trajectory.append((sent, decision.segments[-1][0]))
    return trajectory, first_at


def _run_linked(throttle, names, *, share, batch, duration, detect_after, clock, start, kind):
    """The accounts ``names`` take turns sending ``share`` rows each under one descriptor.

    Returns the trajectory against the group's total [(total so far, level of last row)], the rows served
    per level for each member, and the group's total before the first row at each level.
    """
    value = "campaign-1"
    n_each = max(1, math.ceil(share / batch))
    n_requests = n_each * len(names)
    total, trajectory = 0, [(0, 0)]
    sent = {name: 0 for name in names}
    served = {name: {} for name in names}
    first_at = {}
    group, expire_after = AccountState(), throttle.policy.group_kind(kind).expire_after  # as in _run_account
    for k in range(n_requests):
        name = names[k % len(names)]
        if sent[name] >= share:
            continue
        clock.now = start + duration * k / n_requests
        # The detector watches the group as it watches an account: it (re-)flags it once the group's total passes.
        if total >= detect_after and not _in_force(group, clock.now, expire_after):
            throttle.flag_group(kind, value, level=1, reason="simulated detector (linked accounts)")
        rows = min(batch, share - sent[name])
        decision = throttle.decide(name, rows, groups={kind: value})
        group = decision.groups[0][1].state
        offset = total
        for level, n in decision.segments:
            first_at.setdefault(level, offset)
            served[name][level] = served[name].get(level, 0) + n
            offset += n
        sent[name] += rows
        total += rows
        trajectory.append((total, decision.segments[-1][0]))
    return trajectory, served, first_at


def simulate(policy, *, queries: int | None = None, detect_after: int | None = None, batch: int = 100,
             duration: float = DEFAULT_DURATION, sybils: int = DEFAULT_SYBILS, repeats: int = DEFAULT_REPEATS,
             extraction: dict | None = None, linked: bool = True) -> dict:
    """Replay the scenarios through ``policy``; a JSON-able report.

    Parameters
    ----------
    policy : Policy
    queries : int, optional
        The campaign's size (rows). Default: enough for one account to reach
        the top level and spend as many queries there again.
    detect_after : int, optional
        Queries a detector needs before it flags an account (default: the
        policy's escalation threshold).
    batch : int, default 100
        Rows per request.
    duration : float, default 7 days
        Seconds over which each account spreads its queries (expiry can lapse inside it).
    sybils, repeats : int
        Accounts the campaign is split over; copies of each input the repeater sends.
    extraction : dict, optional
        A ``caliber.extraction/v1`` report (surrogate retention per level).
    linked : bool, default True
        Add the linked campaign (the sybils sharing one group descriptor).

    Returns
    -------
    dict
        The levels, one summary per account (``linked`` last, with its members'
        top levels, and ``first_at_level``: the group's total queries before its
        first row at each level; the thief's is there too).
    """
    e = policy.escalate_after
    queries = int(queries) if queries is not None else e * (policy.top + 1) + e
    detect_after = e if detect_after is None else int(detect_after)
    for name, value, low in (("queries", queries, 1), ("batch", batch, 1), ("sybils", sybils, 1),
                             ("repeats", repeats, 1), ("detect_after", detect_after, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**9:
            raise ValueError(f"{name} must be an integer in [{low}, 1e9], got {value!r}")
    if not (isinstance(duration, (int, float)) and math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a positive number of seconds, got {duration!r}")
    accounts = [("benign", queries, True)] + [("thief", queries, False)]
    share = max(1, queries // sybils)
    accounts += [(f"sybil-{i + 1:02d}", share, False) for i in range(sybils)]
    accounts += [("repeater", queries, False)]
    if not policy.groups:  # the linked campaign needs a kind: one at the accounts' own rule
        policy = replace(policy, groups=(GroupKind("link", policy.escalate_after, policy.expire_after),))
    kind = policy.groups[0]
    clock = _Clock()
    throttle = Throttle(policy, store=ScratchStore(), clock=clock, metrics=False)
    try:
        out = []
        for name, n, by_mistake in accounts:
            trajectory, first_at = _run_account(throttle, name, queries=n, batch=batch, duration=duration,
                                                detect_after=detect_after, flag_first=by_mistake, clock=clock,
                                                start=0.0, kind=kind.name)
            clock.now = duration
            report = audit_report(policy, account_fingerprint(name), throttle.state(name), now=clock.now)
            out.append(_account_summary(policy, name, report, trajectory, repeats) | {"first_at_level": first_at})
        if linked:
            members = [f"linked-{i + 1:02d}" for i in range(sybils)]
            trajectory, served, first_at = _run_linked(
                throttle, members, share=share, batch=batch, duration=duration, detect_after=detect_after,
                clock=clock, start=0.0, kind=kind.name)
            clock.now = duration
            out.append(_linked_summary(policy, throttle, kind, members, trajectory, served, first_at))
    finally:
        throttle.close()
    levels = [{"level": lv.index, "target": lv.target, "sigma": lv.sigma,
               "surrogate_retention": None if extraction is None else surrogate_at(extraction, lv.sigma)}
              for lv in policy.levels]
    return {"queries": queries, "detect_after": detect_after, "batch": batch, "duration": duration,
            "sybils": sybils, "repeats": repeats, "seeding": policy.seeding, "levels": levels, "accounts": out,
            "extraction": None if extraction is None else extraction.get("model"),
            "group_kind": {"name": kind.name, "escalate_after": kind.escalate_after,
                           "expire_after": kind.expire_after}}


def _linked_summary(policy, throttle, kind, members, trajectory, served, first_at) -> dict:
    """The linked campaign as one row: what its members received together, from the levels they were served."""
    total = {}
    for per in served.values():
        for level, n in per.items():
            total[level] = total.get(level, 0) + n
    # What the members received (served levels), weighed as the audit weighs an account's.
    shadow = total if policy.shadow else {}
    report = audit_report(policy, "linked", AccountState(queries=total, shadow={k: v for k, v in shadow.items()
                                                                                 if k > 0}), now=0.0)
    group = throttle.group_state(kind.name, "campaign-1")
    return {"account": "linked", "members": len(members), "max_level": max((lv for lv, n in total.items() if n),
                                                                           default=0),
            "queries_per_level": total, "flag_events": [e.event for e in group.history],
            "accuracy_lost": report["loss_vs_clean"]["accuracy"], "retention_lost": report["loss_vs_clean"]["retention"],
            "trajectory": trajectory, "first_at_level": first_at,
            "member_max_levels": {name: max((lv for lv, n in per.items() if n), default=0)
                                  for name, per in served.items()}}


def _account_summary(policy, name, report, trajectory, repeats) -> dict:
    per_level = {lv["level"]: lv["queries"] for lv in report["levels"]}
    reached = max((lv for lv, n in per_level.items() if n), default=0)
    loss = report["loss_vs_clean"]
    summary = {"account": name, "max_level": reached, "queries_per_level": per_level,
               "flag_events": [e["event"] for e in report["history"]],
               "accuracy_lost": loss["accuracy"], "retention_lost": loss["retention"],
               "trajectory": trajectory}
    if name == "repeater":
        # Consistent noise is a smooth function of the logits: near-duplicates share it, averaging gains nothing.
        shrink = math.sqrt(repeats) if policy.seeding == "per-input" else 1.0
        summary["effective_sigma_near_duplicates"] = {
            lv: policy.levels[lv].sigma / shrink for lv, n in per_level.items() if n}
    return summary


def format_simulation(result: dict) -> str:
    """The simulation as text tables.

    Parameters
    ----------
    result : dict
        :func:`simulate`'s report.

    Returns
    -------
    str
        The levels, then one line per account: its top level, queries per
        level, the accuracy lost with its interval, and its flag events.
    """
    lines = [f"{result['seeding']} seeding; "
             f"campaign {result['queries']:,} queries in requests of {result['batch']}; detector flags after "
             f"{result['detect_after']:,}; {result['sybils']} sybils; repeater sends each input "
             f"{result['repeats']}x", "levels:"]
    for lv in result["levels"]:
        sur = lv["surrogate_retention"]
        text = "" if sur is None else (f"  surrogate keeps {sur['mean']:.1%}"
                                       + (f" (sd {sur['sd']:.1%} over {sur['n']} seeds)" if sur.get("n") else ""))
        lines.append(f"  level {lv['level']}: sigma {lv['sigma']:.4g}{text}")
    head = f"{'account':<10} {'top':>3}  {'queries per level':<34} {'accuracy lost (interval)':<26} events"
    kind = result.get("group_kind")
    lines += ["", head]
    for a in result["accounts"]:
        per = ", ".join(f"L{lv}:{n:,}" for lv, n in sorted(a["queries_per_level"].items()) if n)
        acc = a["accuracy_lost"]
        acc_text = "n/a" if acc is None else f"{acc['value']:.1%}" + (
            f" ({acc['interval'][0]:.1%}-{acc['interval'][1]:.1%})" if acc["interval"] else "")
        counts = {e: a["flag_events"].count(e) for e in dict.fromkeys(a["flag_events"])}
        events = ", ".join(f"{e} x{n}" if n > 1 else e for e, n in counts.items()) or "-"
        lines.append(f"{a['account']:<10} {a['max_level']:>3}  {per:<34} {acc_text:<26} {events}")
        if a["account"] == "linked":
            thief = next((t for t in result["accounts"] if t["account"] == "thief"), None)
            reach = ", ".join(f"L{lv} after {n:,}" + ("" if thief is None or lv not in thief["first_at_level"] else
                                                     f" (thief {thief['first_at_level'][lv]:,})")
                              for lv, n in sorted(a["first_at_level"].items()) if lv > 0)
            lines.append(f"{'':<10}     {a['members']} accounts sharing one {kind['name']} descriptor, flagged as a "
                         f"group; reaches {reach or 'no flagged level'} queries in total (events are the group's)")
        if "effective_sigma_near_duplicates" in a:
            eff = ", ".join(f"L{lv}: {s:.4g}" for lv, s in sorted(a["effective_sigma_near_duplicates"].items()))
            why = ("each near-duplicate is a fresh draw" if result["seeding"] == "per-input" else
                   "near-duplicates get nearly the same noise")
            lines.append(f"{'':<10}     near-duplicates averaged x{result['repeats']}: effective sigma {eff} "
                         f"({result['seeding']} seeding: {why}); exact repeats get identical answers")
    return "\n".join(lines)
