"""Verify sigma* with fresh noise: the reference argmax Monte Carlo, in pieces on threads, for progress."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from caliber_core.simulation.reference import argmax_monte_carlo
from caliber_core.target_record import DEFAULT_CONFIDENCE
from caliber_dashboard.common.rounding import normal_half_width


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
    workers: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> Verification:
    """Fresh Monte-Carlo accuracy and agreement at sigma (``argmax_monte_carlo``).

    The draws are split into ``chunks`` pieces (whole realizations, or a block of
    rows of one realization when there are fewer realizations than chunks), each
    with its own stream spawned from ``seed``: the pieces run on ``workers``
    threads (numpy's draws release the interpreter lock) and the result does not
    depend on how many. Progress is reported as pieces end, in order. The standard
    errors are binomial over all N x realizations draws (an upper bound on the
    noise-only error).
    """
    z = np.asarray(logits)
    y = labels if labels is not None else np.argmax(z, axis=1)
    pieces = _pieces(z.shape[0], int(realizations), max(1, int(chunks)))
    streams = np.random.SeedSequence(int(seed)).spawn(len(pieces))

    def hits(i: int) -> tuple[int, int]:
        rows, reps = pieces[i]
        a, g = argmax_monte_carlo(z[rows], y[rows], [sigma], realizations=reps,
                                  seed=np.random.default_rng(streams[i]))
        draws = (rows.stop - rows.start) * reps  # the means back to counts, exactly
        return round(float(a[0]) * draws), round(float(g[0]) * draws)

    workers = min(len(pieces), workers or min(4, os.cpu_count() or 1))
    acc_hits = agr_hits = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="caliber-verify") as pool:
        futures = [pool.submit(hits, i) for i in range(len(pieces))]
        for done, future in enumerate(futures, 1):
            a, g = future.result()
            acc_hits += a
            agr_hits += g
            if progress is not None:
                progress(done / len(pieces))
    n_draws = z.shape[0] * realizations
    acc = acc_hits / n_draws
    agr = agr_hits / n_draws

    def se(p):
        return math.sqrt(max(p * (1 - p), 0.0) / n_draws)

    return Verification(sigma=float(sigma), realizations=int(realizations), seed=int(seed),
                        accuracy=acc if labels is not None else None,
                        accuracy_se=se(acc) if labels is not None else None,
                        agreement=agr, agreement_se=se(agr))


def _pieces(n_samples: int, realizations: int, chunks: int) -> list[tuple[slice, int]]:
    """(rows, realizations) of each piece: ``chunks`` groups of whole realizations over every row,
    or, with fewer realizations than chunks, each realization cut into blocks of rows."""
    if realizations >= chunks:
        return [(slice(0, n_samples), realizations // chunks + (1 if i < realizations % chunks else 0))
                for i in range(chunks)]
    blocks = min(n_samples, -(-chunks // realizations))
    edges = np.linspace(0, n_samples, blocks + 1).round().astype(int)
    return [(slice(int(a), int(b)), 1) for _ in range(realizations) for a, b in zip(edges[:-1], edges[1:])]


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
    with z the (1 + confidence) / 2 quantile of the standard normal
    (:func:`~caliber_dashboard.common.rounding.normal_half_width`). A tolerance
    of 1e-12 keeps a value exactly on the band's edge inside.
    """
    half_width = normal_half_width(standard_error, confidence=confidence)
    if wanted == 0 or not math.isfinite(wanted):
        raise ValueError(f"wanted must be finite and non-zero (a relative error divides by it), got {wanted!r}")
    return VerificationCheck(measured=float(measured), wanted=float(wanted), half_width=half_width,
                             confidence=float(confidence), relative_error=(measured - wanted) / wanted,
                             within=abs(measured - wanted) <= half_width + 1e-12)
