"""Plot-ready series and small tables computed from the core's results.

Plain functions (no Streamlit) so tests can call them directly. The numerics
are the core's (``caliber_core``); this module only evaluates its curves on
grids, normalizes them the way the paper does and shapes tables.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from caliber_core.calibration import cost
from caliber_core.calibration import margins
from caliber_core.calibration.calibrate import Calibration, measured_accuracy
from caliber_core.loading import LogitsData
from caliber_core.simulation.reference import argmax_monte_carlo

TARGET_KINDS = ("retention", "accuracy", "agreement")
KIND_LABELS = {
    "retention": "retention (% of clean accuracy A0)",
    "accuracy": "absolute accuracy (%)",
    "agreement": "agreement with the clean prediction (%)",
}


def data_digest(data: LogitsData) -> str:
    """Content digest of a loaded model: the file's sha256 plus its labels.

    The file digest alone is not enough as a cache key: the same ``.npy`` logits
    can be loaded with and without a separate labels file.
    """
    h = hashlib.sha256(data.sha256.encode())
    if data.labels is not None:
        h.update(np.ascontiguousarray(data.labels, dtype=np.int64).tobytes())
    else:
        h.update(b"no-labels")
    return h.hexdigest()


# ----------------------------------------------------------------- exact curves


@dataclass(frozen=True)
class CalibrationCurves:
    """Exact (quadrature) curves of one model on a sigma grid.

    ``accuracy``, ``corridor_lower`` and ``corridor_upper`` are None without labels.
    """

    sigma: np.ndarray
    v: np.ndarray
    agreement: np.ndarray
    accuracy: np.ndarray | None
    corridor_lower: np.ndarray | None
    corridor_upper: np.ndarray | None


def sigma_grid(cal: Calibration, n_points: int = 60) -> np.ndarray:
    """A log grid over the sweep's sigma range."""
    lo, hi = cal.sigma_range()
    return np.geomspace(lo, hi, n_points)


def exact_curves(
    cal: Calibration,
    *,
    n_points: int = 60,
    chunk: int = 6,
    progress: Callable[[float], None] | None = None,
) -> CalibrationCurves:
    """Exact agreement, expected accuracy and the Corollary 1 corridor on a grid.

    Evaluated ``chunk`` sigmas at a time so ``progress`` (fraction done) can be reported.
    """
    sigma = sigma_grid(cal, n_points)
    exact = cal.exact
    agree, acc, lower, upper = [], [], [], []
    for start in range(0, sigma.size, chunk):
        s = sigma[start : start + chunk]
        agree.append(exact.agreement(s))
        if cal.has_labels:
            a, lo, hi = exact.accuracy_with_corridor(s)
            acc.append(a)
            lower.append(lo)
            upper.append(hi)
        if progress is not None:
            progress(min(1.0, (start + s.size) / sigma.size))
    v = np.square(sigma / cal.scale)
    if cal.has_labels:
        return CalibrationCurves(sigma, v, np.concatenate(agree), np.concatenate(acc),
                                 np.concatenate(lower), np.concatenate(upper))
    return CalibrationCurves(sigma, v, np.concatenate(agree), None, None, None)


def normalized_accuracy(accuracy, cal: Calibration) -> np.ndarray:
    """A~ = (A - 1/K) / (A0 - 1/K) (Eq. util-norm)."""
    return margins.normalized_utility(accuracy, clean=cal.clean_accuracy, n_classes=cal.n_classes)


def normalized_agreement(agreement, n_classes: int) -> np.ndarray:
    """Agreement on the same [chance, clean] scale: (pi - 1/K) / (1 - 1/K)."""
    chance = 1.0 / n_classes
    return (np.asarray(agreement, dtype=np.float64) - chance) / (1.0 - chance)


def fitted_points(cal: Calibration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(v, normalized value, its standard error) of the points the logistic was fit to."""
    sw = cal.sweep
    if cal.fit_quantity == "accuracy":
        span = cal.clean_accuracy - cal.chance
        return sw.v, sw.utility, sw.accuracy_se / span
    return sw.v, normalized_agreement(sw.agreement, cal.n_classes), sw.agreement_se / (1 - cal.chance)


def residuals(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(v, point - logistic) on the fitted points."""
    v, u, _ = fitted_points(cal)
    return v, u - cal.fit.predict(v)


def logistic_accuracy(cal: Calibration, v) -> np.ndarray:
    """Accuracy the fitted logistic predicts at v (de-normalized); needs labels."""
    return margins.accuracy_from_normalized(cal.fit.predict(v), clean=cal.clean_accuracy,
                                            n_classes=cal.n_classes)


def sweep_table(cal: Calibration) -> pd.DataFrame:
    """The sweep as a table (for CSV download)."""
    sw = cal.sweep
    cols = {"sigma": sw.sigma, "v": sw.v}
    if sw.accuracy is not None:
        cols.update(accuracy=sw.accuracy, accuracy_se=sw.accuracy_se, utility=sw.utility)
    cols.update(agreement=sw.agreement, agreement_se=sw.agreement_se,
                logistic=cal.fit.predict(sw.v))
    return pd.DataFrame(cols)


# ----------------------------------------------------------------- targets


def percent_to_fraction(value: float) -> float:
    """80 -> 0.8, computed the way the CLI reads a percentage (value / 100)."""
    return float(value) / 100.0


def parse_percent_list(text: str) -> list[float]:
    """"90, 80 70%" -> [0.9, 0.8, 0.7]; each entry a percentage in (0, 100].

    Raises ValueError naming the offending entry.
    """
    out = []
    for raw in text.replace(";", ",").replace(",", " ").split():
        item = raw.strip().rstrip("%")
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"not a number: {raw!r}") from None
        if not (math.isfinite(value) and 0.0 < value <= 100.0):
            raise ValueError(f"a target must be a percentage in (0, 100], got {raw!r}")
        out.append(percent_to_fraction(value))
    return out


