"""A finished calibration and its targets as the ``caliber.config/v2`` dict."""

from __future__ import annotations

from ..config import SCHEMA
from ..target_record import TargetRecord
from ..version import __version__
from .calibrate import Calibration


def build_config(
    cal: Calibration,
    targets: list[TargetRecord],
    *,
    sha256: str | None = None,
    source: str | None = None,
) -> dict:
    """The config dict for a calibration and its targets (in the order given).

    Parameters
    ----------
    cal : Calibration
        The sweep, fit and scale of one model.
    targets : list of TargetRecord
        The solved targets, written in this order.
    sha256 : str, optional
        The calibrated file's digest, recorded for provenance.
    source : str, optional
        The calibrated file's name.

    Returns
    -------
    config : dict
        Unvalidated: :func:`caliber_core.config.config_to_json` and
        :func:`caliber_core.config.load_config` validate it.
    """
    sweep = cal.sweep
    return {
        "schema": SCHEMA,
        "generator": f"caliber_core {__version__}",
        "model": cal.name,
        "source": source,
        "sha256": sha256,
        "n_samples": cal.n_samples,
        "n_classes": cal.n_classes,
        "statistic": cal.statistic,
        "scale": cal.scale,
        "scales": dict(cal.scales),
        "clean_accuracy": cal.clean_accuracy,
        "chance": cal.chance,
        "sweep": {
            "realizations": cal.intervals.realizations,
            "seed": cal.seed,
            "n_points": int(sweep.v.size),
            "v_min": float(sweep.v[0]),
            "v_max": float(sweep.v[-1]),
        },
        "fit": {
            "mode": "per-model",
            "law": "logistic",
            "quantity": cal.fit_quantity,
            "v50": cal.fit.v50,
            "p": cal.fit.p,
            "c": cal.fit.c,
            "r2": cal.fit.r2,
            "rmse": cal.fit.rmse,
            "n_points": cal.fit.n_points,
        },
        "inversion": {
            "accuracy_targets": "exact-curve" if cal.curve_method == "exact" else "monte-carlo-curve",
            "agreement_targets": "exact-agreement" if cal.curve_method == "exact" else "monte-carlo-agreement",
            "note": "sigma inverts the measured curve; sigma_logistic is the closed-form "
            "logistic answer (Eq. inverse-v) kept for comparison",
        },
        "targets": [t.to_dict() for t in targets],
    }
