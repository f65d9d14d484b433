"""The per-session model store, in plain ``st.session_state`` keys.

Widget-keyed values vanish from the session state when their widget is not
drawn (a page switch), so everything that must outlive a page lives under the
plain keys below, never in module globals: each browser session has its own
models.

* ``MODELS``: dict sha256 -> LogitsData, in load order (a file loaded twice is kept once);
* ``PROCESSED``: upload keys already handled, so the uploader's persisted value
  does not re-add a removed model on every rerun;
* ``UPLOAD_ERRORS``: upload key -> the one-line LogitsFileError message, shown
  while that file stays in the uploader;
* ``SELECTED``: sha256 of the model the pages last worked on;
* ``TARGETS``: the last target chosen per kind (percent), shared by the pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from caliber_core.loading import LogitsData, LogitsFileError, load_logits, load_logits_bytes

MODELS = "caliber_models"
PROCESSED = "caliber_processed_uploads"
UPLOAD_ERRORS = "caliber_upload_errors"
DEMO_DONE = "caliber_demo_loaded"
SELECTED = "caliber_selected"
TARGETS = "caliber_targets"
VERIFY_COUNTER = "caliber_verify_counter"
LAST_UPLOAD = "caliber_last_upload"

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEMO_GLOB = "digits_*.npz"


@st.cache_resource(max_entries=1, show_spinner=False)
def demo_models() -> tuple[LogitsData, ...]:
    """The bundled demo files, read once per process (read-only, shared)."""
    return tuple(load_logits(p) for p in sorted(DATA_DIR.glob(DEMO_GLOB)))


def init() -> None:
    """Create the plain keys; on a session's first run, load the demo set."""
    ss = st.session_state
    ss.setdefault(MODELS, {})
    ss.setdefault(PROCESSED, set())
    ss.setdefault(UPLOAD_ERRORS, {})
    ss.setdefault(TARGETS, {})
    ss.setdefault(VERIFY_COUNTER, 0)
    if not ss.get(DEMO_DONE):
        ss[DEMO_DONE] = True
        load_demo()


def load_demo() -> int:
    """Add the demo models not loaded yet; returns how many were added."""
    return sum(add_model(d) for d in demo_models())


def models() -> dict[str, LogitsData]:
    return st.session_state.setdefault(MODELS, {})


def labelled_models() -> dict[str, LogitsData]:
    return {k: d for k, d in models().items() if d.has_labels}


def add_model(data: LogitsData) -> bool:
    """Store a model under its sha256; False if that file is already loaded.

    A file first loaded without labels and now given labels replaces the old entry.
    """
    store = models()
    old = store.get(data.sha256)
    if old is not None and (old.has_labels or not data.has_labels):
        return False
    store[data.sha256] = data
    return True


def remove_model(sha256: str) -> None:
    models().pop(sha256, None)
    if st.session_state.get(SELECTED) == sha256:
        st.session_state.pop(SELECTED, None)


def clear_models() -> None:
    models().clear()
    st.session_state.pop(SELECTED, None)


def model_label(data: LogitsData) -> str:
    """Display name: the model name plus the digest prefix (two files may share a name)."""
    return f"{data.name} · {data.sha256[:8]}"


def remember_target(kind: str, percent: float) -> None:
    st.session_state.setdefault(TARGETS, {})[kind] = float(percent)


def remembered_target(kind: str, default: float) -> float:
    return float(st.session_state.get(TARGETS, {}).get(kind, default))


def next_verify_seed() -> int:
    """A fresh seed for every verify click in this session (a counter)."""
    st.session_state[VERIFY_COUNTER] = st.session_state.get(VERIFY_COUNTER, 0) + 1
    return 1_000 + st.session_state[VERIFY_COUNTER]


# ------------------------------------------------------------------------ uploads


@dataclass
class UploadOutcome:
    added: list[LogitsData] = field(default_factory=list)
    duplicates: list[LogitsData] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # for every file in the uploader now


def _upload_key(upload, labels) -> str:
    return f"{upload.file_id}|{labels.file_id if labels is not None else '-'}"


def process_uploads(uploads: Iterable, labels_upload=None) -> UploadOutcome:
    """Load the uploader's files that were not handled yet (by file_id).

    A bad file records its one-line message and changes nothing else. The
    labels file, when given, is used for logits files that carry no labels.
    """
    ss = st.session_state
    processed: set = ss.setdefault(PROCESSED, set())
    errors: dict = ss.setdefault(UPLOAD_ERRORS, {})
    out = UploadOutcome()
    for upload in uploads or ():
        key = _upload_key(upload, labels_upload)
        if key not in processed:
            processed.add(key)
            try:
                data = _load_upload(upload, labels_upload)
            except LogitsFileError as exc:
                errors[key] = str(exc)
            else:
                if add_model(data):
                    out.added.append(data)
                    st.session_state[SELECTED] = data.sha256  # the pages open on the new model
                else:
                    out.duplicates.append(data)
        if key in errors:
            out.errors.append(errors[key])
    return out


def _load_upload(upload, labels_upload) -> LogitsData:
    content = upload.getvalue()
    data = load_logits_bytes(content, upload.name)
    if labels_upload is not None and not data.has_labels:
        data = load_logits_bytes(content, upload.name, labels_content=labels_upload.getvalue(),
                                 labels_filename=labels_upload.name)
    return data
