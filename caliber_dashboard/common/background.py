"""Session work that need not hold up the page: one worker thread, in submission order.

A slider step on the Calibrate page stores the chosen target in the session's
workspace: two database commits, 20-150 ms on this machine depending on the
disk. The readout and plot do not depend on them, so the page hands them to
:func:`run_after` and its script run ends as soon as they are drawn.

The worker runs each call with the submitting session's script context
attached (``add_script_run_ctx``), so ``st.session_state`` is that session's;
one worker keeps a session's calls in the order they were made (the last
target chosen is the last one stored). Without a server runtime (``AppTest``)
the call runs at once, in the caller's thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Callable

from streamlit import config, runtime
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

_LOG = logging.getLogger(__name__)
_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-after-run")


def serving() -> bool:
    """True inside a ``streamlit run`` server; False in a bare script or under ``AppTest``.

    (``AppTest`` installs a stand-in runtime while it runs a page, and says so
    in the ``global.appTest`` option.)
    """
    return runtime.exists() and not config.get_option("global.appTest")


def run_after(func: Callable, *args) -> concurrent.futures.Future | None:
    """Run ``func(*args)`` after the current work, in this session's context.

    Returns the future (None when it ran at once). Exceptions are logged, not
    raised: callers hand over only work whose failure the page reports itself
    (the workspace turns its own failures into sidebar warnings).
    """
    ctx = get_script_run_ctx()
    if ctx is None or not serving():
        func(*args)
        return None
    return _worker.submit(_with_context, ctx, func, args)


def _with_context(ctx, func: Callable, args: tuple) -> None:
    add_script_run_ctx(threading.current_thread(), ctx)
    try:
        func(*args)
    except Exception:  # noqa: BLE001  (logged: a lost store is a choice not saved, not a crash)
        _LOG.exception("deferred session work failed")


def drain(timeout_s: float = 30.0) -> None:
    """Wait until the work handed over so far has run (the worker keeps submission order).

    Called before a session leaves its workspace (a new one, or deleted): a choice
    still queued for the old workspace is then written before the switch, never
    into the new one, and never after a deletion, which it would undo.
    """
    if serving() and not threading.current_thread().name.startswith("caliber-after-run"):  # not the worker itself
        _worker.submit(lambda: None).result(timeout_s)


def lowest_priority() -> None:
    """Give the calling thread (and the threads it starts) the lowest CPU priority, where one thread can have its own.

    For work that only prepares what a page may ask for next: it then takes the cores
    while the visitors' own runs and the browser's drawing leave them idle.

    On Linux a thread is scheduled on its own and ``setpriority`` on its native id
    changes that thread alone; elsewhere the same call would name a process, so
    nothing changes there.
    """
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # not allowed here: it runs at normal priority
            pass
