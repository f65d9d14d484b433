"""A file's SHA-256 begun before the file is parsed, through the read-only map its rows are later read from.

Hashing a 2 GB dump costs about 1.5 CPU-seconds on one thread (SHA-256 is
one chain), the longest part of calibrating it. ``caliber calibrate`` starts
it here as soon as it has the file's name: the imports, the header and the
reduction's set-up (some 0.2-0.3 s) then run beside the digest instead of
before it. :class:`EarlyDigest` hashes the first ``EARLY_BYTES`` in chunks on
a thread of its own; :func:`.calibration.vocab_stream.reduce_file_hashing`
takes it over (the same map, hasher and thread) and hashes the rest block by
block. Standard library only: nothing here waits for numpy to import.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["EARLY_BYTES", "STREAM_EXTENSIONS", "EarlyDigest", "begin_digest"]

#: The formats a full-vocabulary matrix streams from (:mod:`.row_stream`), the ones worth a head start.
STREAM_EXTENSIONS = (".npy", ".safetensors", ".pt", ".pth", ".npz")

#: How far the digest runs before the reduction takes it over: those pages stay mapped until reduced.
EARLY_BYTES = 192 << 20
_CHUNK = 16 << 20
#: Smaller files are hashed as before, where there is nothing to overlap.
MIN_FILE_BYTES = 256 << 20


class EarlyDigest:
    """SHA-256 of a file's first bytes, hashed in order on one thread through a read-only map.

    Attributes
    ----------
    map : mmap.mmap
        The whole file, mapped read-only (for the reduction to read in place).
    digest : hashlib._Hash
        Fed in the file's order; the reduction feeds it what follows.
    hasher : ThreadPoolExecutor
        The one thread that hashes; the reduction submits the rest to it.
    """

    def __init__(self, path, limit: int = EARLY_BYTES):
        with open(path, "rb") as fh:
            self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            self.map.madvise(mmap.MADV_SEQUENTIAL)
        self.path = os.fspath(path)
        self.digest = hashlib.sha256()
        self.hasher = ThreadPoolExecutor(max_workers=1)
        self._lock = threading.Lock()
        self._jobs: list[tuple[int, int, Future]] = []  # (first byte, stop byte, job)
        self._taken = False
        view = memoryview(self.map)
        for lo in range(0, min(limit, len(self.map)), _CHUNK):
            hi = min(lo + _CHUNK, limit, len(self.map))
            self._jobs.append((lo, hi, self.hasher.submit(self.digest.update, view[lo:hi])))

    def take_over(self) -> tuple[int, list[tuple[int, int, Future]]]:
        """Hand the digest to the reduction: the bytes submitted so far and their jobs, in order.

        Returns
        -------
        submitted : int
            The digest covers [0, submitted) once its jobs are done.
        jobs : list of (first byte, stop byte, Future)

        Raises
        ------
        RuntimeError
            Taken over or closed already.
        """
        with self._lock:
            if self._taken:
                raise RuntimeError("the early digest was taken over or closed already")
            self._taken = True
        return (self._jobs[-1][1] if self._jobs else 0), list(self._jobs)

    def close(self) -> None:
        """Give it up (the file is read another way, or calibration failed): its thread stops and its map closes."""
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self.hasher.shutdown(wait=True, cancel_futures=True)
        self._jobs = []
        try:
            self.map.close()
        except BufferError:  # a chunk's view still referenced: the map closes when it goes
            pass


def begin_digest(path) -> EarlyDigest | None:
    """An :class:`EarlyDigest` of ``path`` when it is a file of ``MIN_FILE_BYTES`` or more in a streamed format.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    EarlyDigest or None
        None also when the file cannot be opened or mapped: the reduction then hashes it itself.
    """
    if not str(path).lower().endswith(STREAM_EXTENSIONS):
        return None
    try:
        if os.path.getsize(path) < MIN_FILE_BYTES:
            return None
        return EarlyDigest(path)
    except (OSError, ValueError):
        return None
