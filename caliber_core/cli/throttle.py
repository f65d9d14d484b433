"""``caliber throttle {init,flag,unflag,status,audit,simulate,migrate-store}``.

Bad input (a hostile policy, an unknown level, a bad store URL) is one line on
stderr and exit status 2, through the CLI's common handler; an unreachable
store is one line and exit 2 as well. Account ids are never printed: the
ledger names accounts by fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .arguments import positive_int, seconds


STORE_HELP = ("sqlite:///PATH, redis://HOST:PORT/DB, redis+sentinel://HOST:PORT[,...]/SERVICE[/DB] or "
              "redis+cluster://HOST:PORT[,...] (each Redis form takes ?wait=N)")


def _unseen(text: str):
    if text == "refuse":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'refuse' or a level >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 'refuse' or a level >= 1 (never clean), got {value}")
    return value


def _group_spec(text: str) -> tuple:
    """``KIND=N`` or ``KIND=N:SECONDS``: a group kind, its escalation threshold and (optionally) its flag lifetime."""
    kind, sep, rest = text.partition("=")
    after, _, expire = rest.partition(":")
    if not sep or not kind:
        raise argparse.ArgumentTypeError(f"must be KIND=N or KIND=N:SECONDS, got {text[:60]!r}")
    return kind, positive_int(after), None if not expire else seconds(expire)


def _descriptor(text: str) -> tuple:
    """``KIND=VALUE`` (or ``KIND`` alone, for status: every flagged group); the value is never echoed."""
    kind, sep, value = text.partition("=")
    if not kind or (sep and not value):
        raise argparse.ArgumentTypeError("must be KIND=VALUE (for example card=fp_91c2)")
    return kind, value or None


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``throttle`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``throttle`` parser.
    """
    throttle = sub.add_parser("throttle", help="serve a config to flagged accounts: policy, ledger, audit")
    tsub = throttle.add_subparsers(dest="throttle_command", required=True)

    init = tsub.add_parser("init", help="write a caliber.policy/v1 file for a config")
    init.add_argument("config", help="the calibrated config JSON the policy serves")
    init.add_argument("--levels", type=int, nargs="+", required=True, metavar="I",
                      help="config target index served at level 1, 2, ... (sigmas must increase)")
    init.add_argument("--escalate-after", type=positive_int, required=True, metavar="N",
                      help="queries at a level before a flagged account moves up one")
    init.add_argument("--expire-after", type=seconds, default=None, metavar="SECONDS",
                      help="a flag lapses this long after it was set (default: never)")
    init.add_argument("--shadow", action="store_true", help="decide and record, but serve clean")
    init.add_argument("--on-store-error", choices=("last-known", "refuse"), default="last-known",
                      help="when the store is unreachable: serve an account the last level this process saw "
                      "for it, uncounted (default), or refuse every request")
    init.add_argument("--unseen", type=_unseen, default="refuse", metavar="refuse|LEVEL",
                      help="during an outage, what an account this process has not seen gets: refuse "
                      "(default) or a flagged level >= 1 (never clean)")
    init.add_argument("--start-degraded", action="store_true",
                      help="let a server start while its store is unreachable (default: refuse to start)")
    init.add_argument("--group", type=_group_spec, action="append", default=[], metavar="KIND=N[:SECONDS]",
                      help="count requests by a group descriptor too (card, org, ...): a flagged group moves up "
                      "one level after N queries at a level; its flag lapses after SECONDS (default: as "
                      "--expire-after). Repeat for each kind")
    init.add_argument("--key-file", default=None, metavar="KEYFILE",
                      help="check now that the throttle can serve the policy with this key (a consistent "
                      "config serves only the key it was calibrated with)")
    init.add_argument("--out", required=True, help="where to write the policy JSON")

    def ledger_args(p, account: str):
        if account == "required":
            p.add_argument("account", nargs="?", help="the account id (stored as a fingerprint only)")
        elif account == "optional":
            p.add_argument("account", nargs="?", help="one account (default: every flagged account)")
        p.add_argument("--group", type=_descriptor, default=None, metavar="KIND=VALUE",
                       help="a group instead of an account (a kind the policy declares; the value is kept as a "
                       "fingerprint only)" + ("; --group KIND alone: every flagged group" if account == "optional"
                                              else ""))
        p.add_argument("--policy", required=True, help="the policy JSON")
        p.add_argument("--store", required=True, help=STORE_HELP)
        p.add_argument("--json", action="store_true", help="print JSON")

    flag = tsub.add_parser("flag", help="flag an account (or a group: --group KIND=VALUE) at a level")
    ledger_args(flag, "required")
    flag.add_argument("--level", type=int, default=1, help="the level to serve (default 1)")
    flag.add_argument("--reason", default="", help="why (one line, kept in the history)")
    unflag = tsub.add_parser("unflag", help="serve an account clean again (a group: its members return to their "
                             "own levels)")
    ledger_args(unflag, "required")
    unflag.add_argument("--reason", default="", help="why (one line, kept in the history)")
    ledger_args(tsub.add_parser("status", help="one account's ledger entry, or every flagged account (--group: groups)"),
                "optional")
    ledger_args(tsub.add_parser("audit", help="what an account received, for an appeal (--group: a group's history and members)"),
                "required")

    migrate = tsub.add_parser("migrate-store", help="move a Redis ledger of an earlier version to the "
                              "hash-tagged key layout (once, with every server stopped)")
    migrate.add_argument("--store", required=True, help="redis://..., or the primary's redis+sentinel://...")
    migrate.add_argument("--json", action="store_true", help="print JSON")

    sim = tsub.add_parser("simulate", help="replay synthetic accounts through a policy")
    sim.add_argument("policy", help="the policy JSON")
    sim.add_argument("--queries", type=positive_int, default=None,
                     help="the campaign's size in queries (default: from the escalation threshold)")
    sim.add_argument("--detect-after", type=int, default=None, metavar="N",
                     help="queries before the detector flags an account (default: the escalation threshold)")
    sim.add_argument("--batch", type=positive_int, default=100, help="rows per request (default 100)")
    sim.add_argument("--sybils", type=positive_int, default=20, help="accounts splitting the campaign")
    sim.add_argument("--repeats", type=positive_int, default=4, help="copies of each input the repeater sends")
    sim.add_argument("--duration", type=seconds, default=7 * 86400.0,
                     help="seconds each account spreads its queries over (default 7 days)")
    sim.add_argument("--extraction", default=None, metavar="REPORT",
                     help="an `extract --json` report: the surrogate retention at each level's sigma")
    sim.add_argument("--json", action="store_true", help="print JSON")
    return throttle


