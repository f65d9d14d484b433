"""Throttle.grant: counts and escalates as respond does; its token is refused when forged, altered, expired or foreign."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from throttle_support import KEY, free_port, write_policy

from caliber_core.throttle import StoreUnavailable, Throttle, load_policy
from caliber_core.throttle.grants import (GrantError, grant_key, policy_digest, sign_grant, verify_grant)
from caliber_core.throttle.stores import open_store


class Clock:
    def __init__(self, now=1_800_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def policy(tmp_path):
    return load_policy(write_policy(tmp_path, levels=(0, 1, 2), escalate_after=10))


def _throttle(policy, tmp_path, name="ledger.db", **options):
    return Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / name}", metrics=False, **options)


def _verify(token, policy, now=None, key=KEY):
    return verify_grant(token, signing_key=grant_key(key), digest=policy_digest(policy), top=policy.top, now=now)


def test_grant_counts_and_escalates_exactly_as_respond(policy, tmp_path):
    granting, responding = _throttle(policy, tmp_path, "a.db"), _throttle(policy, tmp_path, "b.db")
    for t in (granting, responding):
        t.flag("acct-7", level=1)
    rng = np.random.default_rng(0)
    for rows in (3, 4, 5, 9, 1, 12):
        token = granting.grant("acct-7", rows=rows)
        logits = rng.normal(size=(rows, 10))
        served = responding.respond("acct-7", logits, [f"r{i}" for i in range(rows)])
        assert _verify(token, policy).level == served.level
        assert _verify(token, policy).rows == rows
        assert granting.state("acct-7").queries == responding.state("acct-7").queries
    assert granting.state("acct-7").level == 3
    assert _verify(granting.grant("stranger", rows=1), policy).level == 0


def test_a_request_crossing_the_threshold_gets_its_highest_level(policy, tmp_path):
    t = _throttle(policy, tmp_path)
    t.flag("acct-7", level=1)
    assert _verify(t.grant("acct-7", rows=14), policy).level == 2
    assert t.state("acct-7").queries == {1: 10, 2: 4}


def test_shadow_mode_counts_but_grants_clean(tmp_path):
    policy = load_policy(write_policy(tmp_path, shadow=True))
    t = _throttle(policy, tmp_path)
    t.flag("acct-7", level=2)
    assert _verify(t.grant("acct-7", rows=3), policy).level == 0
    assert t.state("acct-7").queries == {2: 3}


def test_tokens_differ_by_nonce_and_name_the_policy_and_expiry(policy, tmp_path):
    clock = Clock()
    t = _throttle(policy, tmp_path, clock=clock)
    a, b = t.grant("x", rows=1), t.grant("x", rows=1, valid_minutes=2)
    assert a != b and a.startswith("caliber-grant.v1.")
    ga, gb = _verify(a, policy, now=clock.now), _verify(b, policy, now=clock.now)
    assert ga.nonce != gb.nonce and len(ga.nonce) == 32
    assert ga.policy == policy_digest(policy)
    assert (ga.expires, gb.expires) == (clock.now + 300, clock.now + 120)


def test_expired_tokens_are_refused(policy, tmp_path):
    clock = Clock()
    token = _throttle(policy, tmp_path, clock=clock).grant("x", rows=1, valid_minutes=1)
    assert _verify(token, policy, now=clock.now + 59).level == 0
    with pytest.raises(GrantError, match=r"^caliber grant token expired 1 s ago: ask the gateway for a new one$"):
        _verify(token, policy, now=clock.now + 61)


def _reencode(token, **changes):
    prefix_a, prefix_b, payload, mac = token.split(".")
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    doc.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    return ".".join((prefix_a, prefix_b, raw, mac))


def test_forged_altered_and_foreign_tokens_are_refused(policy, tmp_path):
    t = _throttle(policy, tmp_path)
    t.flag("acct-7", level=2)
    token = t.grant("acct-7", rows=1)
    signature = r"^caliber grant token's signature does not verify: it was forged, altered, or signed with another key$"
    with pytest.raises(GrantError, match=signature):  # a flagged account's token rewritten to level 0
        _verify(_reencode(token, level=0), policy)
    with pytest.raises(GrantError, match=signature):  # a forged MAC
        _verify(token[:-8] + ("A" * 8 if not token.endswith("A" * 8) else "B" * 8), policy)
    with pytest.raises(GrantError, match=signature):  # signed with another key
        _verify(token, policy, key=bytes(range(100, 132)))
    with pytest.raises(GrantError, match=signature):  # the seeding key itself does not sign tokens
        verify_grant(token, signing_key=KEY, digest=policy_digest(policy), top=3)


def test_a_token_of_another_policy_is_refused(policy, tmp_path):
    other = load_policy(write_policy(tmp_path, levels=(0, 2), name="other.json"))
    token = _throttle(other, tmp_path).grant("x", rows=1)
    with pytest.raises(GrantError, match=r"^caliber grant token was made for another policy \(digest [0-9a-f]{12}\.\.\., "
                                         r"this engine serves [0-9a-f]{12}\.\.\.\)$"):
        _verify(token, policy)


def test_malformed_and_missing_tokens_are_refused(policy):
    with pytest.raises(GrantError, match=r"^request has no caliber grant token: it must come through the gateway"):
        _verify(None, policy)
    with pytest.raises(GrantError, match=r"^caliber grant token must be a string, got int$"):
        _verify(3, policy)
    for bad in ("", "level=2", "caliber-grant.v1.abc", "x" * 600, "caliber-grant.v2.a.b"):
        with pytest.raises(GrantError, match=r"^caliber grant token is malformed: expected caliber-grant\.v1\."):
            _verify(bad, policy)
    with pytest.raises(GrantError, match=r"^caliber grant token's signature does not verify"):
        _verify("caliber-grant.v1.e30.!!!", policy)


def test_a_signed_token_naming_an_unknown_level_is_refused(policy):
    token = sign_grant(level=7, digest=policy_digest(policy), rows=1, signing_key=grant_key(KEY), now=0.0)
    with pytest.raises(GrantError, match=r"^caliber grant token names level 7, not a level of this policy \(0\.\.3\)$"):
        _verify(token, policy, now=1.0)


def test_the_digest_ignores_where_the_config_lives(tmp_path):
    from caliber_core.throttle.policy import build_policy

    here = load_policy(write_policy(tmp_path))  # names its config relative to the policy file
    there = load_policy(build_policy(tmp_path / "cfg.json", targets=[0, 1, 2], escalate_after=10))
    assert here.config_path != there.config_path
    assert policy_digest(here) == policy_digest(there)
    assert policy_digest(here) != policy_digest(load_policy(write_policy(tmp_path, shadow=True, name="s.json")))


def test_bad_arguments_are_refused_before_counting(policy, tmp_path):
    t = _throttle(policy, tmp_path)
    with pytest.raises(ValueError, match=r"rows must be an integer in \[1, 1e9\], got 0"):
        t.grant("x", rows=0)
    with pytest.raises(ValueError, match=r"valid_minutes must be a number in \(0, 1440\], got -1"):
        t.grant("x", rows=1, valid_minutes=-1)
    assert t.state("x").queries == {}
    keyless = Throttle(policy, store=f"sqlite:///{tmp_path / 'k.db'}", metrics=False)
    with pytest.raises(ValueError, match=r"grant needs the seeding key"):
        keyless.grant("x", rows=1)


def test_an_unreachable_store_grants_the_last_known_level_or_refuses(tmp_path):
    policy = load_policy(write_policy(tmp_path))
    t = _throttle(policy, tmp_path)
    t.flag("acct-7", level=2)
    t.store = open_store(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    assert _verify(t.grant("acct-7", rows=1), policy).level == 2
    with pytest.raises(StoreUnavailable, match="ConnectionError"):  # an unseen account: never clean
        t.grant("never-seen", rows=1)
    refusing = Throttle(load_policy(write_policy(tmp_path, on_store_error="refuse", start_degraded=True,
                                                 name="p2.json")), key=KEY, store=t.store, metrics=False)
    with pytest.raises(StoreUnavailable, match=r"redis store redis://127\.0\.0\.1:\d+/0: ConnectionError"):
        refusing.grant("acct-7", rows=1)
