"""Proposition 2: what averaging repeated queries costs an attacker.

Averaging M fresh draws of N(0, sigma^2) leaves noise N(0, sigma^2 / M): the
effective normalized intensity is v / M, so driving it down to a usable level
v_use takes M >= v / v_use queries per input (part i). With per-input
deterministic seeding the M answers coincide and the average stays at v (part ii).

For one calibrated model, :func:`query_bound` turns a usable level given as
a retention into v_use and the bound on M; v_use comes from the same
inversion as v* (the measured curve by default, as ``sigma_for_target``), so
the ratio v* / v_use never mixes the curve with the law;
and :func:`analytic_attack` gives the accuracy the attacker recovers with M
fresh queries, on the measured curve and on the law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .calibrate import INVERSIONS, Calibration, measured_accuracy, sigma_for_target
from .fit import LogisticFit
from .margins import accuracy_from_normalized, normalized_noise, normalized_utility


def effective_intensity(v, m, *, seeding: str = "fresh"):
    """Normalized intensity left after averaging ``m`` answers to one input.

    Parameters
    ----------
    v : float or array_like of float
        The served normalized intensity.
    m : int or array_like of int
        Answers averaged per input, each >= 1.
    seeding : {"fresh", "per-input"}, default "fresh"
        "fresh": independent noise per answer, leaving v / m; "per-input": the
        answers coincide, leaving v.

    Returns
    -------
    ndarray
        The effective intensity, broadcast over ``v`` and ``m``.

    Raises
    ------
    ValueError
        If any m < 1 or ``seeding`` is unknown.

    Notes
    -----
    Proposition 2 (``prop:cost``), parts (i) and (ii).
    """
    m = np.asarray(m, dtype=np.float64)
    if np.any(m < 1):
        raise ValueError(f"m must be >= 1, got {m.min()}")
    if seeding == "per-input":
        return np.broadcast_to(np.asarray(v, dtype=np.float64), m.shape).copy()
    if seeding != "fresh":
        raise ValueError(f"seeding must be 'fresh' or 'per-input', got {seeding!r}")
    return np.asarray(v, dtype=np.float64) / m


def queries_needed(v: float, v_use: float) -> int:
    """Smallest integer M with v / M <= v_use.

    Parameters
    ----------
    v : float
        The served normalized intensity (>= 0).
    v_use : float
        The intensity the attacker can use (> 0).

    Returns
    -------
    int
        M >= 1; a ratio within round-off of an integer counts as that integer.

    Raises
    ------
    ValueError
        If ``v_use`` is not positive or ``v`` is negative.

    Notes
    -----
    Proposition 2(i): M >= v / v_use.
    """
    if not v_use > 0:
        raise ValueError(f"v_use must be positive, got {v_use}")
    if v < 0:
        raise ValueError(f"v must be >= 0, got {v}")
    ratio = v / v_use
    # A ratio within round-off of an integer is that integer (0.3 / 0.1, 256.16 / 0.01).
    nearest = round(ratio)
    if abs(ratio - nearest) <= 1e-12 * max(1.0, ratio):
        return max(1, int(nearest))
    return max(1, math.ceil(ratio))


def recovered_utility(fit: LogisticFit, v: float, m, *, seeding: str = "fresh") -> np.ndarray:
    """Normalized utility the attacker recovers with m answers: the law at v / m.

    Parameters
    ----------
    fit : LogisticFit
        The fitted law.
    v : float
        The served normalized intensity.
    m : int or array_like of int
        Answers averaged per input, each >= 1.
    seeding : {"fresh", "per-input"}, default "fresh"

    Returns
    -------
    ndarray
        A~ at the effective intensity.

    Raises
    ------
    ValueError
        As :func:`effective_intensity`.

    Notes
    -----
    Eq. ``logistic-decay`` evaluated at Proposition 2's effective intensity.
    """
    return fit.predict(effective_intensity(v, m, seeding=seeding))


def sigma_after_averaging(sigma: float, m, *, seeding: str = "fresh") -> np.ndarray:
    """Noise scale left after averaging: sigma / sqrt(m) (fresh) or sigma (per-input).

    Parameters
    ----------
    sigma : float
        The served noise scale.
    m : int or array_like of int
        Answers averaged per input, each >= 1.
    seeding : {"fresh", "per-input"}, default "fresh"

    Returns
    -------
    ndarray
        The remaining standard deviation, shaped like ``m``.

    Raises
    ------
    ValueError
        As :func:`effective_intensity`.

    Notes
    -----
    Proposition 2 (``prop:cost``).
    """
    return np.sqrt(effective_intensity(float(sigma) ** 2, m, seeding=seeding))


def analytic_attack(cal: Calibration, sigma: float, m) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy an averaging attacker reaches with M fresh queries per input (Proposition 2(i)).

    Parameters
    ----------
    cal : Calibration
        A calibration with labels.
    sigma : float
        The served noise scale.
    m : array_like of int >= 1
        Queries per input.

    Returns
    -------
    measured, logistic : ndarray of shape m.shape
        The measured curve (exact when available) at sigma / sqrt(M), and the
        fitted law at v / M, de-normalized to accuracy.
    """
    if not cal.has_labels:
        raise ValueError(f"model {cal.name!r} has no labels: the attack's accuracy needs them")
    m = np.asarray(m, dtype=np.float64)
    measured = measured_accuracy(cal, sigma_after_averaging(sigma, m, seeding="fresh"))
    v = float(normalized_noise(sigma, cal.scale))
    logistic = accuracy_from_normalized(recovered_utility(cal.fit, v, m, seeding="fresh"),
                                        clean=cal.clean_accuracy, n_classes=cal.n_classes)
    return np.asarray(measured, dtype=np.float64), np.asarray(logistic, dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class QueryBound:
    """Proposition 2(i) for one usable level.

    Attributes
    ----------
    usable_retention, usable_accuracy, usable_utility : float
        The level the attacker calls usable, as retention, accuracy and A~.
    v_use : float
        The normalized noise at which the curve (or the law) gives that level
        (0: only the clean model is that good; inf: it never falls that low).
    queries : int or None
        The smallest M with v* / M <= v_use; None when no finite M reaches it.
    inversion : {"curve", "logistic"}
        Where v_use came from; v* must come from the same.
    """

    usable_retention: float
    usable_accuracy: float
    usable_utility: float
    v_use: float
    queries: int | None
    inversion: str = "curve"


def query_bound(cal: Calibration, v_star: float, usable_retention: float, *,
                inversion: str = "curve") -> QueryBound:
    """M >= v* / v_use for a usable level given as retention (Proposition 2(i)).

    Parameters
    ----------
    cal : Calibration
    v_star : float
        The served v*, from ``sigma_for_target(..., inversion=inversion)``.
    usable_retention : float
        The level the attacker calls usable, as a fraction of A0.
    inversion : {"curve", "logistic"}, default "curve"
        How v_use is found: on the measured curve (the default of
        ``sigma_for_target``) or through the fitted law's inverse. v* and v_use
        must come from the same one.
    """
    if not cal.has_labels:
        raise ValueError(f"model {cal.name!r} has no labels: a usable retention needs them")
    if inversion not in INVERSIONS:
        raise ValueError(f"inversion must be one of {INVERSIONS}, got {inversion!r}")
    acc = usable_retention * cal.clean_accuracy
    u = float(normalized_utility(acc, clean=cal.clean_accuracy, n_classes=cal.n_classes))
    if inversion == "logistic":
        v_use = float(cal.fit.inverse(min(u, 1.0), saturate=True))
    else:
        try:
            v_use = sigma_for_target(cal, usable_retention, inversion="curve").v
        except ValueError:
            v_use = math.inf  # the curve never falls that low: one answer is already usable
    if v_use <= 0:
        queries = None  # the attacker needs the clean model exactly: no finite M
    elif not math.isfinite(v_use):
        queries = 1
    else:
        queries = queries_needed(v_star, v_use)
    return QueryBound(usable_retention=usable_retention, usable_accuracy=acc, usable_utility=u,
                      v_use=v_use, queries=queries, inversion=inversion)
