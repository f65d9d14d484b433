"""Group descriptors: declared in the policy, refused when hostile, counted, escalated and flagged like accounts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from throttle_support import KEY, write_config, write_policy

from caliber_core.cli import main
from caliber_core.throttle import Throttle, load_policy
from caliber_core.throttle.groups import DescriptorError, group_fingerprint
from caliber_core.throttle.ledger import highest_segments
from caliber_core.throttle.policy import PolicyError, build_policy


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _policy(tmp_path, groups={"card": (5, None), "org": (8, 3600.0)}, **options):
    write_config(tmp_path)
    doc = build_policy(tmp_path / "cfg.json", targets=[0, 1, 2], escalate_after=options.pop("escalate_after", 10),
                       groups=groups, out_path=tmp_path / "p.json", **options)
    (tmp_path / "p.json").write_text(json.dumps(doc))
    return tmp_path / "p.json"


def _throttle(tmp_path, store=None, **options):
    path = _policy(tmp_path, **options)
    clock = Clock()
    t = Throttle.from_files(path, key=KEY, store=store or f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock,
                            metrics=False)
    return t, clock


# ---------------------------------------------------------------- policy
def test_a_policy_declares_group_kinds_and_a_v1_file_without_them_reads_unchanged(tmp_path):
    policy = load_policy(_policy(tmp_path))
    assert [(g.name, g.escalate_after, g.expire_after) for g in policy.groups] == [("card", 5, None),
                                                                                    ("org", 8, 3600.0)]
    (tmp_path / "again.json").write_text(json.dumps(policy.to_dict()))
    assert load_policy(tmp_path / "again.json").groups == policy.groups
    plain = load_policy(write_policy(tmp_path, name="plain.json"))
    assert plain.groups == () and "groups" not in json.loads((tmp_path / "plain.json").read_text())


@pytest.mark.parametrize("groups, message", [
    ([1, 2], "policy 'groups' must be an object"),
    ({"Card": {}}, "kind 'Card' must be a lowercase identifier"),
    ({"card": 5}, "policy 'groups.card' must be an object"),
    ({"card": {"escalation": {"after_queries": 0}, "expiry": {"after_seconds": None}}},
     "groups.card.escalation.after_queries must be an integer"),
    ({"card": {"escalation": {"after_queries": 5}}}, "policy 'groups.card.expiry' must be an object"),
    ({"card": {"escalation": {"after_queries": 5}, "expiry": {"after_seconds": -1}}},
     "groups.card.expiry.after_seconds must be null"),
    ({"card": {"escalation": {"after_queries": 5}, "expiry": {"after_seconds": 1}, "limit": 3}},
     "groups.card has unknown field(s): limit"),
    ({f"k{i}": {"escalation": {"after_queries": 5}, "expiry": {"after_seconds": 1}} for i in range(17)},
     "declares 17 kinds: at most 16"),
])
def test_malformed_group_kinds_are_refused_at_load_naming_the_field(tmp_path, groups, message):
    doc = json.loads(_policy(tmp_path).read_text())
    doc["groups"] = groups
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "bad.json")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_init_writes_group_kinds(tmp_path, capsys):
    config = write_config(tmp_path)
    code = main(["throttle", "init", str(config), "--levels", "0", "1", "--escalate-after", "100",
                 "--expire-after", "600", "--group", "card=5000", "--group", "org=800:60",
                 "--out", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert code == 0 and "group card: a flagged group escalates after 5,000 queries" in out
    policy = load_policy(tmp_path / "p.json")
    assert [(g.name, g.escalate_after, g.expire_after) for g in policy.groups] == [("card", 5000, 600.0),
                                                                                    ("org", 800, 60.0)]
    for bad, message in ((["--group", "card"], "must be KIND=N"), (["--group", "card=x"], "not an integer"),
                         (["--group", "Card=5"], "must be a lowercase identifier"),
                         (["--group", "card=5", "--group", "card=6"], "--group card is given twice")):
        try:
            code = main(["throttle", "init", str(config), "--levels", "0", "--escalate-after", "3", *bad,
                         "--out", str(tmp_path / "q.json")])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and not (tmp_path / "q.json").exists(), (bad, err)


# ---------------------------------------------------------------- descriptors
def test_highest_segments_takes_the_highest_level_row_by_row():
    assert highest_segments(((0, 10),)) == ((0, 10),)
    assert highest_segments(((1, 4), (2, 6)), ((0, 10),), ((3, 1), (0, 9))) == ((3, 1), (1, 3), (2, 6))
    assert highest_segments(((2, 3), (3, 2)), ((2, 5),)) == ((2, 3), (3, 2))


HOSTILE = [
    ({"crad": "x"}, "group kind 'crad' is not declared by the policy (declared: card, org)"),
    ({f"k{i}": "x" for i in range(17)}, "at most 16 group descriptors, got 17"),
    ({"card": "x" * 257}, "group card: the value must be 1..256 bytes of UTF-8, got 257"),
    ({"card": "é" * 129}, "got 258"),
    ({"card": ""}, "got 0"),
    ({"card": "a\x00b"}, "group card: the value holds a NUL character"),
    ({"card": "\udcff"}, "group card: the value is not valid UTF-8"),
    ({"card": b"fp"}, "group card: the value must be a string, got bytes"),
    ({"card": 7}, "the value must be a string, got int"),
    ({7: "x"}, "a int kind is not declared"),
    (["card"], "groups must be a mapping"),
]


@pytest.mark.parametrize("groups, message", HOSTILE)
def test_hostile_descriptors_are_refused_in_one_line_before_anything_is_counted(tmp_path, groups, message):
    t, _ = _throttle(tmp_path)
    with t:
        t.flag_group("card", "x", level=1)
        before = (t.state("a"), t.group_state("card", "x"), t.store.groups(flagged_only=False))
        for call in (lambda: t.respond("a", np.zeros(10), "id", groups=groups),
                     lambda: t.decide("a", 3, groups=groups), lambda: t.grant("a", rows=3, groups=groups)):
            with pytest.raises(DescriptorError) as info:
                call()
            text = str(info.value)
            assert message in text and "\n" not in text
            assert "x" * 20 not in text and "fp" not in text.split(":")[-1]  # never the value
        assert (t.state("a"), t.group_state("card", "x"), t.store.groups(flagged_only=False)) == before


def test_group_values_are_stored_as_fingerprints_only(tmp_path):
    t, _ = _throttle(tmp_path)
    with t:
        t.decide("acct", 3, groups={"card": "fp_91c2_secret", "org": "acme-secret"})
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.db*"))
    assert b"secret" not in raw and group_fingerprint("card", "fp_91c2_secret").encode() in raw


# ---------------------------------------------------------------- counting and levels
@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    from throttle_support import redis_server

    with redis_server(tmp_path) as server:
        yield server.url


def test_each_row_gets_the_highest_level_of_its_account_and_groups(tmp_path, store_url):
    t, _ = _throttle(tmp_path, store_url)
    with t:
        t.flag_group("card", "c1", level=1)
        d = t.decide("a", 3, groups={"card": "c1", "org": "o1"})
        assert d.segments == ((1, 3),) and d.state.level == 0 and not d.state.flagged
        # card escalates after 5 rows at its level: this request crosses it
        d = t.decide("a", 4, groups={"card": "c1"})
        assert d.segments == ((1, 2), (2, 2)) and [e.event for e in d.events] == ["escalated"]
        t.flag("a", level=3)
        assert t.decide("a", 1, groups={"card": "c1"}).segments == ((3, 1),)
        g = t.group_state("card", "c1")
        assert (g.flagged, g.level, g.queries) == (True, 2, {1: 5, 2: 3})
        assert t.group_state("org", "o1").queries == {0: 3}
        assert t.state("a").queries == {0: 7, 3: 1}
        # what the account received above its own level, for its appeal
        assert t.state("a").lifted == {(0, 1): 5, (0, 2): 2}
        audit = t.audit("a")
        assert audit["raised_by_groups"] == {"0->1": 5, "0->2": 2}
        assert {lv["level"]: lv["served"] for lv in audit["levels"]} == {0: 0, 1: 5, 2: 2, 3: 1}
        assert audit["loss_vs_clean"]["accuracy"]["value"] > 0
        members = t.group_audit("card", "c1")["members"]
        assert list(members.values())[0]["queries"] == 8 and len(members) == 1
        # a request without groups is the account's own level
        t.unflag("a")
        assert t.decide("a", 1).segments == ((0, 1),)


def test_a_flagged_groups_member_is_never_served_clean_and_unflagging_returns_it_to_its_own_level(
        tmp_path, store_url):
    t, _ = _throttle(tmp_path, store_url, groups={"card": (1000, None)})
    with t:
        logits = np.random.default_rng(0).normal(size=(4, 10))
        ids = [f"r{i}" for i in range(4)]
        clean = t.respond("member", logits, ids, groups={"card": "c1"})
        assert clean.level == 0 and np.array_equal(clean.logits, logits)
        t.flag_group("card", "c1", level=2, reason="chargeback ring")
        for _ in range(20):
            r = t.respond("member", logits, ids, groups={"card": "c1"})
            assert r.level == 2 and not np.allclose(r.logits, logits)
        assert not t.state("member").flagged
        status = t.group_status("card", "c1")
        assert status["flagged"] and status["kind"] == "card" and status["reason"] == "chargeback ring"
        assert t.group_status()["flagged"][0]["group"] == status["group"]
        t.unflag_group("card", "c1")
        assert t.respond("member", logits, ids, groups={"card": "c1"}).level == 0
        t.flag("member", level=1)
        assert t.respond("member", logits, ids, groups={"card": "c1"}).level == 1
        history = [e["event"] for e in t.group_audit("card", "c1")["history"]]
        assert history == ["flagged", "unflagged"]


def test_a_group_flag_lapses_by_its_kinds_expiry(tmp_path, store_url):
    t, clock = _throttle(tmp_path, store_url)  # org flags lapse after 3600 s, the account's never
    with t:
        t.flag_group("org", "o1", level=1)
        assert t.decide("a", 1, groups={"org": "o1"}).level == 1
        clock.now += 3600
        assert t.decide("a", 1, groups={"org": "o1"}).level == 0
        assert [e["event"] for e in t.group_audit("org", "o1")["history"]] == ["flagged", "expired"]


def test_shadow_mode_counts_and_escalates_groups_but_serves_clean(tmp_path, store_url):
    t, _ = _throttle(tmp_path, store_url, shadow=True)
    with t:
        t.flag_group("card", "c1", level=1)
        logits = np.ones((6, 10))
        r = t.respond("a", logits, [str(i) for i in range(6)], groups={"card": "c1"})
        assert r.shadow and r.level == 2 and np.array_equal(r.logits, logits)
        g = t.group_state("card", "c1")
        assert g.level == 2 and g.shadow == {1: 5, 2: 1}


def test_a_void_uncounts_the_account_and_its_groups(tmp_path, store_url):
    t, _ = _throttle(tmp_path, store_url)
    with t:
        r = t.respond("a", np.zeros((2, 10)), ["x", "y"], groups={"card": "c1"})
        t.void(r)
        assert t.state("a").failed == {0: 2} and t.state("a").queries == {0: 0}
        assert t.group_state("card", "c1").failed == {0: 2}
        t.flag_group("card", "c1", level=2)
        r = t.respond("a", np.zeros((2, 10)), ["x", "y"], groups={"card": "c1"})
        assert t.state("a").lifted == {(0, 2): 2}
        t.void(r)
        t.void(r)  # twice: nothing more
        assert t.state("a").lifted == {} and t.state("a").failed == {0: 4}
        assert t.audit("a")["loss_vs_clean"]["accuracy"] is None  # nothing served


def test_the_grant_carries_the_groups_level(tmp_path):
    from caliber_core.throttle.grants import grant_key, policy_digest, verify_grant

    t, clock = _throttle(tmp_path)
    with t:
        t.flag_group("card", "c1", level=2)
        token = t.grant("a", rows=1, groups={"card": "c1"})
        grant = verify_grant(token, signing_key=grant_key(KEY), digest=policy_digest(t.policy), top=t.policy.top,
                             now=clock.now)
        assert grant.level == 2


# ---------------------------------------------------------------- four processes, both stores
_WORKER = """
import sys
from caliber_core.throttle import Throttle
policy, store, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Throttle.from_files(policy, store=store, metrics=False) as t:
    for j in range(n):
        account = (me + j) % 50
        t.decide(f"acct-{account:02d}", 1, groups={"card": f"card-{account % 5}"})
