"""A saved config against a model as calibrated now: the Export page's review, in the core.

For each target of a config, :func:`review_target` recomputes sigma on the
loaded model the way the config's target was made (the same kind, value,
inversion, side and interval level) and reads what the file's sigma
delivers on the model's own curves. Every number comes from the calibration's
one engine (:attr:`.calibrate.Calibration.engine`), so the review uses
quadrature or Monte Carlo by the same rule as the calibration itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import CALIBRATED_KINDS, inversion_of_method
from .calibrate import Calibration, measured_accuracy, measured_agreement, sigma_for_target
from .intervals import DEFAULT_CONFIDENCE, BootstrapIntervals
from .target_intervals import interval_estimator, side_sigma


def review_target(cal: Calibration, target: Mapping, *,
                  estimators: dict[float, BootstrapIntervals] | None = None) -> dict:
    """One row of the review: the file's sigma, sigma recomputed now, and what the file's sigma delivers.

    Parameters
    ----------
    cal : Calibration
        The loaded model, calibrated with the config's statistic, seed and draws.
    target : mapping
        One entry of the config's ``targets``.
    estimators : dict, optional
        Interval bootstraps by confidence level, filled and reused across targets
        (side targets need one at their own level).

    Returns
    -------
    dict
        ``target``, ``sigma_file``, ``sigma_now`` (None when it cannot be recomputed),
        ``delta_percent``, ``accuracy_file``, ``accuracy_at_file_sigma`` (None without
        labels), ``agreement_at_file_sigma`` (agreement targets), ``note`` (why sigma_now
        is None, else "").
    """
    estimators = {} if estimators is None else estimators
    kind, requested, sigma_file = target.get("kind"), target.get("requested"), target.get("sigma")
    now, note = None, ""
    try:
        if kind not in CALIBRATED_KINDS or requested is None:
            raise ValueError(f"a {kind} target is not recomputed from logits here")
        record = sigma_for_target(cal, float(requested), kind=kind,
                                  inversion=inversion_of_method(target.get("method", "")),
                                  saturate=bool(target.get("saturated")))
        now = record.sigma
        side = target.get("side", "point")
        if side != "point":  # the same side of an interval at the same level
            level = float((target.get("interval") or {}).get("level", DEFAULT_CONFIDENCE))
            if level not in estimators:
                estimators[level] = interval_estimator(cal, confidence=level, seed=cal.seed or 0)
            now = side_sigma(cal, record, estimators[level], side=side,
                             saturate=bool(target.get("saturated")))[0]
    except ValueError as exc:
        note = str(exc)
    has_sigma = isinstance(sigma_file, (int, float)) and not isinstance(sigma_file, bool)
    accuracy = (float(measured_accuracy(cal, sigma_file)[0])
                if cal.has_labels and has_sigma else None)
    agreement = float(measured_agreement(cal, sigma_file)[0]) if kind == "agreement" and has_sigma else None
    delta = None if now is None or not has_sigma or sigma_file == 0 else (now - sigma_file) / sigma_file * 100
    return {"target": f"{kind} {requested}", "sigma_file": sigma_file, "sigma_now": now,
            "delta_percent": delta, "accuracy_file": target.get("accuracy"),
            "accuracy_at_file_sigma": accuracy, "agreement_at_file_sigma": agreement, "note": note}


def review_config(cal: Calibration, config: Mapping) -> list[dict]:
    """:func:`review_target` for every target of a config, the bootstraps shared.

    Parameters
    ----------
    cal : Calibration
        The loaded model, calibrated with the config's statistic, seed and draws.
    config : mapping
        The config (its ``targets`` list; none gives an empty review).

    Returns
    -------
    list of dict
        One :func:`review_target` row per target; a target that cannot be
        recomputed carries its reason in ``note`` rather than raising.
    """
    estimators: dict[float, BootstrapIntervals] = {}
    return [review_target(cal, t, estimators=estimators) for t in config.get("targets", [])]
