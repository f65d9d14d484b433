"""Who the gateway believes a caller is: the accounts file, the trusted proxy's header, the campaign descriptors."""

from __future__ import annotations

import hashlib
import ipaddress

import pytest
from throttle_support import KEY, write_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gateway_support import api_key, recording_upstream, serve, write_accounts  # noqa: E402
from starlette.datastructures import Headers  # noqa: E402

from caliber_core.gateway.app import create_app  # noqa: E402
from caliber_core.gateway.identity import (AccountsFile, HeaderAccounts, KeyAccounts, parse_accounts,  # noqa: E402
                                           parse_trusted_proxies)
from caliber_core.gateway.request_rules import GatewayRefusal  # noqa: E402
from caliber_core.throttle import Throttle, load_policy  # noqa: E402
from caliber_core.throttle.grants import grant_key, policy_digest, verify_grant  # noqa: E402


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def headers(*pairs) -> Headers:
    return Headers(raw=[(name.lower().encode("latin-1"), value.encode("utf-8")) for name, value in pairs])


# ---------------------------------------------------------------- the accounts file
def test_an_accounts_file_maps_key_hashes_to_accounts():
    text = (f"# issued 2026-11\n\n{sha('k1')} acct-7\n{sha('k2').upper()}\tacct-7   # a second key, one account\n"
            f"  {sha('k3')} team blue  \n{sha('k1')} acct-7\n")
    assert parse_accounts(text) == {sha("k1"): "acct-7", sha("k2"): "acct-7", sha("k3"): "team blue"}


@pytest.mark.parametrize("text, message", [
    ("", "accounts file: no accounts"),
    ("# only a comment\n", "accounts file: no accounts"),
    ("abc acct-1\n", "accounts file line 1: expected the key's SHA-256 as 64 hex digits"),
    (f"{sha('k1')}\n", "accounts file line 1: the account id must be 1..512 printable characters"),
    (f"{sha('k1')} a\n{'g' * 64} b\n", "accounts file line 2: expected the key's SHA-256"),
    (f"{sha('k1')} a\n{sha('k1')} b\n", "accounts file line 2: this key's hash is already given to another account"),
    (f"{sha('k1')} {'x' * 513}\n", "accounts file line 1: the account id must be 1..512 printable characters"),
    (f"{sha('k1')} a\x07b\n", "accounts file line 1: the account id must be 1..512 printable characters"),
])
def test_a_malformed_accounts_file_is_refused_by_line_never_by_content(text, message):
    with pytest.raises(ValueError) as info:
        parse_accounts(text)
    assert str(info.value).startswith(message)
    assert sha("k1") not in str(info.value) and "acct" not in str(info.value)


def test_the_accounts_file_is_read_and_reloaded(tmp_path, caplog):
    path = write_accounts(tmp_path / "accounts.txt", {"k1": "acct-1", "k2": "acct-1"})
    accounts = AccountsFile(path)
    assert len(accounts) == 2 and accounts.account_of("k1") == accounts.account_of("k2") == "acct-1"
    assert accounts.account_of("k3") is None and accounts.account_of("K1") is None
    write_accounts(path, {"k3": "acct-3"})
    assert accounts.reload() and accounts.account_of("k3") == "acct-3" and accounts.account_of("k1") is None
    path.write_text("not a line\n")
    assert not accounts.reload() and accounts.account_of("k3") == "acct-3"  # the table in force stays
    assert "accounts file not reloaded, the previous one stays in force" in caplog.text and "acct-3" not in caplog.text
    with pytest.raises(ValueError, match="missing: cannot read the accounts file"):
        AccountsFile(tmp_path / "missing")
    (tmp_path / "latin").write_bytes(sha("k").encode() + b" caf\xe9\n")
    with pytest.raises(ValueError, match="latin: the accounts file is not UTF-8"):
        AccountsFile(tmp_path / "latin")


