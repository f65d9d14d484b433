"""``check`` for a top-k logprob log's config: does a new log still give each target's agreement?

A log's config (``calibrate LOG --agreement X --vocab-size V``) records, for
each target, the sigma served and the certified range of the mean agreement
there on the calibration log (``interval.agreement``: the bounds over every
unseen tail). A new log of the same model is read with the config's V; at
each target's sigma its per-position bounds give the new mean's certified
range [mean lower, mean upper]. Positions are a sample, so each end is widened
by z times the standard error of a difference of two sample means (the new
log's per-position spread, over the new and the calibration counts), z at the
check's confidence split over the targets (Bonferroni: simultaneous). The log
is consistent when, at every target, the widened new range meets the config's.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..calibration.topk_bounds import TopKRows, agreement_bounds
from ..loading.logprob_logs import read_logprob_log
from ..loading.safety import display_name, fail

TOPK_METHOD = "topk-certified-agreement"


def is_log_config(config: dict) -> bool:
    """Whether a config was calibrated on a top-k logprob log."""
    return (config.get("inversion") or {}).get("agreement_targets") == TOPK_METHOD and "bounds" in config


def check_log(config: dict, content: bytes, filename: str, *, confidence: float) -> tuple[bool, list[str]]:
    """Compare a new log with a log's config.

    Parameters
    ----------
    config : dict
        A loaded logprob-log config (:func:`is_log_config`).
    content : bytes
        The new log.
    filename : str
        Its name, for messages.
    confidence : float
        Simultaneous level over the targets.

    Returns
    -------
    consistent : bool
    lines : list of str
        One line per target, then a summary.

    Raises
    ------
    LogitsFileError
        A log the reader refuses, or rows that do not fit the config's V.
    """
    src = display_name(filename)
    vocab = int(config["bounds"]["vocab_size"])
    log = read_logprob_log(content, filename)
    try:
        rows = TopKRows.from_logprobs(log.logprobs, vocab_size=vocab)
    except ValueError as err:
        raise fail(src, str(err)) from None
    targets = config["targets"]
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / (2 * len(targets)))
    n_new, n_cal = rows.n_rows, int(config.get("n_samples") or rows.n_rows)
    consistent, lines = True, []
    for t in targets:
        lower, upper = agreement_bounds(rows, float(t["sigma"]))
        spread = max(float(np.std(lower, ddof=1)) if n_new > 1 else 0.0,
                     float(np.std(upper, ddof=1)) if n_new > 1 else 0.0)
        tol = z * spread * math.sqrt(1.0 / n_new + 1.0 / n_cal)
        low, high = float(lower.mean()) - tol, float(upper.mean()) + tol
        cfg_low, cfg_high = (float(x) for x in t["interval"]["agreement"])
        ok = low <= cfg_high and cfg_low <= high
        consistent &= ok
        lines.append(f"agreement at sigma={t['sigma']:.4g} (target {t['requested']:g}, {t['side']}): config "
                     f"[{cfg_low:.4f}, {cfg_high:.4f}], new log [{float(lower.mean()):.4f}, "
                     f"{float(upper.mean()):.4f}] ± {tol:.4f}: {'consistent' if ok else 'MOVED'}")
    lines.append(f"{'consistent' if consistent else 'drift'}: {len(targets)} targets at {confidence:.0%} "
                 f"(simultaneous), {n_new:,} positions against the config's {n_cal:,} (V={vocab:,})")
    return consistent, lines
