"""What the gateway accepts and forwards: the API key, a bounded JSON body, the rows it counts, what it refuses.

Every rule here raises :class:`GatewayRefusal` with the HTTP status and a one-line
message that never shows a key or an account id; nothing is counted before the
body has passed every check.

Rows are counted for everything vLLM may generate: every prompt of a batched
``prompt`` (strings, token-id lists) or ``prompt_embeds``, times ``n`` (or
``best_of``, the larger), times the token limit. A product over the ledger's
limit per request is a 400, before anything is counted.

Prompt logprobs never pass through vLLM's logits processors (they are computed
apart from sampling): ``prompt_logprobs`` on either endpoint, ``echo`` with
``logprobs`` on ``/v1/completions`` and ``echo`` on ``/v1/chat/completions``
(where vLLM then asks for prompt logprobs at ``top_logprobs``) would hand a
flagged account clean, teacher-forced logprobs for any text it sends. Inputs
that are not token ids (``prompt_embeds``; image, audio, video or file content
in chat) cannot be given noise that repeats consistently: the processor names a
row by its token ids, which such inputs lack or share. The gateway refuses both
with HTTP 400 to an account at level >= 1 (or to every account, with
``refuse_prompt_logprobs="all"`` or ``refuse_non_text="all"``, so that the
refusal does not tell an account it is flagged).
"""

from __future__ import annotations

import json
import numbers

__all__ = ["COMPLETIONS", "CHAT", "DEFAULT_MAX_TOKENS", "MAX_BODY_BYTES", "DROPPED_FIELDS", "GatewayRefusal",
           "bearer_credential", "parse_body", "count_prompts", "token_limit", "rows_of", "asks_prompt_logprobs",
           "non_text_inputs", "needs_level", "check_level_rules", "check_prompt_logprobs"]

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
#: What a request without ``max_tokens`` (``max_completion_tokens`` on chat) is given, counted and forwarded with.
DEFAULT_MAX_TOKENS = 256
#: The largest request body read (1 MiB); larger ones get HTTP 413 before any parsing.
MAX_BODY_BYTES = 1 << 20
#: Body fields a client may not set: they reach vLLM's ``extra_args`` (where the grant token lives).
DROPPED_FIELDS = ("vllm_xargs", "kv_transfer_params", "ec_transfer_params")
#: The two names of a chat request's token limit; a request may carry one.
TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")
#: Chat content part types whose ``text`` is text only (vLLM's names); ``refusal`` and ``thinking`` parts too.
TEXT_PART_TYPES = ("text", "input_text", "output_text")
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


