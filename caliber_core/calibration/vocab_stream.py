"""Full-vocabulary dumps streamed once and reduced row by row.

:func:`reduce_file` reads a ``.npy``/``.safetensors``/``.pt``/stored ``.npz``
matrix block by block (:mod:`caliber_core.loading.row_stream`; float32 in place
through a memory map) and keeps, per row, the top gaps, a gap histogram and,
with labels, the label's gap (:mod:`.gap_histogram`, through the compiled pass
of :mod:`.gap_kernel` where it is built): 4,000 x 128,000 float32
(2 GB) becomes 4,000 x (32 + 1,282) numbers. :func:`stream_labels` reads and
checks the labels that go with such a matrix; :func:`subset` picks evenly
spaced reduced rows.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..loading.early_digest import EarlyDigest
from ..loading.row_stream import BLOCK_BYTES, MappedMatrix, RowSource, can_map, open_rows
from ..loading.safety import DEFAULT_MAX_ELEMENTS, display_name, fail
from .gap_histogram import TOP_GAPS, ReducedRows
from .gap_kernel import reduce_rows


def reduce_file(path, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS,
                progress: Callable[[float], None] | None = None,
                labels: np.ndarray | None = None, source: RowSource | None = None,
                ) -> tuple[ReducedRows, RowSource, str]:
    """Stream a full-vocabulary matrix once and reduce every row.

    Parameters
    ----------
    path : str or os.PathLike
    m : int, default TOP_GAPS
        Gaps kept exactly per row.
    max_elements : int
        The element limit applies to what is kept: rows x (m + bins).
    progress : callable, optional
        Called with the fraction of rows done.
    labels : ndarray of shape (n_rows,), int, optional
        Validated labels in [0, V): each row's label gap is kept exactly (accuracy rows).
    source : RowSource, optional
        Where the matrix lies (default: :func:`open_rows` of ``path``).

    Returns
    -------
    reduced : ReducedRows
    source : RowSource
    sha256 : str
        Of the file's bytes (hashed as they stream).

    Raises
    ------
    LogitsFileError
        A bad header, a truncated file, a NaN or +inf row, or a reduced size over ``max_elements``.
    """
    reduced, source, digest = reduce_file_hashing(path, m=m, max_elements=max_elements, progress=progress,
                                                  labels=labels, source=source)
    return reduced, source, digest.result()


def reduce_file_hashing(path, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS,
                        progress: Callable[[float], None] | None = None,
                        labels: np.ndarray | None = None, source: RowSource | None = None,
                        early_digest: EarlyDigest | None = None) -> tuple[ReducedRows, RowSource, PendingDigest]:
    """:func:`reduce_file`, returning as soon as the rows are reduced while the file's SHA-256 finishes.

    The digest of a memory-mapped file runs on its own thread, in the file's order, the
    reduction at most ``HASH_LAG_BYTES`` ahead of it (SHA-256 costs about twice the CPU of
    the compiled reduction): what the caller does next (the solve) runs beside its last
    stretch. Parameters as :func:`reduce_file`, and ``early_digest``: the file's digest begun
    before it was parsed (:func:`.loading.early_digest.begin_digest`), taken over for a mapped
    matrix (its map, hasher and thread) and closed otherwise.

    Returns
    -------
    reduced : ReducedRows
    source : RowSource
    digest : PendingDigest
        ``digest.result()`` waits for the SHA-256 of the file's bytes (hex). Call it once:
        the file's map stays open until then.

    Raises
    ------
    LogitsFileError
        As :func:`reduce_file`.
    """
    from .gap_histogram import N_BINS

    try:
        source = open_rows(path) if source is None else source
        m = check_kept_size(source, m=m, max_elements=max_elements)
        if early_digest is not None and not can_map(source):
            early_digest.close()  # converted blocks: the file is hashed apart (below)
    except BaseException:
        if early_digest is not None:
            early_digest.close()
        raise
    src = display_name(source.path)
    top_gaps = np.empty((source.n_rows, m))
    counts = np.empty((source.n_rows, N_BINS), dtype=np.int32)
    out = [top_gaps, counts]
    if labels is not None:
        out += [np.empty(source.n_rows), np.empty(source.n_rows, dtype=np.int32)]
    if can_map(source):
        digest = _reduce_mapped(source, m, labels, out, src, progress, early_digest)
    else:
        _reduce_read(source, m, labels, out, src, progress)
        # converted blocks are not the file's bytes: hashed from the file
        digest = PendingDigest(None, [], on_done=lambda: None, text=_file_sha256(source.path))
    return ReducedRows(top_gaps, counts, source.n_classes, *out[2:]), source, digest


class PendingDigest:
    """A file's SHA-256 still being computed on its own thread (:func:`reduce_file_hashing`)."""

    def __init__(self, digest, jobs: list, on_done: Callable[[], None], text: str | None = None):
        self._digest, self._jobs, self._on_done, self.text = digest, jobs, on_done, text

    def result(self) -> str:
        """Wait for the digest; the hex SHA-256 of the file's bytes.

        Returns
        -------
        str
        """
        if self.text is None:
            try:
                for job in self._jobs:
                    job.result()
            finally:
                self._jobs = []
                self._on_done()
            self.text = self._digest.hexdigest()
        return self.text

    def close(self) -> None:
        """Give up the digest (the caller failed): the jobs not started are dropped and the file's map closed."""
        if self.text is None and self._jobs:
            self._jobs = []
            self._on_done()