def test_a_key_names_its_account(tmp_path):
    accounts = KeyAccounts(AccountsFile(write_accounts(tmp_path / "accounts.txt", {"k1": "acct-1"})))
    assert accounts(headers(("Authorization", "bearer   k1 ")), None).account == "acct-1"
    assert accounts(headers(("Authorization", "BEARER k1")), "10.0.0.1").groups == {}
    with pytest.raises(GatewayRefusal) as info:
        accounts(headers(("Authorization", "Bearer k2")), None)
    assert (info.value.status, info.value.message) == (401, "invalid API key")


# ---------------------------------------------------------------- the trusted proxy's header
def test_trusted_proxies_are_addresses_or_networks():
    assert parse_trusted_proxies("10.0.0.5, 10.1.0.0/16,::1") == (
        ipaddress.ip_network("10.0.0.5/32"), ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("::1/128"))
    with pytest.raises(ValueError, match="--trusted-proxy: 'proxy.local' is not an IP address or network"):
        parse_trusted_proxies("10.0.0.5,proxy.local")
    with pytest.raises(ValueError, match="--trusted-proxy needs at least one address"):
        parse_trusted_proxies(" , ")
    with pytest.raises(ValueError, match="--account-header must be an HTTP header name, got 'X Account'"):
        HeaderAccounts("X Account", parse_trusted_proxies("10.0.0.5"))
    with pytest.raises(ValueError, match="--account-header needs --trusted-proxy"):
        HeaderAccounts("X-Account", ())


@pytest.mark.parametrize("peer, pairs, status_message", [
    ("10.0.0.5", [("X-Account", "acct-7")], None),
    ("10.1.2.3", [("X-Account", "acct-7")], None),
    ("::ffff:10.0.0.5", [("X-Account", "acct-7")], None),  # a dual-stack socket's IPv4 peer
    ("10.0.0.6", [("X-Account", "acct-7")], "this gateway serves requests from its authenticating proxy only"),
    (None, [("X-Account", "acct-7")], "this gateway serves requests from its authenticating proxy only"),
    ("not-an-address", [("X-Account", "acct-7")], "this gateway serves requests from its authenticating proxy only"),
    ("10.0.0.5", [("Authorization", "Bearer acct-7")], "the request carries no account"),
    ("10.0.0.5", [("X-Account", "acct-7"), ("X-Account", "acct-8")], "the request's account header is malformed"),
    ("10.0.0.5", [("X-Account", " ")], "the request's account header is malformed"),
    ("10.0.0.5", [("X-Account", "a" * 513)], "the request's account header is malformed"),
])
def test_the_account_header_is_believed_from_the_trusted_proxy_only(peer, pairs, status_message):
    authenticate = HeaderAccounts("X-Account", parse_trusted_proxies("10.0.0.5,10.1.0.0/16"))
    if status_message is None:
        assert authenticate(headers(*pairs), peer).account == "acct-7"
        return
    with pytest.raises(GatewayRefusal) as info:
        authenticate(headers(*pairs), peer)
    assert info.value.status == 401 and info.value.message.startswith(status_message)
    assert "acct-7" not in info.value.message


def test_campaign_descriptors_come_from_the_trusted_proxy_only():
    authenticate = HeaderAccounts("X-Account", parse_trusted_proxies("10.0.0.5"),
                                  group_headers={"card": "X-Card", "org": "X-Org"})
    identity = authenticate(headers(("X-Account", "acct-7"), ("X-Card", "fp_91c2")), "10.0.0.5")
    assert identity.account == "acct-7" and dict(identity.groups) == {"card": "fp_91c2"}
    with pytest.raises(GatewayRefusal, match="campaign descriptor header is malformed"):
        authenticate(headers(("X-Account", "acct-7"), ("X-Org", "a"), ("X-Org", "b")), "10.0.0.5")
    with pytest.raises(GatewayRefusal, match="authenticating proxy only"):
        authenticate(headers(("X-Account", "acct-7"), ("X-Card", "fp_91c2")), "10.9.9.9")


def _group_policy(tmp_path):
    import json

    path = write_policy(tmp_path)
    doc = json.loads(path.read_text())
    doc["groups"] = {"org": {"escalation": {"after_queries": 1000}, "expiry": {"after_seconds": None}}}
    path.write_text(json.dumps(doc))
    return load_policy(path)