"""


def _four_processes(tmp_path, store):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = _policy(tmp_path, groups={"card": (500, None)}, escalate_after=10)
    with Throttle.from_files(path, store=store, metrics=False) as t:
        for g in range(5):
            t.flag_group("card", f"card-{g}", level=1, reason="ring")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(path), store, str(i), "2000"], cwd=root)
             for i in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    with Throttle.from_files(path, store=store, metrics=False) as t:
        for a in range(50):
            state = t.state(f"acct-{a:02d}")
            assert state.queries == {0: 160} and not state.flagged, a
            assert sum(state.lifted.values()) == 160 and {own for own, _ in state.lifted} == {0}, a
        for g in range(5):
            state = t.group_state("card", f"card-{g}")
            # 1,600 rows each: 500 at level 1, 500 at level 2, the rest at the top
            assert state.queries == {1: 500, 2: 500, 3: 600}, g
            assert [(e.event, e.level) for e in state.history] == [("flagged", 1), ("escalated", 2), ("escalated", 3)]
            members = t.group_audit("card", f"card-{g}")["members"]
            assert len(members) == 10 and {m["queries"] for m in members.values()} == {160}


def test_four_processes_count_every_account_and_group_exactly_on_sqlite(tmp_path):
    _four_processes(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")


def test_four_processes_count_every_account_and_group_exactly_on_redis(tmp_path):
    from throttle_support import redis_server

    with redis_server(tmp_path) as server:
        _four_processes(tmp_path, server.url)


def test_a_lost_redis_reply_is_retried_with_its_token_and_counted_once(tmp_path, monkeypatch):
    import redis
    from throttle_support import redis_server

    with redis_server(tmp_path) as server:
        t, _ = _throttle(tmp_path, server.url)
        with t:
            t.flag_group("card", "c1", level=1)
            real, lost = redis.connection.Connection.read_response, []

            def read_response(self, *args, **kwargs):
                reply = real(self, *args, **kwargs)  # the script ran; its reply is lost on the way back
                if not lost:
                    lost.append(1)
                    raise redis.exceptions.ConnectionError("reply lost")
                return reply

            monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)
            d = t.decide("a", 3, groups={"card": "c1", "org": "o1"})
            monkeypatch.undo()
            assert lost and d.segments == ((1, 3),)
            assert t.state("a").queries == {0: 3} and t.group_state("card", "c1").queries == {1: 3}
            assert t.group_state("org", "o1").queries == {0: 3}


def test_the_cli_flags_reads_audits_and_unflags_a_group(tmp_path, capsys):
    path = _policy(tmp_path)
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    base = ["--policy", str(path), "--store", store]

    def run(*argv):
        try:
            code = main(["throttle", *argv])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("flag", "--group", "card=fp_secret_91c2", "--level", "2", "--reason", "ring", *base)
    assert code == 0 and out.startswith("group g:card:") and "flagged at level 2" in out and "secret" not in out
    with Throttle.from_files(path, store=store, metrics=False) as t:
        t.decide("acct-1", 4, groups={"card": "fp_secret_91c2"})
        t.decide("acct-2", 1, groups={"card": "fp_secret_91c2"})
    code, out, _ = run("status", "--group", "card", *base)
    assert code == 0 and "flagged at level 3" in out and "L2:5" in out  # 5 rows: it escalated
    code, out, _ = run("status", "--group", "card=fp_secret_91c2", "--json", *base)
    assert json.loads(out)["kind"] == "card"
    code, out, _ = run("audit", "--group", "card=fp_secret_91c2", *base)
    assert code == 0 and "2 member(s) seen" in out and "members seen" in out and "flagged" in out
    code, out, _ = run("audit", "--group", "card=fp_secret_91c2", "--json", *base)
    assert sorted(m["queries"] for m in json.loads(out)["members"].values()) == [1, 4]
    code, out, _ = run("unflag", "--group", "card=fp_secret_91c2", *base)
    assert code == 0 and "not flagged" in out
    code, out, _ = run("status", "--group", "card", *base)
    assert out.strip() == "no flagged groups"
    for argv, message in ((["flag", "--group", "crad=x"], "group kind 'crad' is not declared"),
                          (["flag", "acct", "--group", "card=x"], "not both"),
                          (["flag"], "name an account, or a group"),
                          (["flag", "--group", "card="], "must be KIND=VALUE")):
        code, out, err = run(*argv, *base)
        last = err.strip().splitlines()[-1]  # argparse's own refusals print its usage above
        assert code == 2 and message in last and last.count("error") == 1 and "Traceback" not in err, (argv, err)


# ---------------------------------------------------------------- simulation
@pytest.mark.parametrize("escalate_after, batch, expire_after", [(10_000, 100, None), (1_000, 70, None),
                                                                  (2_000, 100, 2 * 86400.0)])
def test_the_linked_campaign_reaches_each_level_after_the_thiefs_number_of_queries(
        tmp_path, escalate_after, batch, expire_after):
    from caliber_core.throttle.simulate import simulate

    policy = load_policy(write_policy(tmp_path, escalate_after=escalate_after, expire_after=expire_after))
    result = simulate(policy, batch=batch)
    by = {a["account"]: a for a in result["accounts"]}
    thief, linked = by["thief"], by["linked"]
    # flags that lapse every two days keep both below the top; otherwise both reach it
    assert set(linked["first_at_level"]) == set(thief["first_at_level"]) == set(range(3 if expire_after else 4))
    for level, n in thief["first_at_level"].items():
        assert abs(linked["first_at_level"][level] - n) <= batch, (level, n, linked["first_at_level"])
    assert linked["max_level"] == thief["max_level"] and set(linked["member_max_levels"].values()) == {
        thief["max_level"]}
    assert linked["flag_events"] == thief["flag_events"]
    # unlinked, the same split stays at level 0
    assert {by[f"sybil-{i:02d}"]["max_level"] for i in range(1, 21)} == {0}


def test_the_unlinked_benign_users_levels_do_not_move_with_anyone_elses_traffic(tmp_path):
    from caliber_core.throttle.simulate import simulate

    policy = load_policy(write_policy(tmp_path, escalate_after=1_000, expire_after=86400.0))
    alone = simulate(policy, linked=False, sybils=1)
    crowded = simulate(policy, linked=True, sybils=20)
    benign = [a for a in alone["accounts"] if a["account"] == "benign"][0]
    assert benign == [a for a in crowded["accounts"] if a["account"] == "benign"][0]
    assert benign["trajectory"][1][1] == 1 and benign["max_level"] >= 1


# ---------------------------------------------------------------- the FastAPI example
def test_the_fastapi_example_reads_descriptors_from_the_trusted_headers(tmp_path):
    from fastapi.testclient import TestClient

    from examples.serve_fastapi import create_app, group_headers, linear_model

    t, _ = _throttle(tmp_path, groups={"card": (1000, None), "billing_org": (1000, None)})
    assert group_headers(t.policy) == {"card": "X-Caliber-Group-Card", "billing_org": "X-Caliber-Group-Billing-Org"}
    assert group_headers(t.policy, "card=X-Billing-Card")["card"] == "X-Billing-Card"
    with pytest.raises(ValueError, match="not KIND=HEADER for a kind the policy declares"):
        group_headers(t.policy, "crad=X-Card")
    with t:
        client = TestClient(create_app(t, linear_model(4, 10), group_header_names=group_headers(
            t.policy, "card=X-Billing-Card")))
        body = {"inputs": [[0.1, 0.2, 0.3, 0.4]]}
        auth = {"Authorization": "Bearer acct-1"}
        clean = client.post("/v1/classify", json=body, headers=auth | {"X-Billing-Card": "fp_1"}).json()["logits"]
        t.flag_group("card", "fp_1", level=2)
        noisy = client.post("/v1/classify", json=body, headers=auth | {"X-Billing-Card": "fp_1"}).json()["logits"]
        other = client.post("/v1/classify", json=body, headers=auth | {"X-Billing-Card": "fp_2"}).json()["logits"]
        assert noisy != clean and other == clean
        assert t.group_state("card", "fp_1").queries == {0: 1, 2: 1}
        before = (t.state("acct-1"), t.group_state("card", "fp_1"))
        r = client.post("/v1/classify", json=body, headers=auth | {"X-Billing-Card": "x" * 300})
        assert r.status_code == 400 and "1..256 bytes" in r.json()["detail"] and "xxxx" not in r.text
        # raw header bytes that are not UTF-8 (the test client would re-encode them, so the request is built here)
        from fastapi import HTTPException
        from starlette.requests import Request

        from examples.serve_fastapi import descriptors

        raw = Request({"type": "http", "headers": [(b"x-billing-card", b"\xff\xfe")]})
        with pytest.raises(HTTPException) as info:
            descriptors(raw, {"card": "X-Billing-Card"})
        assert info.value.status_code == 400 and "not UTF-8" in info.value.detail
        r = client.post("/v1/classify", json=body, headers=[("Authorization", "Bearer acct-1"),
                                                             ("X-Billing-Card", "a"), ("X-Billing-Card", "b")])
        assert r.status_code == 400 and "repeated" in r.json()["detail"]
        assert (t.state("acct-1"), t.group_state("card", "fp_1")) == before


def test_during_an_outage_a_group_this_process_saw_flagged_raises_the_level_and_its_rows_are_tallied(tmp_path):
    from throttle_support import free_port

    from caliber_core.throttle.stores import open_store

    t, _ = _throttle(tmp_path)
    with t:
        ledger = t.store
        t.flag_group("card", "c1", level=2)
        t.decide("a", 1, groups={"card": "c1"})
        t.store = open_store(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
        r = t.respond("a", np.zeros((2, 10)), ["x", "y"], groups={"card": "c1"})
        assert (r.level, r.counted) == (2, False)
        pending = t.pending_uncounted()
        assert pending[group_fingerprint("card", "c1")] == {2: 2} and len(pending) == 2
        t.store = ledger
        t.decide("a", 1, groups={"card": "c1"})  # the store answers: the tallies are written back
        assert t.pending_uncounted() == {}
        assert [u["queries"] for u in t.group_state("card", "c1").uncounted] == [{2: 2}]
        assert [u["queries"] for u in t.state("a").uncounted] == [{2: 2}]


def test_a_request_left_in_doubt_is_settled_for_the_account_and_every_group(tmp_path, monkeypatch):
    import redis
    from throttle_support import redis_server

    import caliber_core.throttle.redis_store as redis_store

    with redis_server(tmp_path) as server:
        t, _ = _throttle(tmp_path, server.url)
        with t:
            t.flag_group("card", "c1", level=2)
            t.decide("a", 1, groups={"card": "c1", "org": "o1"})  # this process has seen them
            real = redis.connection.Connection.read_response

            def read_response(self, *args, **kwargs):
                real(self, *args, **kwargs)  # every script runs; every reply is lost
                raise redis.exceptions.ConnectionError("reply lost")

            monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)
            monkeypatch.setattr(redis_store, "RETRY_DELAYS", (0.01,))
            r = t.respond("a", np.zeros((2, 10)), ["x", "y"], groups={"card": "c1", "org": "o1"})
            monkeypatch.undo()
            assert (r.level, r.counted) == (2, False)  # served by the outage rule at the card's last level
            assert len(t._outages.in_doubt) == 3
            t.decide("a", 1, groups={"card": "c1", "org": "o1"})  # the store answers: settled
            assert t._outages.in_doubt == [] and t.pending_uncounted() == {}
            # the scripts had run: the request is counted once in each record, and never as uncounted
            assert t.group_state("card", "c1").queries == {2: 4}
            assert t.group_state("org", "o1").queries == {0: 4}
            assert t.state("a").queries == {0: 4} and t.state("a").uncounted == ()


def test_a_groups_redis_keys_share_one_hash_slot_of_their_own():
    from caliber_core.throttle.redis_keys import account_keys, group_keys
    from caliber_core.throttle.redis_store import RedisStore

    name = group_fingerprint("card", "fp_1")
    keys = group_keys(name, "tok")
    assert len(keys) == 6 and all(k.count("{") == 1 and f"{{{name}}}" in k for k in keys)
    assert RedisStore._keys(name, "tok") == keys[:4] == account_keys(name, "tok")
    assert RedisStore._keys("ab" * 16)[0] == "caliber:throttle:{" + "ab" * 16 + "}:a"


def test_the_cli_simulation_prints_when_the_linked_campaign_reaches_each_level(tmp_path, capsys):
    path = write_policy(tmp_path, escalate_after=500)
    assert main(["throttle", "simulate", str(path), "--sybils", "5"]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if "sharing one link descriptor" in x][0]
    assert "L1 after 500 (thief 500), L2 after 1,000 (thief 1,000), L3 after 1,500 (thief 1,500)" in line
