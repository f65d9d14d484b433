"""Group descriptors: what links accounts into a campaign (a card, an organisation, an IP range), checked and named.

A request may carry ``groups``, a mapping of a kind the policy declares to a
value (``{"card": "fp_91c2", "org": "acme"}``), as envoy's rate limiter
counts a request against several descriptors. Each (kind, value) is a
*group*: the ledger counts, flags and escalates it like an account, under
its kind's threshold and flag lifetime, and a request is served the highest
level of its account and its groups.

:func:`check_groups` refuses a hostile set of descriptors in one line before
anything is counted; :func:`group_fingerprint` is the ledger's name for a
group. Values, like account ids, are never stored, logged or echoed: the
ledger keeps a domain-separated sha256 of kind and value.
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from collections.abc import Mapping

from .policy_schema import GROUP_KIND_PATTERN, MAX_GROUP_KINDS, show_value

_GROUP_DOMAIN = b"caliber.throttle.group/v1\x00"
#: Every group's ledger name starts with this (an account's is 32 hex characters, so the two never meet).
GROUP_ID_PREFIX = "g:"
#: Descriptors one request may carry.
MAX_DESCRIPTORS = MAX_GROUP_KINDS
#: Bytes of one descriptor's value (UTF-8).
MAX_VALUE_BYTES = 256


class DescriptorError(ValueError):
    """A request's group descriptors that the throttle refuses (one line; never the value itself)."""


@functools.lru_cache(maxsize=65536)  # a server sees the same few cards and organisations again and again
def group_fingerprint(kind: str, value: str) -> str:
    """The ledger's name for the group (``kind``, ``value``): ``g:<kind>:<32 hex>``.

    Parameters
    ----------
    kind : str
        A declared kind (checked by :func:`check_groups`).
    value : str
        Its value, NFC-normalized here (a header and a CLI argument agree).

    Returns
    -------
    str
        ``g:`` + the kind + ``:`` + 32 hex characters of sha256(domain, kind, value).
    """
    raw = unicodedata.normalize("NFC", value).encode("utf-8")
    digest = hashlib.sha256(_GROUP_DOMAIN + kind.encode("ascii") + b"\x00" + raw).hexdigest()[:32]
    return f"{GROUP_ID_PREFIX}{kind}:{digest}"


def is_group_id(name: str) -> bool:
    """Whether a ledger name is a group's (else an account's)."""
    return name.startswith(GROUP_ID_PREFIX)


def group_kind_of(group_id: str) -> str:
    """The kind in a group's ledger name."""
    return group_id[len(GROUP_ID_PREFIX):].rsplit(":", 1)[0]


def check_value(kind: str, value) -> str:
    """One descriptor's value: a str of 1..256 UTF-8 bytes without NUL; DescriptorError otherwise.

    Parameters
    ----------
    kind : str
        The kind, for the message.
    value : object
        The value as the request gave it.

    Returns
    -------
    str
        ``value``.

    Raises
    ------
    DescriptorError
        Not a str, empty, over 256 bytes, holding NUL, or not valid UTF-8 (a lone surrogate).
    """
    if not isinstance(value, str):
        raise DescriptorError(f"group {kind}: the value must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise DescriptorError(f"group {kind}: the value holds a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise DescriptorError(f"group {kind}: the value is not valid UTF-8") from None
    if not 1 <= size <= MAX_VALUE_BYTES:
        raise DescriptorError(f"group {kind}: the value must be 1..{MAX_VALUE_BYTES} bytes of UTF-8, got {size}")
    return value


def check_groups(policy, groups) -> tuple:
    """A request's descriptors, checked against the policy's kinds before anything is counted.

    Parameters
    ----------
    policy : Policy
        Its ``groups`` are the kinds a request may carry.
    groups : Mapping of str to str, or None
        ``{kind: value}``; None or empty: the request has no group.

    Returns
    -------
    tuple of (GroupKind, str)
        Each descriptor's kind and the group's ledger name (:func:`group_fingerprint`), in kind order.

    Raises
    ------
    DescriptorError
        Not a mapping, more than 16 descriptors, a kind the policy does not declare
        (a typo must not skip a counter), or a bad value (:func:`check_value`).
        The message names the kind, never the value.
    """
    if groups is None:
        return ()
    if not isinstance(groups, Mapping):
        raise DescriptorError(f"groups must be a mapping of kind to value, got {type(groups).__name__}")
    if len(groups) > MAX_DESCRIPTORS:
        raise DescriptorError(f"a request carries at most {MAX_DESCRIPTORS} group descriptors, got {len(groups)}")
    out = []
    for kind, value in groups.items():
        declared = policy.group_kind(kind) if isinstance(kind, str) else None
        if declared is None:
            shown = show_value(kind) if isinstance(kind, str) and GROUP_KIND_PATTERN.fullmatch(kind) else (
                "a malformed kind" if isinstance(kind, str) else f"a {type(kind).__name__} kind")
            names = ", ".join(k.name for k in policy.groups) or "none"
            raise DescriptorError(f"group kind {shown} is not declared by the policy (declared: {names})")
        out.append((declared, group_fingerprint(kind, check_value(kind, value))))
    return tuple(sorted(out, key=lambda pair: pair[0].name))


def parse_descriptor(text: str, policy) -> tuple:
    """``KIND=VALUE`` (the CLI's ``--group``) as (GroupKind, ledger name).

    Raises
    ------
    DescriptorError
        Not ``KIND=VALUE``, or a kind or value :func:`check_groups` refuses.
    """
    kind, sep, value = text.partition("=")
    if not sep:
        raise DescriptorError("a group is named KIND=VALUE (for example card=fp_91c2)")
    return check_groups(policy, {kind: value})[0]


__all__ = ["DescriptorError", "GROUP_ID_PREFIX", "MAX_DESCRIPTORS", "MAX_VALUE_BYTES", "check_groups",
           "check_value", "group_fingerprint", "group_kind_of", "is_group_id", "parse_descriptor"]
