"""The Calibrate page's plots: a base figure per model and view, the target put on a copy.

Three views share one place on the page (a switch shows one at a time, so
only the visible figure is built, sent and drawn):

* ``"normalized"``: (v, Ã), the sweep points, the fitted logistic, the
  corridor of Corollary 1 and the agreement curve on the same scale;
* ``"raw"``: (σ, accuracy), the sweep points, the expected accuracy, the
  corridor, clean and chance levels;
* ``"residuals"``: sweep minus logistic against v.

:func:`base_figure` holds everything but the target and is built once per
model and view (the page caches it); :func:`target_figure` copies it and adds
the target marker and its guide lines, which is all a slider step changes.
Plain functions, no Streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import plotly.graph_objects as go

from caliber_core.calibration.calibrate import Calibration
from caliber_core.calibration.corridor import ModelCurves
from caliber_core.calibration.intervals import IntervalBands, IntervalSet
from caliber_core.calibration.margins import normalized_noise
from caliber_core.config import TargetRecord

from caliber_dashboard.common import figures
from caliber_dashboard.common.curves import fitted_points, normalized_accuracy, normalized_agreement, residuals

VIEWS = ("normalized", "raw", "residuals")
VIEW_LABELS = {"normalized": "Normalized (v, Ã)", "raw": "Raw (σ, accuracy)",
               "residuals": "Fit residuals"}


def _se(x: float) -> str:
    return f"{x:.1g}"


def corridor_name(curves: ModelCurves) -> str:
    """The corridor's legend entry: exact, or estimated with its Monte-Carlo error."""
    if not curves.estimated:
        return "accuracy corridor (Corollary 1): exact"
    return (f"accuracy corridor (Corollary 1): estimated, Monte Carlo "
            f"±{_se(float(curves.lower_se.max()))} s.e.")


def curve_name(curves: ModelCurves, what: str) -> str:
    """Legend entry of a curve: "exact ..." or "... (Monte Carlo ±se)"."""
    if not curves.estimated:
        return f"exact {what}"
    se = curves.accuracy_se if what.startswith("expected accuracy") else curves.agreement_se
    return f"{what} (Monte Carlo ±{_se(float(se.max()))} s.e.)"


def curves_note(curves: ModelCurves, n_samples: int, n_classes: int) -> str:
    """One sentence on how the curves were computed, for the caption under the plot."""
    if not curves.estimated:
        return ("Curves and corridor: exact quadrature of every row (Proposition 1, Corollary 1); "
                "the corridor's width (1 − A0)·β(σ) is closed form.")
    return (f"Curves and corridor floor: estimated from the sweep's own noise draws "
            f"({n_samples:,} × {n_classes:,} is too large for quadrature on the whole grid); "
            f"largest Monte-Carlo standard error {curves.max_error():.1g}. The corridor's width "
            "(1 − A0)·β(σ) is exact (closed form).")


