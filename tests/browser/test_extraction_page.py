"""A person's path through the Extraction page in Chromium: run, read the frontier, slide, download."""

from __future__ import annotations

import json
import time

import pytest

IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

pytestmark = pytest.mark.browser


def _idle(page, timeout_ms: int = 120_000) -> None:
    time.sleep(0.4)  # let the rerun begin before looking for the idle state
    page.wait_for_selector(IDLE, timeout=timeout_ms)


def _metric(page, label: str) -> str:
    box = page.locator("[data-testid='stMetric']", has_text=label).first
    return box.locator("[data-testid='stMetricValue']").inner_text()


def test_run_extraction_slide_the_surrogate_target_and_download(page, server, tmp_path):
    page.goto(server)
    _idle(page)
    page.locator("[data-testid='stSidebarNavLink']", has_text="Extraction").first.click()
    _idle(page)
    assert page.get_by_role("heading", name="Extraction").count() == 1
    seeds = page.get_by_role("spinbutton", name="Seeds")
    seeds.fill("1")
    seeds.press("Enter")
    _idle(page)
    page.get_by_role("button", name="Run the extraction").click()
    _idle(page, timeout_ms=180_000)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.get_by_text("Defense frontier").count() >= 1
    assert page.get_by_text("Table 3 analogue").count() >= 1
    assert page.locator("[data-testid='stPlotlyChart']").count() == 2
    before = _metric(page, "σ (read off the frontier)")
    slider = page.get_by_role("slider").first
    slider.focus()
    for _ in range(20):  # 20 steps of 0.5 point: 90% -> 80%
        slider.press("ArrowLeft")
    _idle(page)
    after = _metric(page, "σ (read off the frontier)")
    assert float(after) > float(before)  # a lower surrogate target needs more noise
    with page.expect_download() as download:
        page.get_by_role("button", name="Report (caliber.extraction/v1 JSON)").click()
    path = tmp_path / "report.json"
    download.value.save_as(path)
    report = json.loads(path.read_text())
    assert report["schema"] == "caliber.extraction/v1"
    assert [t["requested"] for t in report["targets"]] == [0.95, 0.85, 0.75]


def _table_text(page) -> str:
    return page.locator("[data-testid='stDataFrame']").first.inner_text()


def test_a_finished_run_survives_a_reload_and_a_server_restart(browser, restartable_server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        page.goto(restartable_server.url)
        _idle(page)
        page.locator("[data-testid='stSidebarNavLink']", has_text="Extraction").first.click()
        _idle(page)
        seeds = page.get_by_role("spinbutton", name="Seeds")
        seeds.fill("1")
        seeds.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Run the extraction").click()
        _idle(page, timeout_ms=180_000)
        assert page.get_by_text("Table 3 analogue").count() >= 1
        sigma = _metric(page, "σ (read off the frontier)")
        url = page.url
        assert "ws=" in url

        page.reload()
        _idle(page)
        assert page.get_by_role("button", name="Run the extraction").count() == 0
        assert page.get_by_text("Table 3 analogue").count() >= 1
        assert _metric(page, "σ (read off the frontier)") == sigma
        assert page.get_by_role("spinbutton", name="Seeds").input_value() == "1"  # the run's choices

        restartable_server.restart()  # nothing in memory: only the workspace on disk
        page.goto(url)
        _idle(page, timeout_ms=120_000)
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.get_by_role("button", name="Run the extraction").count() == 0
        assert _metric(page, "σ (read off the frontier)") == sigma
        assert page.get_by_text("kept in this workspace").count() >= 1
    finally:
        context.close()
