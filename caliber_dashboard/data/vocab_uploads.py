"""Uploads of a large vocabulary: the streamed engine, as files opened from the data root get it.

An uploaded matrix that declares at least ``full_vocab.STREAM_MIN_CLASSES``
classes (a next-token dump) is never parsed whole into the dense engine:

* :func:`declared_shape` reads its shape from the header only (the upload's
  buffer for ``.npy`` and ``.npz``; a temporary file for the other streamed formats);
* :func:`open_upload` writes the upload's bytes (the uploader's own, no copy in memory) to a
  temporary file beside the workspace's store, reduces it once through
  :func:`.vocab_files.reduce_once` (the data root's engine), calibrates the
  default targets, and only then stores the bytes in the workspace (its cap
  applies) with a :data:`.vocab_files.KIND` record that names the stored blobs;
* a reload or a restart restores the record without reading the file
  (``session.restore_uploads`` skips such uploads); a new choice on Calibrate
  reduces the stored blob again (:func:`.vocab_files.reopen`).

A file that is not a valid matrix, labels that do not fit, or a file over a cap:
one message naming the file and the rule, nothing stored.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from caliber_core.calibration.full_vocab import STREAM_MIN_CLASSES
from caliber_core.loading import LogitsFileError
from caliber_core.loading.npy import read_header
from caliber_core.loading.row_stream import STREAM_EXTENSIONS, declared_shape as file_shape
from caliber_core.loading.safety import display_name

from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace
from caliber_dashboard.workspace.store import blob_digest

from . import server_files, vocab_files

Message = tuple[str, str]


def declared_shape(upload) -> tuple[int, int] | None:
    """(rows, classes) of an upload's matrix from its header; None when it is not a streamed format
    or the header cannot be read (the ordinary loader then says why).

    ``upload`` is the uploader's file (a ``BytesIO`` with a ``name``); it is left at its start.
    """
    suffix = PurePosixPath(upload.name).suffix.lower()
    if suffix not in STREAM_EXTENSIONS:
        return None
    try:
        upload.seek(0)
        if suffix == ".npy":
            shape = read_header(upload, src=display_name(upload.name), where="the file").shape
        elif suffix == ".npz":
            with zipfile.ZipFile(upload) as zf, zf.open("logits.npy") as member:
                shape = read_header(member, src=display_name(upload.name), where="npz member logits.npy").shape
        else:  # .safetensors, .pt: the core's reader, on a temporary copy on disk
            with _spool() as folder:
                return file_shape(_write(folder, upload.name, upload.getvalue()))
    except Exception:  # noqa: BLE001  (not a matrix header: the ordinary loader gives its one line)
        return None
    finally:
        upload.seek(0)
    return (int(shape[0]), int(shape[1])) if len(shape) == 2 else None


def streams(upload) -> tuple[int, int] | None:
    """The declared shape when the upload goes through the streamed engine (K >= STREAM_MIN_CLASSES), else None."""
    shape = declared_shape(upload)
    return shape if shape is not None and shape[1] >= STREAM_MIN_CLASSES else None


@contextlib.contextmanager
def _spool():
    """A private temporary folder beside the workspace's store (on its disk, not in memory), else the system's."""
    try:
        where = workspace.store().root
    except Exception:  # noqa: BLE001  (no storage: the system's temporary folder)
        where = None
    with tempfile.TemporaryDirectory(prefix="caliber_upload_", dir=where) as folder:
        yield Path(folder)


def _write(folder: Path, filename: str, buffer) -> Path:
    """The buffer as a file whose name ends like ``filename`` (the readers go by the extension)."""
    path = folder / f"{len(list(folder.iterdir()))}{PurePosixPath(filename).suffix.lower()}"
    with open(path, "wb") as out:
        out.write(buffer)
    return path


def open_upload(upload, labels_upload=None, *, progress: Callable[[float], None] | None = None) -> list[Message]:
    """Reduce, calibrate and store one large-vocabulary upload (with its labels file); the Data page's messages.

    ``progress`` is called with the fraction of the matrix's rows read.
    """
    name = upload.name
    labels_name = None if labels_upload is None else labels_upload.name
    try:
        # The uploader's own bytes object (a BytesIO shares it until written to): no copy in memory.
        buffer = upload.getvalue()
        labels = None if labels_upload is None else labels_upload.getvalue()
        with _spool() as folder:
            real = _write(folder, name, buffer)
            labels_real = None if labels is None else _write(folder, labels_name, labels)
            labels_blob = None if labels is None else blob_digest(labels)
            started = time.perf_counter()
            streamed = vocab_files.reduce_once(real, name, labels_real, labels_name,
                                               key=vocab_files.upload_key(blob_digest(buffer), labels_blob),
                                               labels_blob=labels_blob, stored=True, progress=progress)
            targets = vocab_files.default_targets(streamed.has_labels)
            config = vocab_files.calibrate(streamed, targets)
            seconds = time.perf_counter() - started
            stored = workspace.persist_upload(buffer, name, labels_content=labels, labels_filename=labels_name)
    except CapExceeded as exc:
        return [("error", server_files.one_line(exc))]
    except (LogitsFileError, ValueError, OSError, *workspace.STORE_ERRORS) as exc:
        line = server_files.one_line(exc)
        return [("error", line if line.startswith(display_name(name)) else f"{display_name(name)}: {line}")]
    entry = vocab_files.entry_for(streamed, targets, "point", config)
    note = vocab_files.keep(entry)
    if not stored and not note:
        note = f"{name} is kept for this browser session only: storage is unavailable."
    r = streamed.reduced
    labels_from = "" if labels_name is None else f" (labels from {labels_name})"
    what = "with labels" if streamed.has_labels else "without labels: agreement targets only"
    kept = " and stored in this workspace" if stored else ""
    out = [("success", f"Streamed {name}{labels_from}: N={r.n_rows:,} K={r.n_classes:,}, {what}; a vocabulary "
                       f"this large goes through the streamed engine (top {r.top_gaps.shape[1]} gaps exact, the rest "
                       f"binned), calibrated in {seconds:.1f} s{kept}. See it on Calibrate, Export and Policy.")]
    return out + ([("warning", note)] if note else [])
