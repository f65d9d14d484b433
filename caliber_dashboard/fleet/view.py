"""The Fleet page's arithmetic: which models to pool, when to warn, and σ from S alone with its spread.

* :func:`default_pool` -- the labelled models with the most common K; the
  others are left out with the reason (a shared law in v and Ã is fit per
  task, and K changes what chance is);
* :func:`pool_warnings` -- a pool that mixes K, or whose leave-one-out error
  exceeds :data:`MAX_HELD_OUT_ERROR` percent;
* :func:`sigma_spread` -- for each pooled model, how far the σ a law fit
  *without* it gives it (from its S, A0 and K alone) lies from its own σ* on
  its own curve; :func:`from_scale` turns the largest of those errors into
  a range around a new model's σ (a factor either way), and :func:`sigma_with_interval` writes σ with no more digits than
  that interval supports.

No Streamlit; the page calls these and draws.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from caliber_core.calibration import fleet
from caliber_core.calibration.calibrate import Calibration, sigma_for_target
from caliber_core.loading import LogitsData

from caliber_dashboard.common.rounding import with_range

#: Leave-one-out error (mean |relative error| of accuracy, %) above which the pool is flagged.
MAX_HELD_OUT_ERROR = 10.0


def default_pool(models: Mapping[str, LogitsData]) -> tuple[list[str], dict[str, str]]:
    """(the labelled models with the most common K, {left-out sha256: why}).

    A tie between two K goes to the K loaded first. Unlabelled models are left
    out too (a shared law is fit to accuracy).
    """
    labelled = {sha: d for sha, d in models.items() if d.has_labels}
    counts = Counter(d.n_classes for d in labelled.values())
    left_out = {sha: "no labels" for sha, d in models.items() if not d.has_labels}
    if not counts:
        return [], left_out
    top = max(counts.values())
    k = next(d.n_classes for d in labelled.values() if counts[d.n_classes] == top)
    pool = [sha for sha, d in labelled.items() if d.n_classes == k]
    for sha, d in labelled.items():
        if d.n_classes != k:
            left_out[sha] = f"K={d.n_classes}; the pool's most common K is {k} ({top} models)"
    return pool, left_out


def pooled_points(cals: Mapping[str, Calibration], *, statistic: str,
                  n_points: int = 200) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Each model's (v, Ã) sweep points under ``statistic``, and a log grid over all of them for the law."""
    points = {name: fleet.normalized_points(c, statistic) for name, c in cals.items()}
    v_all = np.concatenate([v for v, _ in points.values()])
    return points, np.geomspace(v_all.min(), v_all.max(), n_points)


def pool_warnings(cals: Sequence[Calibration], leave_one_out: Sequence[Mapping]) -> list[str]:
    """One line per reason to distrust the shared law: mixed K, a held-out error above the limit."""
    out = []
    ks = sorted({c.n_classes for c in cals})
    if len(ks) > 1:
        out.append(f"The pool mixes K = {', '.join(map(str, ks))}: chance 1/K differs between them, and "
                   "one law in Ã(v) is meant for models serving one task. Pool models of one K.")
    worst = max(leave_one_out, key=lambda r: r["held_out_error"], default=None)
    if worst is not None and worst["held_out_error"] > MAX_HELD_OUT_ERROR:
        over = sum(r["held_out_error"] > MAX_HELD_OUT_ERROR for r in leave_one_out)
        out.append(f"Leave-one-out error exceeds {MAX_HELD_OUT_ERROR:g}% for {over} of {len(leave_one_out)} "
                   f"models (worst {worst['model']}: {worst['held_out_error']:.1f}%): the shared law does not "
                   "transfer across this pool; a σ from S alone would miss its target.")
    return out


def sigma_spread(cals: Sequence[Calibration], *, statistic: str, value: float) -> np.ndarray:
    """Per pooled model, σ_held-out / σ*_own − 1 at retention ``value``.

    σ_held-out: :func:`fleet.calibrate_from_scale` through the law fit without
    that model, from its S, A0 and K; σ*_own: the model's own curve. Models
    whose own σ* is 0 or either σ out of reach are skipped.
    """
    if len(cals) < 2:
        raise ValueError(f"a leave-one-out spread needs at least 2 models, got {len(cals)}")
    out = []
    for i, cal in enumerate(cals):
        held = fleet.shared_fit([c for j, c in enumerate(cals) if j != i], statistic=statistic)
        try:
            own = sigma_for_target(cal, value, kind="retention").sigma
            law = fleet.calibrate_from_scale(held, scale=cal.scales[statistic], clean_accuracy=cal.clean_accuracy,
                                             n_classes=cal.n_classes, value=value).sigma
        except ValueError:
            continue
        if own > 0 and math.isfinite(law):
            out.append(law / own - 1.0)
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class SigmaFromScale:
    """σ from S alone, with the range the leave-one-out errors put around it.

    ``low``/``high``: σ divided and multiplied by ``factor``, the largest held-out
    error factor max_i max(1 + e_i, 1 / (1 + e_i)) over the pooled models (e_i =
    σ_held-out / σ*_own − 1). Meaning: a model the law misses by no more than the
    worst held-out model has its own σ* in the range. It always contains σ, and
    held-out errors of one sign widen it instead of moving it.
    """

    sigma: float
    low: float | None
    high: float | None
    models: int  # how many held-out models the spread comes from
    factor: float | None = None


def from_scale(sigma: float, spread: np.ndarray) -> SigmaFromScale:
    """σ within the worst leave-one-out error factor (see :class:`SigmaFromScale`); no range from fewer than 2.

    Raises
    ------
    ValueError
        If a relative error is not finite or not above −1 (a held-out σ must be positive).
    """
    spread = np.asarray(spread, dtype=np.float64)
    if spread.size and not (np.isfinite(spread).all() and (spread > -1.0).all()):
        raise ValueError(f"relative errors must be finite and > -1, got {spread.tolist()}")
    if spread.size < 2 or not math.isfinite(sigma):
        return SigmaFromScale(sigma, None, None, int(spread.size))
    factor = float(np.exp(np.max(np.abs(np.log1p(spread)))))
    return SigmaFromScale(sigma, sigma / factor, sigma * factor, int(spread.size), factor)


def sigma_with_interval(result: SigmaFromScale) -> str:
    """"1.9 (1.3–2.6)": σ and its range, to the decimals the range's half-width supports."""
    if result.low is None or result.high is None:
        return f"{result.sigma:.2g}"  # no spread to read precision from: two digits, no more
    return with_range(result.sigma, result.low, result.high)
