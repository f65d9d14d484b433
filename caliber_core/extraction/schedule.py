"""The optimizer settings a batch of students trains with (:class:`Schedule`).

Apart from :mod:`.distill`, which imports torch, so that a result that records
its schedule (an extraction report, the dashboard's archive of runs) can be read
without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Optimizer settings shared by the students of one batch.

    Attributes
    ----------
    epochs : int
        Largest number of passes over a student's training rows, unless
        ``min_steps`` asks for more. Few: on noisy answers a student that
        keeps training fits the noise (measured on a 3,000-row pool at
        D = 784: 12-15 passes beat 30 by 1.5 points at the 75% target and by
        5 at a stronger sigma, and match them on clean answers).
    batch_size : int
        Rows per Adam step.
    learning_rate : float
        Adam step size.
    min_steps : int
        Small pools get more epochs, so that every student takes at least
        this many Adam steps.
    patience : int
        Stop a student once its mean KL over an epoch has not improved by a
        relative ``tolerance`` for this many epochs (early stop).
    tolerance : float
    """

    epochs: int = 12
    batch_size: int = 128
    learning_rate: float = 3e-3
    min_steps: int = 400
    patience: int = 3
    tolerance: float = 2e-3

    def __post_init__(self):
        for name in ("epochs", "batch_size", "min_steps", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("learning_rate", "tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
