"""File in, config out: the one path the command line and the dashboard share.

Both call :func:`calibrate_data` with the same defaults, so the same file and
targets give the same sigma* in the CLI's JSON and the dashboard's download.
The loaded file becomes one :class:`.sample.LogitSample` (the loader's checks
and margins reused); the sweep, sigma*, the intervals and the drift reference
all read that sample and the calibration's one engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import SIDES, TargetRecord
from ..loading import LogitsData, require_labels
from .calibrate import Calibration, calibrate_model, sigma_for_target
from .config_build import build_config
from .intervals import DEFAULT_CONFIDENCE
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
    """Sweep and fit one loaded file (no targets yet)."""
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
    """sigma* for each (kind, value), in the order given."""
    out = []
    for kind, value in targets:
        if kind != "agreement":
            require_labels(data, f"a {kind} target")
        out.append(sigma_for_target(cal, value, kind=kind, inversion=inversion, saturate=saturate))
    return out


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
    """Calibrate a loaded file and build its config dict.

    Every target gets its confidence ``interval`` at ``confidence`` and the
    drift check's ``reference``; ``side`` picks sigma* itself ("point") or the
    end of the interval that keeps the target ("at-least" / "at-most";
    :mod:`.target_intervals`).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if any(kind != "agreement" for kind, _ in targets):
        require_labels(data, "an accuracy or retention target")
    cal = calibrate_data(data, statistic=statistic, seed=seed, realizations=realizations,
                         progress=progress)
    results = resolve_targets(cal, data, targets, inversion=inversion, saturate=saturate)
    estimator = interval_estimator(cal, confidence=confidence, seed=seed)
    results = [with_interval(cal, r, estimator, side=side, saturate=saturate) for r in results]
    config = build_config(cal, results, sha256=data.sha256, source=data.source)
    return cal, results, config
