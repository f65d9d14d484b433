"""Every page at 1400 x 900 and 1920 x 1080: screenshots, and no clipped metric or table header.

Each page is opened from the sidebar (the Fleet page with a new model's S, A0 and K
entered, so its sigma from S alone is drawn), screenshotted top to bottom into a
temporary folder, and checked in the DOM: every element inside a metric's label and
value, a table header or a page link shows all of its text (scrollWidth <= clientWidth;
Streamlit cuts such text with an ellipsis, which leaves scrollWidth larger).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from app_state import settle_run, watch_socket  # this folder is on sys.path (pytest's prepend import mode)

PAGES = ("Data", "Calibrate", "Fleet", "Attack cost", "Extraction", "Export", "Policy")
SIZES = ((1400, 900), (1920, 1080))
SHOTS = Path(os.environ.get("CALIBER_SCREENSHOTS") or tempfile.mkdtemp(prefix="caliber-screens-"))

CLIPPED_JS = """() => {
  const roots = document.querySelectorAll(
    "[data-testid='stMetricValue'], [data-testid='stMetricLabel'], [data-testid='stTable'] th, " +
    "[data-testid='stDataFrame'] [role='columnheader'], [data-testid='stPageLink']");
  const out = [];
  for (const root of roots) {
    for (const e of [root, ...root.querySelectorAll('*')]) {
      if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1 && e.innerText.trim())
        out.push(`${root.getAttribute('data-testid') || root.tagName}: "${e.innerText.trim()}" ` +
                 `(${e.scrollWidth} > ${e.clientWidth})`);
    }
  }
  return [...new Set(out)];
}"""

SCROLL_JS = """(top) => {
  const main = document.querySelector("[data-testid='stMain']") || document.scrollingElement;
  main.scrollTop = top;
  return [main.scrollTop, main.scrollHeight, main.clientHeight];
}"""


def _goto(page, title: str) -> None:
    # A page's first visit on a loaded machine can take minutes (the Policy page simulates its throttle).
    settle_run(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click(),
               ready=f"h1:has-text('{title}')", timeout=300_000)


def _number(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    settle_run(page, lambda: (box.fill(value), box.press("Enter")))


def _screens(page, name: str, size) -> list[Path]:
    """Screenshots down the page, one viewport at a time (at most 8)."""
    paths, top = [], 0
    for i in range(8):
        top_now, height, view = page.evaluate(SCROLL_JS, top)
        path = SHOTS / f"{name.replace(' ', '_')}-{size[0]}x{size[1]}-{i}.png"
        page.screenshot(path=str(path))
        paths.append(path)
        if top_now + view >= height:
            break
        top = top_now + view
    page.evaluate(SCROLL_JS, 0)
    return paths


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_page_readable_and_unclipped(browser, fresh_server, size):
    # A server of its own: what the other browser tests left running on the shared one cannot delay it.
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    context.set_default_timeout(300_000)
    page = context.new_page()
    watch_socket(page)
    try:
        page.goto(fresh_server)
        settle_run(page, ready="h1:has-text('Data')", timeout=300_000)
        clipped = {}
        for title in PAGES:
            if title != "Data":
                _goto(page, title)
            if title == "Fleet":
                _number(page, "S (median top-two margin)", "2.5")
                _number(page, "clean accuracy A0", "0.9")
                _number(page, "classes K", "10")
                page.wait_for_selector("[data-testid='stMetricLabel']:has-text('σ from S alone')")
            assert page.locator("[data-testid='stException']").count() == 0, title
            shots = _screens(page, title, size)
            assert all(p.stat().st_size > 10_000 for p in shots), shots
            found = page.evaluate(CLIPPED_JS)
            if found:
                clipped[title] = found
        assert clipped == {}, f"clipped text (screenshots in {SHOTS}): {clipped}"
    finally:
        context.close()
