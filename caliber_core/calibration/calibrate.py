"""Per-model calibration: one sweep, one fit, then a target in and sigma* out.

Two inversions are kept side by side for every target:

* ``logistic``: the paper's closed form (Eq. inverse-v) on the fitted law;
* ``curve`` (default): the measured curve itself is inverted, the exact
  expected accuracy by quadrature (Proposition 1 with the true label as the
  reference class) when the file is small enough, else the Monte-Carlo curve
  of the sweep. A logistic leaves up to a few points of residual on some
  shapes; the curve has none, so the per-model default is the curve and the
  logistic stays for display, shared fits and transfer.

Which curve is "the measured curve" is the engine's one cost policy
(:func:`.engine.choose_method`): the exact quadrature when the file is small
enough, else the sweep's Monte-Carlo curve; agreement targets follow the same
rule. The intervals, the corridor and the drift reference read the same
engine (:attr:`Calibration.engine`). At K = 2 the curves have a closed form
and no sweep is run (:mod:`.two_class`): the calibration's ``intervals`` are
the exact curves, with no draws (:func:`draws_per_input` is 0). Every inversion goes through
:mod:`caliber_core.calibration.inversion`; the result is a
:class:`caliber_core.config.TargetRecord`. A target out of reach raises, or
with ``saturate`` serves the largest sigma the sweep measured
(:func:`saturated_sigma`), flagged ``saturated``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config import CALIBRATED_KINDS, TargetRecord
from . import margins
from .engine import CurveEngine, choose_method
from .fit import LogisticFit, fit_logistic
from .inversion import first_crossing, logistic_sigma, sigma_for_agreement, solve_near
from .sample import LogitSample
from .sweep import NoiseSweep, SurvivalIntervals, default_realizations, survival_intervals, sweep_from_intervals
from .two_class import TwoClassCurves

INVERSIONS = ("curve", "logistic")
CURVE_METHODS = ("auto", "exact", "monte-carlo")


@dataclass(kw_only=True)
class Calibration:
    """Everything one model's calibration knows (the sweep is done once).

    Build with :func:`calibrate_model`; ask for targets with :func:`sigma_for_target`.

    Attributes
    ----------
    name : str
    n_samples, n_classes : int
        N and K of the calibration sample.
    statistic : {"median", "mean", "trimmed"}
        The margin statistic S is taken with.
    scale : float
        The margin scale S (Eq. ``normalized-noise``).
    scales : dict of str to float
        S under every statistic (NaN where not positive).
    clean_accuracy : float or None
        A0; None without labels.
    intervals : SurvivalIntervals or TwoClassCurves
        The sweep's per-draw survival intervals (closed-form curves at K = 2).
    sweep : NoiseSweep
        The measured curves on the sigma grid.
    fit : LogisticFit
        Eq. ``logistic-decay`` fit to the sweep.
    fit_quantity : {"accuracy", "agreement"}
        What the law was fit to (agreement without labels).
    curve_method : {"exact", "monte-carlo"}
        Which rows every measured curve reads.
    seed : int or None
    sample : LogitSample
    """

    name: str
    n_samples: int
    n_classes: int
    statistic: str
    scale: float
    scales: dict
    clean_accuracy: float | None
    intervals: SurvivalIntervals | TwoClassCurves
    sweep: NoiseSweep
    fit: LogisticFit
    fit_quantity: str
    curve_method: str
    seed: int | None
    sample: LogitSample = field(repr=False)
    _engine: CurveEngine | None = field(default=None, repr=False)

    @property
    def chance(self) -> float:
        """1/K, the chance level."""
        return 1.0 / self.n_classes

    @property
    def has_labels(self) -> bool:
        """Whether the calibration sample carries labels."""
        return self.sample.has_labels

    @property
    def logits(self) -> np.ndarray:
        """The validated float64 logits the calibration was run on (read-only use)."""
        return self.sample.logits

    @property
    def labels(self) -> np.ndarray | None:
        """The validated int64 labels, or None."""
        return self.sample.labels

    @property
    def engine(self) -> CurveEngine:
        """Per-row survival and curves on this sample, by ``curve_method``, over the sweep's draws."""
        if self._engine is None or self._engine.method != self.curve_method:
            # Closed-form curves have no draws: a Monte-Carlo engine would run its own sweep.
            self._engine = CurveEngine(self.sample, method=self.curve_method, draws=self.intervals,
                                       seed=self.seed)
        return self._engine

    def sigma_range(self) -> tuple[float, float]:
        """The first and last sigma of the sweep's grid.

        Returns
        -------
        (float, float)
        """
        return float(self.sweep.sigma[0]), float(self.sweep.sigma[-1])


