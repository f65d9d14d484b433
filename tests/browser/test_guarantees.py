"""A K=4 answer-letter file in Chromium: the one-sided guarantee, Export following Calibrate, Fleet's pool.

The file is what a language-model user brings: float16 logits of the four
answer letters in a bare ``.npy``, with the labels in a file of their own
uploaded after it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration import pipeline
from caliber_core.loading import load_logits

from app_state import settle_run as settle, sigma_readout, upload  # this folder is on sys.path (pytest's prepend import mode)

pytestmark = pytest.mark.browser


def _answer_letters(tmp_path: Path, *, n: int = 1500, seed: int = 4) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    z = rng.normal(scale=1.2, size=(n, 4))
    z[np.arange(n), y] += rng.gamma(2.0, 1.0, n)  # a spread of confidence, some rows wrong
    logits, labels = tmp_path / "mmlu_letters.npy", tmp_path / "mmlu_letters_labels.npy"
    np.save(logits, z.astype(np.float16))
    np.save(labels, y)
    return logits, labels


def _metric(page, label: str) -> str:
    metric = page.locator("[data-testid='stMetric']", has=page.locator(
        "[data-testid='stMetricLabel']", has_text=label)).first
    return metric.locator("[data-testid='stMetricValue']").inner_text().strip()


def _goto(page, title: str) -> None:
    settle(page, lambda: page.locator("[data-testid='stSidebarNavLink']", has_text=title).first.click(),
           ready=f"h1:has-text('{title}')")


def test_at_least_80_reads_as_a_guarantee_export_follows_and_fleet_pools_one_k(page, server, tmp_path):
    logits, labels = _answer_letters(tmp_path)
    page.goto(server)
    settle(page, ready="h1:has-text('Data')")
    page.wait_for_selector("text=models loaded")

    upload(page, logits, ready="text=Loaded mmlu_letters: N=1500, K=4, labels no.")
    # The .npy is still in its uploader: it is read again with the labels that came after it.
    upload(page, labels, label="Labels file", ready="text=Loaded mmlu_letters: N=1500, K=4, labels yes (from mmlu_letters_labels.npy).")
    page.wait_for_selector("text=with labels")
    assert "8 models loaded in this workspace (8 with labels)" in page.locator(
        "[data-testid='stSidebar']").inner_text()

    # Calibrate: 80% retention, side "at least".
    _goto(page, "Calibrate")
    assert page.get_by_role("combobox", name="Model").first.input_value().startswith("mmlu_letters · ")
    side = page.locator("[data-testid='stButtonGroup'] button", has_text=re.compile(r"^at least$"))
    settle(page, lambda: side.click(),
           ready="text=retention ≥ 80.0% (one-sided 95%)")
    data = load_logits(logits, labels_path=labels)
    _, results, _ = pipeline.config_for(data, [("retention", 0.8)], side="at-least")
    cal = pipeline.calibrate_data(data)
    assert _metric(page, "σ served, at least (logit units)") == sigma_readout(cal, results[0].sigma)
    assert page.locator("[data-testid='stMetricLabel']", has_text="σ* (logit units)").count() == 0
    assert page.get_by_text(re.compile(r"^Two-sided, at the σ served: retention ")).count() == 1

    # "Export this σ": Export opens on that target and side.
    settle(page, lambda: page.get_by_role("button", name="Export this σ").click(), ready="h1:has-text('Export')")
    page.wait_for_selector("text=--retention 0.8 --side at-least --out")
    assert page.get_by_role("textbox", name="Retention targets (% of A0)").input_value() == "80"
    assert page.get_by_role("textbox", name="Agreement targets (%)").input_value() == ""
    assert page.get_by_role("combobox", name="side (--side)").input_value() == "at least"

    # Fleet: the K=4 file is left out of the default pool, named, and adding it warns.
    _goto(page, "Fleet")
    pool = page.get_by_role("combobox", name="Models to pool")
    assert page.get_by_text(re.compile(r"Left out by default: mmlu_letters .*K=4")).count() == 1
    assert page.get_by_text("mixes K").count() == 0

    def add_k4():
        pool.click()
        page.get_by_role("option", name=re.compile(r"^mmlu_letters")).click()

    settle(page, add_k4, ready="text=The pool mixes K = 4, 10")
    page.keyboard.press("Escape")
    assert page.locator("[data-testid='stException']").count() == 0
