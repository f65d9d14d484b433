"""The errors every ledger store and the store URL raise (apart from the stores, which import them)."""

from __future__ import annotations


class StoreUnavailable(RuntimeError):
    """The ledger store cannot be reached or written (the message names the store, never an account)."""


class StoreURLError(ValueError):
    """A store URL that names no supported store."""
