"""Each calibrated target's interval, its side, and the drift check's reference.

A target's sigma* is solved on a sample; what it delivers on the population
is uncertain by the sample's size (:mod:`.intervals`). For every target this
module records

* ``interval``: the confidence interval of accuracy, retention and agreement
  at the sigma served (null without labels), and the method that made it;
* ``side``: "point" serves sigma* itself; "at-least" serves the sigma at which
  the lower confidence bound of the target's quantity equals the target (the
  population keeps at least the target with the stated confidence);
  "at-most" the sigma at which the upper bound equals it (the population gets
  no more than the target). The side's sigma is solved on the bound curve by
  :mod:`.inversion`, starting from sigma*; ``method`` still names how sigma*
  itself was found;
* ``reference``: what the sigma delivers on the calibration sample and the
  per-row spreads, which :func:`.drift.check_drift` compares new traffic with.

:func:`interval_estimator` builds the bootstrap for a :class:`.Calibration`
once (the Calibrate page caches it per model and asks it for any sigma).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from ..target_record import CERTIFIED_LEVEL, TargetRecord, check_side
from .calibrate import Calibration, saturated_sigma
from .drift import target_reference
from .intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    QUANTITIES,
    WIDE_HALF_WIDTH,
    BootstrapIntervals,
    sample_size_advice,
)
from .margins import normalized_noise


def interval_estimator(cal: Calibration, *, confidence: float = DEFAULT_CONFIDENCE,
                       resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0) -> BootstrapIntervals:
    """The row bootstrap of one calibrated model.

    The rows are the calibration's own engine (exact or the sweep's draws by
    its one cost policy), so the interval's estimate is the value sigma* was
    solved on.

    Parameters
    ----------
    cal : Calibration
    confidence : float, default 0.95
    resamples : int, default 2000
    seed : int or None, default 0
        Seed of the bootstrap weights.
    """
    return BootstrapIntervals(cal.engine, confidence=confidence, resamples=resamples, seed=seed)


def _quantity_target(record: TargetRecord) -> float:
    return {"accuracy": record.accuracy, "retention": record.retention,
            "agreement": record.agreement}[record.kind]


def side_sigma(cal: Calibration, record: TargetRecord, estimator: BootstrapIntervals, *,
               side: str, saturate: bool = False) -> tuple[float, bool]:
    """(sigma, saturated) for a target on one side of its confidence interval.

    Parameters
    ----------
    cal : Calibration
    record : TargetRecord
        The point target, from :func:`.calibrate.sigma_for_target`.
    estimator : BootstrapIntervals
        The calibration's interval estimator at the wanted level.
    side : {"point", "at-least", "at-most"}
        "point" returns the record's own sigma.
    saturate : bool, default False
        An at-most bound that never falls to the target serves the sweep's largest sigma.

    Returns
    -------
    sigma : float
        0 only where the clean model's own bound keeps the target (at-least:
        its lower bound >= the target; at-most: its upper bound <= it).
    saturated : bool

    Raises
    ------
    ValueError
        An unknown side, or a bound that never reaches the target (at-least: not
        even the clean model's lower bound, sigma* = 0 included; at-most: not even
        the largest sigma) where ``saturate`` does not apply.
    """
    check_side(side)
    if side == "point":
        return record.sigma, record.saturated
    value = _quantity_target(record)
    # The clean model's own bound first, whatever sigma* is: a target that asks for no
    # degradation (sigma* = 0) is still a claim about the population, and the sample may refute it.
    clean = float(estimator.bound(0.0, kind=record.kind, side=side)[0])
    if record.kind == "accuracy" and cal.clean_accuracy is not None:
        # Without noise, accuracy is a binomial proportion: take the exact (Clopper-Pearson) bound
        # too, and the more cautious of the two, so no reading of "the data's bound" refutes it.
        exact = exact_clean_bound(cal.clean_accuracy, cal.n_samples, side=side,
                                  confidence=estimator.confidence)
        clean = min(clean, exact) if side == "at-least" else max(clean, exact)
    if side == "at-least" and clean < value:
        raise ValueError(
            f"{record.kind} target {record.requested:g} cannot be guaranteed at-least at "
            f"{estimator.confidence:.0%} confidence: even without noise the lower bound is "
            f"{clean:.4f} (N={cal.n_samples}; more rows raise it)")
    if record.sigma == 0.0 and _keeps(clean, value, side):
        return 0.0, False  # no noise, and the clean model's bound already keeps the target
    guess = record.sigma if record.sigma > 0 else float(cal.sweep.sigma[0])
    try:
        sigma = estimator.sigma_for_bound(value, kind=record.kind, side=side, guess=guess)
    except ValueError:
        if side == "at-most" and saturate:
            return saturated_sigma(cal), True
        raise
    # The one rule every path shares: a one-sided sigma is served only where its own bound keeps
    # the target (the solver settles on that side; this states it where the guarantee is made).
    bound = float(estimator.bound(sigma, kind=record.kind, side=side)[0])
    if not _keeps(bound, value, side):
        word = "lower" if side == "at-least" else "upper"
        raise ValueError(
            f"{record.kind} target {record.requested:g} cannot be guaranteed {side} at "
            f"{estimator.confidence:.0%} confidence: the {word} bound at sigma {sigma:.4g} is "
            f"{bound:.4f} (N={cal.n_samples})")
    return sigma, False


def exact_clean_bound(accuracy: float, n_samples: int, *, side: str, confidence: float) -> float:
    """The exact one-sided (Clopper-Pearson) bound on a clean accuracy measured on ``n_samples`` rows.

    Parameters
    ----------
    accuracy : float
        The sample's clean accuracy, in [0, 1] (ties split make it a non-integer count; the
        beta quantiles take that as it is).
    n_samples : int
        Rows it was measured on.
    side : {"at-least", "at-most"}
        "at-least" gives the lower bound, "at-most" the upper.
    confidence : float
        One-sided level, in (0, 1).

    Returns
    -------
    float
        ``Beta(1 - c; k, n - k + 1)`` (lower) or ``Beta(c; k + 1, n - k)`` (upper), with k = accuracy * n;
        0 (lower, k = 0) and 1 (upper, k = n) at the ends.
    """
    from scipy.stats import beta

    n = int(n_samples)
    k = min(max(float(accuracy), 0.0), 1.0) * n
    if side == "at-least":
        return 0.0 if k <= 0 else float(beta.ppf(1.0 - confidence, k, n - k + 1))
    return 1.0 if k >= n else float(beta.ppf(confidence, k + 1, n - k))


def _keeps(bound: float, value: float, side: str) -> bool:
    """Whether a one-sided bound is on the target's safe side (at-least: >=, at-most: <=)."""
    return bound >= value if side == "at-least" else bound <= value


