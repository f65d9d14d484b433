"""Readout text for a served target: each value with its interval, and sample-size advice.

Plain functions, no Streamlit. Values are fractions; they are shown as
percentages with one decimal, which is finer than any interval this
dashboard can state (a calibration file of 10^5 rows still has a half-width
of about 0.2 points), so no digit shown is noise.
"""

from __future__ import annotations

from caliber_core.calibration.intervals import WIDE_HALF_WIDTH, Interval, IntervalSet, sample_size_advice

QUANTITY_ORDER = ("retention", "accuracy", "agreement")
SIDE_LABELS = {"point": "point", "at-least": "at least", "at-most": "at most"}
SIDE_HELP = {
    "point": "σ* delivers the target on this calibration sample.",
    "at-least": "The σ at which the lower confidence bound of the target's quantity equals the "
                "target: with that confidence the population keeps at least the target.",
    "at-most": "The σ at which the upper confidence bound equals the target: with that "
               "confidence the population gets no more than the target.",
}


def percent(x: float) -> str:
    return f"{100.0 * x:.1f}%"


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
