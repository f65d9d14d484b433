"""Reviewing a saved config against a loaded model: each target recomputed, and the drift check's table.

* :func:`review_table` -- the core's review (every target solved again on the
  loaded model with the config's statistic, seed, draws, inversion and side,
  beside what the model delivers at the file's sigma), named and in percent;
* :func:`drift_table` -- :func:`caliber_core.calibration.drift.check_drift`'s
  findings, each named by its target ("retention 80% (at least)"), in percent
  (S in logit units).

Accuracy, retention and agreement are shown in percent, as everywhere a person
reads them on the dashboard. No page code: the Export page draws these tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from caliber_core.calibration.calibrate import Calibration
from caliber_core.calibration.drift import DriftReport
from caliber_core.calibration.review import review_config
from caliber_core.loading import LogitsData

from caliber_dashboard.common.readouts import SIDE_LABELS

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
    """One row per target of ``saved`` (:func:`caliber_core.calibration.review.review_config`), for the page.

    ``cal`` is the model calibrated with the config's statistic, seed and
    draws. A target that cannot be recomputed (another kind, out of reach)
    gets a note instead of a sigma.
    """
    rows = []
    for t, r in zip(saved["targets"], review_config(cal, saved)):
        rows.append({
            "target": target_name(t), "σ in file": r["sigma_file"], "σ recomputed now": r["sigma_now"],
            "Δσ %": r["delta_percent"], "accuracy in file %": _percent(r["accuracy_file"]),
            "predicted accuracy at file σ %": _percent(r["accuracy_at_file_sigma"]),
            "predicted agreement at file σ %": _percent(r["agreement_at_file_sigma"]),
            "note": r["note"],
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
