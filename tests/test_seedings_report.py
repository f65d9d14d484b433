"""The seeding comparison's checks, table and JSON, and the extract options that select it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.extraction.archive import load_archive
from caliber_core.extraction.seedings import SeedingComparison, SeedingPoint, compare_seedings
from caliber_core.extraction.seedings_report import format_seedings, seedings_to_json
from caliber_core.extraction.spread import Spread

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "digits_mlp-wide.npz"


def _comparison() -> SeedingComparison:
    pts = [SeedingPoint("per-input", 0.75, Spread.of([2.0, 2.0]), Spread.of([0.75, 0.75]), Spread.of([0.97, 0.96]),
                        ["light", "strong"], [2.0, 2.0], Spread.of([0.99, 0.99])),
           SeedingPoint("consistent", 0.75, Spread.of([2.1, 2.5]), Spread.of([0.74, 0.76]), Spread.of([0.84, 0.80]),
                        ["light+prior", "strong+prior"], [2.1, 2.5], Spread.of([0.84, 0.80]))]
    return SeedingComparison("demo", 4.0, 2, 0.92, "light", pts, 16, np.array([0.0, 1.0]),
                             np.array([[1.0, 0.9], [1.0, 0.8]]))


def test_table_lists_the_named_seeding_first_with_spreads():
    text = format_seedings(_comparison(), first="per-input")
    rows = [line for line in text.splitlines() if line.strip().startswith("0.75")]
    assert "per-input" in rows[0] and "consistent" in rows[1]
    assert "0.820 ± 0.028" in rows[1] and "light+prior, strong+prior" in rows[1]


def test_json_holds_every_point_and_the_key_curves():
    doc = json.loads(seedings_to_json(_comparison()))
    assert doc["schema"] == "caliber.seedings/v1" and doc["length_scale"] == 4.0
    cons = [p for p in doc["points"] if p["seeding"] == "consistent"][0]
    assert cons["sigmas"] == [2.1, 2.5] and cons["thief_retention"]["n"] == 2
    assert doc["key_curves"]["teacher_retention"] == [[1.0, 0.9], [1.0, 0.8]]


def test_compare_seedings_refuses_bad_options():
    archive = load_archive(DEMO)
    with pytest.raises(ValueError, match="levels"):
        compare_seedings(archive, levels=(1.2,))
    with pytest.raises(ValueError, match="keys"):
        compare_seedings(archive, keys=0)


def test_extract_refuses_key_options_without_seeding():
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "extract", str(DEMO), "--length-scale", "2",
                           "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--seeding" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
