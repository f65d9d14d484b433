"""A person's path through the dashboard in a real Chromium: open, upload, slide, download.

The downloaded config must equal the command line's for the same file and target.
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

from caliber_core.calibration import pipeline
from caliber_core.calibration.calibrate import sigma_for_target
from caliber_core.loading import LogitsFileError, load_logits

from app_state import IDLE, settle_run, sigma_readout, upload  # this folder is on sys.path (pytest's prepend import mode)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.browser

N_DEMO = len(list((ROOT / "data").glob("digits_*.npz")))
PAGES = {"Data": "Data", "Calibrate": "Calibrate", "Fleet": "Fleet", "Attack cost": "Attack cost",
         "Export": "Export"}
# The sidebar's order; the Extraction page has its own browser test (it trains surrogates).
NAV_TITLES = ["Data", "Calibrate", "Fleet", "Attack cost", "Extraction", "Export", "Policy"]


def _open(page, url: str) -> None:
    """Open the app and wait for its first run: the Data page drawn, the sidebar's model count there."""
    page.goto(url)
    settle_run(page, ready="text=models loaded")


def _no_exception(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, page.locator(
        "[data-testid='stException']").first.inner_text()


def _goto_page(page, title: str) -> None:
    settle_run(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click(),
               ready=f"h1:has-text('{title}')")


def _metric(page, label: str) -> str:
    metric = page.locator("[data-testid='stMetric']", has=page.locator(
        "[data-testid='stMetricLabel']", has_text=label)).first
    return metric.locator("[data-testid='stMetricValue']").inner_text().strip()


def _selected_model(page) -> str:
    return page.get_by_role("combobox", name="Model").first.input_value()


def _models_loaded(page) -> int:
    text = page.locator("[data-testid='stSidebar']").inner_text()
    return int(re.search(r"(\d+) models? loaded", text).group(1))


def _blob_logits(path: Path, *, n: int = 400, k: int = 5, seed: int = 11) -> Path:
    """A never-seen model: a least-squares linear classifier on Gaussian blobs."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=1.6, size=(k, 8))
    y_train, y = rng.integers(0, k, 600), rng.integers(0, k, n)
    x_train = means[y_train] + rng.normal(size=(600, 8))
    x = means[y] + rng.normal(size=(n, 8))
    design = np.c_[x_train, np.ones(600)]
    weights, *_ = np.linalg.lstsq(design, np.eye(k)[y_train] * 6.0, rcond=None)
    logits = (np.c_[x, np.ones(n)] @ weights).astype(np.float32)
    np.savez(path, logits=logits, labels=y, name=np.array("e2e-blobs"))
    return path


def _upload(page, path: Path, *, ready: str) -> None:
    """Upload and wait until the file is read and ``ready`` (its message) is shown."""
    upload(page, path, ready=ready)


def test_new_user_sees_demo_and_every_page_renders(page, server):
    _open(page, server)
    page.wait_for_selector("h1:has-text('Data')")
    assert _models_loaded(page) == N_DEMO
    page.wait_for_selector("[data-testid='stPlotlyChart']")
    _no_exception(page)
    expected_charts = {"Calibrate": 1, "Fleet": 1, "Attack cost": 1, "Export": 0}  # one Calibrate view at a time
    for title, charts in expected_charts.items():
        _goto_page(page, title)
        _no_exception(page)
        if charts:
            page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg")
            assert page.locator("[data-testid='stPlotlyChart']").count() >= charts
    assert page.get_by_role("button", name="Download config JSON").count() == 1
    _goto_page(page, "Data")
    assert _models_loaded(page) == N_DEMO  # page switches keep the session's models


def test_deep_link_on_a_fresh_server(page, fresh_server):
    """The first request a server ever gets is a page URL: app.py must still run first."""
    page.goto(f"{fresh_server}/calibrate")
    settle_run(page, ready="h1:has-text('Calibrate')")
    settle_run(page, ready="[data-testid='stMetric']")
    _no_exception(page)
    assert _models_loaded(page) == N_DEMO  # the session was set up: demo loaded
    nav = page.locator("[data-testid='stSidebarNavLink']").all_inner_texts()
    assert [t.split("\n")[-1].strip() for t in nav] == NAV_TITLES  # not the raw pages/ listing
    assert _metric(page, "σ* (logit units)")


def test_upload_calibrate_slide_download_equals_cli(page, server, tmp_path):
    path = _blob_logits(tmp_path / "e2e_blobs.npz")
    data = load_logits(path)
    cal = pipeline.calibrate_data(data)

    _open(page, server)
    _upload(page, path, ready="text=Loaded e2e-blobs")
    assert _models_loaded(page) == N_DEMO + 1
    _no_exception(page)

    _goto_page(page, "Calibrate")
    _no_exception(page)
    assert _selected_model(page).startswith("e2e-blobs · ")
    assert _metric(page, "σ* (logit units)") == sigma_readout(cal, sigma_for_target(cal, 0.8).sigma)
    # Move the target: ten steps of 0.5 points down, 80% -> 75% retention.
    thumb = page.locator("[data-testid='stSlider'] input[type=range]").first
    thumb.focus()
    for _ in range(10):
        thumb.press("ArrowLeft")
    expected = sigma_readout(cal, sigma_for_target(cal, 0.75).sigma)
    page.wait_for_function(
        """([label, want]) => [...document.querySelectorAll("[data-testid='stMetric']")]
             .some(m => m.innerText.includes(label) && m.innerText.includes(want))""",
        arg=["σ* (logit units)", expected], timeout=60_000)
    page.wait_for_selector(IDLE)
    assert thumb.input_value() == "75"
    assert _metric(page, "σ* (logit units)") == expected
    _no_exception(page)

    _goto_page(page, "Export")
    assert _selected_model(page).startswith("e2e-blobs · ")
    box = page.get_by_role("textbox", name="Retention targets (% of A0)")
    # fill and Enter in one action: whichever commits the value starts the run the wait counts
    settle_run(page, lambda: (box.fill("80"), box.press("Enter")), ready="text=--retention 0.8 --out")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download config JSON").click()
    download = info.value
    assert download.suggested_filename == "e2e-blobs.caliber.json"
    saved = tmp_path / "dashboard.json"
    download.save_as(saved)
    _no_exception(page)

    # The same file and target through the command line (run where the file lies,
    # so the recorded `source` is the same bare file name the upload had).
    out = tmp_path / "cli.json"
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", path.name,
                           "--retention", "0.8", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    dashboard, cli = json.loads(saved.read_text()), json.loads(out.read_text())
    assert dashboard["targets"][0]["sigma"] == cli["targets"][0]["sigma"]
    assert dashboard["targets"][0]["sigma"] == sigma_for_target(cal, 0.8).sigma
    assert dashboard["sha256"] == cli["sha256"] == data.sha256
    assert dashboard == cli


@pytest.mark.parametrize("make", ["pickled-object-npy", "nan-npz"])
def test_hostile_file_is_refused_and_models_kept(page, server, tmp_path, make):
    good = _blob_logits(tmp_path / "good.npz", seed=12)
    if make == "pickled-object-npy":
        bad = tmp_path / "evil.npy"
        np.save(bad, np.array([{"__reduce__": "os.system"}, None], dtype=object), allow_pickle=True)
    else:
        bad = tmp_path / "nan.npz"
        z = np.random.default_rng(0).normal(size=(300, 4))
        z[5, 1] = np.nan
        np.savez(bad, logits=z, labels=np.zeros(300, dtype=np.int64))

    _open(page, server)
    _upload(page, good, ready="text=Loaded e2e-blobs")
    assert _models_loaded(page) == N_DEMO + 1

    _upload(page, bad, ready=f"[data-testid='stAlertContentError']:has-text('{bad.name}')")
    alert = page.locator("[data-testid='stAlertContentError']", has_text=bad.name)
    with pytest.raises(LogitsFileError) as refused:
        load_logits(bad)
    shown = alert.locator("[data-testid='stMarkdownContainer']").inner_text().strip()
    assert shown == str(refused.value).replace(str(bad), bad.name)  # the core's one line
    _no_exception(page)
    assert _models_loaded(page) == N_DEMO + 1  # nothing disturbed
    # Everything still works with the models that were there.
    _goto_page(page, "Calibrate")
    _no_exception(page)
    assert _selected_model(page).startswith("e2e-blobs · ")
