"""Content-addressed blob files: written all or nothing, read back only if intact.

A blob lives at ``<dir>/ab/abcdef...`` (its sha256). It appears under that
name only complete: it is written to a temporary name in the same directory,
fsynced, then ``os.replace``-d (and the directory fsynced). A blob being
deleted is first renamed to ``<digest>.del`` so that the caller can still undo
the deletion until its transaction commits; :meth:`BlobFiles.sweep` finishes
or undoes what a crash left behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Collection
from pathlib import Path

from .store import CorruptEntry, blob_digest

_DIGEST = re.compile(r"[0-9a-f]{64}")
TMP_MARK = ".tmp-"
DEL_SUFFIX = ".del"


class BlobFiles:
    """Blob files under one directory (created ``0700``; files ``0600``)."""

    def __init__(self, directory) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(exist_ok=True, mode=0o700)

    def path(self, digest: str) -> Path:
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ValueError(f"a blob digest is 64 lowercase hex characters, got {digest!r}")
        return self.directory / digest[:2] / digest

    def write(self, digest: str, content: bytes) -> None:
        """Write a blob under its final name, all or nothing (temp file, fsync, rename)."""
        path = self.path(digest)
        path.parent.mkdir(exist_ok=True, mode=0o700)
        tmp = path.with_name(f"{digest}{TMP_MARK}{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                self._write_bytes(out, content)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power cut
        finally:
            os.close(dir_fd)

    @staticmethod
    def _write_bytes(out, content: bytes) -> None:
        out.write(content)  # a method of its own so tests can interrupt it half-way

    def has(self, digest: str, size: int) -> bool:
        """Whether a file of the right size is in place (a cheap check; reads verify)."""
        try:
            return self.path(digest).stat().st_size == size
        except OSError:
            return False

    def read(self, digest: str) -> bytes:
        """The blob's bytes, checked against its digest; raises CorruptEntry."""
        path = self.path(digest)
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise CorruptEntry(f"stored file {digest[:12]} is unreadable "
                               f"({exc.strerror or type(exc).__name__})") from None
        if blob_digest(content) != digest:
            raise CorruptEntry(f"stored file {digest[:12]} is damaged (its sha256 no longer matches)")
        return content

    def trash(self, digest: str) -> Path | None:
        """Rename a blob to ``<digest>.del``; returns that path (None if it was missing)."""
        path = self.path(digest)
        trash = path.with_name(path.name + DEL_SUFFIX)
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return None
        return trash

    @staticmethod
    def untrash(trash: Path) -> None:
        os.replace(trash, trash.with_suffix(""))

    @staticmethod
    def discard(trash: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            trash.unlink()

    def sweep(self, known: Collection[str], *, stale_s: float) -> dict[str, int]:
        """Restore trashed blobs still ``known``; delete stale temporary and unknown files.

        Files younger than ``stale_s`` seconds are left alone (another process
        may be writing them right now). Returns counts ``restored`` and ``removed``.
        """
        restored = removed = 0
        cutoff = time.time() - stale_s  # file ages are wall-clock
        for path in self.directory.glob("*/*"):
            name = path.name
            if name.endswith(DEL_SUFFIX):
                digest = name[: -len(DEL_SUFFIX)]
                if digest in known and not path.with_name(digest).exists():
                    os.replace(path, path.with_name(digest))
                    restored += 1
                    continue
                stale = True
            elif TMP_MARK in name or name not in known:
                stale = _older_than(path, cutoff)
            else:
                continue
            if stale:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        return {"restored": restored, "removed": removed}


def _older_than(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False
