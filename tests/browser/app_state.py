"""Waiting on the app's own state in the browser tests, never on a timer.

Streamlit marks the app element with ``data-test-script-state``: "running"
(or "rerunRequested") while a script run is under way, "notRunning" when it
is done. :func:`settle_run` watches that attribute from just before an action
until a run has started and ended, then waits for the element the action
should have produced.
"""

from __future__ import annotations


IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

# Counts the script runs the page starts from now on (the app's own state attribute, not a timer).
_WATCH_RUNS = """() => {
  const app = document.querySelector("[data-testid='stApp']");
  if (window.__caliberWatch) window.__caliberWatch.disconnect();
  window.__caliberRuns = 0;
  window.__caliberStates = [app.getAttribute("data-test-script-state")];
  window.__caliberWatch = new MutationObserver(() => {
    const state = app.getAttribute("data-test-script-state");
    window.__caliberStates.push(state);
    if (state === "running" || state === "rerunRequested") window.__caliberRuns += 1;
  });
  window.__caliberWatch.observe(app, {attributes: true, attributeFilter: ["data-test-script-state"]});
}"""
_RUN_DONE = """() => window.__caliberRuns > 0 &&
  document.querySelector("[data-testid='stApp']").getAttribute("data-test-script-state") === "notRunning"
"""


def upload(page, path, *, ready: str, nth: int = 0, timeout: float = 240_000) -> None:
    """Put ``path`` in the ``nth`` file uploader and wait until the upload is done and read.

    Done means: a script run started after the file was given and ended, and
    ``ready`` (the file's own message, which only the run that read it draws) is
    on the page. Streamlit answers
    the browser's request for an upload URL before the file is sent; that answer
    has taken 8 s here even on an idle server, and longer under load, hence the
    generous ``timeout``.
    """
    uploader = page.locator("[data-testid='stFileUploader']").nth(nth)
    settle_run(page, lambda: uploader.locator("input[type=file]").set_input_files(str(path)),
               ready=ready, timeout=timeout)


def settle_run(page, action=None, *, ready: str | None = None, timeout: float = 120_000) -> None:
    """Do ``action`` (a callable) and wait until the script run it starts has finished.

    The wait is on the app's own state: a run must have started after the action
    (``data-test-script-state`` left "notRunning") and ended again. With ``ready``
    (a selector), that element must also be on the page, for actions whose effect
    arrives in a later run (an upload: the file is sent, then the run starts). With
    no action: wait for the page's first run to end.
    """
    page.wait_for_selector("[data-testid='stApp']", timeout=timeout)
    if action is None:
        page.wait_for_selector(IDLE, timeout=timeout)
    else:
        # Start from an idle app: a run already under way would swallow the action's run
        # (the server restarts it with the new widget values), and no new start would show.
        page.wait_for_selector(IDLE, timeout=timeout)
        page.evaluate(_WATCH_RUNS)
        action()
        try:
            page.wait_for_function(_RUN_DONE, timeout=timeout)
        except Exception as exc:  # say what the app did instead
            states = page.evaluate("() => window.__caliberStates")
            files = page.locator("[data-testid='stFileUploader']").all_inner_texts()
            raise AssertionError(f"no script run started and ended after the action; states seen: {states}; "
                                 f"files in the uploaders: {files}") from exc
    if ready is not None:
        page.wait_for_selector(ready, timeout=timeout)
        page.wait_for_selector(IDLE, timeout=timeout)


def sigma_readout(cal, sigma: float, kind: str = "retention") -> str:
    """What the page shows for a served sigma: the same readout function and bootstrap as the app."""
    from caliber_core.calibration.target_intervals import interval_estimator
    from caliber_dashboard.common import readouts

    interval = interval_estimator(cal).at(sigma).get(kind)
    return readouts.sigma_text(sigma, readouts.sigma_range(cal, sigma, interval, kind))
