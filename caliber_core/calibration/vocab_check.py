"""``check`` on a full-vocabulary dump: the drift comparisons on the streamed reduction, no Monte Carlo.

:func:`caliber_core.calibration.drift.check_drift` needs every row's value at each
target's sigma; on a 2,000 x 32,000 dump its Monte-Carlo rows take minutes. The
streamed reduction (:func:`.vocab_stream.reduce_file`, one pass, memory-mapped)
already brackets each row's agreement and expected accuracy
(:func:`.vocab_sigma.bounds_at`), so :func:`check_reduced` makes the same
comparisons from it, with the same findings and messages:

* per target, its own quantity and the agreement, where the config can say what
  the calibration sample delivered (its ``reference``, the point target's value,
  or the midpoint of a certified interval, as a streamed config records);
  the new sample's value is the midpoint of its rows' bounds;
* A0 (labels) and the median top-two margin S, both exact in the reduction.

The range of a target's quantity is the prediction interval of
:mod:`.drift` (each row's spread from its bounds' midpoint), widened by half
of each sample's certified bound width: the bounds hold the true values, so a
sample from the calibration population lands inside with at least the stated
simultaneous confidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..config import load_config
from ..target_record import check_confidence
from .drift import DriftReport, Finding, clean_accuracy_finding, expected_value, scale_finding, target_finding
from .gap_histogram import ReducedRows
from .target_intervals import is_certified
from .vocab_sigma import bounds_at, clean_accuracy

ROW_METHOD = "streamed bounds"
_QUANTITIES = ("accuracy", "retention", "agreement")


def _calibration_side(target: Mapping, quantity: str) -> tuple[float, float | None, float] | None:
    """(value on the calibration sample, its row sd or None, half its certified width) for one target."""
    found = expected_value(target, quantity)
    interval = target.get("interval") if isinstance(target.get("interval"), Mapping) else {}
    bounds = interval.get(quantity)
    certified = (is_certified(interval) and isinstance(bounds, (list, tuple)) and len(bounds) == 2
                 and all(isinstance(b, (int, float)) for b in bounds))
    half = 0.5 * (float(bounds[1]) - float(bounds[0])) if certified else 0.0
    if found is not None:
        return found[0], found[1], half
    if certified:  # a one-sided streamed target: its bounds bracket what sigma delivered
        return 0.5 * (float(bounds[0]) + float(bounds[1])), None, half
    return None


def _rows_at(reduced: ReducedRows, sigma: float, with_agreement: bool, a0: float | None):
    """Per quantity: (each row's bound midpoint, the mean half-width of its bounds); retention linearized."""
    b = bounds_at(reduced, sigma, agreement=with_agreement)
    out = {}
    if with_agreement:
        out["agreement"] = (0.5 * (b.agree_lo + b.agree_hi), float(np.mean(b.agree_hi - b.agree_lo)) / 2)
    if b.acc_lo is not None:
        acc_mid = 0.5 * (b.acc_lo + b.acc_hi)
        acc_half = float(np.mean(b.acc_hi - b.acc_lo)) / 2
        out["accuracy"] = (acc_mid, acc_half)
        retention = float(np.mean(acc_mid)) / a0
        # As drift: the ratio's influence rows (a_i - R c_i) / A0, centred on R.
        out["retention"] = (retention + (acc_mid - retention * reduced.correct) / a0, acc_half / a0)
    return out


def check_reduced(config, reduced: ReducedRows, *, confidence: float = 0.95) -> DriftReport:
    """Compare a config with a new full-vocabulary sample, streamed and reduced.

    Parameters
    ----------
    config : mapping, str or os.PathLike
        Any config :func:`caliber_core.config.load_config` accepts (streamed or Monte-Carlo).
    reduced : ReducedRows
        The new sample (:func:`.vocab_stream.reduce_file`; with labels for A0, accuracy and retention).
    confidence : float, default 0.95
        Simultaneous level of all ranges (Bonferroni over the comparisons).

    Returns
    -------
    DriftReport
        ``row_method`` is :data:`ROW_METHOD`.

    Raises
    ------
    ConfigError
        The config does not follow the schema.
    ValueError
        K differs from the config's, fewer than 2 rows, nothing to compare, or a bad confidence.
    """
    config = load_config(config)
    conf = check_confidence(confidence)
    k_cfg = config.get("n_classes")
    if reduced.n_classes != k_cfg:
        raise ValueError(f"the new sample must have the config's {k_cfg} classes, "
                         f"got logits of shape ({reduced.n_rows}, {reduced.n_classes})")
    n_new, n_cal = reduced.n_rows, int(config["n_samples"])
    if n_new < 2:
        raise ValueError(f"a drift check needs at least 2 rows, got n_samples={n_new}")
    labelled = reduced.has_labels
    plans = []  # (target index, target, quantity, expected, sd_cal, half width of the calibration bounds)
    for i, t in enumerate(config.get("targets", [])):
        if not isinstance(t.get("sigma"), (int, float)) or isinstance(t.get("sigma"), bool):
            continue
        kind = t.get("kind")
        wanted = ([kind] if kind in _QUANTITIES else []) + ([] if kind == "agreement" else ["agreement"])
        for q in wanted:
            if q != "agreement" and not labelled:
                continue
            cal = _calibration_side(t, q)
            if cal is not None:
                plans.append((i, t, q, *cal))
    a0_cal = config.get("clean_accuracy")
    a0_cal = float(a0_cal) if isinstance(a0_cal, (int, float)) and not isinstance(a0_cal, bool) else None
    check_a0 = labelled and a0_cal is not None
    scales = config.get("scales") if isinstance(config.get("scales"), Mapping) else {}
    s_cal = scales.get("median") if isinstance(scales.get("median"), (int, float)) else (
        config.get("scale") if config.get("statistic") == "median" else None)
    m = len(plans) + int(check_a0) + int(s_cal is not None)
    if m == 0:
        raise ValueError("nothing to compare: the config has no target with a sigma and no median scale")
    from scipy.special import ndtri

    zq = float(ndtri(1.0 - (1.0 - conf) / (2 * m)))
    a0_new = clean_accuracy(reduced) if labelled else None
    findings = []
    for sigma in sorted({float(t["sigma"]) for _, t, *_ in plans}):
        here = [p for p in plans if float(p[1]["sigma"]) == sigma]
        rows = _rows_at(reduced, sigma, any(p[2] == "agreement" for p in here), a0_new)
        for i, t, q, expected, sd_cal, half_cal in here:
            values, half_new = rows[q]
            observed, sd_new = float(np.mean(values)), float(np.std(values, ddof=1))
            sd_cal = sd_new if sd_cal is None else sd_cal
            half = zq * math.sqrt(sd_cal**2 / n_cal + sd_new**2 / n_new) + half_cal + half_new
            findings.append(target_finding(i, t, q, expected, observed, half, n_new))
    findings.sort(key=lambda f: (f.target, _QUANTITIES.index(f.quantity)))
    if check_a0:
        findings.append(clean_accuracy_finding(a0_cal, a0_new, zq, n_cal, n_new))
    if s_cal is not None:
        findings.append(scale_finding(float(s_cal), reduced.top_gaps[:, 0], zq, n_cal, n_new))
    return DriftReport(tuple(findings), n_new, n_cal, conf, ROW_METHOD)
