"""The data root and the workspace's non-model members in a real Chromium.

* a path out of the root (``..``, a link out, an absolute path) gets the one refusal a missing
  file gets, and opens nothing;
* a calibrated top-k logprob log survives a reload and is downloaded from Export, and `check`
  accepts the downloaded config on the log;
* a large-vocabulary file under the root is streamed, shown on Calibrate with its certified
  bounds, and its config downloaded from Export is accepted by `caliber check`;
* a large-vocabulary upload, and such a file opened from the root, show a progress bar while
  they are streamed, gone once they are.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app_state import settle_run, upload, watch_socket  # this folder is on sys.path (pytest's prepend import mode)
from conftest import streamlit_server

ROOT = Path(__file__).resolve().parents[2]
K = 8192  # full_vocab.STREAM_MIN_CLASSES: streamed from here on
RULE = "no such file in the data root (a path is relative to the root, without '..', and may not lead out of it)"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def root_server(sync_playwright_api, tmp_path_factory):
    work = tmp_path_factory.mktemp("data_root")
    base = work / "root"
    (base / "lm").mkdir(parents=True)
    rng = np.random.default_rng(4)
    n = 240
    y = rng.integers(0, K, n)
    z = rng.standard_normal((n, K), dtype=np.float32)
    z[np.arange(n), y] += 3.0
    np.save(base / "lm" / "next_token.npy", z)
    np.save(base / "lm" / "next_token_labels.npy", y)
    np.save(work / "outside.npy", z[:, :40].copy())
    os.symlink(work / "outside.npy", base / "link_out.npy")
    with streamlit_server(work / "server.log", data_dir=work / "data",
                          env={"CALIBER_DATA_ROOT": str(base)}) as url:
        yield url, base, work


@pytest.fixture
def page(browser, root_server):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(120_000)
    pg = context.new_page()
    watch_socket(pg)
    yield pg
    context.close()


def _open(page, url: str) -> None:
    page.goto(url)
    settle_run(page, ready="text=models loaded")


def _goto_page(page, title: str) -> None:
    settle_run(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click(),
               ready=f"h1:has-text('{title}')")


def _no_exception(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, page.locator(
        "[data-testid='stException']").first.inner_text()


def _models_loaded(page) -> int:
    return int(re.search(r"(\d+) models? loaded", page.locator("[data-testid='stSidebar']").inner_text()).group(1))


def _open_typed(page, path: str, ready: str) -> None:
    box = page.get_by_role("textbox", name="Or a path relative to the data root")
    settle_run(page, lambda: (box.fill(path), box.press("Enter")))
    button = page.locator("[data-testid='stButton'] button", has_text=re.compile(r"Open$"))  # not a selectbox's
    settle_run(page, lambda: button.click(), ready=ready)


# Records the text of every progress bar the page shows from now on (however briefly it is there).
_WATCH_PROGRESS = """() => {
  window.__caliberProgress = [];
  new MutationObserver(() => {
    for (const el of document.querySelectorAll("[data-testid='stProgress']")) {
      const text = el.innerText.trim();
      if (text && !window.__caliberProgress.includes(text)) window.__caliberProgress.push(text);
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def _alerts(page, text: str) -> list[str]:
    return page.locator("[data-testid='stAlert']", has_text=text).all_inner_texts()


def test_paths_out_of_the_root_read_like_a_missing_file_and_open_nothing(page, root_server):
    url, base, work = root_server
    _open(page, url)
    _goto_page(page, "Data")
    loaded = _models_loaded(page)
    seen = {}
    for path in ("../outside.npy", "link_out.npy", str(work / "outside.npy"), "missing.npy", "lm/../link_out.npy"):
        _open_typed(page, path, ready=f"[data-testid='stAlert']:has-text('{RULE[:40]}')")
        (text,) = _alerts(page, "no such file in the data root")
        seen[path] = text.strip().splitlines()[-1]  # after the icon's name
        _no_exception(page)
    for path, text in seen.items():
        assert text == f"{path}: {RULE}", (path, text)  # the same line whatever the reason
    assert _models_loaded(page) == loaded


def test_a_large_file_is_streamed_calibrated_and_exported_for_check(page, root_server, tmp_path):
    url, base, _ = root_server
    _open(page, url)
    _goto_page(page, "Data")
    labels = page.get_by_role("combobox", name="Labels file (optional)").first
    labels.click()
    settle_run(page, lambda: page.get_by_role("option", name="lm/next_token_labels.npy", exact=True).click())
    _open_typed(page, "lm/next_token.npy", ready="text=Streamed lm/next_token.npy")
    _no_exception(page)

    _goto_page(page, "Calibrate")
    page.wait_for_selector("text=Large-vocabulary files (streamed engine)")
    page.wait_for_selector("text=Bound width at each target")
    page.wait_for_selector("text=retention 0.9 (point)")  # a target's bounds in the figure's legend
    _no_exception(page)
    box = page.get_by_role("textbox", name="Targets (%)")
    settle_run(page, lambda: (box.fill("85"), box.press("Enter")), ready="text=retention 0.85 (point)")
    _no_exception(page)

    _goto_page(page, "Export")
    part = page.locator("[data-testid='stExpander']", has_text="Large-vocabulary files, streamed (1)")
    page.wait_for_selector("text=--retention 0.85 --out next_token.caliber.json")
    with page.expect_download() as info:
        part.get_by_role("button", name="Download config JSON").click()
    assert info.value.suggested_filename == "next_token.caliber.json"
    saved = tmp_path / "next_token.caliber.json"
    info.value.save_as(saved)
    config = json.loads(saved.read_text())
    assert [t["requested"] for t in config["targets"]] == [0.85] and config["n_classes"] == K
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "check", str(saved), "lm/next_token.npy",
                           "--labels", "lm/next_token_labels.npy"], cwd=base, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith(f"consistent with {saved}")


def test_a_calibrated_log_survives_a_reload_and_reaches_export(page, root_server, tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_app_log_member import V, chat_log

    url, _, _ = root_server
    log = tmp_path / "answers.jsonl"
    log.write_bytes(chat_log())
    _open(page, url)
    _goto_page(page, "Data")
    page.get_by_text("Calibrate an API log of top-k logprobs").click()  # opens in the browser: no run
    upload(page, log, label="Log file", ready="button:has-text('Calibrate log')")
    vocab = page.get_by_role("spinbutton", name="Vocabulary size V")
    settle_run(page, lambda: (vocab.fill(str(V)), vocab.press("Enter")))
    settle_run(page, lambda: page.get_by_role("button", name="Calibrate log").click(),
               ready="text=Bound width at each target")
    _no_exception(page)

    page.reload()  # the session is gone; the workspace (its token is in the URL) keeps the log
    settle_run(page, ready="text=models loaded")
    _goto_page(page, "Export")
    part = page.locator("[data-testid='stExpander']", has_text="Calibrated top-k logprob logs (1)")
    part.get_by_text("Calibrated top-k logprob logs (1)").click()  # opens in the browser: no run
    with page.expect_download() as info:
        part.get_by_role("button", name="Download config JSON").click()
    assert info.value.suggested_filename == "answers.caliber.json"
    saved = tmp_path / "answers.caliber.json"
    info.value.save_as(saved)
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "check", str(saved), str(log)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _no_exception(page)


def test_a_large_upload_and_a_large_root_file_show_their_progress(page, root_server, tmp_path):
    url, base, _ = root_server
    rng = np.random.default_rng(5)
    n = 1500  # 49 MB of float32: long enough to read that the bar is drawn before it goes
    y = rng.integers(0, K, n)
    z = rng.standard_normal((n, K), dtype=np.float32)
    z[np.arange(n), y] += 3.0
    np.savez(tmp_path / "dump.npz", logits=z, labels=y)
    np.save(base / "lm" / "wide.npy", z)
    _open(page, url)
    _goto_page(page, "Data")
    page.evaluate(_WATCH_PROGRESS)
    upload(page, tmp_path / "dump.npz", ready="text=Streamed dump.npz")
    _open_typed(page, "lm/wide.npy", ready="text=Streamed lm/wide.npy")
    _no_exception(page)
    seen = page.evaluate("window.__caliberProgress")
    for name in ("dump.npz", "lm/wide.npy"):
        assert any(text.startswith(f"Streaming {name}: reading its rows once") for text in seen), seen
    assert page.locator("[data-testid='stProgress']").count() == 0  # gone once each file is streamed
