"""Waiting on the app's own state in the browser tests, never on a timer.

Streamlit marks the app element with ``data-test-script-state``: "running"
(or "rerunRequested") while a script run is under way, "notRunning" when it
is done. :func:`settle_run` watches that attribute from just before an action
until a run has started and ended, then waits for the element the action
should have produced.

A short run can leave no trace on that attribute: the frontend may handle the
run's start and end messages in one task, and React then renders only the
final "notRunning" (seen on a cached page reached from the sidebar: the page
was drawn, the attribute never moved). So an action given a ``ready``
element that was not on the page before it also counts as done once that
element is there and the app is idle: only the run the action started can
have drawn it. Without such an element, a page registered with
:func:`watch_socket` is waited on through the server's own messages: the
action's run is over when the websocket brings its ``script_finished``
(a run cut short for a rerun does not count). The attribute watch remains
the fallback, and says what the app did when a wait fails.
"""

from __future__ import annotations

import weakref

# page -> its app websocket (the last one opened); a closed page's entry goes with it
_SOCKETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

# Counts the script runs the page starts from now on (the app's own state attribute, not a timer).
_WATCH_RUNS = """() => {
  const app = document.querySelector("[data-testid='stApp']");
  if (window.__caliberWatch) window.__caliberWatch.disconnect();
  window.__caliberRuns = 0;
  window.__caliberStates = [app.getAttribute("data-test-script-state")];
  const busy = (state) => state === "running" || state === "rerunRequested";
  window.__caliberWatch = new MutationObserver((records) => {
    // Every record, not only the attribute's value now: two changes can arrive in one callback.
    for (const record of records) {
      const state = record.target.getAttribute("data-test-script-state");
      window.__caliberStates.push(state);
      if (busy(record.oldValue) && !busy(state)) window.__caliberRuns += 1;
      else if (busy(state)) window.__caliberRuns = Math.max(window.__caliberRuns, 1);
    }
  });
  window.__caliberWatch.observe(app, {attributes: true, attributeOldValue: true,
                                      attributeFilter: ["data-test-script-state"]});
}"""
_RUN_DONE = """() => window.__caliberRuns > 0 &&
  document.querySelector("[data-testid='stApp']").getAttribute("data-test-script-state") === "notRunning"
"""


def upload(page, path, *, ready: str, label: str = "Logits files", timeout: float = 240_000) -> None:
    """Put ``path`` in the file uploader whose label starts ``label`` and wait until it is read.

    Done means: a script run started after the file was given and ended, and
    ``ready`` (the file's own message, which only the run that read it draws) is
    on the page. The uploader is found by its label, never by position: the
    labels uploader is re-keyed after each upload, and an index taken while it
    remounts has put a logits file into it. Streamlit answers the browser's
    request for an upload URL before the file is sent; that answer has taken
    8 s here even on an idle server, and longer under load, hence the generous
    ``timeout``.
    """
    settle_run(page, lambda: file_input(page, label).set_input_files(str(path)), ready=ready, timeout=timeout)


def file_input(page, label: str = "Logits files"):
    """The ``<input type=file>`` of the uploader whose label starts ``label`` (sync or async page)."""
    name = page.locator("[data-testid='stWidgetLabel']", has_text=label)
    return page.locator("[data-testid='stFileUploader']", has=name).first.locator("input[type=file]")


def settle_run(page, action=None, *, ready: str | None = None, timeout: float = 120_000) -> None:
    """Do ``action`` (a callable) and wait until the script run it starts has finished.

    The wait is on the app's own state: a run must have started after the action
    (``data-test-script-state`` left "notRunning") and ended again. With ``ready``
    (a selector), that element must also be on the page, for actions whose effect
    arrives in a later run (an upload: the file is sent, then the run starts); a
    ``ready`` element absent before the action stands for the run itself (see the
    module docstring). With no action: wait for the page's first run to end.
    """
    page.wait_for_selector("[data-testid='stApp']", timeout=timeout)
    if action is None:
        page.wait_for_selector(IDLE, timeout=timeout)
    else:
        # Start from an idle app: a run already under way would swallow the action's run
        # (the server restarts it with the new widget values), and no new start would show.
        page.wait_for_selector(IDLE, timeout=timeout)
        page.evaluate(_WATCH_RUNS)
        # A ready element already on the page proves nothing about this action's run.
        drawn_by_run = ready if ready is not None and not _on_page(page, ready) else None
        socket = _SOCKETS.get(page)
        try:
            if drawn_by_run is not None:  # drawn only by the run the action started; idle below ends it
                action()
                page.wait_for_selector(drawn_by_run, timeout=timeout)
            elif socket is not None and not socket.is_closed():
                with socket.expect_event("framereceived", predicate=_run_finished, timeout=timeout):
                    action()
            else:
                action()
                page.wait_for_function(_RUN_DONE, timeout=timeout)
        except Exception as exc:  # say what the app did instead
            states = page.evaluate("() => window.__caliberStates")
            files = page.locator("[data-testid='stFileUploader']").all_inner_texts()
            headings = page.locator("h1").all_inner_texts()
            raise AssertionError(f"no script run started and ended after the action; states seen: {states}; "
                                 f"files in the uploaders: {files}; headings: {headings}; url: {page.url}") from exc
    if ready is not None:
        page.wait_for_selector(ready, timeout=timeout)
    page.wait_for_selector(IDLE, timeout=timeout)


def watch_socket(page) -> None:
    """Keep the page's app websocket (call before the first ``goto``): :func:`settle_run` then waits on it."""
    # The frames' parser now, not on the first frame: importing it imports streamlit (0.6-1.5 s here),
    # which would land inside the first action's wait and hold back every event the wait reads.
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # noqa: F401

    page.on("websocket", lambda ws: _SOCKETS.__setitem__(page, ws))


def _run_finished(payload) -> bool:
    """A ``script_finished`` message of a run that was not cut short for a rerun."""
    if isinstance(payload, str):
        return False
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    msg = ForwardMsg()
    try:
        msg.ParseFromString(payload)
    except Exception:  # not a ForwardMsg: not the end of a run
        return False
    return (msg.WhichOneof("type") == "script_finished"
            and msg.script_finished != ForwardMsg.ScriptFinishedStatus.FINISHED_EARLY_FOR_RERUN)


def sigma_readout(cal, sigma: float, kind: str = "retention") -> str:
    """What the page shows for a served sigma: the same readout function and bootstrap as the app."""
    from caliber_core.calibration.target_intervals import interval_estimator
    from caliber_dashboard.common import readouts

    interval = interval_estimator(cal).at(sigma).get(kind)
    return readouts.sigma_text(sigma, readouts.sigma_range(cal, sigma, interval, kind))


def _on_page(page, selector: str) -> bool:
    """Whether ``selector`` (Playwright syntax, e.g. "text=...") matches an element now."""
    return page.locator(selector).count() > 0
