"""Distillation batches split over worker processes.

A student's result depends only on its own seed, answers and recipe, never
on the other students of its batch (:mod:`.distill`), so a batch can be cut
in two and trained in two processes with the same numbers as in one. With
``processes = 2`` a spawned worker trains the first part of every batch while
the calling process trains the rest; each process runs torch single-threaded.
On a 2-core machine that is otherwise idle this nearly halves the wall time
of a batch; when other work already occupies the cores it gains little.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

import numpy as np
import torch

from .distill import Schedule, distill
from .students import StudentBatch, StudentShape

_INPUTS: torch.Tensor | None = None


def _init_worker(inputs: np.ndarray) -> None:
    global _INPUTS
    torch.set_num_threads(1)
    _INPUTS = torch.from_numpy(inputs)


def _work(targets, shape, temperatures, weight_decays, seeds, train_rows, schedule) -> list[np.ndarray]:
    students = distill(_INPUTS, targets, shape=shape, temperatures=temperatures, weight_decays=weight_decays,
                       seeds=seeds, train_rows=train_rows, schedule=schedule)
    return [p.numpy() for p in students.params]


class DistillPool:
    """Trains distillation batches in ``processes`` processes (the caller's included).

    Parameters
    ----------
    inputs : Tensor of shape (n_samples, n_features), float32
        The thief's standardized pool inputs, sent once to each worker.
    processes : int
        1 trains in the calling process only; 2 adds one spawned worker.

    Use :meth:`close` (or a ``with`` block) to end the worker.
    """

    def __init__(self, inputs: torch.Tensor, *, processes: int):
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a positive integer, got {processes!r}")
        self.inputs = inputs
        self.processes = processes
        self._pool = None
        if processes > 1:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(processes - 1, initializer=_init_worker,
                                  initargs=(inputs.numpy().copy(),))

    def distill(self, targets: Sequence[np.ndarray], *, shape: StudentShape, temperatures: Sequence[float],
                weight_decays: Sequence[float], seeds: Sequence[int],
                train_rows: Sequence[np.ndarray] | None = None, schedule: Schedule = Schedule()) -> StudentBatch:
        """:func:`~caliber_core.extraction.distill.distill` on ``targets``, split over the processes.

        Parameters
        ----------
        targets : sequence of ndarray
            One target matrix per student.
        shape : StudentShape
        temperatures, weight_decays : sequence of float
            Per student.
        seeds : sequence of int
            Per student.
        train_rows : sequence of ndarray, optional
            Rows each student trains on (default: every input).
        schedule : Schedule, default Schedule()

        Returns
        -------
        StudentBatch
            The students in ``targets`` order, the same whatever the process count.
        """
        n = len(targets)
        if train_rows is None:
            train_rows = [np.arange(self.inputs.shape[0])] * n
        if self._pool is None or n < 2:
            return distill(self.inputs, targets, shape=shape, temperatures=temperatures,
                           weight_decays=weight_decays, seeds=seeds, train_rows=train_rows, schedule=schedule)
        cut = n // self.processes
        parts = [slice(0, cut), slice(cut, n)]
        remote = self._pool.apply_async(_work, (
            [np.asarray(t, dtype=np.float32) for t in targets[parts[0]]], shape, list(temperatures[parts[0]]),
            list(weight_decays[parts[0]]), list(seeds[parts[0]]), list(train_rows[parts[0]]), schedule))
        local = distill(self.inputs, targets[parts[1]], shape=shape, temperatures=temperatures[parts[1]],
                        weight_decays=weight_decays[parts[1]], seeds=seeds[parts[1]],
                        train_rows=train_rows[parts[1]], schedule=schedule)
        first = [torch.from_numpy(p) for p in remote.get()]
        return StudentBatch.from_params(shape, [torch.cat([a, b]) for a, b in zip(first, local.params)])

    def close(self) -> None:
        """End the worker process (if any)."""
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> "DistillPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
