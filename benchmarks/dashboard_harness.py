"""The browser harness of ``bench_dashboard.py``: Streamlit servers and a probed Chromium.

* :func:`serve` starts ``streamlit run`` on a free port of 127.0.0.1 and waits
  for ``/_stcore/health``; :func:`cpu_seconds` reads the server's CPU time.
* :class:`Visitor` is one browser context (a new Streamlit session) with a
  probe installed in every document: the last DOM mutation, the frame painted
  after it, and the last key press or click, all from ``performance.now()``.

How "done" is decided, for every action: the app's script state is back to
``notRunning``; for a step, the metric values have changed; for a visit, the
page's title is shown and every plotly chart has drawn; and then the page has
been quiet (no DOM mutation, plotly redraws included) for ``quiet_ms``. The
time reported is from the key press or click (or navigation start) to the
frame painted after the last mutation.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = os.environ.get("CALIBER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
MINIMAL_PAGE = str(Path(__file__).resolve().parent / "minimal_slider_page.py")
VIEWPORT = {"width": 1400, "height": 1000}

# Installed in every document before the app's own code: the last DOM mutation,
# the frame painted after it, and when the last key press or click happened.
PROBE = """
(() => {
  if (window.__bench) return;
  const b = window.__bench = {t0: 0, last: performance.now(), painted: performance.now()};
  const mark = () => {
    const t = performance.now();
    b.last = t;
    requestAnimationFrame(() => requestAnimationFrame(() => {
      if (b.last === t) b.painted = performance.now();
    }));
  };
  new MutationObserver(mark).observe(document, {subtree: true, childList: true,
                                                attributes: true, characterData: true});
  for (const kind of ["keydown", "click"]) {
    document.addEventListener(kind, () => { b.t0 = performance.now(); }, true);
  }
})();
"""

# When the page's main thread last ended a task of 50 ms or more (plotly's first drawing of a page is
# one of 1.5-2 s here); installed before the app's own code.
LONG_TASKS = """
(() => {
  window.__longTaskEnd = 0;
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__longTaskEnd = Math.max(window.__longTaskEnd, e.startTime + e.duration);
  }).observe({type: "longtask", buffered: true});
})();
"""

BROWSER_IDLE_JS = "(quiet) => performance.now() - window.__longTaskEnd > quiet"


def wait_browser_idle(page, *, quiet_ms: float = 500.0, timeout_s: float = 60.0) -> None:
    """Wait until the page's main thread has run no long task for ``quiet_ms`` (its context has
    :data:`LONG_TASKS` installed): the page a person sees is drawn before the first action is timed."""
    page.wait_for_function(BROWSER_IDLE_JS, arg=quiet_ms, timeout=timeout_s * 1000, polling=50)


READOUT_JS = """
[...document.querySelectorAll("[data-testid='stMetricValue']")].map(e => e.innerText).join("|")
"""

STEP_DONE_JS = """
([old, quiet]) => {
  const b = window.__bench, app = document.querySelector("[data-testid='stApp']");
  if (!b || !app || app.getAttribute("data-test-script-state") !== "notRunning") return false;
  const now = [...document.querySelectorAll("[data-testid='stMetricValue']")]
    .map(e => e.innerText).join("|");
  return now !== old && performance.now() - b.last > quiet && b.painted >= b.last;
}
"""

VISIT_DONE_JS = """
([title, quiet]) => {
  const b = window.__bench, app = document.querySelector("[data-testid='stApp']");
  if (!b || !app || app.getAttribute("data-test-script-state") !== "notRunning") return false;
  if (![...document.querySelectorAll("h1")].some(h => h.innerText.trim().startsWith(title)))
    return false;
  if (document.querySelector("[data-testid='stProgress'], [data-testid='stSpinner']")) return false;
  const charts = [...document.querySelectorAll("[data-testid='stPlotlyChart']")];
  if (charts.some(c => !c.querySelector(".main-svg"))) return false;
  return performance.now() - b.last > quiet && b.painted >= b.last;
}
"""

LEGEND_JS = """
[...document.querySelectorAll("[data-testid='stPlotlyChart'] .legendtext")].map(e => e.textContent)
"""

CORRIDOR_JS = """
() => [...document.querySelectorAll("[data-testid='stPlotlyChart'] .legendtext")]
        .some(e => /corridor/i.test(e.textContent))
"""


# ----------------------------------------------------------------------------- servers


PIDS: dict[str, int] = {}  # server url -> process id, for its CPU time


def cpu_seconds(url: str) -> float:
    """CPU time (user + system, all threads) the server at ``url`` has used so far."""
    fields = Path(f"/proc/{PIDS[url]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(url: str, *, limit_s: float = 30.0, window_s: float = 0.5, windows: int = 1) -> float:
    """Wait until the server at ``url`` uses under 5% of a CPU for ``windows`` windows in a row (its
    warm-up is over); seconds waited. Several windows: a warm-up importing modules from a busy disk
    can use little CPU for half a second and then hold the interpreter for seconds."""
    start = time.monotonic()
    quiet = 0
    while time.monotonic() - start < limit_s and quiet < windows:
        before = cpu_seconds(url)
        time.sleep(window_s)
        quiet = quiet + 1 if cpu_seconds(url) - before < 0.05 * window_s else 0
    return time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(script: str, log: Path, *, root: Path = ROOT):
    """``streamlit run script`` in ``root`` on a free port; yields (url, seconds until healthy)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", script, "--server.headless=true",
           "--server.address=127.0.0.1", f"--server.port={port}",
           "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() - start > 90:
                raise RuntimeError(f"streamlit did not become healthy: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        PIDS[url] = proc.pid
        yield url, time.monotonic() - start
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------------------- browser


class Visitor:
    """One browser context (a new Streamlit session) with the probe installed."""

    def __init__(self, browser, *, quiet_ms: float, timeout_s: float = 180.0):
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(timeout_s * 1000)
        self.context.add_init_script(PROBE)
        self.page = self.context.new_page()
        self.quiet = quiet_ms
        self.timeout = timeout_s * 1000
        self.received = 0
        self.page.on("websocket", self._watch)

    def _watch(self, ws) -> None:
        def count(payload):
            self.received += len(payload)
        ws.on("framereceived", count)

    def close(self) -> None:
        self.context.close()

    def _elapsed(self) -> float:
        return self.page.evaluate("window.__bench.painted - window.__bench.t0") / 1000.0

    def wait_visit(self, title: str) -> float:
        self.page.wait_for_function(VISIT_DONE_JS, arg=[title, self.quiet], timeout=self.timeout,
                                    polling=25)
        return self._elapsed()

    def open(self, url: str, title: str) -> float:
        """Navigate; seconds from navigation start (t0 = 0) to done."""
        self.page.goto(url)
        return self.wait_visit(title)

    def click_page(self, title: str) -> float:
        self.page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click()
        return self.wait_visit(title)

    def step(self, key: str = "ArrowLeft") -> tuple[float, int]:
        """One slider step; (seconds to done, websocket bytes received)."""
        thumb = self.page.locator("[data-testid='stSlider'] input[type=range]").first
        thumb.focus()
        old = self.page.evaluate(READOUT_JS)
        before = self.received
        self.page.keyboard.press(key)
        self.page.wait_for_function(STEP_DONE_JS, arg=[old, self.quiet], timeout=self.timeout,
                                    polling=25)
        return self._elapsed(), self.received - before

    def exceptions(self) -> int:
        return self.page.locator("[data-testid='stException']").count()

    def legends(self) -> list[str]:
        return self.page.evaluate(LEGEND_JS)
