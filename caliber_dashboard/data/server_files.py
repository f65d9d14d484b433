"""Files opened in place from the data root: read once, never copied into the workspace.

:func:`open_in_place` turns a file under the data root (:mod:`.data_root`)
into the same validated :class:`~caliber_core.loading.LogitsData` an upload
gives, by the core loader's own rules (header checks before any allocation,
``validate_logits``, ``validate_labels``, the margin check):

* a row-major ``.npy`` (float16/32/64) is read a block of rows at a time from
  the open file straight into the float64 matrix the calibration works on, so
  the server holds that matrix and one block, never the file's bytes as well
  (a memory map would add every page it touches to the process's resident
  memory; plain reads leave them to the page cache);
* every other format is read from the open file and parsed by
  ``load_logits_bytes``, as an upload is.

The workspace records only the relative paths (result kind :data:`KIND`, keyed
by the model's digest); a reload or a server restart reopens them through the
same root checks (:func:`restore`), and a process cache keyed by each file's
real path, size and modification time spares a second read of an unchanged file.
A file changed on disk is read again, under its new digest.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np

from caliber_core.loading import DEFAULT_MAX_ELEMENTS, LABELS_EXTENSIONS, SUPPORTED_EXTENSIONS
from caliber_core.loading import LogitsData, LogitsFileError, load_logits_bytes
from caliber_core.loading import npy
from caliber_core.loading.checks import check_margin_scale, check_rows_and_classes, validate_labels, validate_logits
from caliber_core.loading.labels_file import read_labels_file
from caliber_core.loading.load import MIN_ROWS_FOR_PRECISION
from caliber_core.loading.safety import RAISE_LIMIT, check_count, check_dtype, clean_name, display_name, fail
from caliber_core.loading.safety import max_file_bytes

from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

from . import data_root
from .data_root import NotInRoot

#: Workspace result kind of a file opened from the data root.
KIND = "server_file"
#: Bytes read from the file per block (a block of rows; the float64 matrix is filled from it).
BLOCK_BYTES = 16 * 1024 * 1024
_HASH_CHUNK = 8 * 1024 * 1024
_STREAMED = {np.dtype("<f2"), np.dtype("<f4"), np.dtype("<f8")}
_CACHE_BYTES = 2 << 30  # parsed matrices kept per process (float64)


def open_in_place(root: Path, path: str, labels_path: str | None = None, *,
                  max_elements: int = DEFAULT_MAX_ELEMENTS,
                  progress: Callable[[float], None] | None = None) -> LogitsData:
    """Read and validate a logits file (and optionally a labels file) under the data root.

    Parameters
    ----------
    root : Path
        The resolved data root.
    path, labels_path : str
        Paths relative to the root, as :func:`.data_root.list_files` gives them.
    max_elements : int
        The loader's element budget.
    progress : callable, optional
        Called with the fraction of the logits read.

    Returns
    -------
    LogitsData
        ``source`` and ``labels_source`` are the relative paths; ``sha256`` is
        the logits file's digest (as an upload of the same bytes gets).

    Raises
    ------
    NotInRoot
        A path that cannot be opened from the root (one message for every reason).
    LogitsFileError
        The file opened but is not valid logits (the loader's one line).
    """
    if Path(path).suffix.lower() not in SUPPORTED_EXTENSIONS:
        raise data_root.refusal(path)
    key = cache_key(root, path, labels_path)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    labels_content = None
    if labels_path is not None:
        with checked(root, labels_path, LABELS_EXTENSIONS) as (fh, _):
            labels_content = _read_all(fh, labels_path, max_elements)
    with checked(root, path, SUPPORTED_EXTENSIONS) as (fh, real):
        data = None
        if real.suffix.lower() == ".npy":
            data = _npy_in_blocks(fh, path, labels_path, labels_content, max_elements, progress)
        if data is None:
            content = _read_all(fh, path, max_elements)
            data = load_logits_bytes(content, path, labels_content=labels_content,
                                     labels_filename=labels_path, max_elements=max_elements)
    _CACHE.put(key, data)
    return data


class checked:
    """``with checked(root, rel, exts) as (file, real):`` the file, opened by :func:`.data_root.open_file`,
    and refused on exit if the path names another file than the one read (swapped meanwhile)."""

    def __init__(self, root: Path, relative: str, extensions: tuple[str, ...]) -> None:
        self.root, self.relative, self.extensions = root, relative, extensions

    def __enter__(self):
        self.fh, self.real = data_root.open_file(self.root, self.relative, extensions=self.extensions)
        return self.fh, self.real

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                before, now = os.fstat(self.fh.fileno()), None
                try:
                    now = os.stat(self.real)
                except OSError:
                    pass
                if now is None or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
                    raise data_root.refusal(self.relative)
        finally:
            self.fh.close()
        return False


def _read_all(fh, relative: str, max_elements: int) -> bytes:
    size, limit = os.fstat(fh.fileno()).st_size, max_file_bytes(max_elements)
    if size > limit:
        raise fail(display_name(relative), f"the file is {size:,} bytes, more than the {limit:,} allowed "
                   f"for max_elements={max_elements:,} ({RAISE_LIMIT})")
    return fh.read()


def _npy_in_blocks(fh, relative, labels_path, labels_content, max_elements, progress) -> LogitsData | None:
    """A row-major float ``.npy`` read block by block into float64; None for another layout or dtype."""
    src = display_name(relative)
    size = os.fstat(fh.fileno()).st_size
    header = npy.read_header(io.BytesIO(fh.read(npy.HEAD_BYTES)), src=src, where="the file")
    if header.fortran_order or header.dtype not in _STREAMED or len(header.shape) != 2:
        fh.seek(0)
        return None  # the ordinary reader gives its message or copes
    check_dtype(src, "logits", header.dtype)
    npy.check_data_size(header, size=size, src=src, field="logits", max_elements=max_elements, what="npy")
    n, k = header.shape
    if n < 1 or k < 2:
        fh.seek(0)
        return None
    check_count(src, "logits", header.shape, max_elements)
    check_rows_and_classes(src, n, k)
    z = np.empty((n, k), dtype=np.float64)
    row_bytes = k * header.dtype.itemsize
    per_block = max(1, BLOCK_BYTES // row_bytes)
    buf = np.empty(per_block * k, dtype=header.dtype)
    digest = hashlib.sha256()
    fh.seek(0)
    digest.update(fh.read(header.data_offset))
    for start in range(0, n, per_block):
        rows = min(per_block, n - start)
        view = memoryview(buf.view(np.uint8))[:rows * row_bytes]
        got = 0
        while got < len(view):
            count = fh.readinto(view[got:])
            if not count:
                raise fail(src, f"the file ends inside row {start + got // row_bytes} (truncated)")
            got += count
        digest.update(view)
        z[start:start + rows] = buf[:rows * k].reshape(rows, k)
        if progress is not None:
            progress((start + rows) / n)
    while chunk := fh.read(_HASH_CHUNK):  # trailing bytes belong to the file's digest too
        digest.update(chunk)
    logits = validate_logits(z, src, max_elements=max_elements)  # float64 and ours: no copy
    labels = labels_source = None
    warnings = []
    if labels_content is not None:
        labels_src = display_name(labels_path)
        if not labels_content:
            raise fail(labels_src, "the file is empty (0 bytes)")
        labels = read_labels_file(labels_content, PurePosixPath(labels_path).suffix.lower(), labels_src,
                                  max_elements=max_elements)
        labels = validate_labels(labels, labels_src, n_samples=n, n_classes=k, logits_src=src)
        labels_source = labels_path
    margins = check_margin_scale(logits, src)
    margins.flags.writeable = False
    if n < MIN_ROWS_FOR_PRECISION:
        warnings.append(f"N={n} rows: calibration precision will be poor")
    stem = PurePosixPath(relative).name.rsplit(".", 1)[0]
    return LogitsData(name=clean_name(stem) or "logits", logits=logits, labels=labels,
                      sha256=digest.hexdigest(), source=relative, labels_source=labels_source,
                      warnings=tuple(warnings), margins=margins)


# -------------------------------------------------------------- the process cache


def cache_key(root: Path, path: str, labels_path: str | None) -> tuple:
    """What identifies the two files on disk now: real path, size and mtime (NotInRoot if absent)."""
    out: list = [str(root)]
    for relative, exts in ((path, SUPPORTED_EXTENSIONS), (labels_path, LABELS_EXTENSIONS)):
        if relative is None:
            out.append(None)
            continue
        real = data_root.resolve(root, relative, extensions=exts)
        info = real.stat()
        out.append((relative, str(real), info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(out)


_CACHE = workspace.ModelCache(_CACHE_BYTES)  # opened files, bounded as the parsed uploads are


def record(data: LogitsData) -> dict:
    """What the workspace keeps of a file opened from the root: the relative paths and the digest."""
    return {"path": data.source, "labels": data.labels_source, "sha256": data.sha256}


def one_line(exc: BaseException) -> str:
    """The message of a refusal or a loader error, on one line."""
    return " ".join(str(exc).split())

# ------------------------------------------------------------ workspace members


def remember(data: LogitsData) -> bool:
    """Record in the workspace that ``data`` was opened from the root; False without storage.

    Raises
    ------
    CapExceeded
        The workspace is full (a record is a few hundred bytes).
    """
    return workspace.save_result(KIND, data.sha256, record(data))


def forget(sha256: str) -> None:
    """Drop the workspace's record of a file opened from the root (nothing when there is none)."""
    workspace.delete_result(KIND, sha256)


def restore() -> tuple[list[LogitsData], list[str]]:
    """Reopen the workspace's files from the root: the models, and one warning per file skipped.

    A file is skipped, with the same refusal as on the Data page, when the root
    is not set on this server any more, or the path no longer names a file in
    it; a file whose contents changed is opened as it is now (a new digest).
    """
    records, bad = workspace.load_results(KIND)
    if not records and not bad:
        return [], []
    warnings = [f"Skipped an unreadable record of a server file ({key[:8]})." for key in bad]
    try:
        root = data_root.configured_root()
    except ValueError as exc:
        root, reason = None, one_line(exc)
    else:
        reason = f"no data root is set on this server ({data_root.DATA_ROOT_ENV})"
    models = []
    for key, rec in records.items():
        path = rec.get("path") if isinstance(rec, dict) else None
        labels = rec.get("labels") if isinstance(rec, dict) else None
        if not isinstance(path, str) or not (labels is None or isinstance(labels, str)):
            warnings.append(f"Skipped an unreadable record of a server file ({key[:8]}).")
            continue
        if root is None:
            warnings.append(f"Skipped server file {display_name(path)}: {reason}.")
            continue
        try:
            data = open_in_place(root, path, labels)
        except (NotInRoot, LogitsFileError, OSError) as exc:
            warnings.append(f"Skipped server file: {one_line(exc)}")
            continue
        if data.sha256 != key:  # changed on disk: keep the record under its new digest
            try:
                forget(key)
                remember(data)
            except (CapExceeded, *workspace.STORE_ERRORS):
                pass
        models.append(data)
    return models, warnings
