"""Grant tokens: the throttle's decision for one request, signed for an engine that adds the noise itself.

A gateway calls :meth:`caliber_core.throttle.Throttle.grant`, which counts the
request's rows and escalates exactly as ``respond`` does, and forwards the
token it returns with the request; the engine (vLLM's logits processor,
:mod:`caliber_core.serving.vllm`) checks it with :func:`verify_grant` and
serves the level it names. An engine never trusts a level a client wrote.

Token layout (ASCII, URL-safe): ``caliber-grant.v1.<payload>.<mac>``

* payload: base64url (unpadded) of compact JSON
  ``{"level": j, "policy": <policy digest>, "expires": <unix s>, "nonce": <32 hex>, "rows": N}``;
* mac: base64url of HMAC-SHA256 over ``caliber-grant.v1.<payload>``, keyed with
  :func:`grant_key` (a key derived from the seeding key under its own label, so
  no token MAC ever equals a noise stream key, and the seeding key itself never
  signs anything).

The policy digest (:func:`policy_digest`) covers every field of the policy that
changes what is served (levels, sigmas, the config's sha256, seeding, shadow),
but not the path the config is read from, which differs between hosts.

Only the standard library is imported.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import numbers
import secrets
import time
from dataclasses import dataclass

from ..validation import check_key

__all__ = ["PREFIX", "DEFAULT_VALID_MINUTES", "MAX_VALID_MINUTES", "Grant", "GrantError", "grant_key",
           "policy_digest", "sign_grant", "verify_grant"]

PREFIX = "caliber-grant.v1"
_KEY_LABEL = b"caliber.grant-token-key/v1\x00"
#: How long a token is honoured when the caller does not say (a request's admission takes milliseconds).
DEFAULT_VALID_MINUTES = 5.0
#: The longest validity a token may ask for: one day.
MAX_VALID_MINUTES = 24 * 60.0
#: No honest token is longer (a hostile one is refused before any decoding work).
MAX_TOKEN_CHARS = 512


class GrantError(ValueError):
    """A grant token that is missing, malformed, forged or altered, expired, or made for another policy."""


@dataclass(frozen=True)
class Grant:
    """A verified token: the level to serve and what it was bound to.

    Attributes
    ----------
    level : int
        The level the engine serves the rows at.
    policy : str
        The policy digest (:func:`policy_digest`) the token was signed for.
    expires : float
        Unix time after which the token is refused.
    nonce : str
        The token's random nonce (tokens are distinct even for equal fields).
    rows : int
        The rows the gateway counted for this grant.
    """

    level: int
    policy: str
    expires: float
    nonce: str
    rows: int


def grant_key(key) -> bytes:
    """The token-signing key: HMAC-SHA256(seeding key, a label of its own), 32 bytes.

    Parameters
    ----------
    key : bytes
        The seeding key (as read by ``read_key_file``), at least 16 bytes.

    Returns
    -------
    bytes
        A key used for grant tokens only (domain-separated from the noise streams).
    """
    return hmac.new(check_key(key), _KEY_LABEL, hashlib.sha256).digest()


def policy_digest(policy) -> str:
    """Hex SHA-256 of the policy's canonical JSON, without the config's path (it differs between hosts).

    Parameters
    ----------
    policy : caliber_core.throttle.policy.Policy
        A loaded policy.

    Returns
    -------
    str
        64 hex characters; equal for the same policy read on the gateway and on the engine.
    """
    doc = policy.to_dict()
    doc["config"] = {name: value for name, value in doc["config"].items() if name != "path"}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def check_valid_minutes(minutes) -> float:
    """A token validity in minutes.

    Parameters
    ----------
    minutes : float or None
        A number in (0, ``MAX_VALID_MINUTES``]; None gives ``DEFAULT_VALID_MINUTES``.

    Returns
    -------
    float
        The validity in minutes.

    Raises
    ------
    ValueError
        Not a finite real number in the range (the message shows it).
    """
    if minutes is None:
        return DEFAULT_VALID_MINUTES
    if (isinstance(minutes, bool) or not isinstance(minutes, numbers.Real) or not math.isfinite(minutes)
            or not 0 < minutes <= MAX_VALID_MINUTES):
        raise ValueError(f"valid_minutes must be a number in (0, {MAX_VALID_MINUTES:g}], got {minutes!r}")
    return float(minutes)


def sign_grant(*, level: int, digest: str, rows: int, signing_key: bytes, now: float,
               valid_minutes: float = DEFAULT_VALID_MINUTES) -> str:
    """A token granting ``level`` under the policy whose digest is ``digest``, valid ``valid_minutes`` from ``now``.

    Parameters
    ----------
    level : int
        The level the engine is to serve (0: clean).
    digest : str
        :func:`policy_digest` of the policy that decided it.
    rows : int
        The rows counted for the request (recorded in the token for audit).
    signing_key : bytes
        :func:`grant_key` of the seeding key.
    now : float
        Seconds since the epoch.
    valid_minutes : float, default DEFAULT_VALID_MINUTES
        How long the engine honours the token.

    Returns
    -------
    str
        ``caliber-grant.v1.<payload>.<mac>``.
    """
    expires = int(math.ceil(now + 60.0 * check_valid_minutes(valid_minutes)))
    payload = {"level": int(level), "policy": digest, "expires": expires, "nonce": secrets.token_hex(16),
               "rows": int(rows)}
    body = f"{PREFIX}.{_b64(json.dumps(payload, separators=(',', ':')).encode('ascii'))}"
    mac = hmac.new(signing_key, body.encode("ascii"), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def verify_grant(token, *, signing_key: bytes, digest: str, top: int, now: float | None = None) -> Grant:
    """Check a grant token and return what it grants; :class:`GrantError` (one line) otherwise.

    Checks, in order: present and shaped like a token; the MAC (forged or
    altered tokens fail here, in constant time); made for this policy; not
    expired; a level of this policy.

    Parameters
    ----------
    token : str
        What the request carried (``extra_args["caliber"]``).
    signing_key : bytes
        :func:`grant_key` of the seeding key.
    digest : str
        :func:`policy_digest` of the policy this engine serves.
    top : int
        The policy's highest level.
    now : float, optional
        Seconds since the epoch (default: ``time.time()``).

    Raises
    ------
    GrantError
        With a message saying which check failed; never echoing the token.
    """
    if token is None:
        raise GrantError("request has no caliber grant token: it must come through the gateway, "
                         "which adds one (extra_args['caliber'])")
    if not isinstance(token, str):
        raise GrantError(f"caliber grant token must be a string, got {type(token).__name__}")
    parts = token.split(".")
    if len(token) > MAX_TOKEN_CHARS or len(parts) != 4 or ".".join(parts[:2]) != PREFIX:
        raise GrantError(f"caliber grant token is malformed: expected {PREFIX}.<payload>.<mac> "
                         f"({len(token)} characters received)")
    body = ".".join(parts[:3])
    try:
        mac = _unb64(parts[3])
    except (binascii.Error, ValueError):
        mac = b""
    expected = hmac.new(signing_key, body.encode("ascii", errors="replace"), hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise GrantError("caliber grant token's signature does not verify: it was forged, altered, "
                         "or signed with another key")
    try:
        payload = json.loads(_unb64(parts[2]))
        level, policy, expires = payload["level"], payload["policy"], payload["expires"]
        nonce, rows = payload["nonce"], payload["rows"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise GrantError("caliber grant token's payload is unreadable (signed, but not by this version)") from None
    if policy != digest:
        raise GrantError(f"caliber grant token was made for another policy (digest {str(policy)[:12]}..., "
                         f"this engine serves {digest[:12]}...)")
    now = time.time() if now is None else now
    if isinstance(expires, bool) or not isinstance(expires, numbers.Real) or now >= expires:
        raise GrantError(f"caliber grant token expired {now - expires:.0f} s ago: ask the gateway for a new one"
                         if isinstance(expires, numbers.Real) and not isinstance(expires, bool)
                         else "caliber grant token has no valid expiry")
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= top:
        raise GrantError(f"caliber grant token names level {level!r}, not a level of this policy (0..{top})")
    return Grant(level=level, policy=policy, expires=float(expires), nonce=str(nonce), rows=int(rows))
