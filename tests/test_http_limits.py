"""Request bounds of the FastAPI example under uvicorn, over real HTTP, and the strict JSON they rest on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from throttle_support import serve_example, write_policy

from caliber_core.serving.request_limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, RequestRejected, parse_json

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from caliber_core.throttle import Throttle  # noqa: E402

MAX_BODY = 1 << 20  # the server under test takes 1 MiB bodies


def _rss_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http-limits")
    policy = write_policy(folder, escalate_after=1000)
    env = {"CALIBER_POLICY": str(policy), "CALIBER_STORE": f"sqlite:///{folder / 'ledger.db'}",
           "CALIBER_FEATURES": "8", "CALIBER_MAX_BODY_BYTES": str(MAX_BODY)}
    with serve_example(folder, env=env) as (base, proc):
        yield base, proc.pid, policy, folder


def _queries(policy, folder, account):
    with Throttle.from_files(policy, store=f"sqlite:///{folder / 'ledger.db'}", metrics=False) as admin:
        return admin.state(account).queries


def _post(base, content, *, account="acct-1", headers=None):
    return httpx.post(base + "/v1/classify", content=content, timeout=120,
                      headers={"Authorization": f"Bearer {account}", "Content-Type": "application/json",
                               **(headers or {})})


def test_a_60_mb_body_is_refused_with_413_and_never_held(server):
    base, pid, policy, folder = server
    assert _post(base, json.dumps({"inputs": [[0.5] * 8]})).status_code == 200  # warm: imports done
    before = _rss_kib(pid, "VmRSS")
    row = "[" + ", ".join(["0.0"] * 8) + "]"
    body = ('{"inputs": [' + ", ".join([row] * 1_500_000) + "]}").encode()
    assert len(body) > 60_000_000
    declared = _post(base, body)  # Content-Length: refused from the header
    assert declared.status_code == 413
    assert declared.json() == {"detail": f"request body is larger than the {MAX_BODY:,} bytes allowed "
                                         f"(declared {len(body):,} bytes)"}

    def chunks():  # no Content-Length: counted as it arrives
        for start in range(0, len(body), 1 << 16):
            yield body[start:start + (1 << 16)]

    streamed = _post(base, chunks())
    assert streamed.status_code == 413
    assert streamed.json() == {"detail": f"request body is larger than the {MAX_BODY:,} bytes allowed"}
    assert (_rss_kib(pid, "VmHWM") - before) * 1024 < 150e6  # the peak, not just what is left
    assert _queries(policy, folder, "acct-1") == {0: 1}  # only the warm-up counted


@pytest.mark.parametrize("literal, detail", [
    ("Infinity", "Infinity is not a number JSON allows; every value must be finite"),
    ("-Infinity", "-Infinity is not a number JSON allows"),
    ("NaN", "NaN is not a number JSON allows"),
    ("1e400", "a number of 5 characters is beyond the float64 range"),
    ("1" + "0" * 400, "an integer of 401 characters is beyond the float64 range"),
])
def test_non_finite_numbers_are_422_and_not_counted(server, literal, detail):
    base, _, policy, folder = server
    account = f"acct-nonfinite-{len(literal)}-{literal[:3]}"
    reply = _post(base, '{"inputs": [[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, %s]]}' % literal, account=account)
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith(detail)
    assert literal not in reply.text or literal in ("Infinity", "-Infinity", "NaN")  # named, the value not quoted
    assert _queries(policy, folder, account) == {}


def test_error_bodies_never_echo_the_input(server):
    base, _, policy, folder = server
    rows = [[0.123456789 + i] * 8 for i in range(1025)]
    too_many = _post(base, json.dumps({"inputs": rows}), account="acct-echo")
    assert too_many.status_code == 422 and len(too_many.content) < 300
    assert too_many.json()["detail"] == "inputs: List should have at most 1024 items after validation, not 1025"
    for body, detail in [
        ('{"inputs": [[1, 2, "0.123456789secret"]]}', "inputs.0.2: Input should be a valid number"),
        ('{"inputs": "0.123456789secret"}', "inputs: Input should be a valid list"),
        ('{"inputs": [[0.1234567 0.5]]}', "request body is not valid JSON (line 1, column 24: Expecting ',' delimiter)"),
        (b'{"inputs": [[\xff]]}', "request body is not UTF-8 (invalid byte at offset 13)"),
    ]:
        reply = _post(base, body, account="acct-echo")
        assert reply.status_code == 422 and reply.json()["detail"].startswith(detail), reply.text
        assert "secret" not in reply.text and "1234567" not in reply.text
    assert _queries(policy, folder, "acct-echo") == {}


def test_the_body_limit_is_stated_and_checked():
    assert DEFAULT_MAX_BODY_BYTES == 8 << 20
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1, got 0"):
        BodyLimit(None, max_bytes=0)


@pytest.mark.parametrize("raw, match", [
    (b"[Infinity]", "Infinity is not a number JSON allows"),
    (b"[1e309]", "beyond the float64 range"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"{\"a\": 1", r"not valid JSON \(line 1, column 8"),
])
def test_strict_json_refusals(raw, match):
    with pytest.raises(RequestRejected, match=match):
        parse_json(raw)
    assert parse_json(b'{"a": [1.5, -2, 1e300]}') == {"a": [1.5, -2, 1e300]}
