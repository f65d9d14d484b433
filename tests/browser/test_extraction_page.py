"""A person's path through the Extraction page in Chromium: run, read the frontier, slide, download."""

from __future__ import annotations

import json

import pytest

from app_state import settle_run, watch_socket  # this folder is on sys.path (pytest's prepend import mode)

pytestmark = pytest.mark.browser
RESULTS = "text=Table 3 analogue"  # drawn once a run's results are on the page


def _open_extraction(page, url: str) -> None:
    page.goto(url)
    settle_run(page, ready="text=models loaded")
    settle_run(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text="Extraction").first.click(),
               ready="h1:has-text('Extraction')")


def _run_with_one_seed(page) -> None:
    seeds = page.get_by_role("spinbutton", name="Seeds")
    # fill and Enter in one action: whichever commits the value starts the run the wait counts
    settle_run(page, lambda: (seeds.fill("1"), seeds.press("Enter")))
    settle_run(page, lambda: page.get_by_role("button", name="Run the extraction").click(), ready=RESULTS,
               timeout=300_000)


def _metric(page, label: str) -> str:
    box = page.locator("[data-testid='stMetric']", has_text=label).first
    return box.locator("[data-testid='stMetricValue']").inner_text()


def test_run_extraction_slide_the_surrogate_target_and_download(page, server, tmp_path):
    _open_extraction(page, server)
    assert page.get_by_role("heading", name="Extraction").count() == 1
    _run_with_one_seed(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.get_by_text("Defense frontier").count() >= 1
    assert page.get_by_text("Table 3 analogue").count() >= 1
    # the run's frontier and averaging charts, and the campaign-size figure (drawn from docs/figures)
    assert page.locator("[data-testid='stPlotlyChart']").count() == 3
    before = _metric(page, "σ (read off the frontier)")
    slider = page.get_by_role("slider").first
    slider.focus()
    for _ in range(19):  # 20 steps of 0.5 point: 90% -> 80%
        slider.press("ArrowLeft")
    settle_run(page, lambda: slider.press("ArrowLeft"))  # the run after the last step has the last value
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
    watch_socket(page)
    try:
        _open_extraction(page, restartable_server.url)
        _run_with_one_seed(page)
        assert page.get_by_text("Table 3 analogue").count() >= 1
        sigma = _metric(page, "σ (read off the frontier)")
        url = page.url
        assert "ws=" in url

        page.reload()
        settle_run(page, ready=RESULTS)
        assert page.get_by_role("button", name="Run the extraction").count() == 0
        assert page.get_by_text("Table 3 analogue").count() >= 1
        assert _metric(page, "σ (read off the frontier)") == sigma
        assert page.get_by_role("spinbutton", name="Seeds").input_value() == "1"  # the run's choices

        restartable_server.restart()  # nothing in memory: only the workspace on disk
        page.goto(url)
        settle_run(page, ready=RESULTS)
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.get_by_role("button", name="Run the extraction").count() == 0
        assert _metric(page, "σ (read off the frontier)") == sigma
        assert page.get_by_text("kept in this workspace").count() >= 1
    finally:
        context.close()
