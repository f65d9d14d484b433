"""Does a deployed config still fit the traffic? A check against a new sample.

A config's sigma* was solved on one sample of rows. A new sample of the same
model's logits (last week's traffic of unflagged accounts, say) is a second
sample. If both come from the same population, what each sigma delivers on
the new sample differs from the config's value only by the sampling error of
*both* samples, so the expected range is a prediction interval:

    q_new - q_cal  ~  N(0, sd_cal^2 / N_cal + sd_new^2 / N_new)

where sd is the per-row standard deviation of the estimate's influence
function (:func:`.engine.row_spread`; retention linearizes as
(a_i - R c_i) / A0). The config stores q_cal and sd_cal per target in its
``reference`` record (:func:`target_reference`); for a config without it,
q_cal is the target's own value (point side) and sd_cal is estimated from the
new sample, which under the null has the same spread.

What is compared
----------------
* per target, at its sigma: the target's own quantity (accuracy, retention or
  agreement; accuracy and retention need labels for the new sample) and the
  agreement, which needs no labels;
* the clean accuracy A0 (labels needed): two independent proportions;
* the margin scale S as the median top-two margin: the calibration median
  sits at the population's 50% point up to 0.5 / sqrt(N_cal), the new one up
  to 0.5 / sqrt(N_new); the quantile band is turned into a range for S with the
  new sample's own margin quantiles (no density estimate needed).

All ranges are simultaneous at ``confidence``: with m comparisons each one
uses level 1 - (1 - confidence) / m (Bonferroni), so a sample from the
calibration population passes the whole check with probability at least
``confidence``. Normal ranges are adequate at the sample sizes this is meant
for (hundreds of rows and up).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from ..config import load_config
from ..target_record import check_confidence
from .engine import CurveEngine, row_spread, sample_estimates
from .sample import LogitSample

REPORT_SCHEMA = "caliber.check/v1"
_QUANTITIES = ("accuracy", "retention", "agreement")


@dataclass(frozen=True)
class Finding:
    """One comparison between the config and the new sample.

    Attributes
    ----------
    quantity : {"accuracy", "retention", "agreement", "scale", "clean_accuracy"}
    target : int or None
        Index into the config's targets (None for S and A0).
    sigma : float or None
        The target's sigma.
    expected : float
        The config's value (calibration sample).
    observed : float
        The new sample's value.
    low, high : float
        Range expected for a sample of this size from the calibration population.
    consistent : bool
        ``low <= observed <= high``.
    message : str
        One line: what moved, by how much, and "recalibrate" when it is outside.
    """

    quantity: str
    target: int | None
    sigma: float | None
    expected: float
    observed: float
    low: float
    high: float
    consistent: bool
    message: str

    def to_dict(self) -> dict:
        """The fields as a plain dict (JSON-ready)."""
        return asdict(self)


@dataclass(frozen=True)
class DriftReport:
    """All findings of one check, and the verdict.

    Attributes
    ----------
    findings : tuple of Finding
        One per compared quantity (S, A0, and each target's quantities).
    n_samples, n_calibration : int
        Rows of the new sample and of the calibration sample.
    level : float
        The confidence level of every range.
    row_method : str
        How the per-row values were computed ("exact" or "monte-carlo").
    """

    findings: tuple[Finding, ...]
    n_samples: int
    n_calibration: int
    level: float
    row_method: str

    @property
    def consistent(self) -> bool:
        """True when every finding lies in its expected range."""
        return all(f.consistent for f in self.findings)

    @property
    def problems(self) -> list[Finding]:
        """The findings outside their expected range."""
        return [f for f in self.findings if not f.consistent]

    def to_dict(self) -> dict:
        """The report as a JSON-ready dict, tagged with ``REPORT_SCHEMA``.

        Returns
        -------
        dict
            ``schema``, ``consistent``, ``level``, ``comparisons``, ``n_samples``,
            ``n_calibration``, ``rows`` and ``findings`` (each :meth:`Finding.to_dict`).
        """
        return {"schema": REPORT_SCHEMA, "consistent": self.consistent, "level": self.level,
                "comparisons": len(self.findings), "n_samples": self.n_samples,
                "n_calibration": self.n_calibration, "rows": self.row_method,
                "findings": [f.to_dict() for f in self.findings]}


def target_reference(rows: CurveEngine, sigma: float) -> dict:
    """What a sigma delivers on the calibration sample, with the spreads :func:`check_drift` needs.

    Stored per target in a config.

    Parameters
    ----------
    rows : CurveEngine
        The calibration sample's per-row source.
    sigma : float
        The target's sigma (>= 0).

    Returns
    -------
    dict
        ``{"accuracy": q, "retention": q, "agreement": q, "row_sd": {...same keys...}}``;
        accuracy and retention None without labels.

    Raises
    ------
    ValueError
        An invalid sigma.
    """
    rv = rows.at(float(sigma))
    est = sample_estimates(rv)
    out = {k: (None if est[k] is None else float(est[k][0])) for k in _QUANTITIES}
    out["row_sd"] = row_spread(rv)[0]
    return out


def percent(x: float) -> str:
    """A fraction as the check's lines print it (one decimal of a percent)."""
    return f"{100 * x:.1f}%"


def _number(config: Mapping, key: str):
    x = config.get(key)
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def expected_value(target: Mapping, quantity: str):
    """(q_cal, sd_cal or None) for one target, or None when the config cannot say."""
    ref = target.get("reference")
    if isinstance(ref, Mapping) and isinstance(ref.get(quantity), (int, float)):
        sd = ref.get("row_sd", {}).get(quantity) if isinstance(ref.get("row_sd"), Mapping) else None
        return float(ref[quantity]), (float(sd) if isinstance(sd, (int, float)) else None)
    # Without a reference the target value is what sigma delivers only on the point side.
    if target.get("side", "point") == "point" and isinstance(target.get(quantity), (int, float)):
        return float(target[quantity]), None
    return None


def check_drift(config, logits, labels=None, *, confidence: float = 0.95,
                seed: int | None = 0) -> DriftReport:
    """Compare a config with a new sample of the same model's logits.

    Parameters
    ----------
    config : mapping, str or os.PathLike
        A config in any form :func:`caliber_core.config.load_config` accepts (a v1
        file is upgraded): its targets' sigma, S, A0, N and per-target references.
    logits : array_like of shape (n_samples, n_classes), or LogitSample
        The new sample; K must match the config's. A loaded file's sample
        (:meth:`.sample.LogitSample.from_data`) is used as it is: its margins are not taken again.
    labels : array_like of int, shape (n_samples,), optional
        Without them only agreement and S are compared. Only with raw logits
        (a sample carries its own).
    confidence : float, default 0.95
        Simultaneous level of all ranges (Bonferroni over the comparisons).
    seed : int or None, default 0
        Seed of the Monte-Carlo rows when the sample is too large for quadrature.

    Returns
    -------
    DriftReport

    Raises
    ------
    ConfigError
        The config does not follow the schema.
    ValueError
        K differs from the config's, bad labels, or a confidence outside [0.5, 1).
    """
    config = load_config(config)
    conf = check_confidence(confidence)
    given = logits if isinstance(logits, LogitSample) else None
    if given is not None and labels is not None:
        raise ValueError("labels come with the LogitSample; pass them when building it")
    z = given.logits if given is not None else np.asarray(logits)
    k_cfg = config.get("n_classes")
    if z.ndim != 2 or z.shape[1] != k_cfg:
        raise ValueError(f"the new sample must have the config's {k_cfg} classes, "
                         f"got logits of shape {z.shape}")
    n_cal = int(config["n_samples"])
    sample = given if given is not None else LogitSample(z, labels, finite=True)
    if sample.n_samples < 2:
        raise ValueError(f"a drift check needs at least 2 rows, got n_samples={sample.n_samples}")
    rows = CurveEngine(sample, seed=seed)  # the one cost policy: exact, or the sweep's draws
    n_new = rows.n_samples
    targets = [(i, t) for i, t in enumerate(config.get("targets", []))
               if isinstance(t.get("sigma"), (int, float)) and not isinstance(t.get("sigma"), bool)]
    plans = []  # (target index, target, quantity, expected, sd_cal)
    for i, t in targets:
        kind = t.get("kind")
        wanted = [kind] if kind in _QUANTITIES else []
        wanted += [] if kind == "agreement" else ["agreement"]
        for q in wanted:
            if q != "agreement" and not rows.has_labels:
                continue
            exp = expected_value(t, q)
            if exp is not None:
                plans.append((i, t, q, *exp))
    a0_cal = _number(config, "clean_accuracy")
    check_a0 = rows.has_labels and a0_cal is not None
    scales = config.get("scales") if isinstance(config.get("scales"), Mapping) else {}
    s_cal = scales.get("median") if isinstance(scales.get("median"), (int, float)) else (
        _number(config, "scale") if config.get("statistic") == "median" else None)
    m = len(plans) + int(check_a0) + int(s_cal is not None)
    if m == 0:
        raise ValueError("nothing to compare: the config has no target with a sigma and no median scale")
    from scipy.special import ndtri

    zq = float(ndtri(1.0 - (1.0 - conf) / (2 * m)))

    findings = []
    if plans:
        # One sigma's rows at a time: all of them at once would hold 16 bytes a row per sigma.
        at_sigma = {s: _estimates_at(rows, s) for s in sorted({float(t["sigma"]) for _, t, *_ in plans})}
        for i, t, q, expected, sd_cal in plans:
            est, sds = at_sigma[float(t["sigma"])]
            observed, sd_new = float(est[q][0]), sds[q]
            sd_cal = sd_new if sd_cal is None else sd_cal
            half = zq * math.sqrt(sd_cal**2 / n_cal + sd_new**2 / n_new)
            findings.append(target_finding(i, t, q, expected, observed, half, n_new))
    if check_a0:
        a0_new = float(rows.correct.mean())
        findings.append(clean_accuracy_finding(a0_cal, a0_new, zq, n_cal, n_new))
    if s_cal is not None:
        findings.append(scale_finding(float(s_cal), sample.margins, zq, n_cal, n_new))
    return DriftReport(tuple(findings), n_new, n_cal, conf, rows.method)


def _estimates_at(rows: CurveEngine, sigma: float) -> tuple[dict, dict]:
    """Sample estimates and per-row spreads at one sigma (its rows are let go on return)."""
    rv = rows.at(sigma)
    return sample_estimates(rv), row_spread(rv)[0]


def target_finding(i, t, q, expected, observed, half, n_new) -> Finding:
    """The finding of target ``i``: consistent when ``observed`` lies within ``half`` of ``expected``."""
    lo, hi = expected - half, expected + half
    ok = bool(lo <= observed <= hi)
    req = t.get("requested")
    label = f"{t.get('kind')} {req:g} target" if isinstance(req, (int, float)) else f"{t.get('kind')} target"
    msg = (f"{label} (sigma={float(t['sigma']):.4g}): {q} {percent(observed)} on this sample, "
           f"expected {percent(lo)}-{percent(hi)} for N={n_new:,} (calibration {percent(expected)}, "
           f"moved {100 * (observed - expected):+.1f} points); " + ("consistent" if ok else "recalibrate"))
    return Finding(q, i, float(t["sigma"]), expected, observed, lo, hi, ok, msg)


def clean_accuracy_finding(a0_cal: float, a0_new: float, zq: float, n_cal: int, n_new: int) -> Finding:
    """The finding of the clean accuracy: the new rows' A0 against the calibration's, within their joint interval."""
    half = zq * math.sqrt(a0_cal * (1 - a0_cal) / n_cal + a0_new * (1 - a0_new) / n_new)
    lo, hi = a0_cal - half, a0_cal + half
    ok = bool(lo <= a0_new <= hi)
    msg = (f"clean accuracy A0 {percent(a0_cal)} -> {percent(a0_new)} ({100 * (a0_new - a0_cal):+.1f} points), "
           f"expected {percent(lo)}-{percent(hi)} for N={n_new:,}; " + ("consistent" if ok else "recalibrate"))
    return Finding("clean_accuracy", None, None, a0_cal, a0_new, lo, hi, ok, msg)


def scale_finding(s_cal: float, margins: np.ndarray, zq: float, n_cal: int, n_new: int) -> Finding:
    """The finding of the scale S: the new rows' median margin against the calibration's, within its interval."""
    s_new = float(np.median(margins))
    h = min(0.49, zq * 0.5 * math.sqrt(1.0 / n_cal + 1.0 / n_new))
    q_lo, q_hi = np.quantile(margins, [0.5 - h, 0.5 + h])
    # Consistent iff q_lo <= S_cal <= q_hi (the rank test); written as a range for S_new.
    lo, hi = s_cal - (q_hi - s_new), s_cal + (s_new - q_lo)
    ok = bool(lo <= s_new <= hi)
    msg = (f"margin scale S (median) {s_cal:.4g} -> {s_new:.4g} ({(s_new - s_cal) / s_cal:+.1%}), "
           f"expected {lo:.4g}-{hi:.4g} for N={n_new:,}; " + ("consistent" if ok else "recalibrate"))
    return Finding("scale", None, None, s_cal, s_new, float(lo), float(hi), ok, msg)
