"""Mean and spread of a quantity over replicate seeds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation over seeds (sd None for one seed).

    Attributes
    ----------
    mean : float
        NaN for no values.
    sd : float or None
    n : int
    """

    mean: float
    sd: float | None
    n: int

    @classmethod
    def of(cls, values) -> "Spread":
        """The spread of ``values``, skipping None and non-finite ones.

        Parameters
        ----------
        values : iterable of float or None

        Returns
        -------
        Spread
        """
        v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
        if v.size == 0:
            return cls(math.nan, None, 0)
        return cls(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else None, int(v.size))

    def to_dict(self) -> dict:
        """Plain JSON values: ``{"mean", "sd", "n"}`` (a NaN mean as None)."""
        return {"mean": None if math.isnan(self.mean) else self.mean, "sd": self.sd, "n": self.n}

