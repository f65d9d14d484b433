"""Readout text for a served target: each value with its interval, and sample-size advice.

Plain functions, no Streamlit. Values are fractions; they are shown as
percentages with one decimal, which is finer than any interval this
dashboard can state (a calibration file of 10^5 rows still has a half-width
of about 0.2 points), so no digit shown is noise.
"""

from __future__ import annotations

import math

from caliber_core.calibration.calibrate import Calibration, sigma_for_target
from caliber_core.calibration.intervals import WIDE_HALF_WIDTH, Interval, IntervalSet, sample_size_advice

from caliber_dashboard.common.rounding import decimals_for, with_range

QUANTITY_ORDER = ("retention", "accuracy", "agreement")
SIDE_LABELS = {"point": "point", "at-least": "at least", "at-most": "at most"}
SIDE_HELP = {
    "point": "σ* delivers the target on this calibration sample.",
    "at-least": "The σ at which the lower confidence bound of the target's quantity equals the "
                "target: with that confidence the population keeps at least the target.",
    "at-most": "The σ at which the upper confidence bound equals the target: with that "
               "confidence the population gets no more than the target.",
}


#: The metric label of the sigma each side serves: sigma* only on the point.
SIGMA_LABELS = {"point": "σ* (logit units)", "at-least": "σ served, at least (logit units)",
                "at-most": "σ served, at most (logit units)"}
V_LABELS = {"point": "v* = σ*²/S²", "at-least": "v = σ²/S² (σ served)", "at-most": "v = σ²/S² (σ served)"}


def sigma_range(cal: Calibration, sigma: float, interval: Interval, kind: str) -> tuple[float, float] | None:
    """The σ values whose sample ``kind`` lies within ``interval`` (the interval of what ``sigma`` delivers).

    Read on the measured curve (``sigma_for_target`` at the interval's two ends; the
    curve falls with σ, so the top end gives the smaller σ). Contains ``sigma``.
    None when an end is out of the curve's reach, or for σ = 0.
    """
    if interval is None or not sigma > 0:
        return None
    try:
        low = sigma_for_target(cal, float(interval.high), kind=kind).sigma
        high = sigma_for_target(cal, float(interval.low), kind=kind).sigma
    except ValueError:
        return None
    return (min(low, sigma), max(high, sigma))


def sigma_text(sigma: float, sigma_range: tuple[float, float] | None) -> str:
    """"0.857 (0.842–0.871)": σ with its range, to the digits the range supports; 3 digits without one."""
    if sigma_range is None or not sigma > 0:
        return f"{sigma:.3g}"
    return with_range(sigma, *sigma_range)


def rounded_like(value: float, sigma: float, sigma_range: tuple[float, float] | None, *, power: int = 1) -> str:
    """A quantity that scales as σ**power (v = σ²/S²: 2; a logistic σ: 1), rounded to σ's relative range.

    None (no such value, e.g. no logistic σ for the target) shows as a dash.
    """
    if value is None:
        return "—"
    value = float(value)
    if sigma_range is None or not (sigma > 0 and math.isfinite(value)):
        return f"{value:.3g}"
    relative = max(sigma - sigma_range[0], sigma_range[1] - sigma) / sigma
    return f"{value:.{decimals_for(abs(value) * power * relative)}f}"


SIGMA_RANGE_HELP = ("In brackets: the σ range, where the measured curve crosses the ends of the "
                    "interval of what this σ delivers (the bootstrap's level); σ is rounded to the "
                    "digits that range supports. The config stores σ in full.")


def percent(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _bound_percent(bound: float, side: str) -> str:
    """The one-sided bound in percent, rounded towards the safe side (never overstated).

    A 1e-9 slack keeps a bound solved to equal 0.8 reading 80.0%, not 79.9%.
    """
    tenths = 1000.0 * bound
    tenths = math.floor(tenths + 1e-6) if side == "at-least" else math.ceil(tenths - 1e-6)
    return f"{tenths / 10:.1f}%"


def guarantee(kind: str, bound: float, *, side: str, level: float) -> str:
    """"retention ≥ 80.0% (one-sided 95%)": what a one-sided target promises the population.

    Parameters
    ----------
    kind : {"retention", "accuracy", "agreement"}
    bound : float
        The one-sided bound at the sigma served (lower for "at-least", upper for "at-most"), a fraction.
    side : {"at-least", "at-most"}
    level : float
        Its confidence.
    """
    if side not in ("at-least", "at-most"):
        raise ValueError(f"side must be 'at-least' or 'at-most', got {side!r}")
    if kind not in QUANTITY_ORDER:
        raise ValueError(f"kind must be one of {QUANTITY_ORDER}, got {kind!r}")
    if not (math.isfinite(bound) and 0.0 <= bound <= 1.0 + 1e-9):
        raise ValueError(f"bound must be a fraction in [0, 1], got {bound!r}")
    sign = "≥" if side == "at-least" else "≤"
    return f"{kind} {sign} {_bound_percent(bound, side)} (one-sided {level:.0%})"


def with_interval(name: str, interval: Interval, level: float) -> str:
    """"retention 80.0% (95%: 77.6–82.5%)"."""
    return (f"{name} {percent(interval.estimate)} "
            f"({level:.0%}: {100.0 * interval.low:.1f}–{percent(interval.high)})")


def interval_line(intervals: IntervalSet, *, first: str) -> str:
    """Every quantity the file supports with its interval, the target's own first.

    Parameters
    ----------
    intervals : IntervalSet
        At the sigma served.
    first : {"retention", "accuracy", "agreement"}
        The target's kind, shown first.
    """
    if first not in QUANTITY_ORDER:
        raise ValueError(f"first must be one of {QUANTITY_ORDER}, got {first!r}")
    order = (first,) + tuple(q for q in QUANTITY_ORDER if q != first)
    parts = [with_interval(q, intervals.get(q), intervals.level)
             for q in order if intervals.get(q) is not None]
    return " · ".join(parts)


def advice(intervals: IntervalSet, *, kind: str) -> tuple[str, bool]:
    """(the one-line sample-size advice for the target's quantity, whether it is wider than ±2 points)."""
    iv = intervals.get(kind)
    if iv is None:
        raise ValueError(f"no {kind} interval for a file without labels")
    text = sample_size_advice(iv.half_width, intervals.n_samples)
    return f"{kind.capitalize()} interval: {text}.", iv.half_width > WIDE_HALF_WIDTH