def test_the_gateway_serves_the_proxy_named_account_and_hands_its_descriptors_to_the_grant(tmp_path):
    policy = _group_policy(tmp_path)
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.flag("acct-7", level=2)
    seen = []
    trusted = HeaderAccounts("X-Account", parse_trusted_proxies("127.0.0.1"), group_headers={"org": "X-Org"})
    untrusted = HeaderAccounts("X-Account", parse_trusted_proxies("10.0.0.5"))
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=trusted)) as base, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=untrusted)) as elsewhere:
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 2},
                       headers={"X-Account": "acct-7", "X-Org": "acme"}, timeout=30)
        assert r.status_code == 200 and sum(throttle.group_state("org", "acme").queries.values()) == 2
        level = verify_grant(seen[-1]["body"]["vllm_xargs"]["caliber"], signing_key=grant_key(KEY),
                             digest=policy_digest(policy), top=policy.top).level
        assert level == 2 and throttle.state("acct-7").queries == {2: 2}
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4"},
                       headers={"Authorization": f"Bearer {api_key('acct-7')}"}, timeout=30)
        assert r.status_code == 401 and "www-authenticate" not in r.headers
        r = httpx.post(elsewhere + "/v1/completions", json={"prompt": "w4"}, headers={"X-Account": "acct-7"},
                       timeout=30)
        assert r.status_code == 401 and r.json()["error"]["message"] == (
            "this gateway serves requests from its authenticating proxy only")
    assert len(seen) == 1 and throttle.state("acct-7").queries == {2: 2}


def test_a_flagged_campaign_is_served_its_level_through_the_gateway(tmp_path):
    policy = _group_policy(tmp_path)
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.flag_group("org", "acme", level=1)
    seen = []
    trusted = HeaderAccounts("X-Account", parse_trusted_proxies("127.0.0.1"), group_headers={"org": "X-Org"})
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=trusted)) as base:
        def level_of(headers_):
            r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 1}, headers=headers_,
                           timeout=30)
            assert r.status_code == 200
            return verify_grant(seen[-1]["body"]["vllm_xargs"]["caliber"], signing_key=grant_key(KEY),
                                digest=policy_digest(policy), top=policy.top).level

        # A member never flagged itself gets the campaign's level; without the descriptor, its own.
        assert level_of({"X-Account": "fresh-member", "X-Org": "acme"}) == 1
        assert level_of({"X-Account": "fresh-member"}) == 0
        assert level_of({"X-Account": "other", "X-Org": "someone-else"}) == 0
        # A value the throttle refuses (over 256 bytes) is a 400 that quotes nothing; nothing counted.
        before = throttle.state("fresh-member").queries
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 1},
                       headers={"X-Account": "fresh-member", "X-Org": "v" * 300}, timeout=30)
        assert r.status_code == 400 and "vvvv" not in r.text and "fresh-member" not in r.text
        assert throttle.state("fresh-member").queries == before


def test_group_headers_are_checked_against_the_policy_at_start(tmp_path):
    from caliber_core.cli import build_parser
    from caliber_core.cli.gateway import build_app

    policy_path = tmp_path / "policy.json"
    _group_policy(tmp_path)
    from caliber_core.serving.keys import write_key_file

    key_file = tmp_path / "k.key"
    write_key_file(key_file)
    base = ["gateway", "--upstream", "http://127.0.0.1:9", "--policy", str(policy_path), "--key-file",
            str(key_file), "--store", f"sqlite:///{tmp_path / 'l.db'}", "--account-header", "X-Account",
            "--trusted-proxy", "127.0.0.1"]
    with pytest.raises(ValueError, match="kind 'card' is not declared"):
        build_app(build_parser().parse_args(base + ["--group-header", "card=X-Card"]))
    with pytest.raises(ValueError, match="must be KIND=HEADER"):
        build_app(build_parser().parse_args(base + ["--group-header", "org"]))
    app = build_app(build_parser().parse_args(base + ["--group-header", "org=X-Org"]))
    assert app is not None
