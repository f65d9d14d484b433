"""Serving a decided level: the same noise work for every request, whatever its level.

Level j >= 1 is served by ``Perturber.from_config(config, target=I_j, key=key)``,
so a flagged account gets exactly the noise the config's own Perturber adds.
To keep the level out of the response time, every request (clean, flagged or
shadow) computes every level's noise over all its rows and then picks each
row's level; clean and shadow rows discard what was computed and return an
equal copy.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..serving.runtime import Perturber
from ..validation import is_torch


class LevelNoise:
    """The policy's levels as Perturbers (index 0: None, served clean)."""

    def __init__(self, policy, *, key):
        with warnings.catch_warnings():  # a saturated target is a policy choice, said at init time
            warnings.simplefilter("ignore")
            self.perturbers = (None,) + tuple(
                Perturber.from_config(policy.config, target=lv.target, seeding=policy.seeding, key=key)
                for lv in policy.levels[1:])
        self.top = len(self.perturbers) - 1

    def serve(self, logits, ids, segments, *, shadow: bool):
        """``logits`` with each segment's rows at its level; ``segments`` is ((level, rows), ...).

        Returns the noisy array or tensor (same type, dtype, device and shape);
        with ``shadow`` (or only level-0 rows) an equal copy of the input.
        Every call computes every level's noise over all rows, so its cost does
        not depend on the levels decided.
        """
        noisy = [None] + [p.perturb(logits, ids) for p in self.perturbers[1:]]
        clean = _copy(logits)
        if shadow:
            return clean
        if len(segments) == 1:
            level = segments[0][0]
            return clean if level == 0 else noisy[level]
        # A batch that crossed a threshold: rows served at more than one level.
        start = 0
        for level, n in segments:
            if level > 0:
                clean[start:start + n] = noisy[level][start:start + n]
            start += n
        return clean


def _copy(logits):
    return logits.detach().clone() if is_torch(logits) else np.array(logits, copy=True)
