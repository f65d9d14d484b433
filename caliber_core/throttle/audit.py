"""The appeal report: what an account received, level by level, with the config's intervals.

For each level the account was served at, the accuracy, retention and
agreement of that level's target as the config states them (what its sigma
delivers on the calibration sample, ``reference`` when present, else the
target's value) and the config's confidence interval. Level 0 is clean
service: the config's clean accuracy A0, retention and agreement 1.

The overall loss against clean service is the query-weighted mean of each
level's loss (A0 - accuracy, 1 - retention); its interval combines the
per-level interval ends the same way, so it holds whenever every level's
interval holds (a conservative, union-bound reading of their level).
Rows shadow mode decided at a level but served clean count as clean.

Two more records, kept apart from the queries: ``failed`` (rows counted,
then rolled back because no answer was produced) and ``served_uncounted``
(rows a serving process answered while the store was unreachable, per
process with the first and last time, written back once the store answered
again; rows of a process that stopped before that are not known here).
"""

from __future__ import annotations

from .ledger import AccountState, expired

_QUANTITIES = ("accuracy", "retention", "agreement")


def _received(policy, level: int) -> dict:
    """Point value and interval of each quantity at ``level`` (None where the config has none)."""
    config = policy.config
    if level == 0:
        a0 = config.get("clean_accuracy")
        return {"accuracy": {"value": a0, "interval": None if a0 is None else [a0, a0]},
                "retention": {"value": 1.0, "interval": [1.0, 1.0]},
                "agreement": {"value": 1.0, "interval": [1.0, 1.0]}}
    target = config["targets"][policy.levels[level].target]
    ref = target.get("reference") or {}
    interval = target.get("interval") or {}
    out = {}
    for q in _QUANTITIES:
        value = ref.get(q, target.get(q))
        bounds = interval.get(q)
        out[q] = {"value": value, "interval": None if bounds is None else [float(bounds[0]), float(bounds[1])]}
    return out


def _loss(policy, served: dict, quantity: str, best: float | None):
    """Query-weighted loss against ``best`` (clean), with its interval; None when a level lacks the value."""
    total = sum(served.values())
    if total == 0 or best is None:
        return None
    point = lo = hi = 0.0
    for level, n in served.items():
        got = _received(policy, level)[quantity]
        if got["value"] is None:
            return None
        bounds = got["interval"] or [got["value"], got["value"]]
        point += n * (best - got["value"])
        lo += n * (best - bounds[1])
        hi += n * (best - bounds[0])
    interval_known = all(_received(policy, lv)[quantity]["interval"] is not None for lv in served)
    return {"value": point / total, "interval": [lo / total, hi / total] if interval_known else None}


def audit_report(policy, fingerprint: str, state: AccountState, *, now: float, expire_after=False) -> dict:
    """The JSON-able appeal report for one account (named by its ledger fingerprint).

    Parameters
    ----------
    policy : Policy
        The policy the account was served under (its levels and config).
    fingerprint : str
        The account's ledger fingerprint (the report never holds the account id).
    state : AccountState
        The account's ledger record.
    now : float
        Unix time, to tell whether the flag has lapsed.
    expire_after : float or None, optional
        The flag lifetime to judge it by (a group's kind's); default the policy's.

    Returns
    -------
    dict
        The flag, its history, the queries and uncounted rows per level, and the
        accuracy, retention and agreement lost against clean service (with
        intervals where the config has them).
    """
    served = {}  # level actually applied -> rows
    for level, n in state.queries.items():
        clean = state.shadow.get(level, 0) if level > 0 else 0
        if n - clean:
            served[level] = served.get(level, 0) + n - clean
        if clean:
            served[0] = served.get(0, 0) + clean
    for (own, raised), n in state.lifted.items():  # rows a group served above the account's own level
        served[own] = served.get(own, 0) - n
        served[raised] = served.get(raised, 0) + n
    served = {level: n for level, n in served.items() if n > 0}
    levels = []
    for level in sorted(set(state.queries) | set(served)):
        if level > policy.top:
            continue
        lv = policy.levels[level]
        levels.append({
            "level": level, "target": lv.target, "sigma": lv.sigma,
            "queries": state.queries.get(level, 0),
            "served_clean_in_shadow": state.shadow.get(level, 0),
            "served": served.get(level, 0),
            "received": _received(policy, level),
        })
    confidence = {policy.levels[j].target: (policy.config["targets"][policy.levels[j].target].get("interval") or {})
                  .get("level") for j in range(1, policy.top + 1)}
    return {
        "account": fingerprint,
        "model": policy.config.get("model"),
        "config_sha256": policy.config_sha256,
        "flagged": state.flagged and not expired(state, now, policy.expire_after if expire_after is False
                                                 else expire_after),
        "level": state.level if state.flagged else 0,
        "reason": state.reason,
        "flagged_at": state.flagged_at,
        "first_seen": state.first_seen,
        "last_seen": state.last_seen,
        "history": [e.to_dict() for e in state.history],
        "total_queries": sum(state.queries.values()),
        "failed": {str(k): v for k, v in sorted(state.failed.items())},
        "raised_by_groups": {f"{a}->{b}": n for (a, b), n in sorted(state.lifted.items()) if n},
        "served_uncounted": [{"process": u["process"], "first": u["first"], "last": u["last"],
                              "queries": {str(k): v for k, v in sorted(u["queries"].items())}}
                             for u in state.uncounted],
        "total_served_uncounted": sum(sum(u["queries"].values()) for u in state.uncounted),
        "levels": levels,
        "interval_levels": sorted({c for c in confidence.values() if c is not None}),
        "loss_vs_clean": {
            "accuracy": _loss(policy, served, "accuracy", policy.config.get("clean_accuracy")),
            "retention": _loss(policy, served, "retention", 1.0),
            "agreement": _loss(policy, served, "agreement", 1.0),
        },
    }


