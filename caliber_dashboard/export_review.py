"""Reviewing a saved config against a loaded model: each target recomputed, and the drift check's table.

* :func:`review_table` -- every target of the config solved again on the
  loaded model with the config's statistic, seed, draws, inversion and side,
  beside what the model delivers at the file's sigma;
* :func:`drift_table` -- :func:`caliber_core.calibration.drift.check_drift`'s
  findings, each named by its target ("retention 80% (at least)"), in percent
  (S in logit units).

Accuracy, retention and agreement are shown in percent, as everywhere a person
reads them on the dashboard. No page code: the Export page draws these tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from caliber_core.calibration.calibrate import Calibration, measured_accuracy
from caliber_core.calibration.drift import DriftReport
from caliber_core.calibration.intervals import DEFAULT_CONFIDENCE
from caliber_core.calibration.target_intervals import interval_estimator, side_sigma
from caliber_core.config import CALIBRATED_KINDS, inversion_of_method
from caliber_core.loading import LogitsData

from . import cache
from .readouts import SIDE_LABELS

#: What a finding compares, as a person reads it.
QUANTITY_NAMES = {"accuracy": "accuracy", "retention": "retention", "agreement": "agreement",
                  "scale": "margin scale S", "clean_accuracy": "clean accuracy A0"}


def target_name(target: Mapping) -> str:
    """"retention 80% (at least)": a config target's kind, requested percent and side."""
    kind, requested = target.get("kind"), target.get("requested")
    value = f"{100 * float(requested):g}%" if isinstance(requested, (int, float)) else "?"
    side = target.get("side", "point")
    return f"{kind} {value}" + ("" if side == "point" else f" ({SIDE_LABELS.get(side, side)})")


def _percent(x) -> float | None:
    return None if x is None else 100.0 * float(x)


def review_table(saved: Mapping, model: LogitsData, cal: Calibration) -> pd.DataFrame:
    """One row per target of ``saved``: sigma in the file, recomputed now, the change, predictions there.

    ``cal`` is the model calibrated with the config's statistic, seed and
    draws. A target that cannot be recomputed (another kind, out of reach)
    gets a note instead of a sigma.
    """
    rows = []
    estimators = {}  # one bootstrap per confidence level, for side targets
    seed = (saved.get("sweep") or {}).get("seed", 0) or 0
    for t in saved["targets"]:
        kind, requested, sigma_file = t.get("kind"), t.get("requested"), t.get("sigma")
        now = note = None
        try:
            if kind not in CALIBRATED_KINDS or requested is None:
                raise ValueError(f"a {kind} target is not recomputed from logits here")
            # The inversion the file used: its method names it ("saturated-logistic" is logistic).
            record = cache.target(model, cal, kind, float(requested),
                                  inversion=inversion_of_method(t.get("method", "")),
                                  saturate=bool(t.get("saturated")))
            now = record.sigma
            if t.get("side", "point") != "point":  # the same side at the same level
                level = (t.get("interval") or {}).get("level", DEFAULT_CONFIDENCE)
                if level not in estimators:
                    estimators[level] = interval_estimator(cal, confidence=level, seed=seed)
                now = side_sigma(cal, record, estimators[level], side=t["side"],
                                 saturate=bool(t.get("saturated")))[0]
        except ValueError as exc:
            note = str(exc)
        rows.append({
            "target": target_name(t), "σ in file": sigma_file, "σ recomputed now": now,
            "Δσ %": None if now is None or not sigma_file else (now - sigma_file) / sigma_file * 100,
            "accuracy in file %": _percent(t.get("accuracy")),
            "predicted accuracy at file σ %": (_percent(measured_accuracy(cal, sigma_file)[0])
                                               if cal.has_labels else None),
            "predicted agreement at file σ %": (_percent(cal.exact.agreement(sigma_file)[0])
                                                if kind == "agreement" else None),
            "note": note or "",
        })
    df = pd.DataFrame(rows).dropna(axis=1, how="all")
    return df if df["note"].any() else df.drop(columns="note")


def _shown(quantity: str, value: float) -> str:
    return f"{value:.4g} (logit units)" if quantity == "scale" else f"{100 * value:.2f}%"


def _range(quantity: str, low: float, high: float) -> str:
    if quantity == "scale":
        return f"{low:.4g}–{high:.4g} (logit units)"
    return f"{100 * low:.2f}–{100 * high:.2f}%"


def drift_table(report: DriftReport, saved: Mapping) -> pd.DataFrame:
    """The check's findings: what is compared, for which target, expected range, verdict (text, in percent)."""
    targets: Sequence[Mapping] = saved.get("targets", [])
    rows = []
    for f in report.findings:
        named = target_name(targets[f.target]) if f.target is not None and f.target < len(targets) else "—"
        rows.append({"compared": QUANTITY_NAMES.get(f.quantity, f.quantity), "target": named,
                     "σ": "—" if f.sigma is None else f"{f.sigma:.4g}",
                     "config": _shown(f.quantity, f.expected), "this model": _shown(f.quantity, f.observed),
                     "expected range": _range(f.quantity, f.low, f.high),
                     "consistent": f.consistent})
    return pd.DataFrame(rows)