def run(args) -> int:
    """Run one ``throttle`` subcommand (init, flag, unflag, status, audit, simulate).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``throttle`` options; ``throttle_command`` picks the subcommand.

    Returns
    -------
    int
        The subcommand's exit status.

    Raises
    ------
    ValueError
        A policy the throttle refuses, a bad store URL, or an unreachable
        store (turned into one line, exit 2, by the CLI's handler); other
        bad input raises ValueError directly.
    """
    from ..throttle.groups import DescriptorError
    from ..throttle.policy import PolicyError
    from ..throttle.stores import StoreUnavailable, StoreURLError

    try:
        return _COMMANDS[args.throttle_command](args)
    except (PolicyError, StoreURLError, DescriptorError) as exc:
        raise ValueError(str(exc)) from None
    except StoreUnavailable as exc:
        raise ValueError(f"store unreachable: {exc}") from None


def _print(obj, as_json: bool, text: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    else:
        print(text)


def _cmd_init(args) -> int:
    from ..throttle.policy import build_policy, save_policy

    groups = {}
    for kind, after, expire in args.group:
        if kind in groups:
            raise ValueError(f"--group {kind} is given twice")
        groups[kind] = (after, args.expire_after if expire is None else expire)
    doc = build_policy(args.config, targets=args.levels, escalate_after=args.escalate_after,
                       expire_after=args.expire_after, shadow=args.shadow, on_store_error=args.on_store_error,
                       unseen_level=None if args.unseen == "refuse" else args.unseen,
                       start_degraded=args.start_degraded, groups=groups or None, out_path=args.out)
    # Build what the throttle builds, so init refuses what a server would (a wrong key included).
    from ..throttle.levels import check_servable
    from ..throttle.policy import parse_policy

    key = None
    if args.key_file is not None:
        from ..serving.keys import read_key_file

        key = read_key_file(args.key_file)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    checked = check_servable(parse_policy(doc, base_dir=out_dir), key=key)
    save_policy(doc, args.out)
    from ..config import load_config, saturation_message

    targets = load_config(args.config)["targets"]
    for level in doc["levels"][1:]:
        print(f"level {level['level']}: config target {level['target']}, sigma {level['sigma']:.5g}")
        if targets[level["target"]].get("saturated"):
            print(f"warning: level {level['level']}: {saturation_message(targets[level['target']])}",
                  file=sys.stderr)
    expiry = "never" if args.expire_after is None else f"{args.expire_after:,.0f} s after the flag"
    print(f"escalate after {args.escalate_after:,} queries at a level; flags expire {expiry}"
          + ("; shadow mode (decide and record, serve clean)" if args.shadow else ""))
    if not checked:
        print(f"{doc['seeding']} seeding: pass --key-file to check now that your key serves this config "
              "(the server refuses any other key at start)")
    for kind, spec in doc.get("groups", {}).items():
        lifetime = spec["expiry"]["after_seconds"]
        print(f"group {kind}: a flagged group escalates after {spec['escalation']['after_queries']:,} queries at a "
              f"level; its flags expire {'never' if lifetime is None else f'{lifetime:,.0f} s after the flag'}")
    print(f"seeding {doc['seeding']}; store unreachable: serve {doc['on_store_error']['serve']}, unseen accounts "
          f"{doc['on_store_error']['unseen']}, at start {doc['on_store_error']['start']}")
    print(f"policy written to {args.out}")
    return 0


def _throttle(args):
    from ..throttle.throttle import Throttle

    return Throttle.from_files(args.policy, store=args.store, metrics=False)


def _status_line(s: dict) -> str:
    queries = ", ".join(f"L{k}:{v:,}" for k, v in s["queries"].items()) or "no queries"
    state = (f"flagged at level {s['level']} (sigma {s['sigma']:.4g})" if s["flagged"] else "not flagged")
    lapsed = " (flag lapsed: expires at its next request)" if s.get("flag_lapsed") else ""
    reason = f", reason: {s['reason']}" if s["flagged"] and s["reason"] else ""
    name = f"account {s['account']}" if "account" in s else f"group {s['group']}"
    return f"{name}: {state}{lapsed}{reason}; {queries}"


def _one(args, *, required: bool = True):
    """The account or the group (``--group``) a command names: exactly one of them."""
    if args.group is not None and args.account is not None:
        raise ValueError("name an account or --group KIND=VALUE, not both")
    if required and args.group is None and args.account is None:
        raise ValueError("name an account, or a group with --group KIND=VALUE")
    return args.group


def _cmd_flag(args) -> int:
    group = _one(args)
    with _throttle(args) as t:
        s = (t.flag(args.account, level=args.level, reason=args.reason) if group is None else
             t.flag_group(*group, level=args.level, reason=args.reason))
    _print(s, args.json, _status_line(s))
    return 0


def _cmd_unflag(args) -> int:
    group = _one(args)
    with _throttle(args) as t:
        s = t.unflag(args.account, reason=args.reason) if group is None else t.unflag_group(*group, reason=args.reason)
    _print(s, args.json, _status_line(s))
    return 0


def _cmd_status(args) -> int:
    group = _one(args, required=False)
    with _throttle(args) as t:
        if group is None:
            s = t.status(args.account)
        else:
            s = t.group_status(*group) if group[1] else t.group_status()
    if args.account is not None or (group is not None and group[1]):
        _print(s, args.json, _status_line(s))
    else:
        what = "groups" if group is not None else "accounts"
        _print(s, args.json, "\n".join(_status_line(x) for x in s["flagged"]) or f"no flagged {what}")
    return 0


def _cmd_audit(args) -> int:
    from ..throttle.audit import format_audit

    group = _one(args)
    with _throttle(args) as t:
        report = t.audit(args.account) if group is None else t.group_audit(*group)
    _print(report, args.json, format_audit(report))
    return 0


def _cmd_simulate(args) -> int:
    from ..throttle.policy import load_policy
    from ..throttle.simulate import format_simulation, load_extraction_report, simulate

    policy = load_policy(args.policy)
    extraction = None if args.extraction is None else load_extraction_report(args.extraction)
    result = simulate(policy, queries=args.queries, detect_after=args.detect_after, batch=args.batch,
                      duration=args.duration, sybils=args.sybils, repeats=args.repeats, extraction=extraction)
    _print(result, args.json, format_simulation(result))
    return 0


def _cmd_migrate_store(args) -> int:
    from ..throttle.redis_migrate import migrate_layout
    from ..throttle.redis_store import RedisStore
    from ..throttle.stores import open_store

    store = open_store(args.store)
    if not isinstance(store, RedisStore):
        raise ValueError("migrate-store moves a Redis ledger; a SQLite ledger has one layout")
    try:
        moved = migrate_layout(store)
        store.ping()  # the layout check now passes
    finally:
        store.close()
    _print(moved, args.json, f"moved {moved['accounts']:,} account(s) ({moved['keys']:,} keys, "
           f"{moved['flagged']:,} flagged) to the hash-tagged layout")
    return 0


_COMMANDS = {"init": _cmd_init, "flag": _cmd_flag, "unflag": _cmd_unflag, "status": _cmd_status,
             "audit": _cmd_audit, "simulate": _cmd_simulate,
             "migrate-store": _cmd_migrate_store}
