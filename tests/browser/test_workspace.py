"""The workspace in a real Chromium: reload, server restart, isolation, unknown tokens, hostile files."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.loading import load_logits
from caliber_dashboard.workspace import SQLiteStore

from app_state import IDLE, settle_run, sigma_readout, upload, watch_socket  # this folder is on sys.path (pytest's prepend import mode)

ROOT = Path(__file__).resolve().parents[2]
N_DEMO = len(list((ROOT / "data").glob("digits_*.npz")))

pytestmark = pytest.mark.browser


def _open(page, url: str, *, ready: str = "text=models loaded") -> None:
    """Open (or reopen) a URL and wait for its first run to end with ``ready`` on the page."""
    page.goto(url)
    settle_run(page, ready=ready)


def _stored_targets(data_dir: Path, token: str) -> dict:
    """The targets the workspace holds (the app's own record), read from its store."""
    raw = SQLiteStore(data_dir).load_result(token, "settings", "targets")
    return {} if raw is None else json.loads(raw[1:])


def _wait_stored(data_dir: Path, token: str, kind: str, percent: float, timeout: float = 60.0) -> None:
    """Until the workspace has the target written (the page writes it after its run)."""
    deadline = time.monotonic() + timeout
    while _stored_targets(data_dir, token).get(kind) != percent:
        assert time.monotonic() < deadline, f"{kind} {percent} never stored: {_stored_targets(data_dir, token)}"
        time.sleep(0.1)  # polling the store's state, not a fixed wait


def _no_exception(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, page.locator(
        "[data-testid='stException']").first.inner_text()


def _models_loaded(page) -> int:
    text = page.locator("[data-testid='stSidebar']").inner_text()
    return int(re.search(r"(\d+) models? loaded", text).group(1))


def _token(page) -> str:
    page.wait_for_function("() => new URLSearchParams(location.search).get('ws')")
    return parse_qs(urlparse(page.url).query)["ws"][0]


def _goto_page(page, title: str) -> None:
    settle_run(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click(),
               ready=f"h1:has-text('{title}')")


def _upload(page, path: Path, *, ready: str) -> None:
    """Upload and wait until the file is read and ``ready`` (its message) is shown."""
    upload(page, path, ready=ready)


def _blobs(path: Path, *, seed: int, name: str, n: int = 400, k: int = 5) -> Path:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)).astype(np.float32)
    z[np.arange(n), y] += 2.5
    np.savez(path, logits=z, labels=y, name=np.array(name))
    return path


def _combobox(page, label: str):
    return page.get_by_role("combobox", name=label).first


def _choose(page, label: str, option: str) -> None:
    _combobox(page, label).click()
    settle_run(page, lambda: page.get_by_role("option", name=option, exact=True).click())


def _calibrate_state(page) -> tuple[str, str, str]:
    slider = page.locator("[data-testid='stSlider'] input[type=range]").first
    return (_combobox(page, "Model").input_value(),
            _combobox(page, "Margin statistic for S").input_value(), slider.input_value())


@pytest.fixture
def context_factory(browser):
    contexts = []

    def make():
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        ctx.set_default_timeout(60_000)
        contexts.append(ctx)
        page = ctx.new_page()
        watch_socket(page)
        return page

    yield make
    for ctx in contexts:
        ctx.close()