def base_figure(cal: Calibration, curves: ModelCurves, view: str, *,
                bands: IntervalBands | None = None) -> go.Figure:
    """One view without its target (see module docstring).

    ``bands`` (the row bootstrap on ``curves.sigma``) adds the confidence band
    of the fitted quantity (accuracy with labels, else agreement).
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if view == "residuals":
        v_res, res = residuals(cal)
        return figures.residual_figure(v_res, res, rmse=cal.fit.rmse)
    quantity = "accuracy" if cal.has_labels else "agreement"
    band = None if bands is None else bands.bands[quantity]
    band_name = None if bands is None else (
        f"{bands.level:.0%} interval of the population {quantity} (row bootstrap)")
    if view == "normalized":
        v_curve = normalized_noise(curves.sigma, cal.scale)
        v_pts, u_pts, u_se = fitted_points(cal)
        kw = dict(v_points=v_pts, u_points=u_pts, u_se=u_se, v_curve=v_curve,
                  logistic=cal.fit.predict(v_curve),
                  agreement=normalized_agreement(curves.agreement, cal.n_classes),
                  agreement_name=curve_name(curves, "agreement π(σ), normalized"))
        if cal.has_labels:
            kw.update(corridor_lower=normalized_accuracy(curves.lower, cal),
                      corridor_upper=normalized_accuracy(curves.upper, cal),
                      corridor_name=corridor_name(curves))
        else:
            kw["y_title"] = figures.AGREEMENT_AXIS
        if band is not None:
            scale = ((lambda a: normalized_accuracy(a, cal)) if cal.has_labels
                     else (lambda g: normalized_agreement(g, cal.n_classes)))
            kw.update(interval_lower=scale(band["low"]), interval_upper=scale(band["high"]),
                      interval_name=band_name)
        return figures.normalized_figure(**kw)
    kw = dict(sigma_points=cal.sweep.sigma, chance=cal.chance, sigma_curve=curves.sigma)
    if cal.has_labels:
        kw.update(y_points=cal.sweep.accuracy, y_se=cal.sweep.accuracy_se,
                  clean=cal.clean_accuracy, exact=curves.accuracy,
                  exact_name=curve_name(curves, "expected accuracy"),
                  corridor_lower=curves.lower, corridor_upper=curves.upper,
                  corridor_name=corridor_name(curves))
    else:
        kw.update(y_points=cal.sweep.agreement, y_se=cal.sweep.agreement_se, clean=1.0,
                  y_title="agreement with the clean prediction (fraction)",
                  exact=curves.agreement, exact_name=curve_name(curves, "agreement π(σ)"))
    if band is not None:
        kw.update(interval_lower=band["low"], interval_upper=band["high"], interval_name=band_name)
    return figures.raw_figure(**kw)


def target_xy(cal: Calibration, record: TargetRecord, view: str, *,
              delivered: Mapping[str, float | None]) -> tuple[float, float] | None:
    """Where the served target sits in a view, or None (no noise, or nothing to show).

    ``delivered`` maps "accuracy" and "agreement" to what the served sigma
    gives on the calibration sample (accuracy None without labels). The raw
    view plots accuracy (agreement without labels); the normalized view puts
    an agreement target on the agreement curve and any other on Ã.
    """
    if view == "residuals" or not (math.isfinite(record.sigma) and record.sigma > 0):
        return None
    on_agreement = record.kind == "agreement" if view == "normalized" else not cal.has_labels
    y = delivered.get("agreement" if on_agreement else "accuracy")
    if y is None:
        return None
    if view == "raw":
        return record.sigma, float(y)
    y = normalized_agreement(y, cal.n_classes) if on_agreement else normalized_accuracy(y, cal)
    return record.v, float(y)


def delivered(intervals: IntervalSet | None) -> dict:
    """{"accuracy": ..., "agreement": ...}: the estimates at the served sigma (None when absent)."""
    if intervals is None:
        return {}
    return {q: (None if intervals.get(q) is None else intervals.get(q).estimate)
            for q in ("accuracy", "agreement")}


def target_figure(base: go.Figure, cal: Calibration, record: TargetRecord | None, view: str, *,
                  delivered: Mapping[str, float | None]) -> go.Figure:
    """A copy of ``base`` with the served target marked (hidden when there is none to mark)."""
    xy = None if record is None else target_xy(cal, record, view, delivered=delivered)
    return figures.with_target(base, xy, x_name="σ*" if view == "raw" else "v*")


def move_target(fig: go.Figure, cal: Calibration, record: TargetRecord | None, view: str, *,
                delivered: Mapping[str, float | None]) -> go.Figure:
    """Move the target of a :func:`target_figure` in place (a slider step)."""
    xy = None if record is None else target_xy(cal, record, view, delivered=delivered)
    return figures.move_target(fig, xy, x_name="σ*" if view == "raw" else "v*")