def bearer_credential(authorization: str | None) -> str:
    """The API key of an ``Authorization: Bearer <API key>`` header.

    Parameters
    ----------
    authorization : str or None
        The header's value as received (None when absent).

    Returns
    -------
    str
        The credential after ``Bearer`` (the scheme in any case, any spaces
        around it), stripped: the key the accounts file is searched for.

    Raises
    ------
    GatewayRefusal
        401 when the header is missing, not a Bearer credential, empty,
        longer than 512 characters or holding whitespace or control characters
        (the message never shows the credential).
    """
    if not authorization:
        raise GatewayRefusal(401, "missing Authorization header: send 'Authorization: Bearer <API key>'")
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        raise GatewayRefusal(401, "Authorization must be 'Bearer <API key>'")
    if len(credential) > MAX_ACCOUNT_CHARS or not credential.isprintable() or any(c.isspace() for c in credential):
        raise GatewayRefusal(401, f"the API key must be one word of at most {MAX_ACCOUNT_CHARS} "
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


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count_prompts(path: str, body: dict) -> int:
    """How many prompts vLLM generates for: each is decoded ``n`` (or ``best_of``) times.

    ``/v1/completions`` takes ``prompt`` as a string, a list of strings, a list
    of token ids (one prompt) or a list of lists of token ids, and
    ``prompt_embeds`` as one base64 tensor or a list of them; vLLM generates for
    every prompt of both. A chat request is one prompt.

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body.

    Returns
    -------
    int
        The number of prompts, >= 1.

    Raises
    ------
    GatewayRefusal
        400 for a ``prompt`` or ``prompt_embeds`` of any other shape (a bool
        is not a token id), or chat ``messages`` that are not a list of objects.
    """
    if path == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise GatewayRefusal(400, "messages must be a non-empty list of message objects")
        return 1
    prompt, embeds, count = body.get("prompt"), body.get("prompt_embeds"), 0
    if isinstance(prompt, str):
        count += 1
    elif isinstance(prompt, list):
        if all(_is_token_id(item) for item in prompt):
            count += 1  # one prompt given as token ids
        elif all(isinstance(item, str) for item in prompt) or all(
                isinstance(item, list) and all(_is_token_id(t) for t in item) for item in prompt):
            count += len(prompt)
        else:
            raise GatewayRefusal(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                                      "lists of token ids")
    elif prompt is not None:
        raise GatewayRefusal(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                                  f"lists of token ids, got {type(prompt).__name__}")
    if isinstance(embeds, str):
        count += 1
    elif isinstance(embeds, list) and all(isinstance(item, str) for item in embeds):
        count += len(embeds)
    elif embeds is not None:
        raise GatewayRefusal(400, "prompt_embeds must be a base64 string or a list of them")
    return max(count, 1)


def token_limit(path: str, body: dict, *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    """The most tokens each sequence may generate; writes ``default_max_tokens`` into a body that names none.

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body: ``max_tokens``, or on chat ``max_tokens`` or
        ``max_completion_tokens`` (null counts as absent).
    default_max_tokens : int, default :data:`DEFAULT_MAX_TOKENS`
        The budget of a request that names none.

    Returns
    -------
    int
        The limit, in [0, 2^20].

    Raises
    ------
    GatewayRefusal
        400 for a chat request carrying both limits (engines differ in which
        one they honour, so neither could be counted with certainty), for
        ``max_completion_tokens`` on ``/v1/completions`` (not a field there),
        and for a limit that is not an integer in [0, 2^20].
    """
    named = [field for field in TOKEN_LIMIT_FIELDS if body.get(field) is not None]
    if path != CHAT and "max_completion_tokens" in named:
        raise GatewayRefusal(400, "max_completion_tokens is a chat field: /v1/completions takes max_tokens")
    if len(named) > 1:
        raise GatewayRefusal(400, "send max_tokens or max_completion_tokens, not both: engines differ in which one "
                                  "they honour")
    if not named:
        body["max_completion_tokens" if path == CHAT else "max_tokens"] = default_max_tokens
        return default_max_tokens
    return _count(body, named[0], low=0, high=MAX_TOKENS_LIMIT, default=None)


def rows_of(path: str, body: dict, *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    """The rows a request may generate, counted by the throttle; sets ``max_tokens`` when the client did not.

    rows = prompts x max(n, best_of) x max(max_tokens, 1): every sequence of
    every prompt that vLLM decodes is served noise, and the throttle counts
    each position it may generate.

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
        The number of rows (decoding positions) to count, >= 1 and within the ledger's limit per request.

    Raises
    ------
    GatewayRefusal
        400 for a bad prompt shape (:func:`count_prompts`), a bad or doubled
        token limit (:func:`token_limit`), ``n`` or ``best_of`` that is not an
        integer in [1, 1024] (bools refused), and a product over the ledger's
        limit per request (nothing is counted).
    """
    from ..throttle.ledger import check_rows

    prompts = count_prompts(path, body)
    max_tokens = token_limit(path, body, default_max_tokens=default_max_tokens)
    n = _count(body, "n", low=1, high=MAX_SEQUENCES, default=1)
    best_of = _count(body, "best_of", low=1, high=MAX_SEQUENCES, default=1)
    rows = prompts * max(n, best_of) * max(max_tokens, 1)
    try:
        return check_rows(rows)
    except ValueError:
        raise GatewayRefusal(400, f"the request may generate {rows:,} rows (prompts x sequences x max tokens), more "
                                  "than the ledger counts in one request: send fewer prompts, sequences or "
                                  "tokens") from None


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


def _is_text_part(part) -> bool:
    if isinstance(part, str):
        return True  # vLLM reads a bare string part as text
    if not isinstance(part, dict):
        return False
    kind = part.get("type", "text")
    field = "text" if kind in TEXT_PART_TYPES else kind if kind in ("refusal", "thinking") else None
    # only the type and its text: any other key (a media URL, a cached media uuid) makes a part media
    return field is not None and set(part) <= {"type", field} and isinstance(part.get(field), str)


def non_text_inputs(path: str, body: dict) -> list:
    """The inputs of a request that vLLM's rows could not be named by consistently.

    The processor names a row by its token ids (``position_id``). A row whose
    prompt is ``prompt_embeds`` has none (vLLM gives it a random id: fresh
    noise on every repeat, which averages away), and image, audio or video
    content reaches the model as placeholder tokens that are alike for every
    image: two different images would share one draw.

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body (after :func:`count_prompts`, which checked its shape).

    Returns
    -------
    list of str
        ``"prompt_embeds"`` and/or ``"non-text message content"``; empty for a text-only request.
    """
    found = []
    if body.get("prompt_embeds") is not None:
        found.append("prompt_embeds")
    if path == CHAT:
        for message in body.get("messages") or ():
            content = message.get("content") if isinstance(message, dict) else None
            if content is None or isinstance(content, str):
                continue
            if not isinstance(content, list) or not all(_is_text_part(part) for part in content):
                found.append("non-text message content")
                break
    return found


def needs_level(path: str, body: dict) -> bool:
    """Whether a request carries something that is served only at some levels (prompt logprobs, non-text input).

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body.

    Returns
    -------
    bool
    """
    return asks_prompt_logprobs(path, body) or bool(non_text_inputs(path, body))


def check_level_rules(path: str, body: dict, *, level: int, refuse_prompt_logprobs: str = "flagged",
                      refuse_non_text: str = "flagged") -> None:
    """Refuse what cannot be served noised to this level: prompt logprobs and non-text inputs.

    Parameters
    ----------
    path : str
        The endpoint, :data:`COMPLETIONS` or :data:`CHAT`.
    body : dict
        The parsed body.
    level : int
        The account's level (0: clean).
    refuse_prompt_logprobs, refuse_non_text : {"flagged", "all"}
        Refuse only accounts at level >= 1, or every account (so the refusal
        does not reveal a flag).

    Raises
    ------
    GatewayRefusal
        400, naming the fields refused.
    """
    check_prompt_logprobs(path, body, level=level, refuse=refuse_prompt_logprobs)
    found = non_text_inputs(path, body)
    if found and (refuse_non_text == "all" or level >= 1):
        raise GatewayRefusal(400, f"{' and '.join(found)} is not served to this account: only text and token-id "
                                  "prompts get noise that repeats consistently")


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
