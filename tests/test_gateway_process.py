"""``caliber gateway`` as a process in front of a recording upstream: what an attacker meets on the wire."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from throttle_support import KEY, write_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gateway_support import ROOT, api_key, gateway_process, recording_upstream, serve, write_accounts  # noqa: E402

from caliber_core.throttle import Throttle, load_policy  # noqa: E402
from caliber_core.throttle.grants import grant_key, policy_digest, verify_grant  # noqa: E402

ESCALATE_AFTER = 100


def _files(folder):
    policy = write_policy(folder, levels=(0, 1, 2), escalate_after=ESCALATE_AFTER)
    key_file = folder / "caliber.key"
    key_file.write_text(KEY.hex() + "\n")
    key_file.chmod(0o600)
    return policy, key_file, f"sqlite:///{folder / 'ledger.db'}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gateway-process")
    policy, key_file, store = _files(folder)
    throttle = Throttle(load_policy(policy), key=KEY, store=store, metrics=False)
    throttle.flag("thief", level=1, reason="red team")
    accounts = write_accounts(folder / "accounts.txt", {api_key("thief"): "thief", api_key("thief") + "-2": "thief",
                                                        api_key("clean"): "clean"})
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            gateway_process(["--upstream", upstream, "--policy", str(policy), "--key-file", str(key_file),
                             "--store", store, "--accounts", str(accounts)], folder=folder) as (base, proc, log):
        yield SimpleNamespace(base=base, proc=proc, log=log, seen=seen, throttle=throttle, accounts=accounts,
                              policy=load_policy(policy))


def call(stack, body, key, path="/v1/completions"):
    return httpx.post(stack.base + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def level_of(stack, forwarded):
    return verify_grant(forwarded["body"]["vllm_xargs"]["caliber"], signing_key=grant_key(KEY),
                        digest=policy_digest(stack.policy), top=stack.policy.top).level


def rows(stack, account):
    return sum(stack.throttle.state(account).queries.values())


def test_an_unknown_key_is_refused_with_nothing_forwarded_or_counted(stack):
    before = len(stack.seen)
    for key in ("thief", "thief-2", api_key("thief").upper(), api_key("thief")[:-1], "sk-test-nobody"):
        r = call(stack, {"prompt": "w4", "max_tokens": 1, "logprobs": 5}, key)
        assert r.status_code == 401 and r.json()["error"]["message"] in ("invalid API key",
                                                                         "Authorization must be 'Bearer <API key>'")
    assert len(stack.seen) == before
    assert stack.throttle.state("thief-2").queries == {} and stack.throttle.state("nobody").queries == {}


def test_batched_prompts_are_counted_and_escalate_the_account(stack):
    start = rows(stack, "thief")
    r = call(stack, {"prompt": [f"w{i}" for i in range(500)], "max_tokens": 1, "logprobs": 5}, api_key("thief"))
    assert r.status_code == 200 and len(stack.seen[-1]["body"]["prompt"]) == 500
    assert rows(stack, "thief") - start == 500
    r = call(stack, {"prompt": [[4, 9, i % 50] for i in range(2000)], "max_tokens": 2, "logprobs": 5},
             api_key("thief"))
    assert r.status_code == 200 and rows(stack, "thief") - start == 500 + 4000
    state = stack.throttle.state("thief")
    assert state.level == 3 and level_of(stack, stack.seen[-1]) == 3  # escalated past every threshold of 100


def test_two_keys_of_one_account_share_its_level_and_counter(stack):
    start = rows(stack, "thief")
    levels = []
    for key in (api_key("thief"), api_key("thief") + "-2"):
        assert call(stack, {"prompt": "w4", "max_tokens": 3}, key).status_code == 200
        levels.append(level_of(stack, stack.seen[-1]))
    r = httpx.post(stack.base + "/v1/completions", json={"prompt": "w4", "max_tokens": 3}, timeout=60,
                   headers={"Authorization": f"BEARER \t {api_key('thief')}"})  # the scheme's case and spacing
    assert r.status_code == 200
    levels.append(level_of(stack, stack.seen[-1]))
    assert levels[0] == levels[1] == levels[2] >= 1 and rows(stack, "thief") - start == 9
    assert call(stack, {"prompt": "w4", "max_tokens": 3}, api_key("clean")).status_code == 200
    assert level_of(stack, stack.seen[-1]) == 0


@pytest.mark.parametrize("body, path, status, message", [
    ({"prompt": "x", "max_tokens": 1048576, "n": 1024}, "/v1/completions", 400, "the request may generate"),
    ({"prompt_embeds": "AAAA", "max_tokens": 1, "logprobs": 5}, "/v1/completions", 400,
     "prompt_embeds is not served to this account"),
    ({"messages": [{"role": "user", "content": "w4"}], "max_completion_tokens": 0, "max_tokens": 100000},
     "/v1/chat/completions", 400, "send max_tokens or max_completion_tokens, not both"),
    ({"prompt": "w4", "max_tokens": 1, "echo": True, "logprobs": 1}, "/v1/completions", 400,
     "echo with logprobs is not served to this account"),
    ({"prompt": "echo", "max_tokens": 1, "stream_options": {"include_usage": True}}, "/v1/completions", 400,
     "the model server refused the request (HTTP 400)"),
    ({"prompt": "echo", "max_tokens": 1, "stream": True}, "/v1/completions", 400,
     "the model server refused the request (HTTP 400)"),
])
def test_what_a_flagged_account_is_refused_holds_no_secret(stack, body, path, status, message):
    start, before = rows(stack, "thief"), len(stack.seen)
    with httpx.stream("POST", stack.base + path, json=body, timeout=60,
                      headers={"Authorization": f"Bearer {api_key('thief')}"}) as r:
        text = r.read().decode()
    assert r.status_code == status and json.loads(text)["error"]["message"].startswith(message), text
    for secret in ("caliber-grant", "vllm_xargs", "caliber", "level", "thief", api_key("thief")):
        assert secret not in text
    if body.get("prompt") == "echo":  # forwarded and counted: the upstream refused it
        assert len(stack.seen) == before + 1 and "caliber-grant" in json.dumps(stack.seen[-1]["body"])
    else:
        assert len(stack.seen) == before and rows(stack, "thief") == start
    assert call(stack, {"prompt": "w4", "max_tokens": 1}, api_key("clean")).status_code == 200  # still serving


def test_sighup_reloads_the_accounts_file(stack):
    new_key = api_key("clean") + "-rotated"
    assert call(stack, {"prompt": "w4", "max_tokens": 1}, new_key).status_code == 401
    original = stack.accounts.read_text()
    write_accounts(stack.accounts, {api_key("thief"): "thief", new_key: "clean"})  # clean's old key revoked
    try:
        stack.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while call(stack, {"prompt": "w4", "max_tokens": 1}, new_key).status_code != 200:
            assert time.monotonic() < deadline, stack.log.read_text()
            time.sleep(0.2)
        assert call(stack, {"prompt": "w4", "max_tokens": 1}, api_key("clean")).status_code == 401
        stack.accounts.write_text("garbage\n")  # a bad file is not taken: the table in force stays
        stack.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert call(stack, {"prompt": "w4", "max_tokens": 1}, new_key).status_code == 200
        assert stack.proc.poll() is None
        assert "accounts file reloaded (2 keys)" in stack.log.read_text()
    finally:
        stack.accounts.write_text(original)
        stack.proc.send_signal(signal.SIGHUP)


def _start(arguments, folder):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "caliber_core", "gateway", *arguments], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("extra, message", [
    ([], "error: caliber gateway serves authenticated accounts only: give --accounts FILE, or --account-header "
         "NAME with --trusted-proxy ADDR[,ADDR...]"),
    (["--account-header", "X-Account"], "error: --account-header needs --trusted-proxy ADDR[,ADDR...]"),
    (["--trusted-proxy", "10.0.0.5"], "error: caliber gateway serves authenticated accounts only"),
    (["--accounts", "ACCOUNTS", "--account-header", "X-Account"],
     "error: give --accounts or --account-header, not both"),
    (["--accounts", "MISSING"], "error: MISSING: cannot read the accounts file (No such file or directory)"),
    (["--account-header", "X-Account", "--trusted-proxy", "proxy.local"],
     "error: --trusted-proxy: 'proxy.local' is not an IP address or network"),
])
def test_the_gateway_does_not_start_without_a_way_to_authenticate(tmp_path, extra, message):
    policy, key_file, store = _files(tmp_path)
    accounts = write_accounts(tmp_path / "accounts.txt", {"k": "a"})
    extra = [str(accounts) if word == "ACCOUNTS" else str(tmp_path / "missing") if word == "MISSING" else word
             for word in extra]
    message = message.replace("MISSING", str(tmp_path / "missing"))
    out = _start(["--upstream", "http://127.0.0.1:9", "--policy", str(policy), "--key-file", str(key_file),
                  "--store", store, "--port", "9", *extra], tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().startswith(message) and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_forwarded_for_header_does_not_make_a_client_the_trusted_proxy(tmp_path):
    policy, key_file, store = _files(tmp_path)
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            gateway_process(["--upstream", upstream, "--policy", str(policy), "--key-file", str(key_file),
                             "--store", store, "--account-header", "X-Account", "--trusted-proxy", "10.0.0.5"],
                            folder=tmp_path) as (base, _proc, _log):
        for spoof in ({"X-Forwarded-For": "10.0.0.5"}, {"Forwarded": "for=10.0.0.5"}, {"X-Real-IP": "10.0.0.5"}):
            r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 1},
                           headers={"X-Account": "clean", **spoof}, timeout=60)
            assert r.status_code == 401 and r.json()["error"]["message"] == (
                "this gateway serves requests from its authenticating proxy only")
    assert seen == []
