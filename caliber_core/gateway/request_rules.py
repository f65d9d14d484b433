"""What the gateway accepts and forwards: the bearer account, a bounded JSON body, the rows it counts.

Every rule here raises :class:`GatewayRefusal` with the HTTP status and a one-line
message; nothing is counted before the body has passed every check but the
level-dependent one (prompt logprobs), which needs the grant.

Prompt logprobs never pass through vLLM's logits processors (they are computed
apart from sampling): ``prompt_logprobs`` on either endpoint, ``echo`` with
``logprobs`` on ``/v1/completions`` and ``echo`` on ``/v1/chat/completions``
(where vLLM then asks for prompt logprobs at ``top_logprobs``) would hand a
flagged account clean, teacher-forced logprobs for any text it sends. The
gateway refuses them with HTTP 400 for an account granted level >= 1 (or for
every account, with ``refuse_prompt_logprobs="all"``, so that the refusal does
not tell an account it is flagged).
"""

from __future__ import annotations

import json
import numbers

__all__ = ["COMPLETIONS", "CHAT", "DEFAULT_MAX_TOKENS", "MAX_BODY_BYTES", "DROPPED_FIELDS", "GatewayRefusal",
           "bearer_account", "parse_body", "rows_of", "check_prompt_logprobs"]

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
#: What a request without ``max_tokens`` (``max_completion_tokens`` on chat) is given, counted and forwarded with.
DEFAULT_MAX_TOKENS = 256
#: The largest request body read (1 MiB); larger ones get HTTP 413 before any parsing.
MAX_BODY_BYTES = 1 << 20
#: Body fields a client may not set: they reach vLLM's ``extra_args`` (where the grant token lives).
DROPPED_FIELDS = ("vllm_xargs", "kv_transfer_params", "ec_transfer_params")
#: Bounds on the counts that multiply the rows (vLLM has its own, usually lower, limits).
MAX_TOKENS_LIMIT = 1 << 20
MAX_SEQUENCES = 1 << 10
MAX_ACCOUNT_CHARS = 512


class GatewayRefusal(Exception):
    """A request the gateway does not forward.

    Parameters
    ----------
    status : int
        The HTTP status to answer with (400, 401, 413, ...).
    message : str
        One line for the client; it shows the offending value, never a secret.

    Attributes
    ----------
    status : int
        As given.
    message : str
        As given (also the exception's text).
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def bearer_account(authorization: str | None) -> str:
    """The account named by an ``Authorization: Bearer <account>`` header.

    Parameters
    ----------
    authorization : str or None
        The header's value as received (None when absent).

    Returns
    -------
    str
        The credential after ``Bearer``, stripped: the account key the throttle counts under.

    Raises
    ------
    GatewayRefusal
        401 when the header is missing, not a Bearer credential, empty,
        longer than 512 characters or holding whitespace or control characters.
    """
    if not authorization:
        raise GatewayRefusal(401, "missing Authorization header: send 'Authorization: Bearer <account key>'")
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        raise GatewayRefusal(401, "Authorization must be 'Bearer <account key>'")
    if len(credential) > MAX_ACCOUNT_CHARS or not credential.isprintable() or any(c.isspace() for c in credential):
        raise GatewayRefusal(401, f"the bearer credential must be one word of at most {MAX_ACCOUNT_CHARS} "
                                  "printable characters")
    return credential


def _reject_constant(name):
    raise ValueError(f"{name} is not a number")


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, with the fields a client may not set removed.

    Parameters
    ----------
    raw : bytes
        The request body as read from the socket.

    Returns
    -------
    dict
        The parsed object without the :data:`DROPPED_FIELDS` (changed in place
        later by :func:`rows_of`, which fills a missing ``max_tokens``).

    Raises
    ------
    GatewayRefusal
        413 beyond :data:`MAX_BODY_BYTES` (checked by the caller while reading
        too), 400 for invalid JSON (NaN and Infinity included, or nesting deep
        enough to exhaust recursion) and for anything that is not a JSON object.
    """
    if len(raw) > MAX_BODY_BYTES:
        raise GatewayRefusal(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise GatewayRefusal(400, f"request body is not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(body, dict):
        raise GatewayRefusal(400, f"request body must be a JSON object, got {type(body).__name__}")
    for field in DROPPED_FIELDS:
        body.pop(field, None)
    return body


def _count(body: dict, field: str, *, low: int, high: int, default):
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        shown = repr(value)[:40]
        raise GatewayRefusal(400, f"{field} must be an integer in [{low}, {high}], got {shown}")
    return int(value)


def rows_of(path: str, body: dict, *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    """The rows a request may generate, counted by the throttle; sets ``max_tokens`` when the client did not.

    rows = max(max_tokens, 1) x max(n, best_of): every sequence vLLM decodes
    is served noise, and the throttle counts each position it may generate.

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body (:func:`parse_body`). When it has no ``max_tokens``
        (``max_completion_tokens`` on chat), ``default_max_tokens`` is written
        into it, so vLLM cannot generate more than was counted.
    default_max_tokens : int, default :data:`DEFAULT_MAX_TOKENS`
        The token budget of a request that names none.

    Returns
    -------
    int
        The number of rows (decoding positions) to count, >= 1.

    Raises
    ------
    GatewayRefusal
        400 when ``max_tokens`` is not an integer in [0, 2^20], or ``n`` or
        ``best_of`` is not an integer in [1, 1024] (bools refused).
    """
    field = "max_completion_tokens" if path == CHAT and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _count(body, field, low=0, high=MAX_TOKENS_LIMIT, default=None)
    if max_tokens is None:
        max_tokens = default_max_tokens
        body["max_completion_tokens" if path == CHAT else "max_tokens"] = max_tokens
    n = _count(body, "n", low=1, high=MAX_SEQUENCES, default=1)
    best_of = _count(body, "best_of", low=1, high=MAX_SEQUENCES, default=1)
    return max(max_tokens, 1) * max(n, best_of)


def asks_prompt_logprobs(path: str, body: dict) -> bool:
    """Whether the request would return logprobs of its prompt (computed by vLLM without the noise).

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body.

    Returns
    -------
    bool
        True for ``prompt_logprobs``, for ``echo`` on chat, and for ``echo``
        with ``logprobs`` on completions.
    """
    if body.get("prompt_logprobs") is not None:
        return True
    if body.get("echo"):
        return path == CHAT or body.get("logprobs") is not None
    return False


def check_prompt_logprobs(path: str, body: dict, *, level: int, refuse: str) -> None:
    """Refuse a request for prompt logprobs at level >= 1 (``refuse="flagged"``) or always (``refuse="all"``).

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body.
    level : int
        The level the throttle granted this account.
    refuse : {"flagged", "all"}
        Refuse only accounts at level >= 1, or every account (so the refusal
        does not reveal a flag).

    Raises
    ------
    GatewayRefusal
        400, naming the fields that ask for prompt logprobs.
    """
    if asks_prompt_logprobs(path, body) and (refuse == "all" or level >= 1):
        fields = "prompt_logprobs" if body.get("prompt_logprobs") is not None else (
            "echo" if path == CHAT else "echo with logprobs")
        raise GatewayRefusal(400, f"{fields} is not served to this account: prompt logprobs are computed apart from "
                                  "the served noise")
