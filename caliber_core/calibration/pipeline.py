"""File in, config out: the one path the command line and the dashboard share.

Two steps: :func:`calibrate_data` sweeps and fits one loaded file (the
expensive part, done once per file and options), and
:func:`config_from_calibration` solves the targets on that calibration and
builds the config. The CLI chains them (:func:`config_for`); the dashboard
passes the calibration its Calibrate page already holds, so the same file and
targets give the same sigma* in the CLI's JSON and the dashboard's download
without a second sweep. The loaded file becomes one
:class:`.sample.LogitSample` (the loader's checks and margins reused); the
sweep, sigma*, the intervals and the drift reference all read that sample and
the calibration's one engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..loading import LogitsData, require_labels
from ..target_record import DEFAULT_CONFIDENCE, TargetRecord, check_confidence, check_side
from .calibrate import Calibration, calibrate_model, sigma_for_target
from .config_build import build_config
from .intervals import BootstrapIntervals
from .sample import LogitSample
from .target_intervals import interval_estimator, with_interval

DEFAULT_TARGETS = (("retention", 0.9), ("retention", 0.8), ("retention", 0.7), ("retention", 0.6))


def calibrate_data(
    data: LogitsData,
    *,
    statistic: str = "median",
    seed: int = 0,
    realizations: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> Calibration:
    """Sweep and fit one loaded file (no targets yet).

    Parameters
    ----------
    data : LogitsData
        A loaded file: the loader validated it, and the sample trusts that.
    statistic : {"median", "mean", "trimmed"}, default "median"
        The margin statistic S is taken with.
    seed : int, default 0
        Seeds the sweep's draws (and later the bootstrap).
    realizations : int, optional
        Noise draws per input (default: chosen from N).
    progress : callable, optional
        Called with the fraction done.

    Returns
    -------
    Calibration

    Notes
    -----
    The sweep measures accuracy and agreement against v = sigma^2 / S^2
    (Eq. ``normalized-noise``) and fits the logistic law to them.
    """
    return calibrate_model(
        LogitSample.from_data(data), name=data.name, statistic=statistic,
        realizations=realizations, seed=seed, progress=progress,
    )


def resolve_targets(
    cal: Calibration,
    data: LogitsData,
    targets: Sequence[tuple[str, float]],
    *,
    inversion: str = "curve",
    saturate: bool = False,
) -> list[TargetRecord]:
    """sigma* for each (kind, value), in the order given.

    Parameters
    ----------
    cal : Calibration
        The calibration of ``data``.
    data : LogitsData
        The calibrated file (its labels are checked for accuracy targets).
    targets : sequence of (kind, value)
        kind in {"accuracy", "retention", "agreement"}.
    inversion : {"curve", "logistic"}, default "curve"
    saturate : bool, default False
        An unreachable target serves the largest sigma swept instead of failing.

    Returns
    -------
    list of TargetRecord

    Raises
    ------
    LogitsFileError
        An accuracy or retention target on a file without labels.
    ValueError
        An unreachable target (without ``saturate``).

    Notes
    -----
    Eq. ``inverse-v`` for the logistic inversion.
    """
    out = []
    for kind, value in targets:
        if kind != "agreement":
            require_labels(data, f"a {kind} target")
        out.append(sigma_for_target(cal, value, kind=kind, inversion=inversion, saturate=saturate))
    return out


def config_from_calibration(
    calibration: Calibration,
    data: LogitsData,
    targets: Sequence[tuple[str, float]] = DEFAULT_TARGETS,
    *,
    inversion: str = "curve",
    saturate: bool = False,
    side: str = "point",
    confidence: float = DEFAULT_CONFIDENCE,
    estimator: BootstrapIntervals | None = None,
) -> tuple[list[TargetRecord], dict]:
    """Solve ``targets`` on a finished calibration and build its config dict (no sweep).

    Parameters
    ----------
    calibration : Calibration
        :func:`calibrate_data` of ``data`` (its seed also seeds the bootstrap).
    data : LogitsData
        The calibrated file: its labels, digest and name go into the config.
    targets : sequence of (kind, value)
        Already parsed at the boundary (the CLI's ``fraction``, the dashboard's fields).
    inversion : {"curve", "logistic"}, default "curve"
    saturate : bool, default False
        An unreachable target serves the largest sigma swept instead of failing.
    side : {"point", "at-least", "at-most"}, default "point"
        sigma* itself, or the end of the interval that keeps the target
        (:mod:`.target_intervals`).
    confidence : float, default 0.95
        The level of every target's interval and of the side's bound.
    estimator : BootstrapIntervals, optional
        The calibration's row bootstrap (``interval_estimator(calibration,
        confidence=confidence, seed=calibration.seed)``) when the caller holds
        it already; built here otherwise (0.3 s at 10,000 x 1,000).

    Returns
    -------
    results : list of TargetRecord
        One per target, in the order given, with its ``interval`` and drift ``reference``.
    config : dict
        The ``caliber.config/v2`` dict (validated when written or loaded).

    Raises
    ------
    LogitsFileError
        An accuracy or retention target on a file without labels.
    ValueError
        An unreachable target (without ``saturate``), or a side that cannot be guaranteed.

    Notes
    -----
    sigma* = S sqrt(v*) inverts the measured curve at the target (Eq. ``inverse-v``
    for the logistic inversion).
    """
    if any(kind != "agreement" for kind, _ in targets):
        require_labels(data, "an accuracy or retention target")
    results = resolve_targets(calibration, data, targets, inversion=inversion, saturate=saturate)
    if estimator is None:
        estimator = interval_estimator(calibration, confidence=confidence, seed=calibration.seed)
    elif ((estimator.confidence, estimator.seed, estimator.rows.n_samples)
          != (confidence, calibration.seed, calibration.n_samples)):
        raise ValueError("the estimator given is not this calibration's bootstrap at this confidence")
    results = [with_interval(calibration, r, estimator, side=side, saturate=saturate) for r in results]
    return results, build_config(calibration, results, sha256=data.sha256, source=data.source)


def config_for(
    data: LogitsData,
    targets: Sequence[tuple[str, float]] = DEFAULT_TARGETS,
    *,
    statistic: str = "median",
    seed: int = 0,
    realizations: int | None = None,
    inversion: str = "curve",
    saturate: bool = False,
    side: str = "point",
    confidence: float = DEFAULT_CONFIDENCE,
    progress: Callable[[float], None] | None = None,
) -> tuple[Calibration, list[TargetRecord], dict]:
    """:func:`calibrate_data` then :func:`config_from_calibration`: (calibration, results, config).

    Parameters
    ----------
    data : LogitsData
    targets : sequence of (kind, value), default ``DEFAULT_TARGETS``
    statistic : {"median", "mean", "trimmed"}, default "median"
    seed : int, default 0
    realizations : int, optional
        These three and ``progress`` as :func:`calibrate_data`.
    inversion : {"curve", "logistic"}, default "curve"
    saturate : bool, default False
    side : {"point", "at-least", "at-most"}, default "point"
    confidence : float, default 0.95
        These four as :func:`config_from_calibration`; ``side`` and
        ``confidence`` are checked before the sweep.
    progress : callable, optional

    Returns
    -------
    calibration : Calibration
    results : list of TargetRecord
    config : dict

    Raises
    ------
    LogitsFileError
        An accuracy or retention target on a file without labels.
    ValueError
        A bad ``side`` or ``confidence``, or as the two steps.
    """
    check_side(side)  # a library call's options, checked before the sweep rather than after it
    check_confidence(confidence)
    if any(kind != "agreement" for kind, _ in targets):
        require_labels(data, "an accuracy or retention target")
    cal = calibrate_data(data, statistic=statistic, seed=seed, realizations=realizations, progress=progress)
    results, config = config_from_calibration(cal, data, targets, inversion=inversion, saturate=saturate,
                                              side=side, confidence=confidence)
    return cal, results, config
