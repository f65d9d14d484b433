"""Verify sigma* with fresh noise: the reference argmax Monte Carlo, in chunks for progress."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from caliber_core.simulation.reference import argmax_monte_carlo
from caliber_core.target_record import DEFAULT_CONFIDENCE, check_confidence


#: Noise values one Verify click draws at most (about half a second of numpy on an idle core).
VERIFY_MAX_VALUES = 50_000_000


def verify_realizations(n_samples: int, n_classes: int = 10) -> int:
    """Fresh noise draws for the verify action: 200 at N=500, within [16, 400].

    On a large file fewer (at least 4), so one click draws at most
    :data:`VERIFY_MAX_VALUES` noise values: 5 draws at 10,000 x 1,000, whose
    50,000 noisy answers still give a standard error of about 0.002.
    """
    reps = int(np.clip(math.ceil(100_000 / n_samples), 16, 400))
    return max(4, min(reps, VERIFY_MAX_VALUES // max(1, n_samples * n_classes)))


@dataclass(frozen=True, kw_only=True)
class Verification:
    """Fresh-noise accuracy and agreement at one sigma, each with its binomial standard error."""

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

    return Verification(sigma=float(sigma), realizations=int(realizations), seed=int(seed),
                        accuracy=acc if labels is not None else None,
                        accuracy_se=se(acc) if labels is not None else None,
                        agreement=agr, agreement_se=se(agr))


@dataclass(frozen=True, kw_only=True)
class VerificationCheck:
    """A measured value set against the value wanted, with its Monte-Carlo band."""

    measured: float
    wanted: float
    half_width: float  #: the band's half width: the normal quantile of ``confidence`` times the standard error
    confidence: float
    relative_error: float  #: (measured - wanted) / wanted, a fraction
    within: bool  #: ``wanted`` lies within ``measured`` +- ``half_width``


def check_verification(measured: float, standard_error: float, wanted: float, *,
                       confidence: float = DEFAULT_CONFIDENCE) -> VerificationCheck:
    """Whether a fresh-noise measurement agrees with the value wanted, at a confidence level.

    Parameters
    ----------
    measured : float
        The fresh-noise accuracy or agreement (a fraction).
    standard_error : float
        Its binomial standard error (:func:`verify_sigma`), >= 0.
    wanted : float
        The value the served sigma should deliver (the target, or the prediction off the point).
    confidence : float, optional
        The two-sided level of the Monte-Carlo band, in [0.5, 1);
        ``DEFAULT_CONFIDENCE`` (0.95) gives the normal quantile 1.96.

    Returns
    -------
    VerificationCheck
        The band's half width, the relative error and whether ``wanted`` is within the band.

    Raises
    ------
    ValueError
        For a confidence level outside [0.5, 1), a negative or non-finite
        standard error, or a ``wanted`` of zero (no relative error).

    Notes
    -----
    The band is the normal approximation to the binomial: measured +- z se,
    with z the (1 + confidence) / 2 quantile of the standard normal. A tolerance
    of 1e-12 keeps a value exactly on the band's edge inside.
    """
    level = check_confidence(confidence)
    if not (math.isfinite(standard_error) and standard_error >= 0):
        raise ValueError(f"standard_error must be finite and >= 0, got {standard_error!r}")
    if wanted == 0 or not math.isfinite(wanted):
        raise ValueError(f"wanted must be finite and non-zero (a relative error divides by it), got {wanted!r}")
    half_width = NormalDist().inv_cdf(0.5 + level / 2) * standard_error
    return VerificationCheck(measured=float(measured), wanted=float(wanted), half_width=half_width,
                             confidence=level, relative_error=(measured - wanted) / wanted,
                             within=abs(measured - wanted) <= half_width + 1e-12)
