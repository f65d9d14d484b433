"""What a distilled surrogate keeps at a sigma, read off a finished extraction run.

The Calibrate page shows it beside the sigma it serves, so the user sees the
thief's side of the trade without leaving the page. The numbers are the run's
frontier attacker (the strongest recipe of the run) at its measured sigmas;
between two of them they are interpolated linearly in log sigma, the mean and
the spread over seeds alike, and the line says which points it lies between.
No Streamlit in :func:`surrogate_at`; :func:`readout_line` reads the session's runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from caliber_core.extraction.experiment import ExtractionResult


@dataclass(frozen=True)
class SurrogateAt:
    """The frontier attacker at one sigma: accuracy and retention as mean and sd over seeds (fractions)."""

    sigma: float
    recipe: str
    accuracy: float
    accuracy_sd: float | None
    retention: float
    retention_sd: float | None
    seeds: int
    bracket: tuple[float, float]  # the measured sigmas it lies between (equal when measured there)


def _mix(a: float | None, b: float | None, t: float) -> float | None:
    if a is None or b is None:
        return None
    return a + t * (b - a)


def surrogate_at(result: ExtractionResult, sigma: float) -> SurrogateAt | None:
    """The run's frontier attacker at ``sigma``; None outside the sigmas the run measured.

    Raises ValueError for a negative or non-finite sigma.
    """
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise ValueError(f"sigma must be a finite value >= 0, got {sigma!r}")
    points = sorted(result.frontier, key=lambda p: p.sigma)
    for p0, p1 in zip(points, points[1:]):
        if p0.sigma <= sigma <= p1.sigma:
            if p1.sigma == p0.sigma:
                t = 0.0
            elif p0.sigma <= 0.0:  # the clean point: linear in sigma
                t = (sigma - p0.sigma) / (p1.sigma - p0.sigma)
            else:
                t = math.log(sigma / p0.sigma) / math.log(p1.sigma / p0.sigma)
            a0, a1 = p0.surrogate_accuracy, p1.surrogate_accuracy
            r0, r1 = p0.surrogate_retention, p1.surrogate_retention
            return SurrogateAt(
                sigma=sigma, recipe=result.frontier_attacker.name,
                accuracy=_mix(a0.mean, a1.mean, t), accuracy_sd=_mix(a0.sd, a1.sd, t),
                retention=_mix(r0.mean, r1.mean, t), retention_sd=_mix(r0.sd, r1.sd, t),
                seeds=min(a0.n, a1.n), bracket=(p0.sigma, p1.sigma))
    return None


def _pm(mean: float, sd: float | None) -> str:
    return f"{100 * mean:.1f}%" if sd is None else f"{100 * mean:.1f} ± {100 * sd:.1f}%"


def describe(found: SurrogateAt) -> str:
    """'The strongest surrogate (kd-soft) keeps 61.2 ± 1.4% accuracy there (...)'."""
    where = (f"measured at σ = {found.bracket[0]:.3g}" if found.bracket[0] == found.bracket[1] else
             f"interpolated between the run's σ = {found.bracket[0]:.3g} and {found.bracket[1]:.3g}")
    return (f"Thief: the strongest surrogate ({found.recipe}) keeps {_pm(found.accuracy, found.accuracy_sd)} "
            f"accuracy at this σ, {_pm(found.retention, found.retention_sd)} of what it gets from clean "
            f"answers (mean ± sd over {found.seeds} seeds, {where}).")


def readout_line(sha256: str, sigma: float) -> str:
    """The Calibrate page's thief line for one model at the sigma it serves (Markdown-safe text)."""
    from caliber_dashboard.extraction import runs

    archive = runs.archives().get(sha256)
    if archive is None:
        return ("Thief: not measured — this file carries no model inputs, so no surrogate can be trained "
                "on its answers (`python -m caliber_core extract` on a file with inputs measures it).")
    latest = runs.latest(archive)
    if latest is None:
        return ("Thief: not measured yet — run an extraction on the Extraction page to see what a "
                "distilled surrogate keeps at this σ.")
    found = surrogate_at(latest, sigma)
    if found is None:
        top = max(p.sigma for p in latest.frontier)
        return (f"Thief: this σ is beyond the last extraction run's frontier (σ up to {top:.3g}); "
                "a run with larger σ on the Extraction page measures it.")
    return describe(found)