def test_upload_survives_reload_and_restart_with_its_options(restartable_server, context_factory,
                                                             tmp_path):
    server = restartable_server
    page = context_factory()
    _open(page, server.url)
    token = _token(page)
    assert len(token) >= 43
    assert "sharing the URL shares the workspace" in page.locator(
        "[data-testid='stSidebar']").inner_text()
    kept = _blobs(tmp_path / "kept.npz", seed=1, name="ws-kept")
    _upload(page, kept, ready="text=Loaded ws-kept")
    assert _models_loaded(page) == N_DEMO + 1

    _goto_page(page, "Calibrate")
    assert _token(page) == token  # the page switch keeps ?ws= in the address bar
    _choose(page, "Margin statistic for S", "mean")
    page.wait_for_selector("[data-testid='stMetric']")
    thumb = page.locator("[data-testid='stSlider'] input[type=range]").first
    thumb.focus()
    for _ in range(10):
        thumb.press("ArrowLeft")
    # The readout shows the 75% target's sigma*, and the workspace has stored the choice.
    cal_mean = pipeline.calibrate_data(load_logits(kept), statistic="mean")
    want = sigma_readout(cal_mean, sigma_for_target(cal_mean, 0.75).sigma)
    page.wait_for_function(
        """([label, want]) => [...document.querySelectorAll("[data-testid='stMetric']")]
             .some(m => m.innerText.includes(label) && m.innerText.includes(want))""",
        arg=["σ* (logit units)", want], timeout=120_000)
    page.wait_for_selector(IDLE)
    _wait_stored(server.data_dir, token, "retention", 75.0)
    _no_exception(page)
    chosen = _calibrate_state(page)
    assert chosen[0].startswith("ws-kept · ") and chosen[1:] == ("mean", "75")

    page.reload()
    settle_run(page, ready="h1:has-text('Calibrate')")
    settle_run(page, ready="[data-testid='stSlider']")
    assert _token(page) == token and _models_loaded(page) == N_DEMO + 1
    assert _calibrate_state(page) == chosen
    _no_exception(page)

    server.restart()
    page.goto(page.url)
    settle_run(page, ready="h1:has-text('Calibrate')")
    settle_run(page, ready="[data-testid='stSlider']")
    assert _token(page) == token and _models_loaded(page) == N_DEMO + 1
    assert _calibrate_state(page) == chosen
    _no_exception(page)

    # Another browser (a new context, no shared cookies or storage) never sees it...
    other = context_factory()
    _open(other, server.url)
    assert _models_loaded(other) == N_DEMO and _token(other) != token
    assert other.locator("text=ws-kept").count() == 0
    # ...nor does a guessed or mistyped token: it gets an empty workspace of its own.
    for guess in ("guessed-token", token[:-2] + ("xy" if token[-2:] != "xy" else "zz")):
        _open(other, f"{server.url}/?ws={guess}")
        assert _models_loaded(other) == N_DEMO
        assert _token(other) not in (guess, token)
        assert other.locator("[data-testid='stAlert']").count() == 0  # nothing tells it apart
        _goto_page(other, "Calibrate")
        assert not _combobox(other, "Model").input_value().startswith("ws-kept")
    # Tokens are never logged, and the store keeps only their hashes.
    logs = b"".join(p.read_bytes() for p in server.work.glob("server-*.log"))
    stored = b"".join(p.read_bytes() for p in server.data_dir.glob("workspaces.sqlite3*"))
    assert token.encode() not in logs and token.encode() not in stored


@pytest.mark.parametrize("make", ["pickled-object-npz", "nan-npz"])
def test_hostile_upload_after_a_good_one_loses_nothing(restartable_server, context_factory,
                                                       tmp_path, make):
    server = restartable_server
    good = _blobs(tmp_path / "good.npz", seed=2, name="ws-good")
    if make == "pickled-object-npz":
        bad = tmp_path / "evil.npz"
        np.savez(bad, logits=np.array([{"__reduce__": "os.system"}, None], dtype=object),
                 labels=np.zeros(2, dtype=np.int64))
    else:
        bad = tmp_path / "nan.npz"
        z = np.random.default_rng(0).normal(size=(300, 4))
        z[5, 1] = np.nan
        np.savez(bad, logits=z, labels=np.zeros(300, dtype=np.int64))

    page = context_factory()
    _open(page, server.url)
    token = _token(page)
    _upload(page, good, ready="text=Loaded ws-good")
    stored_before = [r.filename for r in SQLiteStore(server.data_dir).uploads(token)]
    assert stored_before == ["good.npz"]

    _upload(page, bad, ready=f"[data-testid='stAlert']:has-text('{bad.name}')")
    assert _models_loaded(page) == N_DEMO + 1
    _no_exception(page)
    assert [r.filename for r in SQLiteStore(server.data_dir).uploads(token)] == stored_before

    page.reload()
    settle_run(page, ready="h1:has-text('Data')")
    settle_run(page, ready="text=models loaded")
    assert _token(page) == token and _models_loaded(page) == N_DEMO + 1
    page.wait_for_selector("text=ws-good")  # the restored model, once the page below the sidebar is drawn
    _no_exception(page)