def calibrate_model(
    logits,
    labels=None,
    *,
    name: str = "model",
    statistic: str = "median",
    realizations: int | None = None,
    seed: int | None = 0,
    curve: str = "auto",
    progress: Callable[[float], None] | None = None,
) -> Calibration:
    """Margins, sweep and logistic fit for one model.

    Parameters
    ----------
    logits : LogitSample, or array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,), optional
        Without labels only agreement targets are possible; the fit is then
        to normalized agreement. Only with raw logits (a sample carries its own).
    name : str
    statistic : {"median", "mean", "trimmed"}, default "median"
    realizations : int, optional
        Noise draws per input; default from N and K (:func:`default_realizations`).
        Unused at K = 2 unless ``curve="monte-carlo"``: the curves are then
        closed form (:func:`draws_per_input`).
    seed : int or None, default 0
    curve : {"auto", "exact", "monte-carlo"}, default "auto"
        Which measured curve every consumer reads (``sigma_for_target``, the
        intervals, the corridor); "auto" is :func:`.engine.choose_method`.
    progress : callable, optional
        Called with the fraction done in [0, 1].

    Notes
    -----
    At K = 2, Eq. top1-exact is Phi(g / (sigma sqrt 2)) per row: the sweep's
    curves are replaced by the exact ones (:class:`.two_class.TwoClassCurves`,
    standard error 0), so no per-draw arrays are held.
    """
    sample = LogitSample.of(logits, labels)
    n, k = sample.n_samples, sample.n_classes
    if curve not in CURVE_METHODS:
        raise ValueError(f"curve must be one of {CURVE_METHODS}, got {curve!r}")
    m = sample.margins
    scale = margins.scale_from_margins(m, statistic=statistic)
    scales = {s: (scale if s == statistic else _try_scale(m, s)) for s in margins.MARGIN_STATISTICS}
    a0 = None
    if sample.has_labels:
        a0 = sample.clean_accuracy
        if not a0 > 1.0 / k:
            raise ValueError(
                f"clean accuracy A0={a0:.4g} is not above chance 1/K={1 / k:.4g}: nothing to calibrate"
            )
    r = draws_per_input(n, k, realizations=realizations, curve=curve)
    if r == 0:
        intervals = TwoClassCurves(sample, seed=seed)
        if progress is not None:
            progress(1.0)  # nothing to sweep
    else:
        intervals = survival_intervals(sample, realizations=r, seed=seed, progress=progress)
    sweep = sweep_from_intervals(intervals, scale=scale, clean_accuracy=a0)
    if sweep.utility is not None:
        fit = fit_logistic(sweep.v, sweep.utility)
        quantity = "accuracy"
    else:
        fit = fit_logistic(sweep.v, (sweep.agreement - 1.0 / k) / (1.0 - 1.0 / k))
        quantity = "agreement"
    if curve == "auto":
        curve = choose_method(n, k)
    return Calibration(
        name=name, n_samples=n, n_classes=k, statistic=statistic, scale=scale, scales=scales,
        clean_accuracy=a0, intervals=intervals, sweep=sweep, fit=fit, fit_quantity=quantity,
        curve_method=curve, seed=seed, sample=sample,
    )


