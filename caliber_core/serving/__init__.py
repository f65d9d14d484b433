"""Serving: adding calibrated noise to the logits returned to a flagged account (numpy, torch on demand).

Request helpers for a serving endpoint, handed on lazily:

* :func:`canonical_id`, :func:`canonical_ids`, :func:`canonical_features` -- per-input ids that
  cannot be multiplied (:mod:`.canonical`);
* :func:`account_from_authorization` -- the account of an ``Authorization`` header (:mod:`.accounts`).
"""

from ..lazy_names import lazy_names

_NAMES = {
    "canonical_id": "canonical", "canonical_ids": "canonical", "canonical_features": "canonical",
    "account_from_authorization": "accounts", "AuthorizationError": "accounts",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
