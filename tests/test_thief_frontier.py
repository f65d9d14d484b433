"""The thief's frontier: noise designs (keyed, unit RMS, exact calibration) and one measured frontier point."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.keyed_curve import keyed_accuracy, solve_keyed
from caliber_core.extraction.frontier_report import frontier_summary, frontier_table, frontier_to_json
from caliber_core.extraction.noise_designs import DESIGNS, SERVED_DESIGN, design, keyed_cycle
from caliber_core.extraction.thief_frontier import Interval, measure_frontier

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "digits_mlp-wide.npz"
KEY = b"frontier-test-key-0123"


def _pool():
    with np.load(DEMO, allow_pickle=False) as f:
        return f["logits"].astype(np.float64), f["labels"], f["heldout_logits"].astype(np.float64)


def _rows(n, tag="r"):
    return [f"{tag}-{i}" for i in range(n)]


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_every_design_is_keyed_unit_rms_on_the_calibration_rows_and_finite_elsewhere(name):
    z, _, ze = _pool()
    g = design(name).build(z, KEY, scale=5.0)
    pool = g(z, _rows(len(z)))
    assert pool.shape == z.shape
    assert math.isclose(float(np.sqrt(np.mean(pool ** 2))), 1.0, rel_tol=0.03)
    assert np.isfinite(g(ze, _rows(len(ze), "e"))).all()
    again = design(name).build(z, KEY, scale=5.0)(z, _rows(len(z)))
    np.testing.assert_array_equal(pool, again)  # a pure function of the key
    other = design(name).build(z, b"frontier-test-key-4567", scale=5.0)(z, _rows(len(z)))
    assert np.mean(np.abs(pool - other)) > 0.1  # another key, another noise


def test_consistent_designs_ignore_request_names_and_per_input_needs_them():
    z, _, _ = _pool()
    g = design("field-4").build(z, KEY, scale=5.0)
    np.testing.assert_array_equal(g(z[:5], _rows(5, "a")), g(z[:5], _rows(5, "b")))
    iid = design("per-input").build(z, KEY, scale=5.0)
    assert not np.array_equal(iid(z[:5], _rows(5, "a")), iid(z[:5], _rows(5, "b")))
    with pytest.raises(ValueError, match="per-input noise needs row names"):
        iid(z[:5])


def test_an_unknown_design_is_refused_by_name():
    with pytest.raises(ValueError, match="noise design must be one of .*got 'nope'"):
        design("nope")
    assert SERVED_DESIGN in DESIGNS


def test_a_keyed_cycle_moves_every_class_and_visits_all_of_them():
    nxt = keyed_cycle(KEY, 10)
    assert sorted(nxt) == list(range(10)) and all(nxt[c] != c for c in range(10))
    c, seen = 0, set()
    for _ in range(10):
        seen.add(c)
        c = nxt[c]
    assert seen == set(range(10))


def test_each_design_is_calibrated_exactly_on_its_rows():
    z, y, _ = _pool()
    a0 = float(np.mean(z.argmax(1) == y))
    for name in ("field-4", "balanced-2", "cycle-mix"):
        g = design(name).build(z, KEY, scale=5.0)(z)
        solved = solve_keyed(z, y, g, target=0.75 * a0, bootstrap=0)
        assert abs(keyed_accuracy(z, y, g, solved.sigma) - 0.75 * a0) <= 1.0 / len(z) + 1e-12


def test_a_thief_who_knows_the_class_cycle_undoes_it_but_not_the_field():
    from caliber_core.extraction.cycle_unmixing import estimate_cycle, unmixed

    z, y, _ = _pool()
    a0 = float(np.mean(z.argmax(1) == y))
    accuracy = {}
    for name in ("class-cycle", "field-4"):
        g = design(name).build(z, KEY, scale=5.0, target=0.75)(z, _rows(len(z)))
        served = z + solve_keyed(z, y, g, target=0.75 * a0, bootstrap=0).sigma * g
        accuracy[name] = float(np.mean(unmixed(served).argmax(1) == y)) / a0
    assert accuracy["class-cycle"] > 0.82  # from 0.75: the push is estimated and subtracted (0.84-0.98 by key)
    assert accuracy["field-4"] < 0.76
    successor, push = estimate_cycle(z)  # clean logits: no push worth the name
    assert successor.shape == (10,) and (push >= 0).all()
    with pytest.raises(ValueError, match="at least 3 classes, got shape \\(4, 2\\)"):
        estimate_cycle(np.zeros((4, 2)))


def test_interval_is_the_t_interval_of_the_mean():
    from scipy.stats import t

    v = np.array([0.81, 0.84, 0.86, 0.79, 0.83])
    got = Interval.of(v)
    half = t.ppf(0.975, 4) * v.std(ddof=1) / math.sqrt(5)
    assert math.isclose(got.lo, v.mean() - half, rel_tol=1e-4) and math.isclose(got.hi, v.mean() + half, rel_tol=1e-4)
    assert Interval.of([0.5]).lo == 0.5 and Interval.of([]).n == 0


def test_one_frontier_point_on_the_demo_file():
    frontier = measure_frontier(str(DEMO), designs=["field-4"], levels=[0.75], keys=1, seeds=1, near_duplicates=2)
    (point,) = frontier.points
    assert abs(point.teacher.mean - 0.75) < 0.08  # solved on the pool, measured on the held-out split
    assert 0.5 < point.thief.mean < 1.05 and point.attacker in point.attackers
    label_free = {a: v for a, v in point.attackers.items() if not a.startswith("labels:")}
    assert max(label_free.values()) == pytest.approx(point.thief.mean)
    assert point.labelled.mean == pytest.approx(max(point.attackers.values()))
    assert point.labelled.mean >= point.thief.mean
    for family in ("hard-", "near2:", "unmix:"):
        assert any(a.startswith(family) for a in label_free), family
    assert 0.85 < frontier.clean_accuracy <= 1.0
    text = "\n".join(frontier_table(frontier) + frontier_summary([frontier]))
    assert "| field-4 | 0.75 |" in text
    doc = json.loads(frontier_to_json([frontier]))
    assert doc["schema"] == "caliber.frontier/v1" and doc["frontiers"][0]["points"][0]["design"] == "field-4"


def test_measure_frontier_refuses_bad_settings():
    with pytest.raises(ValueError, match="levels must be retention fractions in \\(0, 1\\), got \\(1.5,\\)"):
        measure_frontier(str(DEMO), designs=["field-4"], levels=[1.5])
    with pytest.raises(ValueError, match="keys must be a positive integer, got 0"):
        measure_frontier(str(DEMO), designs=["field-4"], keys=0)
    with pytest.raises(ValueError, match="noise design must be one of"):
        measure_frontier(str(DEMO), designs=["nope"])


@pytest.mark.parametrize("extra, message", [
    (["--frontier", "nope"], "--frontier: unknown design 'nope'"),
    (["--frontier", "--seeding", "consistent"], "--frontier compares noise designs by name"),
])
def test_extract_frontier_refuses_in_one_line(extra, message):
    out = subprocess.run([sys.executable, "-m", "caliber_core", "extract", str(DEMO), *extra],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
