"""Designs keyed on the input (calibration, determinism) and the thief that looks for the cells' seams."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.extraction.cell_seams import estimate_swapped, unswapped
from caliber_core.extraction.input_designs import INPUT_DESIGNS, InputDesign, input_design, swap_top2


@pytest.fixture(scope="module")
def task():
    gen = np.random.default_rng(3)
    x = gen.normal(size=(1500, 8))
    z = np.tanh(x @ gen.normal(size=(8, 5))) * 3 + gen.normal(0, 0.5, (1500, 5))
    y = np.where(gen.random(1500) < 0.8, z.argmax(1), gen.integers(0, 5, 1500))
    return x, z, y


@pytest.mark.parametrize("name", sorted(INPUT_DESIGNS))
def test_every_design_is_calibrated_to_the_target_and_is_a_function_of_its_key(task, name):
    x, z, y = task
    a0 = float(np.mean(z.argmax(1) == y))
    noise = input_design(name).calibrate(x, z, y, b"key-a", target=0.75 * a0)
    served = noise.serve(x, z)
    retention = float(np.mean(served.argmax(1) == y)) / a0
    # the field is solved on an exact step curve; the cells step by one cell's rows
    assert abs(retention - 0.75) <= (0.002 if "field" in name else 0.03)
    again = input_design(name).calibrate(x, z, y, b"key-a", target=0.75 * a0)
    np.testing.assert_array_equal(again.serve(x, z), served)
    other = input_design(name).calibrate(x, z, y, b"key-b", target=0.75 * a0).serve(x, z)
    assert not np.array_equal(other, served)
    # a repeated query is answered the same way, alone or in a batch
    np.testing.assert_allclose(noise.serve(x[7:8], z[7:8]), served[7:8], rtol=1e-12, atol=1e-12)


def test_cells_swap_only_the_top_two_and_only_in_whole_cells(task):
    x, z, y = task
    noise = InputDesign("t", "cells-swap", 1.0, 2).calibrate(x, z, y, b"k", target=0.6)
    served = noise.serve(x, z)
    altered = noise.altered(x)
    assert 0.05 < altered.mean() < 0.95
    np.testing.assert_array_equal(served[~altered], z[~altered])
    np.testing.assert_array_equal(np.sort(served, axis=1), np.sort(z, axis=1))
    assert np.all(served[altered].argmax(1) == np.argsort(z[altered], axis=1)[:, -2])


def test_swap_top2_exchanges_the_two_largest_entries():
    u = np.array([[1.0, 5.0, 3.0], [2.0, 0.0, 1.0]])
    np.testing.assert_array_equal(swap_top2(u, [True, False]), [[1.0, 3.0, 5.0], [2.0, 0.0, 1.0]])


def test_bad_designs_and_inputs_are_refused_in_one_line(task):
    x, z, y = task
    with pytest.raises(ValueError, match="input design must be one of"):
        input_design("cells-swap-99")
    with pytest.raises(ValueError, match="target accuracy must be in"):
        input_design("input-field-1").calibrate(x, z, y, b"k", target=1.5)
    with pytest.raises(ValueError, match="the same rows"):
        input_design("input-field-1").calibrate(x[:10], z, y, b"k", target=0.5)


def test_the_seam_thief_finds_a_planted_swapped_region_where_the_inputs_are_dense():
    gen = np.random.default_rng(0)
    x = gen.uniform(-1, 1, size=(3000, 2))
    z = x @ np.array([[4.0, -2.0, 0.0], [1.0, 3.0, -4.0]])  # smooth logits with large margins
    planted = x[:, 0] > 0.4  # 30 % of the square, one region
    served = swap_top2(z, planted)
    found = estimate_swapped(x, served)
    assert np.mean(found == planted) > 0.95
    np.testing.assert_allclose(unswapped(x, served)[found == planted], z[found == planted])


def test_the_seam_thief_flags_nothing_without_seams():
    gen = np.random.default_rng(1)
    x = gen.uniform(-1, 1, size=(1000, 2))
    z = x @ np.array([[4.0, -2.0, 0.0], [1.0, 3.0, -4.0]])
    assert estimate_swapped(x, z).mean() < 0.02
    with pytest.raises(ValueError, match="at least two queries"):
        estimate_swapped(x[:1], z[:1])


def test_one_measured_point_of_the_cells_has_every_thief_and_the_seam_thief():
    from pathlib import Path

    from caliber_core.extraction.input_frontier import measure_input_frontier

    demo = Path(__file__).resolve().parent.parent / "data" / "digits_mlp-wide.npz"
    frontier = measure_input_frontier(str(demo), designs=["cells-swap-4x1"], keys=1, seeds=1, near_duplicates=2)
    (point,) = frontier.points
    assert abs(point.teacher.mean - 0.75) < 0.1  # solved on the pool, measured on the held-out split
    assert 0.0 < point.sigma_over_s.mean < 1.0  # the cells' cut t
    assert 0.3 < point.thief.mean < 1.05
    for family in ("hard-", "near2:", "seams:"):
        assert any(a.startswith(family) for a in point.attackers), family
    with pytest.raises(ValueError, match="noise design must be one of"):
        measure_input_frontier(str(demo), designs=["cells-swap-99"])
