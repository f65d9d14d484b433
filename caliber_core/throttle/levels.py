"""Serving a decided level: the same noise work for every request, whatever its level.

Level j >= 1 serves the noise of ``Perturber.from_config(config, target=I_j,
key=key)``. Those Perturbers share the config's ladder of sigmas: the one at
ladder position m adds eps_m = sum_{i<=m} c_i xi_i (nested levels), so its
cost grows with m. To keep the level out of the response time, every request
(clean, flagged at any level, or shadow) makes the draws xi_1..xi_M of the
policy's top position M: a row at level j gets ``keyed_noise.add_keyed_noise``
over the first draws, exactly what its level's Perturber computes (bit for
bit), and the draws above it are made on the same rows and discarded; clean
and shadow rows discard them all and get an equal copy. The row seeds (one
HMAC stream per ladder level) are taken before the decision, while a Redis
store runs its script.

With ``fresh`` seeding a request draws one standard-normal matrix and each
row scales it by its level's sigma.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..serving import keyed_noise
from ..serving.rows import check_request
from ..serving.runtime import Perturber, level_increments
from ..validation import check_key, is_torch


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
        self._key = check_key(key) if policy.seeding == "per-input" else None
        # The ladder draws the top level makes (a zero increment draws nothing, as in the Perturber),
        # and how many of them level j adds up.
        self._drawn = [(position, inc) for position, inc in enumerate(self.increments, start=1) if inc != 0.0]
        self._draws_at = (0,) + tuple(sum(1 for position, _ in self._drawn if position <= p)
                                      for p in self.positions[1:])
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
        n_rows, n_classes, _, encoded, _ = check_request(
            logits, ids, n_classes=self.n_classes, seeding=self.seeding, noise_bound=self.noise_bound,
            source="the policy's top sigma")
        return (logits, encoded, n_rows, n_classes)

    def prepare(self, logits, ids, checked=None):
        """What every level needs before the decision: the rows and each ladder level's row seeds."""
        logits, encoded, n_rows, n_classes = checked or self.check(logits, ids)
        torch_in = is_torch(logits)
        values = logits.detach() if torch_in else np.asarray(logits)
        rows = values.reshape(n_rows, n_classes)
        if self.seeding == "fresh":
            return logits, rows, torch_in, self._generator.standard_normal((n_rows, n_classes))
        digests = keyed_noise.row_digests(encoded)
        seeds = [keyed_noise.row_seeds(self._key, self._top.binding, position, digests, n_classes)
                 for position, _ in self._drawn]
        return logits, rows, torch_in, seeds

    def assemble(self, prepared, segments, *, shadow: bool):
        """The served logits for the decided ``segments``; the same draws whatever was decided.

        Rows at level j are ``add_keyed_noise`` over the first k_j ladder draws,
        what the level's own Perturber computes; the remaining draws up to the
        top are made too, on the same rows, and discarded.
        """
        logits, rows, torch_in, seeds = prepared
        if self.seeding == "fresh":
            return self._assemble_fresh(logits, rows, torch_in, seeds, segments, shadow)
        if torch_in:
            from ..serving.keyed_noise_torch import add_keyed_noise
        else:
            add_keyed_noise = keyed_noise.add_keyed_noise
        increments = [inc for _, inc in self._drawn]
        clean = shadow or all(level == 0 for level, _ in segments)
        out = None if len(segments) == 1 and not clean else (rows.clone() if torch_in else rows.copy())
        start = 0
        for level, n in segments:
            part = slice(start, start + n)
            block = rows if len(segments) == 1 else rows[part]
            block_seeds = seeds if len(segments) == 1 else [s[part] for s in seeds]
            k = 0 if clean else self._draws_at[level]
            if k:
                served = add_keyed_noise(block, block_seeds[:k], increments[:k])
                if out is None:
                    out = served
                else:
                    out[part] = served
            if k < len(increments):  # the draws above this level: made, not served
                add_keyed_noise(block, block_seeds[k:], increments[k:])
            start += n
        return out.reshape(logits.shape)

    def _assemble_fresh(self, logits, rows, torch_in, draw, segments, shadow):
        if shadow or all(level == 0 for level, _ in segments):
            return logits.detach().clone() if torch_in else np.array(logits, copy=True)
        scale = np.concatenate([np.full(n, self.sigmas[level]) for level, n in segments])[:, None]
        noise = draw * scale
        if torch_in:
            import torch

            noise = torch.from_numpy(noise).to(rows.device)
            noise += rows
            return noise.reshape(logits.shape).to(logits.dtype)
        noise += rows
        return noise.reshape(np.shape(logits)).astype(np.asarray(logits).dtype, copy=False)