def draws_per_input(n_samples: int, n_classes: int, *, realizations: int | None = None,
                    curve: str = "auto") -> int:
    """Noise draws per input :func:`calibrate_model` makes: 0 at K = 2 (closed form), else the sweep's.

    Parameters
    ----------
    n_samples, n_classes : int
    realizations : int, optional
        Asked for; None is :func:`.sweep.default_realizations`. An odd count is
        rounded up to even (antithetic pairs).
    curve : {"auto", "exact", "monte-carlo"}, default "auto"
        At K = 2 only "monte-carlo" runs the sweep.
    """
    if n_classes == 2 and curve != "monte-carlo":
        return 0
    r = default_realizations(n_samples, n_classes) if realizations is None else realizations
    return r + r % 2 if isinstance(r, (int, np.integer)) and not isinstance(r, bool) else r


def _try_scale(m, statistic):
    try:
        return margins.scale_from_margins(m, statistic=statistic)
    except ValueError:
        return float("nan")


# How far past the sweep's end a target is sought: accuracy creeps towards 1/K
# only slowly, so targets just above chance need sigma beyond the sweep's end.
SEARCH_REACH = 1000.0


def _search_range(cal: Calibration) -> tuple[float, float]:
    return float(cal.sweep.sigma[0]) / 10.0, float(cal.sweep.sigma[-1]) * SEARCH_REACH


def saturated_sigma(cal: Calibration) -> float:
    """What a saturated target serves: the largest sigma the sweep measured.

    Parameters
    ----------
    cal : Calibration

    Returns
    -------
    float
    """
    return float(cal.sweep.sigma[-1])


def _record(cal: Calibration, **fields) -> TargetRecord:
    sigma = float(fields.pop("sigma"))
    v = float(margins.normalized_noise(sigma, cal.scale))
    return TargetRecord(sigma=sigma, v=v, **fields)


