"""The gateway app: authenticate, count and grant, strip, sign, forward to vLLM; stream back.

For each ``POST /v1/completions`` or ``/v1/chat/completions``:

1. the bearer credential names the account (401 otherwise);
2. the body is read up to a bound (413), parsed (400), stripped of the fields
   that reach vLLM's ``extra_args`` (a client's ``vllm_xargs`` is dropped);
3. ``Throttle.grant(account, rows=max(max_tokens, 1) x max(n, best_of))``
   counts the request and escalates as ``respond`` does; an unreachable store
   under ``on_store_error: refuse`` answers 503 (fail closed);
4. a request for prompt logprobs is refused (400) at level >= 1;
5. the grant token goes into ``vllm_xargs.caliber`` and the body to the
   upstream; its answer (streamed as server-sent events when asked) goes back
   unchanged. An unreachable upstream answers 502.

Nothing else is proxied: any other path is 404 here.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..throttle.grants import grant_key, policy_digest, verify_grant
from ..throttle.stores import StoreUnavailable
from .request_rules import (CHAT, COMPLETIONS, DEFAULT_MAX_TOKENS, MAX_BODY_BYTES, GatewayRefusal, bearer_account,
                            check_prompt_logprobs, parse_body, rows_of)

__all__ = ["create_app", "PROMPT_LOGPROBS_RULES"]

#: ``flagged``: refuse prompt logprobs at level >= 1; ``all``: for every account (the refusal then reveals nothing).
PROMPT_LOGPROBS_RULES = ("flagged", "all")
_FORWARDED_RESPONSE_HEADERS = ("content-type",)


def _error(status: int, message: str) -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": "invalid_request_error"
                                                                if status < 500 else "server_error",
                                                               "code": status}})


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


def create_app(throttle, *, key: bytes, upstream: str, default_max_tokens: int = DEFAULT_MAX_TOKENS,
               max_body_bytes: int = MAX_BODY_BYTES, refuse_prompt_logprobs: str = "flagged",
               upstream_api_key: str | None = None, valid_minutes: float | None = None, timeout: float = 600.0,
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
    default_max_tokens : int, default DEFAULT_MAX_TOKENS
        Given to, and counted for, a request that does not set ``max_tokens``.
    max_body_bytes : int, default MAX_BODY_BYTES
        Larger bodies get 413.
    refuse_prompt_logprobs : {"flagged", "all"}
        Who is refused prompt logprobs (see :mod:`.request_rules`).
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
    """
    if refuse_prompt_logprobs not in PROMPT_LOGPROBS_RULES:
        raise ValueError(f"refuse_prompt_logprobs must be one of {PROMPT_LOGPROBS_RULES}, got {refuse_prompt_logprobs!r}")
    if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int) or default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be a positive integer, got {default_max_tokens!r}")
    signing_key, digest, top = grant_key(key), policy_digest(throttle.policy), throttle.policy.top
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

    async def forward(path: str, request: Request):
        try:
            account = bearer_account(request.headers.get("authorization"))
            body = parse_body(await _read_bounded(request, max_body_bytes))
            rows = rows_of(path, body, default_max_tokens=default_max_tokens)
            try:
                token = throttle.grant(account, rows=rows, valid_minutes=valid_minutes)
            except StoreUnavailable:
                return _error(503, "the service cannot decide this request now; try again later")
            level = verify_grant(token, signing_key=signing_key, digest=digest, top=top).level
            check_prompt_logprobs(path, body, level=level, refuse=refuse_prompt_logprobs)
        except GatewayRefusal as refusal:
            return _error(refusal.status, refusal.message)
        body["vllm_xargs"] = {"caliber": token}
        client: httpx.AsyncClient = state["client"]
        upstream_request = client.build_request("POST", base + path, json=body, headers=headers)
        try:
            reply = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, f"the model server is unreachable ({type(exc).__name__})")
        passed = {name: reply.headers[name] for name in _FORWARDED_RESPONSE_HEADERS if name in reply.headers}
        if body.get("stream") and reply.status_code == 200:
            async def relay():
                try:
                    async for chunk in reply.aiter_raw():
                        yield chunk
                finally:
                    await reply.aclose()

            return StreamingResponse(relay(), status_code=reply.status_code, headers=passed)
        try:
            content = await reply.aread()
        finally:
            await reply.aclose()
        return Response(content=content, status_code=reply.status_code, headers=passed)

    @app.post(COMPLETIONS)
    async def completions(request: Request):
        return await forward(COMPLETIONS, request)

    @app.post(CHAT)
    async def chat_completions(request: Request):
        return await forward(CHAT, request)

    return app
