"""Numbers with their interval, rounded to the digits the interval supports."""

from __future__ import annotations

import pytest

from caliber_dashboard.common.rounding import decimals_for, plus_minus, with_range


@pytest.mark.parametrize("half, decimals", [(0.3, 1), (0.0147, 3), (0.03, 2), (1.655, 1), (7.0, 0),
                                            (40.0, 0), (0.0, 4), (float("nan"), 4)])
def test_decimals_follow_the_half_width(half, decimals):
    assert decimals_for(half) == decimals


def test_with_range_rounds_the_value_to_nearest_and_the_ends_outward():
    assert with_range(0.85683, 0.842, 0.871) == "0.857 (0.842–0.871)"
    assert with_range(3.0966, 2.71, 3.49) == "3.1 (2.7–3.5)"
    assert with_range(12.345, 11.0, 14.5) == "12 (11–15)"
    assert with_range(0.5, 0.5, 0.5) == "0.5000 (0.5000–0.5000)"


def test_with_range_refuses_an_interval_without_its_point():
    with pytest.raises(ValueError, match=r"interval \(0.889, 0.899\) does not contain its value 0.877"):
        with_range(0.877, 0.889, 0.899)
    with pytest.raises(ValueError, match="must be finite"):
        with_range(float("nan"), 0.0, 1.0)


def test_plus_minus():
    assert plus_minus(0.78537, 0.0081) == "0.785 ± 0.008"
    assert plus_minus(0.7, 0.014) == "0.700 ± 0.014"
    assert plus_minus(0.7, float("nan")) == "0.7000"
    assert plus_minus(float("nan"), 0.1) == "—"
