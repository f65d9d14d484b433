"""Proposition 2: what averaging repeated queries costs an attacker.

Averaging M fresh draws of N(0, sigma^2) leaves noise N(0, sigma^2 / M): the
effective normalized intensity is v / M, so driving it down to a usable level
v_use takes M >= v / v_use queries per input (part i). With per-input
deterministic seeding the M answers coincide and the average stays at v (part ii).
"""

from __future__ import annotations

import math

import numpy as np

from .fit import LogisticFit


def effective_intensity(v, m, *, seeding: str = "fresh"):
    """Normalized intensity left after averaging ``m`` answers: v / m, or v per-input."""
    m = np.asarray(m, dtype=np.float64)
    if np.any(m < 1):
        raise ValueError(f"m must be >= 1, got {m.min()}")
    if seeding == "per-input":
        return np.broadcast_to(np.asarray(v, dtype=np.float64), m.shape).copy()
    if seeding != "fresh":
        raise ValueError(f"seeding must be 'fresh' or 'per-input', got {seeding!r}")
    return np.asarray(v, dtype=np.float64) / m


def queries_needed(v: float, v_use: float) -> int:
    """Smallest integer M with v / M <= v_use (Proposition 2(i): M >= v / v_use).

    Raises ValueError unless 0 < v_use; returns 1 when v <= v_use already.
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
    """Normalized utility the attacker recovers with m queries: the law at v / m."""
    return fit.predict(effective_intensity(v, m, seeding=seeding))


def sigma_after_averaging(sigma: float, m, *, seeding: str = "fresh") -> np.ndarray:
    """Noise scale left after averaging: sigma / sqrt(m) (fresh) or sigma (per-input)."""
    return np.sqrt(effective_intensity(float(sigma) ** 2, m, seeding=seeding))
