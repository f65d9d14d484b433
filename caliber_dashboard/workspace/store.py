"""The workspace storage interface: what the dashboard needs from a store, nothing more.

A workspace is reached through a bearer token (``secrets.token_urlsafe(32)``,
256 random bits) that travels in the page URL. A store never keeps the token
itself: it keys every row on :func:`workspace_id`, the SHA-256 of the token,
so a copied data directory does not hand out working URLs.

A workspace holds

* uploads: one entry per model (keyed by the logits file's sha256), naming a
  logits blob and optionally a labels blob; blob bytes are content-addressed and
  stored once however many workspaces hold them;
* results: opaque payloads keyed by ``(kind, key)`` (a model's chosen options,
  the session's choices, long computations).

:class:`WorkspaceStore` is the protocol the Streamlit glue talks to; the
embedded implementation is :class:`caliber_dashboard.workspace.sqlite_store.SQLiteStore`.
A deployment with several app instances can provide another implementation
(a shared database plus an object store) with the same methods.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 256 random bits, 43 URL-safe characters


class WorkspaceError(Exception):
    """Base class of the store's errors."""


class CapExceeded(WorkspaceError):
    """A size cap refuses a write; ``str(err)`` is one line for the user."""


class CorruptEntry(WorkspaceError):
    """A stored entry is missing or does not match its digest (skipped by readers)."""


class UnknownWorkspace(WorkspaceError):
    """The token names no workspace (it never existed, was deleted or expired)."""


@dataclass(frozen=True)
class Limits:
    """Size caps and ages for a store.

    Attributes
    ----------
    workspace_bytes : int
        Most bytes one workspace may hold (its distinct blobs plus its results).
    total_bytes : int
        Most bytes the whole store may hold (distinct blobs plus all results).
    max_idle_s : float
        A workspace unused for longer than this is deleted (least recently used first).
    evictable_idle_s : float
        When an upload would pass ``total_bytes``, workspaces unused for at least
        this long are deleted, least recently used first, to make room; younger
        ones are never evicted (the upload is refused instead).
    """

    workspace_bytes: int = 1_000_000_000
    total_bytes: int = 10_000_000_000
    max_idle_s: float = 30 * 86_400.0
    evictable_idle_s: float = 86_400.0

    def __post_init__(self) -> None:
        for name in ("workspace_bytes", "total_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer number of bytes, got {value!r}")
        for name in ("max_idle_s", "evictable_idle_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if self.workspace_bytes > self.total_bytes:
            raise ValueError(f"workspace_bytes ({self.workspace_bytes}) must not exceed "
                             f"total_bytes ({self.total_bytes})")


@dataclass(frozen=True)
class UploadRecord:
    """One stored model: its blobs and the names they were uploaded under."""

    model: str  # sha256 of the logits file (LogitsData.sha256)
    filename: str
    blob: str  # sha256 of the logits bytes (equal to ``model``)
    size: int
    labels_filename: str | None
    labels_blob: str | None
    labels_size: int | None
    added: float  # seconds since the epoch
    seq: int  # upload order within the workspace


@dataclass(frozen=True)
class Usage:
    """Bytes held: by one workspace and by the whole store."""

    workspace_bytes: int
    total_bytes: int
    limits: Limits


def new_token() -> str:
    """A fresh workspace token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def workspace_id(token: str) -> str:
    """The only form of a token a store keeps: its SHA-256, hex."""
    if not isinstance(token, str) or not token:
        raise ValueError("a workspace token must be a non-empty string")
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def blob_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@runtime_checkable
class WorkspaceStore(Protocol):
    """What the dashboard needs from a workspace store (all methods thread-safe)."""

    limits: Limits

    def create(self, token: str | None = None) -> str:
        """Make an empty workspace; returns its token (a new one, or ``token`` when the caller drew it
        with :func:`new_token` and has not stored it yet; creating an existing one changes nothing)."""

    def exists(self, token: str) -> bool:
        """Whether the token names a workspace (marks it used when it does)."""

    def delete(self, token: str) -> None:
        """Remove the workspace, its entries and the blobs nothing else holds."""

    def put_upload(self, token: str, *, filename: str, content: bytes,
                   labels_filename: str | None = None, labels_content: bytes | None = None) -> str:
        """Store (or replace) one model's files atomically; returns the model's digest.

        Raises CapExceeded (nothing written) when a cap refuses it.
        """

    def uploads(self, token: str) -> list[UploadRecord]:
        """The workspace's models in upload order; raises UnknownWorkspace."""

    def remove_upload(self, token: str, model: str) -> None:
        """Forget one model (its blobs go when no workspace holds them)."""

    def read_blob(self, digest: str) -> bytes:
        """A blob's bytes, checked against the digest; raises CorruptEntry."""

    def save_result(self, token: str, kind: str, key: str, payload: bytes) -> None:
        """Store (or replace) an opaque payload; raises CapExceeded."""

    def load_result(self, token: str, kind: str, key: str) -> bytes | None:
        """A stored payload, or None."""

    def results(self, token: str, kind: str) -> dict[str, bytes]:
        """Every payload of one kind, by key."""

    def delete_result(self, token: str, kind: str, key: str) -> None:
        """Forget one payload (no error when absent)."""

    def usage(self, token: str) -> Usage:
        """Bytes held by the workspace and by the store."""

    def evict_expired(self, *, now: float | None = None) -> int:
        """Delete workspaces idle past ``limits.max_idle_s``; returns how many."""