def with_interval(cal: Calibration, record: TargetRecord, estimator: BootstrapIntervals, *,
                  side: str = "point", saturate: bool = False) -> TargetRecord:
    """The record served on ``side``, with its ``interval`` and drift ``reference`` filled in.

    ``side="point"`` keeps sigma*, v and every other field unchanged.

    Parameters
    ----------
    cal : Calibration
    record : TargetRecord
    estimator : BootstrapIntervals
    side : {"point", "at-least", "at-most"}, default "point"
    saturate : bool, default False
        As :func:`side_sigma`.

    Returns
    -------
    TargetRecord
        A new record (the input is frozen).

    Raises
    ------
    ValueError
        As :func:`side_sigma`.
    """
    sigma, saturated = side_sigma(cal, record, estimator, side=side, saturate=saturate)
    fields = {}
    if sigma != record.sigma:
        fields = {"sigma": float(sigma), "v": float(normalized_noise(sigma, cal.scale)),
                  "saturated": saturated}
        if saturated and not record.method.startswith("saturated-"):
            fields["method"] = f"saturated-{record.method}"
    return replace(record, side=side, interval=estimator.at(sigma).to_config(),
                   reference=target_reference(estimator.rows, sigma), **fields)


def interval_notes(config: Mapping) -> tuple[str | None, str | None]:
    """The sample-size advice line and the wide-interval warning of any config ``calibrate`` writes.

    The one rule for every input (matrices, lm-eval samples, top-k logprob logs,
    full-vocabulary dumps): the advice is about the widest sampling interval of the
    targets' own quantities, with the rows that would narrow it (1/sqrt(N)), and the
    warning appears when some interval is wider than ±``WIDE_HALF_WIDTH`` (2 points).

    A config whose targets carry certified bounds (top-k logs, dumps: it has
    ``bounds``) has no bootstrap: its sampling half-width is bounded from the bounds
    themselves (a per-row agreement in [0, 1] with mean mu has variance at most
    mu (1 - mu), taken at the worst mu inside the bound), and the line also states the
    certified bound's width, which more rows do not narrow.

    Parameters
    ----------
    config : mapping
        A config as :func:`.pipeline.config_from_calibration` (or the log and dump
        paths) builds it.

    Returns
    -------
    advice : str or None
        The line as printed, e.g. "interval half-width, widest target: retention 0.8:
        ±2.9% at N=500; about 1,100 rows for ±2.0%, about 4,200 rows for ±1.0%"; None when
        no target has an interval for its quantity.
    warning : str or None
        E.g. "1 of 1 target intervals (95%) are wider than ±2%, the widest retention 0.8:
        ±2.9% at N=500; about 1,100 rows for ±2.0%"; None when none is.
    """
    n = int(config["n_samples"])
    certified = any(is_certified(t.get("interval") or {}) for t in config["targets"])
    halves = []
    for t in config["targets"]:
        iv = t.get("interval") or {}
        bounds = iv.get(t["kind"]) if t["kind"] in QUANTITIES else None
        if bounds is None:
            continue
        label = f"{t['kind']} {t['requested']:g}"
        if certified:
            halves.append((_sampling_half_width(bounds, n), label, DEFAULT_CONFIDENCE))
        else:
            halves.append((0.5 * (bounds[1] - bounds[0]), label, iv["level"]))
    if not halves:
        return None, None
    half, label, level = max(halves)
    advice = f"interval half-width, widest target: {label}: {sample_size_advice(half, n)}"
    if certified and config.get("bounds"):
        advice += f" (at most: the rows' spread is bounded, not measured); {_certified_widths(config)}"
    wide = sum(h > WIDE_HALF_WIDTH for h, _, _ in halves)
    warning = None
    if wide:
        warning = (f"{wide} of {len(halves)} target intervals ({level:.0%}) are wider than "
                   f"±{100 * WIDE_HALF_WIDTH:.0f}%, the widest {label}: "
                   f"{sample_size_advice(half, n, goals=[WIDE_HALF_WIDTH])}")
    return advice, warning


