"""The thief's frontier for designs keyed on the input, beside the logit designs, across campaign sizes.

Every cell is measured as in :mod:`.thief_frontier` -- the design calibrated
on the campaign's pool rows for the user's retention target, the pool
answered as it would be served, every label-free thief distilled from those
answers, the strongest chosen on the evaluation labels -- except that an
input-keyed design (:mod:`.input_designs`) also sees the queries' inputs:

* its strength (the field's sigma, the cells' cut) is solved on the pool;
* the flagged user's retention is the teacher's accuracy on the evaluation
  split as served (its own cells, its own field values) over its clean one;
* the near-duplicate thief asks M copies of every query jittered by
  :data:`~.thief_frontier.NEAR_JITTER` standard deviations of every input
  feature (clean logits modelled as in :mod:`.thief_frontier`), served by
  the design at the copy's own inputs, and averages the answers;
* against the cells, the design-aware thief of :mod:`.cell_seams` swaps back
  what it finds on the seams and distills with
  :data:`~.thief_frontier.UNMIX_RECIPES` (prefix ``seams:``);
* where the archive holds the teacher's layers, the thief of
  :mod:`.input_copies` spends the same budget on fewer inputs and jittered
  copies of them, answered by the teacher at the copies and served by the
  design there (prefix ``copies<M>x<s>:``), against every design in the run
  (the logit designs too, so the strongest thief is the same set for all).

Logit designs in the same run go through
:func:`~.thief_frontier.frontier_cell` unchanged, so one table compares them
at one clean denominator. The column the frontier calls sigma/S holds an
input design's strength: sigma/S for the field, the cut t for the cells.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..calibration.margins import margin_scale
from .cell_seams import unswapped
from .input_copies import archive_teacher, copy_thief_scores
from .input_designs import INPUT_DESIGNS, input_design
from .noise_designs import design as logit_design
from .thief_frontier import (HARD_RECIPES, NEAR_JITTER, NEAR_RECIPES, SOFT_RECIPES, UNMIX_RECIPES, Frontier,
                             frontier_cell, measure_frontier, prefixed, thief_scores, worker_archive)

SEAMS = "seams:"  # the design-aware thief of :mod:`.cell_seams`


def input_frontier_cell(task) -> dict:
    """One (design, level, key): the design's strength, the user's retention and every thief's accuracy per seed.

    Parameters
    ----------
    task : tuple
        (design, level, key index, seeds, near-duplicate copies), as
        :func:`~.thief_frontier.measure_frontier` schedules it.

    Returns
    -------
    dict
        ``task``, ``sigma_over_s`` (the strength), ``user`` and ``scores``.
    """
    name, level, key_index, seeds, near = task
    if name not in INPUT_DESIGNS:
        return _with_copy_thief(frontier_cell(task))
    archive = worker_archive()
    pool, ev = archive.pool, archive.evaluation
    x, z, y = pool.inputs, pool.logits.astype(np.float64), pool.labels
    a0 = float(np.mean(z.argmax(1) == y))
    key = b"caliber-frontier-key-" + str(key_index).encode()
    noise = input_design(name).calibrate(x, z, y, key, target=level * a0)
    served = noise.serve(x, z)
    a0_eval = float(np.mean(ev.logits.argmax(1) == ev.labels))
    user = float(np.mean(noise.serve(ev.inputs, ev.logits).argmax(1) == ev.labels)) / a0_eval
    scores = {**thief_scores(served, SOFT_RECIPES, seeds), **thief_scores(served, HARD_RECIPES, seeds, hard=True)}
    if input_design(name).family == "cells-swap":
        seam_scores = thief_scores(unswapped(x, served), UNMIX_RECIPES, seeds)
        scores.update({prefixed(SEAMS, k): v for k, v in seam_scores.items()})
    if near:
        scale = float(margin_scale(z))
        gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([key_index, 0xD0B])))
        spread = np.asarray(x, dtype=np.float64).std(axis=0)
        total = np.zeros_like(z)
        for _ in range(near):
            copy_x = x + gen.normal(0.0, NEAR_JITTER, x.shape) * spread
            copy_z = z + gen.normal(0.0, NEAR_JITTER * scale, z.shape)
            total += noise.serve(copy_x, copy_z)
        near_scores = thief_scores(total / near, NEAR_RECIPES, seeds)
        scores.update({prefixed(f"near{near}:", k): v for k, v in near_scores.items()})
    teacher = archive_teacher(archive.source)
    if teacher is not None:
        scores.update(copy_thief_scores(noise.serve, teacher, x, ev, archive.n_classes, seeds, seed=key_index))
    strength = noise.strength / float(margin_scale(z)) if input_design(name).family == "input-field" else noise.strength
    return {"task": task, "sigma_over_s": strength, "user": user, "scores": scores}


def _with_copy_thief(result: dict) -> dict:
    """A logit design's cell with the copy thief's scores added (the copies served by the design at the copies)."""
    name, level, key_index, seeds, _ = result["task"]
    archive = worker_archive()
    teacher = archive_teacher(archive.source)
    if name == "clean" or teacher is None:
        return result
    z = archive.pool.logits.astype(np.float64)
    scale = float(margin_scale(z))
    g = logit_design(name).build(z, b"caliber-frontier-key-" + str(key_index).encode(), scale=scale, target=level)
    sigma = result["sigma_over_s"] * scale

    def serve(inputs, logits):
        return logits + sigma * g(logits, [f"copy-{key_index}-{i}" for i in range(len(logits))])

    result["scores"].update(copy_thief_scores(serve, teacher, archive.pool.inputs, archive.evaluation,
                                              archive.n_classes, seeds, seed=key_index))
    return result


def measure_input_frontier(path: str, *, designs: Sequence[str], level: float = 0.75, keys: int = 3,
                           seeds: int = 1, near_duplicates: int = 16, processes: int = 1,
                           pool_rows: int | None = None,
                           progress: Callable[[int, int], None] | None = None) -> Frontier:
    """The frontier of logit and input-keyed designs together on one archive's first ``pool_rows`` queries.

    Parameters
    ----------
    path : str
        An extraction archive whose pool holds inputs.
    designs : sequence of str
        Names from :data:`~.input_designs.INPUT_DESIGNS` or :data:`~.noise_designs.DESIGNS`.
    level : float, default 0.75
        The flagged user's retention target.
    keys, seeds, near_duplicates, processes, pool_rows, progress
        As for :func:`~.thief_frontier.measure_frontier`.

    Returns
    -------
    Frontier

    Raises
    ------
    ValueError
        An unknown design, or a bad count or level.
    """
    for name in designs:
        if name not in INPUT_DESIGNS:
            logit_design(name)
    return measure_frontier(path, designs=designs, levels=[level], keys=keys, seeds=seeds,
                            near_duplicates=near_duplicates, processes=processes, pool_rows=pool_rows,
                            progress=progress, cell=input_frontier_cell)
