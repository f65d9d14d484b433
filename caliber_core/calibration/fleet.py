"""Shared per-task calibration over several models (Sections 3.3, 5.4, Appendix A).

One logistic law is fit to the pooled (v, A~) points of several models; a new
model is then calibrated from its margin scale S alone. Leave-one-architecture-out
fits the law without a model and measures the error on it; the margin-statistic
ablation repeats both with S as the median, mean or 10%-trimmed mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..config import TargetRecord
from .calibrate import Calibration, measured_accuracy
from .fit import LogisticFit, fit_logistic
from .margins import MARGIN_STATISTICS, normalized_noise, normalized_utility, sigma_from_v

DEFAULT_RETENTIONS = (0.9, 0.8, 0.7, 0.6)


def normalized_points(cal: Calibration, statistic: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """(v, A~) sweep points of one model with S under ``statistic``.

    Parameters
    ----------
    cal : Calibration
        A labelled calibration.
    statistic : {"median", "mean", "trimmed"}, default "median"
        Which margin scale S normalizes the sweep's sigma grid.

    Returns
    -------
    v, utility : ndarray of shape (n_sigma,)

    Raises
    ------
    ValueError
        The calibration has no labels, or no positive S under ``statistic``.

    Notes
    -----
    Eq. ``normalized-noise`` and Eq. ``util-norm``.
    """
    if cal.clean_accuracy is None:
        raise ValueError(f"model {cal.name!r} has no labels: shared accuracy fits need them")
    scale = cal.scales[statistic]
    if not np.isfinite(scale):
        raise ValueError(f"model {cal.name!r} has no positive {statistic} margin scale")
    # The sweep's sigma grid is statistic-free; only its v coordinates change.
    return normalized_noise(cal.sweep.sigma, scale), cal.sweep.utility


def shared_fit(calibrations: Sequence[Calibration], *, statistic: str = "median") -> LogisticFit:
    """One logistic law fit to the pooled normalized points of several models.

    Parameters
    ----------
    calibrations : sequence of Calibration
        At least one, each labelled.
    statistic : {"median", "mean", "trimmed"}, default "median"

    Returns
    -------
    LogisticFit

    Raises
    ------
    ValueError
        No models, a model without labels or positive S, too few points.
    FitError
        The least-squares fit did not converge.

    Notes
    -----
    Eq. ``logistic-decay``, shared per task.
    """
    if len(calibrations) < 1:
        raise ValueError("a shared fit needs at least one model")
    pts = [normalized_points(c, statistic) for c in calibrations]
    return fit_logistic(np.concatenate([p[0] for p in pts]), np.concatenate([p[1] for p in pts]))


def calibrate_from_scale(
    fit: LogisticFit,
    *,
    scale: float,
    clean_accuracy: float,
    n_classes: int,
    value: float,
    kind: str = "retention",
    saturate: bool = False,
    v_max: float | None = None,
) -> TargetRecord:
    """sigma* for a model known only by S, A0 and K, through a shared law.

    No sweep of the model is needed: v* from Eq. inverse-v, sigma* = S sqrt(v*).

    Parameters
    ----------
    fit : LogisticFit
        The shared law.
    scale, clean_accuracy, n_classes : float, float, int
        S, A0 and K of the new model.
    value : float
    kind : {"retention", "accuracy"}, default "retention"
    saturate : bool, default False
        A target at or below the law's floor c is flagged ``saturated``
        instead of raising. Its sigma is S sqrt(v_max) when ``v_max`` is given,
        else inf (nothing to serve).
    v_max : float, optional
        The largest v the shared law was fit on (the end of the pooled sweeps).
    """
    if kind not in ("accuracy", "retention"):
        raise ValueError(f"kind must be 'accuracy' or 'retention', got {kind!r}")
    if not scale > 0:
        raise ValueError(f"scale S must be positive, got {scale}")
    chance = 1.0 / n_classes
    if not clean_accuracy > chance:
        raise ValueError(f"clean accuracy {clean_accuracy:.4g} is not above chance 1/K={chance:.4g}")
    accuracy = value if kind == "accuracy" else value * clean_accuracy
    u = float(normalized_utility(accuracy, clean=clean_accuracy, n_classes=n_classes))
    v = float(fit.inverse(min(u, 1.0), saturate=saturate))
    sigma_law = float(sigma_from_v(v, scale))
    saturated = not np.isfinite(v)
    if saturated and v_max is not None:
        v = float(v_max)
    return TargetRecord(kind=kind, requested=float(value), accuracy=accuracy,
                        retention=accuracy / clean_accuracy, agreement=None, v=v,
                        sigma=float(sigma_from_v(v, scale)), sigma_logistic=sigma_law,
                        method="saturated-shared-logistic" if saturated else "shared-logistic",
                        saturated=saturated)


def transfer_error(
    cal: Calibration, fit: LogisticFit, *, statistic: str, retentions=DEFAULT_RETENTIONS
) -> float:
    """Mean |relative error| (%) of a model's accuracy at the sigma* a shared law gives it.

    Parameters
    ----------
    cal : Calibration
        The model, labelled; its measured curve is the reference.
    fit : LogisticFit
        The shared law.
    statistic : {"median", "mean", "trimmed"}
        Which S of the model the law is applied with.
    retentions : sequence of float, default (0.9, 0.8, 0.7, 0.6)
        Targets, as fractions of A0; a saturated one is read at the sweep's end.

    Returns
    -------
    float
        The mean error in percent.

    Raises
    ------
    ValueError
        The model has no labels or its A0 is not above chance.

    Notes
    -----
    Eq. ``inverse-v`` through the shared law.
    """
    errs = []
    for r in retentions:
        t = calibrate_from_scale(fit, scale=cal.scales[statistic], clean_accuracy=cal.clean_accuracy,
                                 n_classes=cal.n_classes, value=r, saturate=True)
        sigma = t.sigma if np.isfinite(t.sigma) else float(cal.sweep.sigma[-1])
        got = float(measured_accuracy(cal, sigma)[0])
        errs.append(abs(got - t.accuracy) / t.accuracy * 100.0)
    return float(np.mean(errs))


def leave_one_out(
    calibrations: Sequence[Calibration], *, statistic: str = "median", retentions=DEFAULT_RETENTIONS
) -> list[dict]:
    """Per model: error of the in-sample shared fit vs the fit without that model.

    Parameters
    ----------
    calibrations : sequence of Calibration
        At least two, each labelled.
    statistic : {"median", "mean", "trimmed"}, default "median"
    retentions : sequence of float, default (0.9, 0.8, 0.7, 0.6)

    Returns
    -------
    list of dict
        One row per model: ``model``, ``scale``, ``in_sample_error``,
        ``held_out_error`` (errors in %, as :func:`transfer_error`).

    Raises
    ------
    ValueError
        Fewer than two models, or a model :func:`shared_fit` rejects.
    FitError
        A shared fit did not converge.
    """
    if len(calibrations) < 2:
        raise ValueError(f"leave-one-out needs at least 2 models, got {len(calibrations)}")
    everyone = shared_fit(calibrations, statistic=statistic)
    rows = []
    for i, cal in enumerate(calibrations):
        others = [c for j, c in enumerate(calibrations) if j != i]
        held = shared_fit(others, statistic=statistic)
        rows.append({
            "model": cal.name,
            "scale": cal.scales[statistic],
            "in_sample_error": transfer_error(cal, everyone, statistic=statistic, retentions=retentions),
            "held_out_error": transfer_error(cal, held, statistic=statistic, retentions=retentions),
        })
    return rows


def margin_ablation(
    calibrations: Sequence[Calibration], *, retentions=DEFAULT_RETENTIONS,
    known: Mapping[str, Sequence[dict]] | None = None,
) -> list[dict]:
    """Mean in-sample and held-out shared-fit error (%) for each margin statistic.

    Parameters
    ----------
    calibrations : sequence of Calibration
    retentions : sequence of float, default (0.9, 0.8, 0.7, 0.6)
    known : mapping of str to list of dict, optional
        A statistic to a :func:`leave_one_out` table already computed for these
        calibrations and ``retentions``, used instead of computing it again.

    Returns
    -------
    list of dict
        One row per statistic: ``statistic``, ``r2`` (of the shared fit),
        ``in_sample_error``, ``held_out_error``.

    Raises
    ------
    ValueError
        ``known`` keyed by an unknown statistic, or as :func:`leave_one_out`.
    FitError
        A shared fit did not converge.
    """
    known = {} if known is None else dict(known)
    unknown = set(known) - set(MARGIN_STATISTICS)
    if unknown:
        raise ValueError(f"known tables must be keyed by {MARGIN_STATISTICS}, got {sorted(unknown)}")
    rows = []
    for stat in MARGIN_STATISTICS:
        table = known.get(stat)
        if table is None:
            table = leave_one_out(calibrations, statistic=stat, retentions=retentions)
        fit = shared_fit(calibrations, statistic=stat)
        rows.append({
            "statistic": stat,
            "r2": fit.r2,
            "in_sample_error": float(np.mean([r["in_sample_error"] for r in table])),
            "held_out_error": float(np.mean([r["held_out_error"] for r in table])),
        })
    return rows