def sigma_for_target(
    cal: Calibration,
    value: float,
    *,
    kind: str = "retention",
    inversion: str = "curve",
    saturate: bool = False,
) -> TargetRecord:
    """The noise sigma* that delivers a target on this model.

    Parameters
    ----------
    cal : Calibration
    value : float
        Absolute accuracy (kind="accuracy"), fraction of A0 (kind="retention")
        or agreement with the clean prediction (kind="agreement").
    kind : {"retention", "accuracy", "agreement"}
    inversion : {"curve", "logistic"}, default "curve"
        Ignored for agreement (the exact pi(sigma), or the Monte-Carlo one
        when ``cal.curve_method`` is "monte-carlo").
    saturate : bool, default False
        A target the curve cannot reach returns the largest sigma the sweep
        measured (:func:`saturated_sigma`, flagged ``saturated``) instead of raising.

    Returns
    -------
    TargetRecord
        sigma = 0 when the target asks for no degradation (A* >= A0, agreement >= 1).

    Raises
    ------
    ValueError
        Unknown kind, a value outside (0, 1], labels missing for accuracy
        targets, or an unreachable target without ``saturate``.
    """
    if kind not in CALIBRATED_KINDS:
        raise ValueError(f"kind must be one of {CALIBRATED_KINDS}, got {kind!r}")
    if inversion not in INVERSIONS:
        raise ValueError(f"inversion must be one of {INVERSIONS}, got {inversion!r}")
    value = float(value)
    if kind == "retention":
        # A retention of 1 or more asks for no degradation (sigma = 0).
        if not (np.isfinite(value) and value > 0.0):
            raise ValueError(f"retention target must be a positive fraction of A0, got {value}")
    elif not (np.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{kind} target must be a number in (0, 1], got {value}")
    if kind == "agreement":
        return _agreement_target(cal, value, saturate=saturate)
    if not cal.has_labels:
        raise ValueError(f"{kind} targets need labels; this file has none (agreement targets do not)")
    a0 = cal.clean_accuracy
    accuracy = value if kind == "accuracy" else value * a0
    u_target = float(margins.normalized_utility(accuracy, clean=a0, n_classes=cal.n_classes))
    sig_log = (logistic_sigma(cal.fit, u_target, scale=cal.scale, saturate=True)
               if cal.fit_quantity == "accuracy" else float("nan"))

    def result(sigma, method, saturated=False):
        return _record(cal, kind=kind, requested=value, accuracy=accuracy, retention=accuracy / a0,
                       agreement=None, sigma=sigma, sigma_logistic=sig_log, method=method,
                       saturated=saturated)

    if accuracy >= a0:
        return result(0.0, "none-needed")
    if inversion == "logistic":
        if not np.isfinite(sig_log):
            return _unreachable(cal, kind, value, accuracy, saturate, result, "logistic")
        return result(sig_log, "logistic")
    lo, hi = _search_range(cal)
    mc = cal.intervals.guide("accuracy")
    try:
        s_mc = first_crossing(mc, accuracy, lo=lo, hi=hi)
    except ValueError:
        return _unreachable(cal, kind, value, accuracy, saturate, result, "curve")
    if cal.curve_method == "monte-carlo":
        return result(s_mc, "monte-carlo-curve")
    engine = cal.engine
    try:
        s = solve_near(lambda s: float(engine.accuracy(s)[0]), accuracy, guess=s_mc,
                       slope=_slope(mc, s_mc))
    except ValueError:
        return _unreachable(cal, kind, value, accuracy, saturate, result, "curve")
    return result(s, "exact-curve")


def _unreachable(cal, kind, value, accuracy, saturate, result, how):
    if saturate:
        return result(saturated_sigma(cal), f"saturated-{how}", saturated=True)
    raise ValueError(
        f"{kind} target {value:g} (accuracy {accuracy:.4f}) is out of reach: accuracy under noise "
        f"only falls towards chance 1/K={cal.chance:.4f} and the {how} never reaches it "
        "(use a higher target, or saturate)"
    )


def _agreement_target(cal: Calibration, value: float, *, saturate: bool) -> TargetRecord:
    def result(sigma, method, saturated=False):
        return _record(cal, kind="agreement", requested=value, accuracy=None, retention=None,
                       agreement=value, sigma=sigma, sigma_logistic=None, method=method,
                       saturated=saturated)

    if value >= 1.0:
        return result(0.0, "none-needed")
    if value <= cal.chance:
        if saturate:
            return result(saturated_sigma(cal), "saturated-exact-agreement", saturated=True)
        raise ValueError(
            f"agreement target {value:g} is out of reach: agreement only falls towards chance "
            f"1/K={cal.chance:.4f}, and never reaches it"
        )
    lo, hi = _search_range(cal)
    try:
        guess = first_crossing(cal.intervals.guide("agreement"), value, lo=lo, hi=hi)
    except ValueError:
        guess = hi
    else:
        if cal.curve_method == "monte-carlo":
            return result(guess, "monte-carlo-agreement")
    s = sigma_for_agreement(cal.engine, value, guess=guess, slope=_slope(cal.intervals.guide("agreement"), guess))
    return result(s, "exact-agreement")


def _slope(curve: Callable, sigma: float, rel: float = 0.05) -> float:
    """d curve / d sigma by a central difference on the (instant) guide curve."""
    lo, hi = curve(np.array([sigma * (1 - rel), sigma * (1 + rel)]))
    return float((hi - lo) / (2 * rel * sigma))


def measured_accuracy(cal: Calibration, sigma) -> np.ndarray:
    """The accuracy the calibration's curve predicts at sigma (exact or Monte-Carlo, by its policy).

    Parameters
    ----------
    cal : Calibration
    sigma : float or 1-D array_like of float >= 0

    Returns
    -------
    ndarray of shape (n_sigma,)

    Raises
    ------
    ValueError
        The calibration has no labels, or an invalid sigma.
    """
    return cal.engine.accuracy(sigma)


def measured_agreement(cal: Calibration, sigma) -> np.ndarray:
    """The agreement the calibration's curve predicts at sigma (exact or Monte-Carlo, by its policy).

    Parameters
    ----------
    cal : Calibration
    sigma : float or 1-D array_like of float >= 0

    Returns
    -------
    ndarray of shape (n_sigma,)

    Raises
    ------
    ValueError
        An invalid sigma.

    Notes
    -----
    The mean of Eq. ``top1-exact`` over the rows.
    """
    return cal.engine.agreement(sigma)
