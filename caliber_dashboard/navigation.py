"""The app's pages and set-up, shared by ``app.py`` and every page file.

Why the pages need a prelude: the page files live in ``pages/``, and Streamlit
treats that folder the legacy way (every file a page, run *without*
``app.py``) until ``st.navigation`` has been called in the process. So the
first visitor of a deep link such as ``/calibrate`` on a fresh server gets the
page file alone: no session set-up, no demo set, the raw file list as
navigation (``AppTest`` does the same on every run: it resets that flag). The
prelude notices that ``app.py`` is not running, registers the real navigation
(which ends the legacy mode) and reruns, so ``app.py`` runs the same page with
the same widget identities. A rerun keeps widget values and runs callbacks
first, but drops a button's click: buttons here act through ``on_click``.
"""

from __future__ import annotations

import threading

import streamlit as st

from caliber_dashboard import warmup
from caliber_dashboard.common import precalibrate, state, ui  # precalibrate: starts on every added model
from caliber_dashboard.workspace import session as workspace

_run = threading.local()  # a script-run marker (per script thread), not session data


def pages() -> list:
    return [
        st.Page("pages/data.py", title="Data", icon=":material/upload_file:", default=True),
        st.Page("pages/calibrate.py", title="Calibrate", icon=":material/tune:"),
        st.Page("pages/fleet.py", title="Fleet", icon=":material/stacked_line_chart:"),
        st.Page("pages/attack_cost.py", title="Attack cost", icon=":material/shield:"),
        st.Page("pages/extraction.py", title="Extraction", icon=":material/content_copy:"),
        st.Page("pages/export.py", title="Export", icon=":material/download:"),
        st.Page("pages/policy.py", title="Policy", icon=":material/policy:"),
    ]


def _setup():
    st.set_page_config(page_title="Caliber", page_icon=":material/tune:", layout="wide")
    state.init()  # the session's workspace: restored on its first run, demo set included
    nav = st.navigation(pages())
    with st.sidebar:
        _workspace_panel()
    return nav


def _workspace_panel() -> None:
    """Model count, the privacy rule, storage used, new/delete, and what the restore skipped."""
    n = len(state.models())
    st.caption(f"{n} model{'s' if n != 1 else ''} loaded in this workspace "
               f"({len(state.labelled_models())} with labels).")
    reason = workspace.unavailable_reason()
    if reason is not None:
        st.warning(ui.plain(f"Workspace storage is unavailable ({reason}): uploads and choices "
                            "last only as long as this browser tab."), icon=":material/cloud_off:")
    else:
        st.caption("**This workspace is private to its link.** Anyone who has this page's URL "
                   "(its `?ws=` part) can see and change these uploads and choices: sharing "
                   "the URL shares the workspace. Bookmark it to come back.")
        used = workspace.usage()
        if used is not None:
            st.caption(f"Stored here: {_megabytes(used.workspace_bytes)} of "
                       f"{_megabytes(used.limits.workspace_bytes)}.")
        st.button("Start a new workspace", key="ws_new", on_click=state.start_new_workspace,
                  icon=":material/add_circle:",
                  help="Opens an empty workspace with a new URL; this one stays at its own URL.")
        with st.popover("Delete this workspace", icon=":material/delete_forever:"):
            st.markdown("Deletes every upload and choice stored in this workspace, for good, "
                        "and opens a new empty one.")
            st.button("Delete for good", key="ws_delete", type="primary",
                      on_click=state.delete_workspace)
    for message in st.session_state.get(state.WARNINGS, []):
        st.warning(ui.plain(message), icon=":material/warning:")


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def run_app() -> None:
    """The body of ``app.py``: set-up, then the chosen page; choices are saved after it."""
    warmup.start()  # once per server: heavy imports and the demo caches, in the background
    nav = _setup()
    _run.inside_app = True
    try:
        nav.run()
    finally:
        _run.inside_app = False
        state.sync_choices()  # failures become sidebar warnings, never exceptions
        warmup.freeze_late_imports()  # torch, after the run that first imported it


def page_prelude() -> None:
    """First call of every page file: hand over to ``app.py`` if it is not running."""
    if getattr(_run, "inside_app", False):
        return
    st.navigation(pages(), position="hidden")  # leaves the legacy pages/ mode for good
    st.rerun()
