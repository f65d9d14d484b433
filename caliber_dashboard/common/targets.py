"""Target entry: the kinds offered, percent fields and slider ranges (no Streamlit).

A target is typed in percent, as on the command line (80 means 0.8), and
becomes the (kind, fraction) list that ``pipeline.config_for`` takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from caliber_core.config import CALIBRATED_KINDS

#: How each kind calibration solves is named on the pages.
KIND_LABELS = {
    "retention": "retention (% of clean accuracy A0)",
    "accuracy": "absolute accuracy (%)",
    "agreement": "agreement with the clean prediction (%)",
}


def kinds_for(has_labels: bool, kinds: tuple[str, ...] = CALIBRATED_KINDS) -> tuple[str, ...]:
    """The target kinds a model offers: without labels only agreement; the first is the default."""
    return kinds if has_labels else tuple(k for k in kinds if k == "agreement")


def percent_to_fraction(value: float) -> float:
    """80 -> 0.8, computed the way the CLI reads a percentage (value / 100)."""
    return float(value) / 100.0


def parse_percent_list(text: str) -> list[float]:
    """"90, 80 70%" -> [0.9, 0.8, 0.7]; each entry a percentage in (0, 100].

    Raises ValueError naming the offending entry.
    """
    out = []
    for raw in text.replace(";", ",").replace(",", " ").split():
        item = raw.strip().rstrip("%")
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"not a number: {raw!r}") from None
        if not (math.isfinite(value) and 0.0 < value <= 100.0):
            raise ValueError(f"a target must be a percentage in (0, 100], got {raw!r}")
        out.append(percent_to_fraction(value))
    return out


def target_list(retention: str, accuracy: str = "", agreement: str = "") -> list[tuple[str, float]]:
    """The (kind, value) list for ``pipeline.config_for`` from three percentage fields."""
    targets = []
    fields = {"retention": retention, "accuracy": accuracy, "agreement": agreement}
    for kind in CALIBRATED_KINDS:
        text = fields[kind]
        try:
            targets.extend((kind, v) for v in parse_percent_list(text or ""))
        except ValueError as exc:
            raise ValueError(f"{kind} targets: {exc}") from None
    return targets


@dataclass(frozen=True, kw_only=True)
class SliderRange:
    """A target slider in percent: min, max, step, default."""

    lo: float
    hi: float
    step: float
    default: float


# Sliders stop where the curve has fallen to this fraction of its range above
# chance: the sweep reaches ~3%, and a target below the sweep's end would saturate.
_SLIDER_FLOOR = 0.05


def slider_range(kind: str, *, clean_accuracy: float | None, n_classes: int,
                 step: float = 0.5) -> SliderRange:
    """Reachable targets in percent for one kind, on a ``step`` grid."""
    chance = 1.0 / n_classes

    def up(x):  # smallest grid value >= x (in percent)
        return math.ceil(round(100.0 * x / step, 9)) * step

    def down(x):
        return math.floor(round(100.0 * x / step, 9)) * step

    if kind == "agreement":
        lo = up(chance + _SLIDER_FLOOR * (1.0 - chance))
        return SliderRange(lo=lo, hi=100.0 - step, step=step, default=max(lo, 80.0))
    if clean_accuracy is None:
        raise ValueError(f"{kind} targets need labels")
    floor_acc = chance + _SLIDER_FLOOR * (clean_accuracy - chance)
    if kind == "retention":
        lo = up(floor_acc / clean_accuracy)
        return SliderRange(lo=lo, hi=100.0, step=step, default=max(lo, 80.0))
    if kind == "accuracy":
        lo = up(floor_acc)
        hi = max(lo + step, down(clean_accuracy))
        default = min(hi, max(lo, down(0.8 * clean_accuracy)))
        return SliderRange(lo=lo, hi=hi, step=step, default=default)
    raise ValueError(f"kind must be one of {CALIBRATED_KINDS}, got {kind!r}")
