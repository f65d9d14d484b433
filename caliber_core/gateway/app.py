"""The gateway app: authenticate, count and grant, strip, sign, forward to vLLM; stream back what is safe to.

For each ``POST /v1/completions`` or ``/v1/chat/completions``:

1. the caller is authenticated (:mod:`.identity`: an API key in the accounts
   file, or a trusted proxy's account header); 401 otherwise, nothing counted;
2. the body is read up to a bound (413), parsed (400), stripped of the fields
   that reach vLLM's ``extra_args`` (a client's ``vllm_xargs`` is dropped);
3. its rows are counted in advance: prompts x max(n, best_of) x max tokens, a
   400 over the ledger's limit (:func:`.request_rules.rows_of`);
4. a request carrying what is served only clean (prompt logprobs, prompt
   embeddings, non-text chat content) is refused (400) when the account's
   ledger entry is flagged, before anything is counted;
5. ``Throttle.grant(account, rows)`` counts the request and escalates as
   ``respond`` does; an unreachable store under ``on_store_error: refuse``
   answers 503 (fail closed). The granted level is checked against step 4's
   rules again (a request whose own rows escalated the account is refused, counted);
6. the grant token goes into ``vllm_xargs.caliber`` and the body to the
   upstream. A 200 answer goes back as it came (streamed as server-sent events
   when asked), unless it holds this request's token. Every error the upstream
   answers, as a status or as an error event in a stream, is replaced by the
   gateway's own, with the status kept: vLLM's validation errors can quote
   the request, grant included. The upstream's text is logged at debug, with
   any grant token redacted. An unreachable upstream answers 502.

Nothing else is proxied: any other path is 404 here.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..throttle.grants import PREFIX, grant_key, policy_digest, verify_grant
from ..throttle.groups import DescriptorError
from ..throttle.stores import StoreUnavailable
from .request_rules import (CHAT, COMPLETIONS, DEFAULT_MAX_TOKENS, MAX_BODY_BYTES, GatewayRefusal, check_level_rules,
                            needs_level, parse_body, rows_of)

__all__ = ["create_app", "PROMPT_LOGPROBS_RULES", "NON_TEXT_RULES", "MAX_UPSTREAM_ERROR_BYTES"]

log = logging.getLogger(__name__)

#: ``flagged``: refuse prompt logprobs at level >= 1; ``all``: for every account (the refusal then reveals nothing).
PROMPT_LOGPROBS_RULES = ("flagged", "all")
#: The same choice for ``prompt_embeds`` and non-text chat content.
NON_TEXT_RULES = ("flagged", "all")
#: The most of an upstream error body read (for the debug log; the client never sees it).
MAX_UPSTREAM_ERROR_BYTES = 64 << 10
#: A streamed event larger than this (without its blank-line end) ends the stream with an error.
MAX_EVENT_BYTES = 64 << 20
_FORWARDED_RESPONSE_HEADERS = ("content-type",)
_TOKEN_PATTERN = re.compile(re.escape(PREFIX) + r"\.[A-Za-z0-9_\-.=]*")


def _error_content(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "code": status}}


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse(status_code=status, content=_error_content(status, message), headers=headers)


def _upstream_message(status: int) -> str:
    if status < 500:
        return f"the model server refused the request (HTTP {status})"
    return f"the model server failed to answer the request (HTTP {status})"


def _redacted(text: str, token: str) -> str:
    """``text`` with this request's token, and anything shaped like a grant token, cut out."""
    return _TOKEN_PATTERN.sub(f"{PREFIX}.<redacted>", text.replace(token, "<grant>"))