def _fmt(entry, pct: bool = True) -> str:
    if entry is None or entry.get("value") is None:
        return "n/a"
    scale = 100.0 if pct else 1.0
    text = f"{entry['value'] * scale:.1f}%"
    if entry.get("interval") is not None and entry["interval"][0] != entry["interval"][1]:
        lo, hi = entry["interval"]
        text += f" ({lo * scale:.1f}-{hi * scale:.1f}%)"
    return text


def format_audit(report: dict) -> str:
    """The report as text for a person reading an appeal.

    Parameters
    ----------
    report : dict
        :func:`audit_report`'s dict.

    Returns
    -------
    str
        Lines with times in UTC and percentages with their intervals.
    """
    import datetime as dt

    def when(t):
        return "-" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    conf = "/".join(f"{c:.0%}" for c in report["interval_levels"]) or "no"
    name = (f"account {report['account']}" if "kind" not in report else
            f"group {report['account']} (kind {report['kind']}, {len(report['members'])} member(s) seen)")
    lines = [f"{name} (fingerprint) on model {report['model']}",
             f"now: {'flagged at level ' + str(report['level']) if report['flagged'] else 'not flagged'}"
             + (f", reason: {report['reason']}" if report["flagged"] and report["reason"] else ""),
             f"first seen {when(report['first_seen'])}, last seen {when(report['last_seen'])}, "
             f"{report['total_queries']:,} quer{'y' if report['total_queries'] == 1 else 'ies'}", "history:"]
    lines += [f"  {when(e['at'])}  {e['event']:<9} level {e['level']}" + (f"  ({e['reason']})" if e["reason"] else "")
              for e in report["history"]] or ["  (no flag events)"]
    lines.append(f"received per level ({conf} intervals from the config):")
    lines.append(f"  {'level':>5} {'sigma':>8} {'queries':>10} {'shadow':>8} {'served':>10}  {'accuracy':<22} "
                 f"{'retention':<22}")
    for lv in report["levels"]:
        r = lv["received"]
        lines.append(f"  {lv['level']:>5} {lv['sigma']:>8.4g} {lv['queries']:>10,} {lv['served_clean_in_shadow']:>8,}"
                     f" {lv.get('served', 0):>10,}  {_fmt(r['accuracy']):<22} {_fmt(r['retention']):<22}")
    if report.get("served_uncounted"):
        lines.append(f"served while the ledger was unreachable, not in the counts above: "
                     f"{report['total_served_uncounted']:,} quer{'y' if report['total_served_uncounted'] == 1 else 'ies'}")
        for u in report["served_uncounted"]:
            per = ", ".join(f"L{k}:{v:,}" for k, v in u["queries"].items())
            lines.append(f"  process {u['process']}: {when(u['first'])} to {when(u['last'])}  {per}")
    if report.get("raised_by_groups"):
        lines.append("served above the account's own level because of a group it was linked to (own->served): "
                     + ", ".join(f"{k}: {v:,}" for k, v in report["raised_by_groups"].items()))
    if report.get("failed"):
        lines.append("counted, then rolled back (no answer produced): "
                     + ", ".join(f"L{k}:{v:,}" for k, v in report["failed"].items()))
    if report.get("members"):
        lines.append("members seen (account fingerprint, queries, first and last seen):")
        lines += [f"  {fp}  {m['queries']:>10,}  {when(m['first_seen'])}  {when(m['last_seen'])}"
                  for fp, m in report["members"].items()]
    loss = report["loss_vs_clean"]
    lines.append(f"lost against clean service: accuracy {_fmt(loss['accuracy'])} points, "
                 f"retention {_fmt(loss['retention'])} points")
    return "\n".join(lines)
