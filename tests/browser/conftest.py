"""Fixtures for the end-to-end tests: a real Streamlit server and Debian's Chromium.

Playwright never downloads a browser here: it drives /usr/bin/chromium. The
tests skip (with the reason) when that binary or the playwright package is missing.
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

import pytest

from app_state import IDLE, watch_socket  # noqa: F401, E402  (re-exported: benchmarks/bench_workspace.py imports it from here)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CALIBER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: end-to-end tests in a real Chromium (Playwright)")


def pytest_collection_modifyitems(items):
    # Under CPU starvation (two busy loops on the 2-core machine) Streamlit 1.67 has been seen
    # to leave a finished upload in the uploader with no script run for 240 s, or to run once
    # without reading it. That stall is the framework's upload round trip, so a browser test
    # that times out waiting on the app's run state gets one more try; any other failure,
    # and a second timeout, fail as before.
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=["TimeoutError", "no script run started"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sync_playwright_api():
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); never `playwright install`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright)")
    return sync_playwright


@contextlib.contextmanager
def streamlit_server(log: Path, *, data_dir: Path, port: int | None = None, env: dict | None = None,
                     on_start=None):
    """`streamlit run app.py` on 127.0.0.1 with its workspaces in ``data_dir``; killed on exit.

    ``port`` (default: a free one) lets a restarted server answer the same URLs;
    ``on_start`` receives the process (the benchmark samples its memory).
    """
    port = _free_port() if port is None else port
    cmd = [sys.executable, "-m", "streamlit", "run", "caliber_dashboard/app.py", "--server.headless=true",
           "--server.address=127.0.0.1", f"--server.port={port}",
           "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    environ = {**os.environ, **(env or {}), "CALIBER_DATA_DIR": str(data_dir)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=environ)
    if on_start is not None:
        on_start(proc)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not become healthy: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def server(sync_playwright_api, tmp_path_factory):
    """One server for the session (its first visitor opens the root URL)."""
    work = tmp_path_factory.mktemp("streamlit")
    with streamlit_server(work / "server.log", data_dir=work / "data") as url:
        yield url


@pytest.fixture
def fresh_server(sync_playwright_api, tmp_path):
    """A server no one has visited yet (for first-request behaviour)."""
    with streamlit_server(tmp_path / "server.log", data_dir=tmp_path / "data") as url:
        yield url


class RestartableServer:
    """A server that can be stopped and started again on the same port and data directory."""

    def __init__(self, work: Path) -> None:
        self.work, self.data_dir, self.port = work, work / "data", _free_port()
        self.url: str | None = None
        self._running = None
        self.starts = 0

    def start(self) -> str:
        self.starts += 1
        self._running = streamlit_server(self.work / f"server-{self.starts}.log",
                                         data_dir=self.data_dir, port=self.port)
        self.url = self._running.__enter__()
        return self.url

    def stop(self) -> None:
        if self._running is not None:
            self._running.__exit__(None, None, None)
            self._running = None

    def restart(self) -> str:
        self.stop()
        return self.start()


@pytest.fixture(scope="module")
def restartable_server(sync_playwright_api, tmp_path_factory):
    """A server whose workspaces outlive a restart (same port, same data directory)."""
    handle = RestartableServer(tmp_path_factory.mktemp("restartable"))
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def browser(sync_playwright_api):
    with sync_playwright_api() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A fresh browser context: a new user with a new Streamlit session."""
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    pg = context.new_page()
    watch_socket(pg)
    yield pg
    context.close()
