"""Surrogate-retention targets in the config contract (``caliber.config/v2``).

A ``--surrogate-retention R`` answer becomes a :class:`~caliber_core.config.TargetRecord`
of kind ``"surrogate-retention"`` next to the calibrated retention targets, so
a serving process reads its sigma like any other (``sigma_to_serve``,
``Perturber.from_config``). Its ``attacker`` field records how the sigma was
measured: the frontier attacker's recipe, the student, the seeds and the
retention reached, with their spreads.

The config ``--out`` writes gives every target, calibrated or surrogate, the
same ``interval`` and drift ``reference`` as ``calibrate`` does: the teacher's
accuracy, retention and agreement at the sigma served, with their bootstrap
interval over the pool's rows (seeded by the run's ``--seed``).
"""

from __future__ import annotations

import numpy as np

from ..calibration.calibrate import measured_accuracy, sigma_for_target
from ..calibration.margins import normalized_noise
from ..calibration.target_intervals import interval_estimator, with_interval
from ..calibration.config_build import build_config
from ..config import TargetRecord
from .experiment import ExtractionResult

METHOD = "surrogate-retention-search"


def surrogate_records(result: ExtractionResult) -> list[TargetRecord]:
    """One record per reachable surrogate-retention target of ``result``.

    Parameters
    ----------
    result : ExtractionResult

    Returns
    -------
    list of TargetRecord
        With the attacker's recipe, student and seeds; accuracy measured at the found sigma.

    Notes
    -----
    v from Eq. normalized-noise.
    """
    cal = result.calibration
    s = result.settings
    out = []
    for c in result.targets:
        if c.kind != "surrogate-retention" or not c.by_recipe:
            continue
        accuracy = float(np.atleast_1d(measured_accuracy(cal, c.sigma))[0])
        out.append(TargetRecord(
            kind="surrogate-retention", requested=float(c.requested), accuracy=accuracy,
            retention=accuracy / cal.clean_accuracy, agreement=None,
            v=float(normalized_noise(c.sigma, cal.scale)), sigma=float(c.sigma), sigma_logistic=None,
            method=METHOD,
            attacker={
                "recipe": result.frontier_attacker.to_dict(),
                "student": {"architecture": s.architecture,
                            "hidden": s.hidden if s.architecture == "mlp" else None},
                "seeds": list(result.seeds),
                "near_seeds": s.n_near(),
                "base_seed": s.seed,
                "sigma_se": c.sigma_se,
                "surrogate_retention": c.frontier_retention.to_dict() if c.frontier_retention else None,
                "teacher_accuracy_eval": c.teacher_accuracy,
                "source": result.archive.source,
            },
        ))
    return out


def with_intervals(result: ExtractionResult, records: list[TargetRecord]) -> list[TargetRecord]:
    """``records`` served at their own sigma, each with its ``interval`` and drift ``reference``.

    Parameters
    ----------
    result : ExtractionResult
    records : list of TargetRecord

    Returns
    -------
    list of TargetRecord
    """
    estimator = interval_estimator(result.calibration, seed=result.settings.seed)
    return [with_interval(result.calibration, r, estimator, side="point") for r in records]


def extraction_config(result: ExtractionResult) -> dict:
    """A config holding the calibrated retention targets, then the surrogate-retention ones, with intervals.

    Parameters
    ----------
    result : ExtractionResult
        With its calibration of the pool.

    Returns
    -------
    dict
        A ``caliber.config/v2`` config.

    Notes
    -----
    Retention targets by Eq. util-norm and Eq. inverse-v.
    """
    cal = result.calibration
    records = [sigma_for_target(cal, r, kind="retention") for r in result.settings.retention]
    records += surrogate_records(result)
    return build_config(cal, with_intervals(result, records), sha256=result.archive.sha256,
                        source=result.archive.source)
