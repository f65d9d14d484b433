"""Serving a decided level: the same noise work for every request, whatever its level.

Level j >= 1 serves the noise of ``Perturber.from_config(config, target=I_j,
key=key)``. Those Perturbers share the config's ladder of sigmas: the one at
ladder position m adds eps_m = sum_{i<=m} c_i xi_i (nested levels), so its
cost grows with m. To keep the level out of the response time, every request
(clean, flagged at any level, or shadow) draws xi_1..xi_M once, M the
policy's top position, forms the running sum, and each row takes the partial
sum of its own level; clean and shadow rows discard it and get an equal copy.
The draws and the order of the float64 additions are the Perturbers' own, so
a flagged row gets bit for bit what its level's Perturber returns.

With ``fresh`` seeding a request draws one standard-normal matrix and each
row scales it by its level's sigma.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..serving import keyed_noise
from ..serving.rows import check_values, encode_row_ids, row_shape
from ..serving.runtime import Perturber, level_increments
from ..validation import is_torch


def _largest(dtype) -> float:
    if isinstance(dtype, np.dtype):
        return float(np.finfo(dtype).max)
    import torch

    return float(torch.finfo(dtype).max)


class LevelNoise:
    """The policy's levels over the config's ladder (level 0: served clean)."""

    def __init__(self, policy, *, key):
        with warnings.catch_warnings():  # a saturated target is a policy choice, said when it was made
            warnings.simplefilter("ignore")
            self.perturbers = (None,) + tuple(
                Perturber.from_config(policy.config, target=lv.target, seeding=policy.seeding, key=key)
                for lv in policy.levels[1:])
        top = self.perturbers[-1]
        self.seeding = policy.seeding
        self.n_classes = top.n_classes
        self.sigmas = (0.0,) + tuple(p.sigma for p in self.perturbers[1:])
        # Ladder position of each policy level, and the increments c_i up to the top one.
        self.positions = (0,) + tuple(p.level for p in self.perturbers[1:])
        self.increments = level_increments(top.levels, top.level)
        self.noise_bound = keyed_noise.MAX_ABS_NORMAL * float(np.sum(self.increments))
        self._top = top
        self.top = len(self.perturbers) - 1
        self._generator = np.random.Generator(np.random.SFC64())

    def serve(self, logits, ids, segments, *, shadow: bool):
        """``logits`` with each segment's rows at its level; ``segments`` is ((level, rows), ...) in row order.

        Returns the input's type, dtype, device and shape; with ``shadow`` (or
        only level-0 rows) an equal copy. Raises ValueError/TypeError as
        ``Perturber.perturb`` does, before any draw.
        """
        return self.assemble(self.prepare(logits, ids), segments, shadow=shadow)

    def check(self, logits, ids):
        """Validate a request as ``Perturber.perturb`` does; returns what :meth:`prepare` needs."""
        n_rows, n_classes, single_row = row_shape(logits)
        if n_classes != self.n_classes:
            raise ValueError(f"logits have n_classes={n_classes}, but the config was calibrated for "
                             f"n_classes={self.n_classes}")
        encoded = None if ids is None else encode_row_ids(ids, n_rows, single_row=single_row)
        if encoded is None and self.seeding == "per-input":
            raise ValueError("per-input seeding needs ids (one str/bytes per row), got ids=None")
        torch_in = is_torch(logits)
        largest = _largest(logits.dtype if torch_in else np.asarray(logits).dtype)
        if self.noise_bound >= largest / 2:
            raise ValueError(f"the policy's top sigma can add noise up to {self.noise_bound:.3g}, beyond "
                             f"half the largest {logits.dtype} value ({largest:.3g})")
        check_values(logits, limit=largest - self.noise_bound)
        return (logits, encoded, n_rows, n_classes)

    def prepare(self, logits, ids, checked=None):
        """Every level's noise for the request's rows (the same work whatever will be decided)."""
        logits, encoded, n_rows, n_classes = checked or self.check(logits, ids)
        if is_torch(logits):
            values = logits.detach()
            rows, device = values.reshape(n_rows, n_classes), values.device
        else:
            rows, device = np.asarray(logits).reshape(n_rows, n_classes), None
        if self.seeding == "fresh":
            draw = self._generator.standard_normal((n_rows, n_classes))
            return logits, rows, device, {"fresh": draw}
        digests = keyed_noise.row_digests(encoded)
        wanted = set(self.positions[1:])
        partial, running = {}, None
        for position, increment in enumerate(self.increments, start=1):
            if increment != 0.0:
                xi = self._top.unit_draw(position, digests, rows, n_classes, device=device)
                xi *= increment
                running = xi if running is None else (running.add_(xi) if device is not None else _iadd(running, xi))
            if position in wanted:
                partial[position] = running.clone() if device is not None else running.copy()
        return logits, rows, device, partial

    def assemble(self, prepared, segments, *, shadow: bool):
        """The served logits from :meth:`prepare`'s noise and the decided ``segments``."""
        logits, rows, device, partial = prepared
        if shadow or all(level == 0 for level, _ in segments):
            return logits.detach().clone() if device is not None else np.array(logits, copy=True)
        if "fresh" in partial:
            scale = np.concatenate([np.full(n, self.sigmas[level]) for level, n in segments])[:, None]
            noise = partial["fresh"] * scale
            if device is not None:
                import torch

                noise = torch.from_numpy(noise).to(device)
        elif len(segments) == 1:
            noise = partial[self.positions[segments[0][0]]]
        else:
            noise = partial[self.positions[self.top]]  # overwritten row range by row range
            start = 0
            for level, n in segments:
                noise[start:start + n] = 0.0 if level == 0 else partial[self.positions[level]][start:start + n]
                start += n
        noise += rows  # in float64, as the Perturber adds
        if device is not None:
            return noise.reshape(logits.shape).to(logits.dtype)
        return noise.reshape(np.shape(logits)).astype(np.asarray(logits).dtype, copy=False)


def _iadd(a, b):
    a += b
    return a