def _sampling_half_width(bounds, n_samples: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Largest normal half-width of a mean of N values in [0, 1] whose mean lies in ``bounds``.

    Var <= mu (1 - mu) for values in [0, 1] with mean mu (Bhatia-Davis), at its
    largest over mu in the bound.
    """
    from statistics import NormalDist  # not scipy.special: a dump's calibration needs no scipy (~0.5 CPU-s)

    lo, hi = float(bounds[0]), float(bounds[1])
    mu = min(max(0.5, lo), hi)  # the worst mean inside [lo, hi]
    return NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(mu * (1.0 - mu) / n_samples)


def _certified_widths(config: Mapping) -> str:
    """The certified bound's width at each target, and where it comes from."""
    b = config["bounds"]
    widths = ", ".join(f"{w:.2g}" if w < 1e-3 else f"{w:.4f}" for w in b["widths"])
    if str(b.get("method", "")).startswith("streamed"):  # a full-vocabulary dump
        return (f"full vocabulary streamed (V={b['vocab_size']}, top {b['k']} gaps exact, the rest binned): "
                f"agreement bound width at each target {widths}, from the binning, which more rows do not narrow")
    return (f"certified agreement bounds (k={b['k']}, V={b['vocab_size']}): width at each target {widths}, "
            "from the unseen tail, which more rows do not narrow")


def describe_interval(target: Mapping) -> str:
    """'retention 80.0% (95%: 77.6-82.5%)' for a config target's own quantity ('' when unknown).

    Parameters
    ----------
    target : mapping
        One entry of a config's ``targets``.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        A target without ``kind``, or an interval without ``level``.
    """
    kind = target["kind"]
    iv = target.get("interval") or {}
    ref = target.get("reference") or {}
    bounds, value = iv.get(kind), ref.get(kind, target.get(kind))
    if kind not in QUANTITIES or bounds is None or value is None:
        return ""
    # Certified bounds (top-k logs, dumps) are not a sampling interval: say so rather than "100%".
    level = "certified" if is_certified(iv) else f"{iv['level']:.0%}"
    return f"{kind} {100 * value:.1f}% ({level}: {100 * bounds[0]:.1f}-{100 * bounds[1]:.1f}%)"


def is_certified(interval: Mapping) -> bool:
    """Whether a target's ``interval`` holds certified bounds (over every unseen or binned tail)
    rather than a confidence interval of the sampling error.

    Parameters
    ----------
    interval : mapping
        A config target's ``interval``.

    Returns
    -------
    bool
    """
    return float(interval.get("level", 0.0)) >= CERTIFIED_LEVEL
