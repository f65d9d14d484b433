"""Numbers shown with their interval, rounded to the digits the interval supports.

A value estimated from a sample is shown with as many decimals as its
interval's half-width resolves: one significant digit of the half-width, two
when that digit is a 1 (0.014 keeps 0.014, 0.03 keeps 0.03). Plain functions,
no Streamlit.
"""

from __future__ import annotations

import math


def decimals_for(half_width: float) -> int:
    """Decimals that resolve ``half_width`` (>= 0): one significant digit, two when it starts with 1.

    Returns 4 significant digits' worth for a zero or non-finite width (nothing to round to).
    """
    h = float(half_width)
    if not (math.isfinite(h) and h > 0.0):
        return 4
    exponent = math.floor(math.log10(h))
    leading = int(h / 10.0 ** exponent + 1e-9)
    return max(0, -exponent + (1 if leading == 1 else 0))


def with_range(value: float, low: float, high: float, *, unit: str = "") -> str:
    """"0.857 (0.842–0.871)": the value and its interval, rounded to the interval's half-width.

    The value is rounded to nearest, the ends outward, so the range shown holds the interval.

    Raises
    ------
    ValueError
        If the interval does not contain the value or an end is not finite.
    """
    value, low, high = float(value), float(low), float(high)
    if not all(math.isfinite(x) for x in (value, low, high)):
        raise ValueError(f"value and interval must be finite, got {value!r} ({low!r}, {high!r})")
    if not low <= value <= high:
        raise ValueError(f"interval ({low:g}, {high:g}) does not contain its value {value:g}")
    d = decimals_for(max(value - low, high - value))
    step = 10.0 ** d
    # The ends rounded outward (a 1e-9 slack for ends already on the grid): the range shown holds the range.
    low_shown = math.floor(low * step + 1e-9) / step
    high_shown = math.ceil(high * step - 1e-9) / step
    return f"{value:.{d}f}{unit} ({low_shown:.{d}f}–{high_shown:.{d}f}{unit})"


def plus_minus(value: float, half_width: float) -> str:
    """"0.785 ± 0.008": the value rounded to its half-width (NaN half-width: 4 decimals, no ±)."""
    value, h = float(value), float(half_width)
    if not math.isfinite(value):
        return "—"
    if not (math.isfinite(h) and h > 0.0):
        return f"{value:.4f}"
    d = decimals_for(h)
    return f"{value:.{d}f} ± {h:.{d}f}"
