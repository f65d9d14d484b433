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

from . import state

_run = threading.local()  # a script-run marker (per script thread), not session data


def pages() -> list:
    return [
        st.Page("pages/data.py", title="Data", icon=":material/upload_file:", default=True),
        st.Page("pages/calibrate.py", title="Calibrate", icon=":material/tune:"),
        st.Page("pages/fleet.py", title="Fleet", icon=":material/stacked_line_chart:"),
        st.Page("pages/attack_cost.py", title="Attack cost", icon=":material/shield:"),
        st.Page("pages/export.py", title="Export", icon=":material/download:"),
    ]


def _setup():
    st.set_page_config(page_title="Caliber", page_icon=":material/tune:", layout="wide")
    state.init()  # the per-session model store; the demo set on a first visit
    nav = st.navigation(pages())
    with st.sidebar:
        n = len(state.models())
        st.caption(f"{n} model{'s' if n != 1 else ''} loaded in this session "
                   f"({len(state.labelled_models())} with labels).")
    return nav


def run_app() -> None:
    """The body of ``app.py``: set-up, then the chosen page."""
    nav = _setup()
    _run.inside_app = True
    try:
        nav.run()
    finally:
        _run.inside_app = False


def page_prelude() -> None:
    """First call of every page file: hand over to ``app.py`` if it is not running."""
    if getattr(_run, "inside_app", False):
        return
    st.navigation(pages(), position="hidden")  # leaves the legacy pages/ mode for good
    st.rerun()
