"""Uploads on the Data page: validate, store, and one set of messages per uploaded file.

Every file in an uploader has its own messages (loaded, already loaded,
refused with the core's one line), kept under ``state.UPLOAD_STATUS`` by the
file's id and shown for as long as that file stays in the uploader: removing
a file removes its messages, and a message is never lost to a rerun.

A labels file is used in one of two ways:

* for the logits files in the uploader that carry no labels of their own and
  have as many rows as it has labels (the others load without it, and no
  message about it appears under them);
* otherwise it attaches to a model already loaded (uploaded earlier, or
  restored after a reload). The rule: among the loaded models without labels,
  those with as many rows as the file has labels; if that leaves several, those
  whose file name (without extension) begins the labels file's name
  (``answers.npy`` <- ``answers_labels.npy``). Exactly one must remain; otherwise
  the message says which models tie, or that none fits, and what to do.

Labels that fail because one equals K (classes numbered 1..K) get a hint. A
matrix of a large vocabulary (``full_vocab.STREAM_MIN_CLASSES`` classes and
more) goes through the streamed engine (:mod:`.vocab_uploads`), never into a
dense copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import PurePath

import streamlit as st

from caliber_core.loading import LogitsData, describe

from caliber_dashboard.common import cache, state
from caliber_dashboard.common import upload_boundary as boundary
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace
from caliber_dashboard.workspace.store import blob_digest

from . import vocab_files, vocab_uploads

Message = tuple[str, str]  # (level: "success" | "info" | "warning" | "error", text)
_OUT_OF_RANGE = re.compile(r"labels index \d+ is (-?\d+), outside \[0, (\d+)\)")


def one_based_hint(message: str) -> str:
    """The hint added to a labels error whose offending label equals K (classes numbered from 1)."""
    found = _OUT_OF_RANGE.search(message)
    if found is None or int(found.group(1)) != int(found.group(2)):
        return ""
    k = int(found.group(2))
    return (f" These labels look 1-based (a label equals K={k}): class indices run 0..{k - 1} here, "
            "so subtract 1 from every label and upload the file again.")


def _refused(exc: Exception, name: str | None = None) -> Message:
    text = boundary.message(exc, name)
    hint = one_based_hint(text)
    if hint and not text.rstrip().endswith("."):
        text = text.rstrip() + "."  # the hint is a sentence of its own
    return ("error", text + hint)


def _status() -> dict:
    return st.session_state.setdefault(state.UPLOAD_STATUS, {})


def _key(upload, labels) -> str:
    return f"{upload.file_id}|{labels.file_id if labels is not None else '-'}"


#: The labels uploader's round: a new round draws a new, empty uploader (the box is cleared once used).
LABELS_ROUND = "caliber_labels_round"
#: Where the messages of the last labels file used stay once its uploader is cleared.
_LAST_LABELS = "labels:last"


def labels_key() -> str:
    """The widget key of the labels uploader this round ("upload_labels", then "upload_labels_1", ...)."""
    n = int(st.session_state.get(LABELS_ROUND, 0))
    return "upload_labels" if n == 0 else f"upload_labels_{n}"


def _labels_count(labels_upload) -> int | None:
    """How many labels the file holds; None when it cannot be read (attach_labels then says why)."""
    try:
        y = boundary.read_labels(labels_upload.getvalue(), labels_upload.name)
    except Exception:  # noqa: BLE001  (attach_labels then says why, in one line)
        return None
    return int(y.shape[0]) if y.ndim >= 1 else 1


def process(uploads: Iterable, labels_upload=None) -> list[Message]:
    """Handle the files not handled yet; return the messages of every file in the uploaders now.

    A labels file goes only with the logits files that have as many rows as it
    has labels; the others load without it and get no message about it. Labels
    that fit none of the files in the uploader attach to a loaded model
    (:func:`attach_labels`). Once the labels are used, the labels box is
    cleared (a new :func:`labels_key`), and its messages stay until the next
    labels file. A bad file, or one a workspace cap refuses, gets its one-line
    message and changes nothing else. Safe to call on every rerun (files are
    handled once, by id).
    """
    ss = st.session_state
    processed: set = ss.setdefault(state.PROCESSED, set())
    status = _status()  # file id -> {"messages": [...], "used_labels": bool}
    uploads = list(uploads or ())
    n_labels = None if labels_upload is None else _labels_count(labels_upload)
    used = False
    for upload in uploads:
        key = _key(upload, labels_upload)
        if key in processed:
            continue
        processed.add(key)
        entry = _load_one(upload, labels_upload, n_labels=n_labels)
        if entry is None:  # these labels are not for this file: it keeps what it had
            continue
        status[upload.file_id] = entry
        used = used or entry["used_labels"]
    if labels_upload is not None:
        key = f"labels|{labels_upload.file_id}"
        if key not in processed:
            processed.add(key)
            status.pop(_LAST_LABELS, None)
            if used or any(status.get(u.file_id, {}).get("used_labels") for u in uploads):
                used = True  # its messages are those of the logits files
            else:
                messages = attach_labels(labels_upload)
                used = bool(messages) and messages[0][0] == "success"
                status[_LAST_LABELS if used else labels_upload.file_id] = {"messages": messages}
    if used and labels_upload is not None:
        # Clear the labels box; the files left on the left are not read again without them.
        ss[LABELS_ROUND] = int(ss.get(LABELS_ROUND, 0)) + 1
        processed.update(_key(u, None) for u in uploads)
        labels_upload = None
    shown = ([u.file_id for u in uploads] + [_LAST_LABELS]
             + ([labels_upload.file_id] if labels_upload is not None else []))
    for file_id in list(status):  # a file taken out of its uploader takes its messages along
        if file_id not in shown:
            del status[file_id]
    return [m for file_id in shown for m in status.get(file_id, {}).get("messages", [])]


def _load_one(upload, labels_upload, *, n_labels: int | None = None) -> dict | None:
    """{"messages": [...], "used_labels": whether the labels file was read with this file}.

    The labels file is read with this file only when it has as many labels as
    the file has rows (``n_labels``). None when the file was handled before and
    these labels are not for it.
    """
    labels = None
    streamed = vocab_uploads.streams(upload)  # a large vocabulary: the data root's streamed engine, never dense
    if streamed is not None:
        fits = labels_upload is not None and n_labels == streamed[0]
        if not fits and labels_upload is not None and upload.file_id in _status():
            return None
        with cache.progress_bar(vocab_files.progress_text(upload.name)) as report:
            messages = vocab_uploads.open_upload(upload, labels_upload if fits else None, progress=report)
        return {"messages": messages, "used_labels": fits}
    try:
        content = upload.getvalue()  # a copy of the upload's bytes: taken once
        data = boundary.load_logits(content, upload.name)
        fits = labels_upload is not None and not data.has_labels and n_labels == data.n_samples
        if not fits and labels_upload is not None and upload.file_id in _status():
            return None
        if fits:  # the logits as read above, not parsed and validated a second time
            labels = labels_upload
            data = boundary.with_labels(data, labels_upload.getvalue(), labels_upload.name)
        if state.is_new(data):
            boundary.check_visitor_budget(state.held_elements(besides=data.sha256), data, upload.name)
            _store(upload.name, content, labels, data)
    except Exception as exc:  # noqa: BLE001  (the one error boundary: one line, never a traceback)
        return {"messages": [_refused(exc, upload.name)], "used_labels": labels is not None}
    return {"messages": _added(data), "used_labels": labels is not None}


def _added(data: LogitsData) -> list[Message]:
    if state.add_model(data):
        st.session_state[state.SELECTED] = data.sha256  # the pages open on the new model
        labels_from = ("" if data.labels_source in (None, data.source)
                       else f" (from {PurePath(data.labels_source).name})")
        return ([("success", f"Loaded {describe(data)}{labels_from}.")]
                + [("warning", f"{data.name}: {w}") for w in data.warnings])
    return [("info", f"{state.model_label(data)} is already loaded (same sha256).")]


def matching_models(labels_name: str, n_labels: int) -> list[LogitsData]:
    """The loaded models a labels file may attach to (see the module docstring)."""
    found = [d for d in state.models().values() if not d.has_labels and d.n_samples == n_labels]
    if len(found) > 1:
        stem = PurePath(labels_name).stem.lower()
        named = [d for d in found if stem.startswith(PurePath(d.source).stem.lower())]
        found = named or found
    return found


def attach_labels(labels_upload) -> list[Message]:
    """Attach a labels file to the one loaded model it matches, or say why not and what to do."""
    name = labels_upload.name
    content = labels_upload.getvalue()
    try:
        y = boundary.read_labels(content, name)
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
        return [_refused(exc, name)]
    n = int(y.shape[0]) if y.ndim >= 1 else 1
    found = matching_models(name, n)
    if not found:
        return [("error", f"{name}: {n:,} labels, but no loaded model without labels has {n:,} rows. "
                          "Upload its logits file on the left while this labels file is here.")]
    if len(found) > 1:
        names = ", ".join(state.model_label(d) for d in found)
        return [("error", f"{name}: {n:,} labels fit {len(found)} loaded models without labels ({names}). "
                          "Name the labels file after its logits file (e.g. answers_labels.npy for "
                          "answers.npy), or upload the logits file again with it.")]
    data = found[0]
    try:
        logits_content = workspace.store().read_blob(data.sha256)
    except Exception:  # noqa: BLE001  (no stored copy: storage off, or another workspace's demo)
        return [("error", f"{name}: the logits of {state.model_label(data)} are not stored in this workspace; "
                          "upload its logits file again on the left while this labels file is here.")]
    try:
        labelled = boundary.load_logits(logits_content, data.source, labels_content=content,
                                        labels_filename=name, sha256=data.sha256)
        _store(data.source, logits_content, labels_upload, labelled)
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
        return [_refused(exc, name)]
    state.add_model(labelled)  # replaces the entry without labels
    st.session_state[state.SELECTED] = labelled.sha256
    return [("success", f"Labels from {name} attached to {state.model_label(labelled)}: the loaded model "
                        f"without labels that has {n:,} rows.")]


def _store(filename: str, content: bytes, labels_upload, data: LogitsData) -> None:
    """Write a validated upload to the workspace; CapExceeded passes through."""
    labels_content = labels_upload.getvalue() if labels_upload is not None else None
    labels_name = labels_upload.name if labels_upload is not None else None
    try:
        stored = workspace.persist_upload(content, filename, labels_content=labels_content,
                                          labels_filename=labels_name)
    except CapExceeded:
        raise
    except (*workspace.STORE_ERRORS, ValueError) as exc:
        state.add_warning(f"{filename} is loaded for this browser session only: saving it failed ({exc}).")
        return
    if stored:
        labels_blob = blob_digest(labels_content) if labels_content is not None else None
        workspace.remember_parsed(data, filename=filename, labels_blob=labels_blob, labels_filename=labels_name)
