"""Bounds on an HTTP request before the service reads it: body size, then strict, finite JSON.

* :class:`BodyLimit`, a plain ASGI middleware (no framework imported):
  a body declared larger than the limit (``Content-Length``) is answered
  413 before a byte of it is read; a body sent without a length (chunked) is
  counted as it arrives and answered 413 as soon as it passes the limit.
  Either way the refused body is read and dropped a chunk at a time (so that
  the client, which is still sending, reads the answer rather than a reset
  connection), never held: the server holds at most the limit per request.
  A client that asked ``Expect: 100-continue`` is answered before it sends
  anything.
* :func:`parse_json`, JSON that holds only finite numbers: ``NaN``,
  ``Infinity`` and a literal too large for a float64 (``1e400``) are refused.
  Its messages say where and what rule, never the input.

Only the standard library is imported.
"""

from __future__ import annotations

import json
import math

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit", "parse_json", "RequestRejected"]

#: The default largest body: 8 MiB, about 1,024 rows of 400 features written as JSON.
DEFAULT_MAX_BODY_BYTES = 8 << 20
#: How much of a refused body is read and dropped so that the client sees the 413; past it
#: the connection is closed.
DRAIN_MAX_BYTES = 1 << 30


class RequestRejected(ValueError):
    """A request body the service refuses; ``str()`` is one line that never quotes the body."""


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413, before it is held.

    Parameters
    ----------
    app : ASGI application
    max_bytes : int, keyword-only, default DEFAULT_MAX_BODY_BYTES
        The largest body accepted, in bytes.

    Notes
    -----
    The accepted body is read here and handed to ``app`` in one message, so
    that the framework behind never waits on the client: the body is whole
    (and at most ``max_bytes``) before any parsing starts.
    """

    def __init__(self, app, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an int >= 1, got {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                await _answer(send, 400, "Content-Length is not a byte count")
                return
            if int(declared) > self.max_bytes:
                # Before any receive(): with Expect: 100-continue the client never sends the body.
                drained = 0 if expects_continue else await _drain(receive, 0)
                await _answer(send, 413, self._too_large(int(declared)), close=drained is None)
                return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                chunks.clear()  # never held: what came is dropped, the rest is read and dropped too
                drained = await _drain(receive, size) if message.get("more_body") else size
                await _answer(send, 413, self._too_large(None), close=drained is None)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self, declared: int | None) -> str:
        said = f" (declared {declared:,} bytes)" if declared is not None else ""
        return f"request body is larger than the {self.max_bytes:,} bytes allowed{said}"


async def _drain(receive, count: int) -> int | None:
    """Read and drop the rest of a body; the bytes seen, or None past DRAIN_MAX_BYTES or a disconnect."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        count += len(message.get("body", b""))
        if count > DRAIN_MAX_BYTES:
            return None
        if not message.get("more_body"):
            return count


async def _answer(send, status: int, detail: str, *, close: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close or status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _refuse_constant(name: str):
    raise RequestRejected(f"{name} is not a number JSON allows; every value must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestRejected(f"a number of {len(text)} characters is beyond the float64 range; "
                              "every value must be finite")
    return value


def _bounded_int(text: str) -> int:
    # A float64 holds at most 309 integer digits; Python would take 4,300 before refusing.
    if len(text.lstrip("-")) > 308:
        raise RequestRejected(f"an integer of {len(text)} characters is beyond the float64 range; "
                              "every value must be finite")
    return int(text)


def parse_json(raw: bytes):
    """Parse a request body as strict JSON: UTF-8, finite numbers only.

    Parameters
    ----------
    raw : bytes
        The whole body (already bounded by :class:`BodyLimit`).

    Returns
    -------
    object
        The parsed document.

    Raises
    ------
    RequestRejected
        Not UTF-8, not JSON (the line and column are given), nested too
        deeply, or a number that is ``NaN``, ``Infinity``, ``-Infinity`` or
        beyond the float64 range (``1e400``, a 400-digit integer). The
        message never quotes the body.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestRejected(f"request body is not UTF-8 (invalid byte at offset {err.start})") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except json.JSONDecodeError as err:
        raise RequestRejected(f"request body is not valid JSON (line {err.lineno}, column {err.colno}: "
                              f"{err.msg})") from None
    except RecursionError:
        raise RequestRejected("request body is nested too deeply") from None
