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

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CALIBER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: end-to-end tests in a real Chromium (Playwright)")


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
def _streamlit_server(log: Path):
    """`streamlit run app.py` on a free port of 127.0.0.1; killed on exit."""
    port = _free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
           "--server.address=127.0.0.1", f"--server.port={port}",
           "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
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
    with _streamlit_server(tmp_path_factory.mktemp("streamlit") / "server.log") as url:
        yield url


@pytest.fixture
def fresh_server(sync_playwright_api, tmp_path):
    """A server no one has visited yet (for first-request behaviour)."""
    with _streamlit_server(tmp_path / "server.log") as url:
        yield url


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
    yield pg
    context.close()