_BUFFERS = 3
#: Threads that reduce blocks (numpy lets go of the interpreter lock in the row work).
REDUCERS = 2
#: How far the reduction may run ahead of the digest: the pages between stay mapped (resident) until hashed.
HASH_LAG_BYTES = 128 << 20


def _reduce_mapped(source: RowSource, m: int, labels, out, src, progress, early=None) -> PendingDigest:
    """Reduce a float32 matrix read in place through a memory map, its SHA-256 trailing on a thread of its own.

    One thread hashes the file's bytes in order (hashlib lets go of the interpreter lock), others
    reduce blocks of rows, at most ``HASH_LAG_BYTES`` ahead of it. A block's pages are let go once
    both are done with it: each page is mapped once, and the resident set holds the blocks in flight
    and the digest's lag only. SHA-256 is the longest chain (twice the compiled reduction's CPU):
    held to it, the reduction and the imports beside it share the other core, and what comes next
    (the solve) overlaps only the digest's last stretch. Letting the digest trail further would
    map every page it reaches again, about 0.3 CPU-s of page faults on 2 GB. An ``early`` digest
    (:class:`.loading.early_digest.EarlyDigest`) has hashed the file's first bytes already, through the
    map the rows are read from: its jobs stand for the blocks they cover.
    """
    per_block = max(1, BLOCK_BYTES // (source.n_classes * 4))
    workers = max(1, min(REDUCERS, os.cpu_count() or 1))
    if early is not None:
        submitted, early_jobs = early.take_over()
        digest, hasher, mapped = early.digest, early.hasher, MappedMatrix(source, mapping=early.map)
    else:
        submitted, early_jobs = 0, []
        digest, hasher, mapped = hashlib.sha256(), ThreadPoolExecutor(max_workers=1), MappedMatrix(source)
    users = {}  # block start -> users left (its reducer and the hasher): the second to finish lets its pages go
    lock = threading.Lock()
    closed = []

    def done_with(start: int, stop: int) -> None:
        with lock:
            users[start] -= 1
            if not users[start] and not closed:
                mapped.release(start, stop)

    def close() -> None:
        hasher.shutdown(wait=True, cancel_futures=True)
        with lock:
            closed.append(True)
            mapped.__exit__(None, None, None)

    def hash_span(lo: int, hi: int):
        """The job after which the file's bytes [lo, hi) are hashed (what the early digest has not, submitted)."""
        nonlocal submitted
        if early_jobs and hi <= early_jobs[-1][1]:
            return next(job for _, stop, job in early_jobs if stop >= hi)  # the hasher runs its jobs in order
        job = hasher.submit(digest.update, mapped.bytes_between(max(lo, submitted), max(hi, submitted)))
        submitted = max(hi, submitted)
        return job

    def hash_rows(start: int, stop: int):
        users[start] = 2
        job = hash_span(source.offset + start * mapped.row_bytes, source.offset + stop * mapped.row_bytes)
        job.add_done_callback(lambda _: done_with(start, stop))  # on the hasher's thread (or here, if done)
        return start, job

    hashing = [(0, hash_span(0, source.offset))]  # (first row, job)
    try:
        with ThreadPoolExecutor(max_workers=workers) as reducers:
            in_flight: list = []
            for start in range(0, source.n_rows, per_block):
                stop = min(source.n_rows, start + per_block)
                # Not more than HASH_LAG_BYTES past the oldest block the digest has not finished.
                while hashing and (hashing[0][1].done()
                                   or (stop - hashing[0][0]) * mapped.row_bytes > HASH_LAG_BYTES):
                    hashing.pop(0)[1].result()
                hashing.append(hash_rows(start, stop))
                block = mapped.rows[start:stop]
                y = None if labels is None else labels[start:stop]
                in_flight.append((start, block, reducers.submit(_reduce, block, m, y)))
                if len(in_flight) > 2 * workers:
                    _finish(in_flight.pop(0), out, src, progress, source.n_rows, done_with)
            while in_flight:
                _finish(in_flight.pop(0), out, src, progress, source.n_rows, done_with)
            del block
        end = source.offset + source.n_rows * mapped.row_bytes
        hashing.append((source.n_rows, hash_span(end, mapped.size)))
    except BaseException:
        close()
        raise
    return PendingDigest(digest, [job for _, job in hashing], on_done=close)


def _reduce_read(source: RowSource, m: int, labels, out, src, progress) -> None:
    """Reduce a matrix read (and converted to float32) into reused buffers, one thread reading, one reducing."""
    in_flight: list = []
    with ThreadPoolExecutor(max_workers=1) as reducer:
        for start, block in source.blocks(buffers=_BUFFERS):
            if len(in_flight) == _BUFFERS - 1:
                _finish(in_flight.pop(0), out, src, progress, source.n_rows)
            y = None if labels is None else labels[start : start + block.shape[0]]
            in_flight.append((start, block, reducer.submit(_reduce, block, m, y)))
        while in_flight:
            _finish(in_flight.pop(0), out, src, progress, source.n_rows)


def check_kept_size(source: RowSource, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS) -> int:
    """Refuse, from the header alone, a matrix whose reduction would hold more than ``max_elements``.

    Returns
    -------
    int
        The gaps kept exactly per row (``m``, at most V - 1).

    Raises
    ------
    LogitsFileError
        Rows x (m + bins) over ``max_elements``.
    """
    from .gap_histogram import N_BINS

    m = min(m, source.n_classes - 1)
    kept = source.n_rows * (m + N_BINS)
    if kept > max_elements:
        raise fail(display_name(source.path), f"{source.n_rows:,} rows reduce to {kept:,} numbers, more than "
                   f"max_elements={max_elements:,}")
    return m


def _reduce(block: np.ndarray, m: int, labels):
    try:
        return reduce_rows(block, m=m, labels=labels)  # the compiled pass where it is built, else numpy's
    except ValueError:
        return None  # a NaN or +inf row: _finish names it


def _finish(job, out, src, progress, n_rows, done_with=None) -> None:
    start, block, reduce_job = job
    result = reduce_job.result()
    if result is None:
        row = start + int(np.argmax(~np.isfinite(block.max(axis=1))))
        raise fail(src, f"row {row} holds NaN or +inf (every logit must be finite or -inf)")
    rows = result[0].shape[0]
    for whole, part in zip(out, result):
        whole[start : start + rows] = part
    if done_with is not None:
        done_with(start, start + rows)
    if progress is not None:
        progress((start + rows) / n_rows)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


SUBSET_ROWS = 400


def subset(reduced: ReducedRows, rows: int = SUBSET_ROWS) -> ReducedRows:
    """Evenly spaced rows of a reduction (a first bracket for sigma, and the display fit).

    Parameters
    ----------
    reduced : ReducedRows
    rows : int, default ``SUBSET_ROWS``
        Rows kept; a reduction with no more rows is returned as is.

    Returns
    -------
    ReducedRows
    """
    if reduced.n_rows <= rows:
        return reduced
    pick = np.linspace(0, reduced.n_rows - 1, rows).round().astype(np.int64)
    if not reduced.has_labels:
        return ReducedRows(reduced.top_gaps[pick], reduced.counts[pick], reduced.n_classes)
    return ReducedRows(reduced.top_gaps[pick], reduced.counts[pick], reduced.n_classes,
                       reduced.label_gaps[pick], reduced.label_slots[pick])



def stream_labels(source: RowSource, labels_path=None, *, max_elements: int = DEFAULT_MAX_ELEMENTS):
    """The labels of a streamed matrix, validated against its shape, or None when there are none.

    Parameters
    ----------
    source : RowSource
    labels_path : str or path-like, optional
        A separate labels file; without it an ``.npz``'s ``labels`` array, if any.
    max_elements : int

    Returns
    -------
    ndarray of shape (n_rows,), int64, or None

    Raises
    ------
    LogitsFileError
        A labels file that does not parse, of another length, or with a label outside [0, V).
    """
    from ..loading.checks import validate_labels
    from ..loading.labels_file import read_labels_file
    from ..loading.load import LABELS_EXTENSIONS, read_file
    from ..loading.row_stream import npz_labels

    src = display_name(source.path)
    if labels_path is not None:
        content = read_file(labels_path, max_elements=max_elements, allowed=LABELS_EXTENSIONS, what="labels")
        lsrc = display_name(labels_path)
        raw = read_labels_file(content, os.path.splitext(str(labels_path))[1].lower(), lsrc,
                               max_elements=max_elements)
    else:
        raw, lsrc = npz_labels(source, max_elements=max_elements), src
        if raw is None:
            return None
    return validate_labels(raw, lsrc, n_samples=source.n_rows, n_classes=source.n_classes, logits_src=src)
