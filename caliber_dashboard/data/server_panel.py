"""The Data page's "Files on this server" part: pick a file under the data root and open it in place.

Shown only when a data root is set (:mod:`.data_root`). The listing offers the
supported files under the root; a path can also be typed (relative to the
root), and gets the same single refusal as any path that cannot be opened, so
nothing outside the root can be opened or probed. An opened file joins the
loaded models like an upload, and the workspace records its relative path
(:func:`.server_files.remember`), never its bytes. A matrix of a large
vocabulary (``full_vocab.STREAM_MIN_CLASSES`` classes and more) goes through
the streamed engine instead (:mod:`.vocab_files`), never into a dense copy.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import streamlit as st

from caliber_core.loading import LABELS_EXTENSIONS, SUPPORTED_EXTENSIONS, LogitsFileError, describe

from caliber_dashboard.common import cache, state, ui
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

from . import data_root, server_files, vocab_files

MESSAGES = "caliber_server_file_messages"
FILE_KEY, LABELS_KEY, TYPED_KEY = "server_file", "server_labels", "server_typed_path"
NO_LABELS = "(none: labels in the file, or none)"
_ICONS = {"success": ":material/check_circle:", "info": ":material/info:", "warning": ":material/warning:",
          "error": ":material/block:"}


@st.cache_data(ttl=10, max_entries=4, show_spinner=False)
def _listing(root: str) -> tuple[list[data_root.RootFile], bool]:
    # A short time to live: files copied into the root show up within seconds.
    return data_root.list_files(Path(root))


def _size(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB" if n >= 1e3 else f"{n} B"


def open_file(path: str, labels: str | None) -> list[tuple[str, str]]:
    """Open ``path`` (and ``labels``) from the root into this session and workspace; the messages.

    A refused path or an invalid file changes nothing and gets one line.
    """
    try:
        root = data_root.configured_root()
    except ValueError as exc:
        return [("error", server_files.one_line(exc))]
    if root is None:
        return [("error", "No data root is set on this server.")]
    try:
        if vocab_files.streams(root, path):  # a large vocabulary: the streamed engine, never a dense copy
            with cache.progress_bar(vocab_files.progress_text(path)) as report:
                return vocab_files.open_member(path, labels, progress=report)
        data = server_files.open_in_place(root, path, labels)
    except (data_root.NotInRoot, LogitsFileError) as exc:
        return [("error", server_files.one_line(exc))]
    if not state.is_new(data):
        return [("info", f"{state.model_label(data)} is already loaded (same sha256).")]
    try:
        kept = server_files.remember(data)
    except (CapExceeded, *workspace.STORE_ERRORS, ValueError) as exc:
        return [("error", f"{data.source}: not opened: the workspace refused its record ({exc}).")]
    state.add_model(data)
    st.session_state[state.SELECTED] = data.sha256
    labels_from = "" if data.labels_source in (None, data.source) else f" (labels from {data.labels_source})"
    where = ("read in place: not copied into the workspace, which keeps only its path"
             if kept else "for this browser session only: storage is unavailable")
    return ([("success", f"Opened {describe(data)}{labels_from} from the data root ({where}).")]
            + [("warning", f"{data.name}: {w}") for w in data.warnings])


def _on_open() -> None:
    ss = st.session_state
    typed = (ss.get(TYPED_KEY) or "").strip()
    path = typed or ss.get(FILE_KEY)
    labels = ss.get(LABELS_KEY)
    labels = None if labels in (None, NO_LABELS) else labels
    if not path:
        ss[MESSAGES] = [("error", "Choose a file from the list, or type its path relative to the data root.")]
        return
    ss[MESSAGES] = open_file(path, labels)


def draw() -> None:
    """The part of the Data page (nothing when no data root is set)."""
    try:
        root = data_root.configured_root()
    except ValueError as exc:
        st.warning(ui.plain(server_files.one_line(exc)), icon=_ICONS["warning"])
        return
    if root is None:
        return
    st.subheader("Files on this server")
    st.caption("Files under the data root the server was started with, opened where they lie: "
               "nothing is uploaded or copied into the workspace, which records only the path, "
               "so a reload or a restart opens the file again. Paths are relative to the root.")
    files, cut = _listing(str(root))
    logits = [f for f in files if PurePosixPath(f.path).suffix.lower() in SUPPORTED_EXTENSIONS]
    labels = [f.path for f in files if PurePosixPath(f.path).suffix.lower() in LABELS_EXTENSIONS]
    sizes = {f.path: f.size for f in files}
    c1, c2, c3 = st.columns([3, 2, 1], vertical_alignment="bottom")
    with c1:
        st.selectbox("Logits file", [f.path for f in logits], index=None, key=FILE_KEY,
                     placeholder="Choose a file" if logits else "No supported file under the root",
                     format_func=lambda p: f"{p}  ({_size(sizes.get(p, 0))})")
    with c2:
        st.selectbox("Labels file (optional)", [NO_LABELS] + labels, key=LABELS_KEY)
    with c3:
        st.button("Open", key="server_open_btn", on_click=_on_open, icon=":material/folder_open:")
    st.text_input("Or a path relative to the data root", key=TYPED_KEY, placeholder="evals/run1/logits.npy",
                  help="Used instead of the list when filled.")
    if cut:
        st.caption(f"The list stops at {data_root.MAX_LISTED:,} files; type a path for the others.")
    for level, text in st.session_state.get(MESSAGES, []):
        getattr(st, level)(ui.plain(text), icon=_ICONS[level])