def target_list(retention: str, accuracy: str = "", agreement: str = "") -> list[tuple[str, float]]:
    """The (kind, value) list for ``pipeline.config_for`` from three percentage fields."""
    targets = []
    for kind, text in (("retention", retention), ("accuracy", accuracy), ("agreement", agreement)):
        try:
            targets.extend((kind, v) for v in parse_percent_list(text or ""))
        except ValueError as exc:
            raise ValueError(f"{kind} targets: {exc}") from None
    return targets


@dataclass(frozen=True)
class SliderRange:
    """A target slider in percent: min, max, step, default."""

    lo: float
    hi: float
    step: float
    default: float


# Sliders stop where the curve has fallen to this fraction of its range above
# chance: the sweep reaches ~3% and the inversion searches 4x beyond it.
_SLIDER_FLOOR = 0.05


def slider_range(kind: str, *, clean_accuracy: float | None, n_classes: int,
                 step: float = 0.5) -> SliderRange:
    """Reachable targets in percent for one kind, on a ``step`` grid."""
    chance = 1.0 / n_classes

    def up(x):  # smallest grid value >= x (in percent)
        return math.ceil(round(100.0 * x / step, 9)) * step

    def down(x):
        return math.floor(round(100.0 * x / step, 9)) * step

    if kind == "agreement":
        lo = up(chance + _SLIDER_FLOOR * (1.0 - chance))
        return SliderRange(lo, 100.0 - step, step, max(lo, 80.0))
    if clean_accuracy is None:
        raise ValueError(f"{kind} targets need labels")
    floor_acc = chance + _SLIDER_FLOOR * (clean_accuracy - chance)
    if kind == "retention":
        lo = up(floor_acc / clean_accuracy)
        return SliderRange(lo, 100.0, step, max(lo, 80.0))
    if kind == "accuracy":
        lo = up(floor_acc)
        hi = max(lo + step, down(clean_accuracy))
        default = min(hi, max(lo, down(0.8 * clean_accuracy)))
        return SliderRange(lo, hi, step, default)
    raise ValueError(f"kind must be one of {TARGET_KINDS}, got {kind!r}")


def target_point(cal: Calibration, result) -> tuple[float, float] | None:
    """Where a TargetResult sits on the normalized axes, or None (infinite sigma).

    Accuracy-type targets sit on the A~ scale, agreement targets on the
    normalized agreement scale (the exact agreement curve of the same plot).
    """
    if not math.isfinite(result.sigma):
        return None
    if result.kind == "agreement":
        return result.v, float(normalized_agreement(result.agreement, cal.n_classes))
    return result.v, float(normalized_accuracy(result.accuracy, cal))


# ----------------------------------------------------------------- verify


def verify_realizations(n_samples: int) -> int:
    """Fresh noise draws for the verify action: 200 at N=500, within [16, 400]."""
    return int(np.clip(math.ceil(100_000 / n_samples), 16, 400))


@dataclass(frozen=True)
class Verification:
    sigma: float
    realizations: int
    seed: int
    accuracy: float | None
    accuracy_se: float | None
    agreement: float
    agreement_se: float