async def _read_bounded(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise GatewayRefusal(413, f"request body is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayRefusal(413, f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _event_error_status(event: bytes) -> int | None:
    """The status of a server-sent event that carries an error object (vLLM's ``data: {"error": ...}``), else None."""
    if b'"error"' not in event:
        return None
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                data = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(data, dict) and "error" in data:
                code = data["error"].get("code") if isinstance(data["error"], dict) else None
                return code if isinstance(code, int) and 400 <= code <= 599 else 500
    return None


def _error_event(status: int) -> bytes:
    return b"data: " + json.dumps(_error_content(status, _upstream_message(status))).encode() + b"\n\n"


def _current_level(throttle, account: str) -> int | None:
    """The level the ledger holds for ``account`` now, without counting; None when the store cannot say."""
    try:
        entry = throttle.status(account)
    except StoreUnavailable:
        return None  # the grant's outage rule decides; the granted level is checked after it
    if throttle.policy.shadow or not entry.get("flagged") or entry.get("flag_lapsed"):
        return 0
    return int(entry.get("level", 0))


def create_app(throttle, *, key: bytes, upstream: str, authenticate, default_max_tokens: int = DEFAULT_MAX_TOKENS,
               max_body_bytes: int = MAX_BODY_BYTES, refuse_prompt_logprobs: str = "flagged",
               refuse_non_text: str = "flagged", upstream_api_key: str | None = None,
               valid_minutes: float | None = None, timeout: float = 600.0,
               transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The gateway's FastAPI app.

    Parameters
    ----------
    throttle : caliber_core.throttle.Throttle
        Built with the key (it signs the grants).
    key : bytes
        The seeding key (the same file vLLM's processor reads), to read back the granted level.
    upstream : str
        vLLM's base URL, e.g. ``http://127.0.0.1:8000`` (reachable by the gateway only).
    authenticate : callable
        ``authenticate(headers, peer) -> Identity``, raising a 401
        :class:`~.request_rules.GatewayRefusal`: a
        :class:`~.identity.KeyAccounts` or :class:`~.identity.HeaderAccounts`.
        Required: the gateway serves authenticated accounts only.
    default_max_tokens : int, default DEFAULT_MAX_TOKENS
        Given to, and counted for, a request that does not set ``max_tokens``.
    max_body_bytes : int, default MAX_BODY_BYTES
        Larger bodies get 413.
    refuse_prompt_logprobs : {"flagged", "all"}
        Who is refused prompt logprobs (see :mod:`.request_rules`).
    refuse_non_text : {"flagged", "all"}
        Who is refused ``prompt_embeds`` and non-text chat content.
    upstream_api_key : str, optional
        Sent to vLLM as its ``--api-key`` bearer (never the client's credential).
    valid_minutes : float, optional
        How long vLLM honours a grant (default: ``grants.DEFAULT_VALID_MINUTES``).
    timeout : float
        Seconds to wait on the upstream.
    transport : httpx transport, optional
        For tests.

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ValueError
        No ``authenticate``, or a bad rule or default.
    """
    if not callable(authenticate):
        raise ValueError("the gateway serves authenticated accounts only: pass authenticate=KeyAccounts(...) "
                         "or HeaderAccounts(...)")
    if refuse_prompt_logprobs not in PROMPT_LOGPROBS_RULES:
        raise ValueError(f"refuse_prompt_logprobs must be one of {PROMPT_LOGPROBS_RULES}, got {refuse_prompt_logprobs!r}")
    if refuse_non_text not in NON_TEXT_RULES:
        raise ValueError(f"refuse_non_text must be one of {NON_TEXT_RULES}, got {refuse_non_text!r}")
    if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int) or default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be a positive integer, got {default_max_tokens!r}")
    signing_key, digest, top = grant_key(key), policy_digest(throttle.policy), throttle.policy.top
    rules = dict(refuse_prompt_logprobs=refuse_prompt_logprobs, refuse_non_text=refuse_non_text)
    challenge = {"www-authenticate": "Bearer"} if getattr(authenticate, "scheme", None) == "bearer" else None
    base = upstream.rstrip("/")
    headers = {"content-type": "application/json"}
    if upstream_api_key:
        headers["authorization"] = f"Bearer {upstream_api_key}"
    state = {}

    @asynccontextmanager
    async def lifespan(_app):
        async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
            state["client"] = client
            yield

    app = FastAPI(title="Caliber gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    def grant(identity, rows: int) -> str:
        if identity.groups:  # campaign descriptors from a trusted proxy, counted with the account
            return throttle.grant(identity.account, rows=rows, groups=dict(identity.groups),
                                  valid_minutes=valid_minutes)
        return throttle.grant(identity.account, rows=rows, valid_minutes=valid_minutes)

    async def forward(path: str, request: Request):
        try:
            identity = authenticate(request.headers, request.client.host if request.client else None)
        except GatewayRefusal as refusal:
            return _error(refusal.status, refusal.message, challenge if refusal.status == 401 else None)
        try:
            body = parse_body(await _read_bounded(request, max_body_bytes))
            rows = rows_of(path, body, default_max_tokens=default_max_tokens)
            if needs_level(path, body):  # refuse a flagged account before counting anything
                level = _current_level(throttle, identity.account)
                check_level_rules(path, body, level=0 if level is None else level, **rules)
            try:
                token = grant(identity, rows)
            except StoreUnavailable:
                return _error(503, "the service cannot decide this request now; try again later")
            except DescriptorError:  # the proxy's descriptor, not the client's: never quoted back
                return _error(400, "a campaign descriptor of this request was refused")
            level = verify_grant(token, signing_key=signing_key, digest=digest, top=top).level
            check_level_rules(path, body, level=level, **rules)  # this request's own rows may have escalated it
        except GatewayRefusal as refusal:
            return _error(refusal.status, refusal.message)
        body["vllm_xargs"] = {"caliber": token}
        secret = token.encode("ascii")
        payload = token.split(".")[2].encode("ascii")  # the level's encoding: never in what the client gets
        client: httpx.AsyncClient = state["client"]
        upstream_request = client.build_request("POST", base + path, json=body, headers=headers)
        try:
            reply = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, f"the model server is unreachable ({type(exc).__name__})")
        if reply.status_code != 200:
            return await _replaced_error(reply, path, token)
        passed = {name: reply.headers[name] for name in _FORWARDED_RESPONSE_HEADERS if name in reply.headers}
        if body.get("stream"):
            return StreamingResponse(_relay_events(reply, path, token, payload), status_code=200, headers=passed)
        try:
            content = await reply.aread()
        except httpx.HTTPError as exc:
            return _error(502, f"the model server's answer broke off ({type(exc).__name__})")
        finally:
            await reply.aclose()
        if secret in content or payload in content:
            if log.isEnabledFor(logging.DEBUG):
                shown = _redacted(content[:MAX_UPSTREAM_ERROR_BYTES].decode("utf-8", "replace"), token)
                log.debug("upstream 200 on %s held the grant, replaced: %s", path, " ".join(shown.split()))
            return _error(502, _upstream_message(502))
        return Response(content=content, status_code=200, headers=passed)

    async def _replaced_error(reply: httpx.Response, path: str, token: str) -> JSONResponse:
        status = reply.status_code
        text = b""
        try:
            async for chunk in reply.aiter_bytes():  # decoded, whatever the upstream compressed
                text += chunk
                if len(text) >= MAX_UPSTREAM_ERROR_BYTES:
                    break
        except httpx.HTTPError:
            pass
        finally:
            await reply.aclose()
        if log.isEnabledFor(logging.DEBUG):
            shown = _redacted(text[:MAX_UPSTREAM_ERROR_BYTES].decode("utf-8", "replace"), token)
            log.debug("upstream answered %d on %s: %s", status, path, " ".join(shown.split()))
        status = status if 400 <= status <= 599 else 502  # a 1xx/3xx here is not an answer to relay
        return _error(status, _upstream_message(status))

    async def _relay_events(reply: httpx.Response, path: str, token: str, payload: bytes):
        """Relay server-sent events as they come, each whole; an error event, or one holding the grant, is replaced."""
        secret, pending = token.encode("ascii"), b""

        def checked(event: bytes) -> bytes:
            status = _event_error_status(event)
            if status is None and (secret in event or payload in event):
                status = 502
            if status is None:
                return event + b"\n\n"
            if log.isEnabledFor(logging.DEBUG):
                shown = _redacted(event[:MAX_UPSTREAM_ERROR_BYTES].decode("utf-8", "replace"), token)
                log.debug("upstream event on %s replaced: %s", path, " ".join(shown.split()))
            return _error_event(status)

        try:
            async for chunk in reply.aiter_bytes():  # decoded, whatever the upstream compressed
                pending += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    yield checked(event)
                if len(pending) > MAX_EVENT_BYTES:
                    yield _error_event(502)
                    return
            if pending.strip():  # a last event without its blank line
                yield checked(pending)
        except httpx.HTTPError:
            yield _error_event(502)
        finally:
            await reply.aclose()

    @app.post(COMPLETIONS)
    async def completions(request: Request):
        return await forward(COMPLETIONS, request)

    @app.post(CHAT)
    async def chat_completions(request: Request):
        return await forward(CHAT, request)

    return app
