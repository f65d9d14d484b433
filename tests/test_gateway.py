"""The gateway over real HTTP on 127.0.0.1, in front of a recording upstream (vLLM itself: test_gateway_vllm.py).

The app runs in a thread here; test_gateway_process.py drives ``caliber gateway`` as a process.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from throttle_support import KEY, free_port, write_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gateway_support import api_key, echoing_upstream, recording_upstream, serve, write_accounts  # noqa: E402

from caliber_core.cli import main  # noqa: E402
from caliber_core.gateway.app import create_app  # noqa: E402
from caliber_core.gateway.identity import AccountsFile, KeyAccounts  # noqa: E402
from caliber_core.throttle import Throttle, load_policy  # noqa: E402
from caliber_core.throttle.grants import grant_key, policy_digest, verify_grant  # noqa: E402


ACCOUNTS = ("acct-clean", "acct-flagged", "acct-bad", "a")


def key_accounts(folder, accounts=ACCOUNTS) -> KeyAccounts:
    """An accounts file giving each account its :func:`api_key`."""
    return KeyAccounts(AccountsFile(write_accounts(folder / "accounts.txt", {api_key(a): a for a in accounts})))


@contextmanager
def running_gateway(tmp_path, **options):
    policy = load_policy(write_policy(tmp_path, levels=(0, 1, 2), escalate_after=10**6))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'ledger.db'}", metrics=False)
    throttle.flag("acct-flagged", level=2)
    seen = []
    with serve(recording_upstream(seen)) as upstream:
        with serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=key_accounts(tmp_path),
                              **options)) as base:
            yield SimpleNamespace(base=base, seen=seen, throttle=throttle, policy=policy, upstream=upstream,
                                  tmp_path=tmp_path)


@pytest.fixture
def gateway(tmp_path):
    with running_gateway(tmp_path, max_body_bytes=4096) as g:
        yield g


@pytest.fixture
def roomy_gateway(tmp_path):
    with running_gateway(tmp_path) as g:  # the default body bound (1 MiB)
        yield g


def post(g, path, body, account="acct-clean", **options):
    headers = {} if account is None else {"Authorization": f"Bearer {api_key(account)}"}
    return httpx.post(g.base + path, json=body, headers=headers, timeout=30, **options)


def level_of(g, body):
    return verify_grant(body["vllm_xargs"]["caliber"], signing_key=grant_key(KEY), digest=policy_digest(g.policy),
                        top=g.policy.top).level


def test_the_gateway_adds_the_grant_and_drops_what_the_client_set(gateway):
    g = gateway
    r = post(g, "/v1/completions", {"prompt": "w4 w5", "max_tokens": 7, "logprobs": 3,
                                    "vllm_xargs": {"caliber": "caliber-grant.v1.forged.x", "other": 1},
                                    "kv_transfer_params": {"x": 1}})
    assert r.status_code == 200 and r.json() == {"ok": True}
    forwarded = g.seen[-1]
    assert forwarded["path"] == "/v1/completions" and forwarded["auth"] is None  # the client's credential stays here
    assert set(forwarded["body"]["vllm_xargs"]) == {"caliber"} and "kv_transfer_params" not in forwarded["body"]
    assert level_of(g, forwarded["body"]) == 0
    assert forwarded["body"]["max_tokens"] == 7 and forwarded["body"]["logprobs"] == 3


def test_a_flagged_account_is_granted_its_level_and_counted_per_position(gateway):
    g = gateway
    r = post(g, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w4"}], "max_completion_tokens": 5,
                                         "n": 3, "logprobs": True, "top_logprobs": 2}, account="acct-flagged")
    assert r.status_code == 200
    assert level_of(g, g.seen[-1]["body"]) == 2
    assert g.throttle.state("acct-flagged").queries == {2: 15}  # 5 tokens x 3 sequences
    post(g, "/v1/completions", {"prompt": "w4", "max_tokens": 2, "n": 2, "best_of": 4}, account="acct-flagged")
    assert g.throttle.state("acct-flagged").queries == {2: 15 + 8}


def test_a_request_without_max_tokens_gets_the_stated_default(gateway):
    g = gateway
    post(g, "/v1/completions", {"prompt": "w4"})
    assert g.seen[-1]["body"]["max_tokens"] == 256
    post(g, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w4"}]})
    assert g.seen[-1]["body"]["max_completion_tokens"] == 256
    assert g.throttle.state("acct-clean").queries == {0: 512}


def test_prompt_logprobs_are_refused_to_flagged_accounts_in_every_shape(gateway):
    g = gateway
    chat = {"messages": [{"role": "user", "content": "w4"}], "max_tokens": 2}
    shapes = [("/v1/completions", {"prompt": "w4", "max_tokens": 2, "prompt_logprobs": 1}, "prompt_logprobs"),
              ("/v1/completions", {"prompt": "w4", "max_tokens": 0, "echo": True, "logprobs": 0}, "echo with logprobs"),
              ("/v1/chat/completions", dict(chat, prompt_logprobs=0), "prompt_logprobs"),
              ("/v1/chat/completions", dict(chat, echo=True), "echo"),
              ("/v1/chat/completions", dict(chat, echo=True, logprobs=True, top_logprobs=3), "echo")]
    before = len(g.seen)
    for path, body, fields in shapes:
        r = post(g, path, body, account="acct-flagged")
        assert r.status_code == 400, (path, body)
        assert r.json()["error"]["message"] == (f"{fields} is not served to this account: prompt logprobs are "
                                                "computed apart from the served noise")
    assert len(g.seen) == before  # nothing reached the model
    for path, body, _ in shapes:  # an unflagged account is served them (clean is what it gets anyway)
        assert post(g, path, body).status_code == 200
    assert post(g, "/v1/completions", {"prompt": "w4", "max_tokens": 2, "echo": True},
                account="acct-flagged").status_code == 200  # echo without logprobs returns no numbers


def test_refusing_prompt_logprobs_to_all_accounts(tmp_path):
    policy = load_policy(write_policy(tmp_path))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, refuse_prompt_logprobs="all",
                             authenticate=key_accounts(tmp_path))) as base:
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 1, "prompt_logprobs": 1},
                       headers={"Authorization": f"Bearer {api_key('a')}"}, timeout=30)
        assert r.status_code == 400 and "prompt_logprobs is not served" in r.json()["error"]["message"]
    assert seen == [] and throttle.state("a").queries == {}  # refused before anything was counted
    with pytest.raises(ValueError, match=r"refuse_prompt_logprobs must be one of \('flagged', 'all'\), got 'some'"):
        create_app(throttle, key=KEY, upstream=upstream, refuse_prompt_logprobs="some",
                   authenticate=key_accounts(tmp_path))


def test_streaming_is_relayed_as_it_comes(gateway):
    g = gateway
    with httpx.stream("POST", g.base + "/v1/completions", json={"prompt": "w4", "max_tokens": 2, "stream": True},
                      headers={"Authorization": f"Bearer {api_key('acct-flagged')}"}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text == "".join(f"data: {json.dumps({'i': i})}\n\n" for i in range(3)) + "data: [DONE]\n\n"
    assert level_of(g, g.seen[-1]["body"]) == 2


@pytest.mark.parametrize("authorization, message", [
    (None, "missing Authorization header: send 'Authorization: Bearer <API key>'"),
    ("Basic abc", "Authorization must be 'Bearer <API key>'"),
    ("Bearer\t-", "Authorization must be 'Bearer <API key>'"),
    ("Bearer a b", "the API key must be one word of at most 512 printable characters"),
    ("Bearer " + "x" * 513, "the API key must be one word of at most 512 printable characters"),
    ("Bearer acct-clean", "invalid API key"),  # an account's name is not its key
    ("Bearer " + api_key("acct-clean").upper(), "invalid API key"),  # keys are compared exactly
])
def test_requests_without_a_known_key_are_refused(gateway, authorization, message):
    g = gateway
    headers = {} if authorization is None else {"Authorization": authorization}
    r = httpx.post(g.base + "/v1/completions", json={"prompt": "w4"}, headers=headers, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["message"] == message
    assert r.headers["www-authenticate"] == "Bearer"
    assert g.seen == [] and g.throttle.status() == {"flagged": [g.throttle.status("acct-flagged")]}
    assert g.throttle.state("acct-clean").queries == {}


@pytest.mark.parametrize("content, status, message", [
    (b"x" * 5000, 413, "request body is larger than 4096 bytes"),
    (b"{not json", 400, "request body is not valid JSON"),
    (b"[1, 2]", 400, "request body must be a JSON object, got list"),
    (b'{"prompt": "w4", "max_tokens": NaN}', 400, "request body is not valid JSON (NaN is not a number"),
    (b'{"prompt": "w4", "max_tokens": -1}', 400, "max_tokens must be an integer in [0, 1048576], got -1"),
    (b'{"prompt": "w4", "max_tokens": "9"}', 400, "max_tokens must be an integer in [0, 1048576], got '9'"),
    (b'{"prompt": "w4", "n": 0}', 400, "n must be an integer in [1, 1024], got 0"),
    (b'{"prompt": "w4", "best_of": true}', 400, "best_of must be an integer in [1, 1024], got True"),
])
def test_bad_bodies_are_refused_before_anything_is_counted(gateway, content, status, message):
    g = gateway
    r = httpx.post(g.base + "/v1/completions", content=content, timeout=30,
                   headers={"Authorization": f"Bearer {api_key('acct-bad')}", "Content-Type": "application/json"})
    assert r.status_code == status and r.json()["error"]["message"].startswith(message)
    assert g.throttle.state("acct-bad").queries == {}


def test_a_body_streamed_without_length_is_bounded_too(gateway):
    def chunks():
        for _ in range(10):
            yield b" " * 1000

    r = httpx.post(gateway.base + "/v1/completions", content=chunks(), timeout=30,
                   headers={"Authorization": f"Bearer {api_key('acct-bad')}", "Content-Type": "application/json"})
    assert r.status_code == 413


def test_upstream_answers_and_failures(gateway, tmp_path):
    g = gateway
    r = post(g, "/v1/completions", {"prompt": "bad", "max_tokens": 1})
    assert r.status_code == 400 and r.json() == {"error": {"message": "the model server refused the request (HTTP 400)",
                                                           "type": "invalid_request_error", "code": 400}}
    assert httpx.post(g.base + "/v1/embeddings", json={}, timeout=30).status_code == 404
    throttle = Throttle(g.policy, key=KEY, store=f"sqlite:///{tmp_path / 'other.db'}", metrics=False)
    with serve(create_app(throttle, key=KEY, upstream=f"http://127.0.0.1:{free_port()}",
                          authenticate=key_accounts(tmp_path))) as base:
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4"},
                       headers={"Authorization": f"Bearer {api_key('a')}"}, timeout=30)
        assert r.status_code == 502 and r.json()["error"]["message"] == "the model server is unreachable (ConnectError)"


def test_an_unreachable_store_fails_closed(tmp_path):
    from caliber_core.throttle.stores import open_store

    policy = load_policy(write_policy(tmp_path, on_store_error="refuse"))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.store = open_store(f"redis://127.0.0.1:{free_port()}/0")  # the store goes away after the start
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=key_accounts(tmp_path))) as base:
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4"},
                       headers={"Authorization": f"Bearer {api_key('a')}"}, timeout=30)
    assert r.status_code == 503 and "try again later" in r.json()["error"]["message"]
    assert seen == []


def test_the_command_line_refuses_bad_settings(tmp_path, capsys):
    policy = write_policy(tmp_path)
    (tmp_path / "k").write_text(KEY.hex() + "\n")
    (tmp_path / "k").chmod(0o600)
    accounts = write_accounts(tmp_path / "accounts.txt", {api_key("a"): "a"})
    common = ["--policy", str(policy), "--store", f"sqlite:///{tmp_path / 'l.db'}", "--accounts", str(accounts)]
    assert main(["gateway", "--upstream", "ftp://x", "--key-file", str(tmp_path / "k"), *common]) == 2
    assert "--upstream must be an http:// or https:// URL, got 'ftp://x'" in capsys.readouterr().err
    assert main(["gateway", "--upstream", "http://127.0.0.1:1", "--key-file", str(tmp_path / "none"), *common]) == 2
    assert "none: cannot read the key (No such file or directory)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["gateway", "--help"])
    assert "--refuse-prompt-logprobs" in capsys.readouterr().out


# ---------------------------------------------------------------- every generated row is counted
TOKEN_PROMPTS = [[4, 9, 17], [30, 2]]


@pytest.mark.parametrize("path, body, rows", [
    ("/v1/completions", {"prompt": "w4", "max_tokens": 3}, 3),
    ("/v1/completions", {"prompt": ["w4"] * 500, "max_tokens": 1, "logprobs": 5}, 500),
    ("/v1/completions", {"prompt": ["w4", "w5"], "max_tokens": 4, "n": 2, "best_of": 3}, 2 * 3 * 4),
    ("/v1/completions", {"prompt": [4, 9, 17, 30], "max_tokens": 5}, 5),  # token ids: one prompt
    ("/v1/completions", {"prompt": TOKEN_PROMPTS * 1000, "max_tokens": 1}, 2000),
    ("/v1/completions", {"prompt": TOKEN_PROMPTS, "max_tokens": 0, "n": 3}, 2 * 3 * 1),  # max_tokens 0 still decodes
    ("/v1/completions", {"prompt_embeds": "AAAA", "max_tokens": 2}, 2),
    ("/v1/completions", {"prompt_embeds": ["AAAA"] * 3, "max_tokens": 2}, 6),
    ("/v1/completions", {"prompt": ["w4", "w5"], "prompt_embeds": ["AAAA"], "max_tokens": 2}, 6),  # both: summed
    ("/v1/completions", {"prompt": ["w4"] * 7}, 7 * 256),  # the default budget, per prompt
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w4"}], "max_tokens": 4, "n": 5}, 20),
])
def test_every_prompt_and_sequence_is_counted(roomy_gateway, path, body, rows):
    g = roomy_gateway
    r = post(g, path, body, account="a")
    assert r.status_code == 200, r.text
    assert g.throttle.state("a").queries == {0: rows}
    assert set(g.seen[-1]["body"]["vllm_xargs"]) == {"caliber"}


def test_a_batch_escalates_a_flagged_account(tmp_path):
    policy = load_policy(write_policy(tmp_path, levels=(0, 1, 2), escalate_after=100))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'ledger.db'}", metrics=False)
    throttle.flag("acct-flagged", level=1)
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=key_accounts(tmp_path))) as base:
        g = SimpleNamespace(base=base, policy=policy)
        r = post(g, "/v1/completions", {"prompt": ["w4"] * 500, "max_tokens": 1, "logprobs": 5},
                 account="acct-flagged")
        assert r.status_code == 200
        state = throttle.state("acct-flagged")
        assert state.queries == {1: 100, 2: 100, 3: 300} and state.level == 3  # 100 rows a level, to the top
        assert level_of(g, seen[-1]["body"]) == 3


@pytest.mark.parametrize("path, body, message", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 1048576, "n": 1024},
     "the request may generate 1,073,741,824 rows (prompts x sequences x max tokens), more than the ledger counts "
     "in one request"),
    ("/v1/completions", {"prompt": ["x"] * 1000, "max_tokens": 1048576},
     "the request may generate 1,048,576,000 rows"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w4"}], "max_completion_tokens": 0,
                              "max_tokens": 100000},
     "send max_tokens or max_completion_tokens, not both: engines differ in which one they honour"),
    ("/v1/completions", {"prompt": "w4", "max_completion_tokens": 5},
     "max_completion_tokens is a chat field: /v1/completions takes max_tokens"),
    ("/v1/completions", {"prompt": [1, "w4"]}, "prompt must be a string, a list of strings, a list of token ids"),
    ("/v1/completions", {"prompt": [[1, 2], [True]]}, "prompt must be a string, a list of strings, a list of token"),
    ("/v1/completions", {"prompt": {"prompt_token_ids": [1]}}, "prompt must be a string, a list of strings"),
    ("/v1/completions", {"prompt_embeds": [1, 2]}, "prompt_embeds must be a base64 string or a list of them"),
    ("/v1/chat/completions", {"messages": "w4"}, "messages must be a non-empty list of message objects"),
])
def test_uncountable_requests_are_refused_before_anything_is_counted(roomy_gateway, path, body, message):
    g = roomy_gateway
    r = post(g, path, body, account="acct-bad")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(message), r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert g.seen == [] and g.throttle.state("acct-bad").queries == {}
    assert post(g, "/v1/completions", {"prompt": "w4", "max_tokens": 1}, account="acct-bad").status_code == 200


def test_one_chat_limit_is_counted_and_forwarded(gateway):
    g = gateway
    chat = [{"role": "user", "content": "w4"}]
    for field in ("max_tokens", "max_completion_tokens"):
        assert post(g, "/v1/chat/completions", {"messages": chat, field: 9, "max_completion_tokens"
                                                if field == "max_tokens" else "max_tokens": None}).status_code == 200
    assert g.throttle.state("acct-clean").queries == {0: 18}


# ---------------------------------------------------------------- nothing from the grant goes back
@pytest.fixture
def echoing_gateway(tmp_path):
    policy = load_policy(write_policy(tmp_path, levels=(0, 1, 2), escalate_after=10**6))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'ledger.db'}", metrics=False)
    throttle.flag("acct-flagged", level=1)
    with serve(echoing_upstream()) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=key_accounts(tmp_path))) as base:
        yield SimpleNamespace(base=base)


def assert_nothing_of_the_grant(text: str):
    for secret in ("caliber-grant", "vllm_xargs", "caliber", '"level"'):
        assert secret not in text, text


@pytest.mark.parametrize("body, status", [
    ({"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": True}}, 400),
    ({"prompt": "x", "max_tokens": 1, "stream": True}, 400),
    ({"prompt": "in-stream", "max_tokens": 1, "stream": True}, 200),
    ({"prompt": "leak-200", "max_tokens": 1}, 502),
])
def test_an_upstream_that_echoes_the_request_gives_nothing_of_the_grant_back(echoing_gateway, caplog, body, status):
    caplog.set_level(logging.DEBUG, logger="caliber_core.gateway.app")
    with httpx.stream("POST", echoing_gateway.base + "/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {api_key('acct-flagged')}"}) as r:
        text = r.read().decode()
    assert r.status_code == status
    assert_nothing_of_the_grant(text)
    if status == 200:  # the stream goes on; the error event is the gateway's own
        assert text == (f"data: {json.dumps({'i': 0})}\n\n" + "data: " + json.dumps(
            {"error": {"message": "the model server refused the request (HTTP 400)", "type": "invalid_request_error",
                       "code": 400}}) + "\n\ndata: [DONE]\n\n")
    else:
        assert set(json.loads(text)) == {"error"} and json.loads(text)["error"]["code"] == status
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "caliber-grant.v1.<redacted>" in logged or "<grant>" in logged  # the upstream's text, redacted
    assert not re.search(r"caliber-grant\.v1\.[A-Za-z0-9_-]{8}", logged)


# ---------------------------------------------------------------- only what can be noised consistently
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
NON_TEXT = [
    ("/v1/completions", {"prompt_embeds": "AAAA", "max_tokens": 2, "logprobs": 5}, "prompt_embeds"),
    ("/v1/completions", {"prompt": "w4", "prompt_embeds": ["AAAA"], "max_tokens": 2}, "prompt_embeds"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "w4"}, IMAGE]}],
                              "max_tokens": 2}, "non-text message content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"image_url": {"url": "x"}}]}],
                              "max_tokens": 2}, "non-text message content"),  # vLLM reads a part without a type too
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}], "max_tokens": 2},
     "non-text message content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "w4",
                                                                         "image_url": {"url": "x"}}]}],
                              "max_tokens": 2}, "non-text message content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "prompt_embeds",
                                                                         "prompt_embeds": "AAAA"}]}],
                              "max_tokens": 2}, "non-text message content"),  # vLLM's chat embeddings part
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "uuid": "img-1"}]}],
                              "max_tokens": 2}, "non-text message content"),  # a cached image by its uuid
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "w4",
                                                                         "uuid": "x"}]}],
                              "max_tokens": 2}, "non-text message content"),
]


@pytest.mark.parametrize("path, body, what", NON_TEXT)
def test_non_text_inputs_are_refused_to_a_flagged_account(gateway, path, body, what):
    g = gateway
    r = post(g, path, body, account="acct-flagged")
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        f"{what} is not served to this account: only text and token-id prompts get noise that repeats consistently")
    assert g.seen == [] and g.throttle.state("acct-flagged").queries == {}  # nothing counted, nothing forwarded
    assert post(g, path, body).status_code == 200  # an unflagged account is served clean anyway


def test_text_parts_are_served_to_a_flagged_account(gateway):
    g = gateway
    body = {"messages": [{"role": "system", "content": None}, {"role": "user", "content": [
        {"type": "text", "text": "w4"}, {"text": "w5"}, "w6", {"type": "input_text", "text": "w7"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}, {"type": "thinking", "thinking": "w8"},
                                          {"type": "output_text", "text": "w9"}]}], "max_tokens": 2}
    assert post(g, "/v1/chat/completions", body, account="acct-flagged").status_code == 200
    assert level_of(g, g.seen[-1]["body"]) == 2


def test_non_text_inputs_refused_to_all_accounts(tmp_path):
    policy = load_policy(write_policy(tmp_path))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, refuse_non_text="all",
                             authenticate=key_accounts(tmp_path))) as base:
        r = httpx.post(base + "/v1/completions", json={"prompt_embeds": "AAAA", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {api_key('a')}"}, timeout=30)
        assert r.status_code == 400 and "prompt_embeds is not served" in r.json()["error"]["message"]
    assert seen == [] and throttle.state("a").queries == {}
    with pytest.raises(ValueError, match=r"refuse_non_text must be one of \('flagged', 'all'\), got 'x'"):
        create_app(throttle, key=KEY, upstream=upstream, refuse_non_text="x", authenticate=key_accounts(tmp_path))
    with pytest.raises(ValueError, match="the gateway serves authenticated accounts only"):
        create_app(throttle, key=KEY, upstream=upstream, authenticate=None)


def test_the_granted_level_is_checked_too_when_the_ledger_cannot_be_read(tmp_path):
    from caliber_core.throttle.stores import open_store

    policy = load_policy(write_policy(tmp_path, on_store_error="last-known", unseen_level=1))
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.store = open_store(f"redis://127.0.0.1:{free_port()}/0")  # the store goes away after the start
    seen = []
    with serve(recording_upstream(seen)) as upstream, \
            serve(create_app(throttle, key=KEY, upstream=upstream, authenticate=key_accounts(tmp_path))) as base:
        for body in ({"prompt": "w4", "max_tokens": 1, "prompt_logprobs": 1}, {"prompt_embeds": "AAAA"}):
            r = httpx.post(base + "/v1/completions", json=body, headers={"Authorization": f"Bearer {api_key('a')}"},
                           timeout=30)
            assert r.status_code == 400 and "is not served to this account" in r.json()["error"]["message"]
        assert seen == []  # served the outage rule's level 1, so refused after the grant
        r = httpx.post(base + "/v1/completions", json={"prompt": "w4", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {api_key('a')}"}, timeout=30)
        assert r.status_code == 200 and len(seen) == 1
