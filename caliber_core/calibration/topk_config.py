"""A config from a top-k logprob log: agreement targets served at a certified sigma.

The log holds no labels, so only agreement targets are possible. Each target is
solved on the side's bound of :mod:`.topk_bounds` (lower for at-least, upper
for at-most, their midpoint for point), and its record states the method, k, V
and both bounds at the sigma served: the bound's width there is how much the
unseen tail leaves open (each end is the agreement of a tail the log allows, so
no method narrows it with the same log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .. import __version__
from ..config import CERTIFIED_LEVEL, SCHEMA, SIDES, TargetRecord
from . import margins
from .fit import fit_logistic
from .vocab_sigma import guess_sigma
from .topk_bounds import SIDE_BOUND, TopKRows, mean_agreement_bounds, sigma_for_agreement_bound

METHOD = "topk-certified-agreement"
#: Points of the sigma grid the config's logistic (display only) is fitted to.
GRID_POINTS = 16


def config_for_logs(
    rows: TopKRows,
    targets: Sequence[tuple[str, float]],
    *,
    name: str,
    side: str = "at-least",
    sha256: str | None = None,
    source: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[list[TargetRecord], dict]:
    """Solve agreement targets on a log's certified bounds and build the config.

    Parameters
    ----------
    rows : TopKRows
    targets : sequence of (kind, value)
        Every kind must be "agreement".
    name : str
    side : {"at-least", "at-most", "point"}, default "at-least"
    sha256, source : str, optional
    progress : callable, optional
        Called with the fraction of targets done.

    Returns
    -------
    records, config : list of TargetRecord and the caliber.config/v2 dict

    Raises
    ------
    ValueError
        A non-agreement target (a log has no labels), an unknown side, a
        target the bound cannot reach, or rows with no positive margin.
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    wrong = [k for k, _ in targets if k != "agreement"]
    if wrong:
        raise ValueError(f"a logprob log has no labels: only --agreement targets apply, got {wrong[0]} "
                         "(accuracy and retention need labelled data, e.g. lm-eval samples)")
    m = rows.top_two_gaps()
    scale = margins.scale_from_margins(m[np.isfinite(m)], statistic="median")
    # The curve on a grid first (the config's band): it also places each target's first bracket.
    grid = np.geomspace(scale / 20.0, scale * 20.0, GRID_POINTS)
    lo, hi = mean_agreement_bounds(rows, grid)
    records = []
    for i, (kind, value) in enumerate(targets):
        sigma = sigma_for_agreement_bound(rows, value, side=side,
                                          guess=guess_sigma(grid, lo, hi, value, side=side))
        at_lo, at_hi = mean_agreement_bounds(rows, sigma)
        interval = {
            "level": CERTIFIED_LEVEL,  # a certified bound, not a sampling interval; the schema wants (0, 1)
            "method": f"certified bounds over every unseen tail (k={rows.shown}, V={rows.vocab_size}); "
                      f"{SIDE_BOUND[side]} bound inverted",
            "accuracy": None, "retention": None,
            "agreement": [float(at_lo[0]), float(at_hi[0])],
        }
        records.append(TargetRecord(
            kind="agreement", requested=float(value), accuracy=None, retention=None,
            agreement=float(value), v=float(margins.normalized_noise(sigma, scale)), sigma=float(sigma),
            sigma_logistic=None, method=METHOD, side=side, interval=interval,
        ))
        if progress is not None:
            progress((i + 1) / len(targets))
    if records and max(r.sigma for r in records) > grid[-1]:  # the config's sweep must cover every sigma
        grid = np.geomspace(scale / 20.0, 2.0 * max(r.sigma for r in records), GRID_POINTS)
        lo, hi = mean_agreement_bounds(rows, grid)
    v = np.asarray(margins.normalized_noise(grid, scale))
    chance = 1.0 / rows.vocab_size
    fit = fit_logistic(v, (0.5 * (lo + hi) - chance) / (1.0 - chance))
    config = {
        "schema": SCHEMA,
        "generator": f"caliber_core {__version__}",
        "model": name,
        "source": source,
        "sha256": sha256,
        "n_samples": rows.n_rows,
        "n_classes": rows.vocab_size,
        "statistic": "median",
        "scale": scale,
        "scales": {"median": scale},
        "clean_accuracy": None,
        "chance": chance,
        "sweep": {"realizations": 0, "seed": None, "n_points": int(grid.size),
                  "v_min": float(v[0]), "v_max": float(v[-1])},
        "fit": {"mode": "per-model", "law": "logistic", "quantity": "agreement", **fit.to_dict()},
        "inversion": {
            "accuracy_targets": None,
            "agreement_targets": METHOD,
            "note": "top-k logprob log: sigma inverts a certified bound of the mean agreement over every "
                    "tail consistent with the shown logprobs (V - k unseen classes, each at or below the "
                    "k-th, holding the leftover mass); the logistic is fitted to the bounds' midpoint "
                    "for display only",
        },
        "bounds": {
            "method": "top-k certified agreement bounds (extremal unseen tails: both ends attained)",
            "k": rows.shown,
            "vocab_size": rows.vocab_size,
            "side": side,
            "widths": [r.interval["agreement"][1] - r.interval["agreement"][0] for r in records],
            "sigma": [float(x) for x in grid],
            "agreement_lower": [float(x) for x in lo],
            "agreement_upper": [float(x) for x in hi],
        },
        "targets": [r.to_dict() for r in records],
    }
    return records, config