def verify_sigma(
    logits,
    labels,
    sigma: float,
    *,
    realizations: int,
    seed: int,
    chunks: int = 10,
    progress: Callable[[float], None] | None = None,
) -> Verification:
    """Fresh Monte-Carlo accuracy and agreement at sigma (``brute_force_accuracy``).

    The draws are split into ``chunks`` equal calls (seeds derived from ``seed``)
    so progress can be reported; the standard errors are binomial over all
    N x realizations draws (an upper bound on the noise-only error).
    """
    z = np.asarray(logits)
    y = labels if labels is not None else np.argmax(z, axis=1)
    chunks = max(1, min(chunks, realizations))
    sizes = [realizations // chunks + (1 if i < realizations % chunks else 0) for i in range(chunks)]
    acc_sum = agr_sum = 0.0
    rng = np.random.default_rng(int(seed))  # one stream over all chunks
    for i, r in enumerate(sizes):
        a, g = argmax_monte_carlo(z, y, [sigma], realizations=r, seed=rng)
        acc_sum += float(a[0]) * r
        agr_sum += float(g[0]) * r
        if progress is not None:
            progress((i + 1) / chunks)
    n_draws = z.shape[0] * realizations
    acc = acc_sum / realizations
    agr = agr_sum / realizations

    def se(p):
        return math.sqrt(max(p * (1 - p), 0.0) / n_draws)

    return Verification(float(sigma), int(realizations), int(seed),
                        acc if labels is not None else None,
                        se(acc) if labels is not None else None, agr, se(agr))


# ----------------------------------------------------------------- fleet


def fleet_model_table(cals: Sequence[Calibration]) -> pd.DataFrame:
    rows = []
    for c in cals:
        rows.append({
            "model": c.name, "K": c.n_classes, "A0": c.clean_accuracy,
            "S median": c.scales["median"], "S mean": c.scales["mean"],
            "S trimmed": c.scales["trimmed"], "own fit v50": c.fit.v50,
            "own fit p": c.fit.p, "own fit c": c.fit.c, "own fit R²": c.fit.r2,
        })
    return pd.DataFrame(rows)


def with_mean_row(rows: Sequence[dict], label_column: str, label: str = "mean") -> pd.DataFrame:
    """A table with a final row averaging every numeric column."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    mean = {c: df[c].mean() for c in df.columns if pd.api.types.is_numeric_dtype(df[c])}
    mean[label_column] = label
    if "scale" in mean:
        mean["scale"] = np.nan
    return pd.concat([df, pd.DataFrame([mean])], ignore_index=True)


# ----------------------------------------------------------------- attack cost


def analytic_attack(cal: Calibration, sigma: float, m) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy an averaging attacker reaches with M fresh queries (Proposition 2).

    Returns (on the measured curve at sigma / sqrt(M), on the logistic at v / M).
    """
    m = np.asarray(m, dtype=np.float64)
    sig_m = cost.sigma_after_averaging(sigma, m, seeding="fresh")
    measured = measured_accuracy(cal, sig_m)
    v = (sigma / cal.scale) ** 2
    logistic = margins.accuracy_from_normalized(
        cost.recovered_utility(cal.fit, v, m, seeding="fresh"),
        clean=cal.clean_accuracy, n_classes=cal.n_classes,
    )
    return np.asarray(measured, dtype=np.float64), np.asarray(logistic, dtype=np.float64)


@dataclass(frozen=True)
class QueryBound:
    usable_retention: float
    usable_accuracy: float
    usable_utility: float
    v_use: float
    queries: int | None


def query_bound(cal: Calibration, v_star: float, usable_retention: float) -> QueryBound:
    """M >= v* / v_use for a usable level given as retention (v_use via the fit inverse)."""
    acc = usable_retention * cal.clean_accuracy
    u = float(normalized_accuracy(acc, cal))
    v_use = float(cal.fit.inverse(min(u, 1.0), saturate=True))
    if v_use <= 0:
        queries = None  # the attacker needs the clean model exactly: no finite M
    elif not math.isfinite(v_use):
        queries = 1
    else:
        queries = cost.queries_needed(v_star, v_use)
    return QueryBound(usable_retention, acc, u, v_use, queries)


def m_grid(m_max: int, n_points: int = 40) -> np.ndarray:
    """Integers M in [1, m_max], log-spaced (for the analytic curves)."""
    return np.unique(np.round(np.geomspace(1, int(m_max), n_points)).astype(int))


def powers_of_two(m_max: int) -> tuple[int, ...]:
    out, m = [], 1
    while m <= m_max:
        out.append(m)
        m *= 2
    return tuple(out)


# ----------------------------------------------------------------- data page


def model_table(datas: Sequence[LogitsData]) -> pd.DataFrame:
    """One row per loaded model: name, N, K, A0, S under each statistic, digest prefix."""
    rows = []
    for d in datas:
        scales = margins.all_scales(d.logits)
        rows.append({
            "model": d.name,
            "file": re.split(r"[\\/]", d.source)[-1],
            "N": d.n_samples,
            "K": d.n_classes,
            "labels": "yes" if d.has_labels else "no",
            "A0": margins.clean_accuracy(d.logits, d.labels) if d.has_labels else np.nan,
            "S median": scales["median"],
            "S mean": scales["mean"],
            "S trimmed": scales["trimmed"],
            "sha256": d.sha256[:12],
        })
    return pd.DataFrame(rows, columns=["model", "file", "N", "K", "labels", "A0", "S median",
                                       "S mean", "S trimmed", "sha256"])
