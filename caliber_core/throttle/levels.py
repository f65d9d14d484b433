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

With ``consistent`` seeding the unit draws are the Perturber's own
(:meth:`~caliber_core.serving.runtime.Perturber.unit_draw`, a keyed function
of the logits): every request computes each ladder level's draw up to the
top one, and a row at level j sums the first of them in the order
``Perturber.level_noise`` does, so it equals its level's Perturber bit for
bit (on the same batch). Whatever that function becomes, the throttle
serves it unchanged: there is no second implementation here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..serving import keyed_noise
from ..serving.rows import check_request
from ..serving.runtime import Perturber, level_increments
from ..validation import check_key, is_torch


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check a Perturber makes, before anything is counted.

    Attributes
    ----------
    logits : ndarray or torch.Tensor
        The request's logits as received.
    encoded : list or None
        The canonical row ids (None: consistent seeding without ids).
    n_rows, n_classes : int
        The request's shape as rows of the config's classes.
    """

    logits: object
    encoded: list | None  # the canonical row ids (None: consistent seeding without ids)
    n_rows: int
    n_classes: int


@dataclass(frozen=True)
class PreparedRequest:
    """What every level needs before the decision is known.

    Attributes
    ----------
    logits : ndarray or torch.Tensor
        The request's logits as received (type, dtype, device and shape are served back).
    rows : ndarray or torch.Tensor
        Their (n_rows, n_classes) view.
    torch_in : bool
        Whether the logits are a torch tensor.
    draws : ndarray or list
        Per ladder draw: the row seeds (per-input seeding, one (draws, rows)
        uint64 array) or the unit draws themselves (consistent seeding, a list).
    """

    logits: object
    rows: object
    torch_in: bool
    draws: object


class LevelNoise:
    """The policy's levels over the config's ladder (level 0: served clean).

    Every request draws the same noise whatever level it is decided at: the
    ladder's draws up to the top are made, and level j adds the first k_j of
    them to the logits (Eq. logits-noise at that level's sigma; a higher level
    adds more draws to a lower one's), so timing and draw counts say nothing
    about an account's level.

    Parameters
    ----------
    policy : Policy
        The levels and the config they serve.
    key : bytes
        The seeding key (at least 16 bytes).

    Raises
    ------
    ValueError, TypeError
        As ``Perturber.from_config`` raises for the policy's config, seeding and key.
    """

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
        self._key = check_key(key)
        # The ladder draws the top level makes (a zero increment draws nothing, as in the Perturber),
        # and how many of them level j adds up.
        self._drawn = [(position, inc) for position, inc in enumerate(self.increments, start=1) if inc != 0.0]
        self._draws_at = (0,) + tuple(sum(1 for position, _ in self._drawn if position <= p)
                                      for p in self.positions[1:])
        self._increments = np.array([inc for _, inc in self._drawn], dtype=np.float64)
        # Each drawn stream's key made once: a request then costs one keyed hash per row and draw.
        self._seeder = (keyed_noise.RowSeeder(self._key, top.binding, [position for position, _ in self._drawn])
                        if self.seeding == "per-input" else None)

    def warm_up(self, device="cpu") -> None:
        """Serve one throwaway request of two rows (level 0 and the top) on ``device``, when torch is loaded.

        A server calls this when it is built: the first real request then pays no
        module import, first-op setup or thread-pool start (on the CPU some 80 ms).

        Parameters
        ----------
        device : str or torch.device, default "cpu"
            Where the engine's logits will live.
        """
        import sys

        if "torch" not in sys.modules:  # a numpy server: nothing to warm
            return
        import torch

        if torch.device(device).type != "cpu" and self.seeding == "per-input":
            from ..serving import compiled_noise

            # The engine's device: its kernel for the top level's draws, compiled now (a no-op where done).
            compiled_noise.prepare(device, n_levels=max(1, len(self._drawn)))
        logits = torch.zeros(2, self.n_classes, device=device)
        ids = [b"caliber.warm-up\x00", b"caliber.warm-up\x01"] if self.seeding == "per-input" else None
        self.serve(logits, ids, ((0, 1), (self.top, 1)), shadow=False)

    def serve(self, logits, ids, segments, *, shadow: bool, out=None):
        """``logits`` with each segment's rows at its level.

        Parameters
        ----------
        logits : array_like or torch.Tensor
            The request's logits, last axis the config's classes.
        ids : sequence or None
            One id per row (per-input seeding), as ``Perturber.perturb`` takes them.
        segments : tuple of (int, int)
            ((level, rows), ...) in row order, summing to the request's rows.
        shadow : bool
            Serve every row clean (the draws are made all the same).
        out : ndarray or torch.Tensor, optional
            Where the result is written: the logits themselves (in place) or an
            array of their type, shape and dtype not overlapping them.

        Returns
        -------
        ndarray or torch.Tensor
            The input's type, dtype, device and shape (``out`` where given); with
            ``shadow`` (or only level-0 rows) an equal copy.

        Raises
        ------
        ValueError, TypeError
            As ``Perturber.perturb`` does, before any draw.
        """
        served = self.assemble(self.prepare(self.check(logits, ids)), segments, shadow=shadow, out=out)
        if out is None or served is out:
            return served
        out[...] = served  # the paths that do not write in place (numpy's, consistent seeding's)
        return out

    def check(self, logits, ids) -> CheckedRequest:
        """Validate a request as ``Perturber.perturb`` does.

        Parameters
        ----------
        logits : array_like or torch.Tensor
            The request's logits.
        ids : sequence or None
            One id per row, or None where the seeding needs none.

        Returns
        -------
        CheckedRequest
            The logits with their shape and canonical ids.

        Raises
        ------
        ValueError, TypeError
            As ``Perturber.perturb`` does, before any draw.
        """
        n_rows, n_classes, _, encoded, _ = check_request(
            logits, ids, n_classes=self.n_classes, seeding=self.seeding, noise_bound=self.noise_bound,
            source="the policy's top sigma")
        return CheckedRequest(logits, encoded, n_rows, n_classes)

    def prepare(self, checked: CheckedRequest) -> PreparedRequest:
        """What every level needs before the decision: the rows and each ladder level's row seeds (or draws).

        Parameters
        ----------
        checked : CheckedRequest
            :meth:`check`'s result.

        Returns
        -------
        PreparedRequest
            The rows and, per ladder draw, the row seeds (per-input seeding) or
            the unit draws (consistent seeding).
        """
        logits, encoded, n_rows, n_classes = checked.logits, checked.encoded, checked.n_rows, checked.n_classes
        torch_in = is_torch(logits)
        values = logits.detach() if torch_in else np.asarray(logits)
        rows = values.reshape(n_rows, n_classes)
        if self.seeding != "per-input":  # a keyed function of the logits: the Perturber's own draws
            device = values.device if torch_in else None
            digests = None if encoded is None else keyed_noise.row_digests(encoded)
            draws = [self._top.unit_draw(position, digests, rows, n_classes, device=device)
                     for position, _ in self._drawn]
            return PreparedRequest(logits, rows, torch_in, draws)
        seeds = self._seeder.seeds(keyed_noise.joined_digests(encoded), n_classes)  # (draws, rows)
        return PreparedRequest(logits, rows, torch_in, seeds)

    def assemble(self, prepared: PreparedRequest, segments, *, shadow: bool, out=None):
        """The served logits for the decided ``segments``; the same draws whatever was decided.

        Parameters
        ----------
        prepared : PreparedRequest
            :meth:`prepare`'s result.
        segments : tuple of (int, int)
            ((level, rows), ...) in row order.
        shadow : bool
            Serve every row clean.
        out : optional
            As :meth:`serve` takes it; only the fused path on tensors writes it here.

        Returns
        -------
        ndarray or torch.Tensor
            As :meth:`serve` returns, or a new array where ``out`` was not written.

        Notes
        -----
        Rows at level j are ``add_keyed_noise`` over the first k_j ladder draws,
        what the level's own Perturber computes; the remaining draws up to the
        top are made too, on the same rows, and discarded.
        """
        logits, rows, torch_in, seeds = prepared.logits, prepared.rows, prepared.torch_in, prepared.draws
        if self.seeding != "per-input":
            return self._assemble_draws(logits, rows, torch_in, seeds, segments, shadow)
        increments = self._increments
        clean = shadow or all(level == 0 for level, _ in segments)
        if torch_in:  # one pass: each row adds its level's draws and draws the rest (the fused kernel on the CPU)
            from ..serving.keyed_noise_torch import add_keyed_noise

            if clean:
                served = [0] * rows.shape[0]
            elif len(segments) == 1:
                served = None if self._draws_at[segments[0][0]] == len(increments) else \
                    [self._draws_at[segments[0][0]]] * rows.shape[0]
            else:
                served = [self._draws_at[level] for level, n in segments for _ in range(n)]
            into = out if is_torch(out) and out.shape == rows.shape else None  # written in place (2-D logits)
            noisy = add_keyed_noise(rows, seeds, increments, served=served, out=into)
            return noisy if noisy.shape == logits.shape else noisy.reshape(logits.shape)
        add_keyed_noise = keyed_noise.add_keyed_noise
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

    def _assemble_draws(self, logits, rows, torch_in, draws, segments, shadow):
        """Rows at level j: the first k_j scaled draws summed as ``Perturber.level_noise`` does, plus the logits.

        Every row sums all the draws up to the top level (the rest are discarded), so the work
        does not depend on the level, clean and shadow rows included.
        """
        values = logits.detach() if torch_in else np.asarray(logits)
        if torch_in:
            from ..serving.keyed_noise_torch import round_once
        clean = shadow or all(level == 0 for level, _ in segments)
        increments = [inc for _, inc in self._drawn]
        out = rows.clone() if torch_in else rows.copy()
        start = 0
        for level, n in segments:
            part = slice(start, start + n)
            start += n
            k = 0 if clean else self._draws_at[level]
            noise = None
            for i, (xi, increment) in enumerate(zip(draws, increments), start=1):
                term = xi[part] * increment
                noise = term if noise is None else noise.__iadd__(term)
                if i == k:
                    served = noise + rows[part]
                    out[part] = round_once(served, values.dtype) if torch_in else served.astype(values.dtype,
                                                                                               copy=False)
        return out.reshape(values.shape)

def check_servable(policy, *, key=None) -> bool:
    """Build the policy's level noise as a Throttle would, so ``throttle init`` refuses what serving refuses.

    With ``key`` everything is checked, the key against a consistent config's
    fingerprint included. Without it, a per-input policy is checked with a
    throwaway key (its draws depend on the key, its checks do not) and a
    consistent one cannot be (its noise is built from the key): returns
    False then, True when fully checked.

    Raises
    ------
    ValueError
        What ``Throttle(policy, key=...)`` raises: a wrong key, a sigma too
        large to serve, a config the Perturber refuses.
    """
    import secrets

    if key is None and policy.seeding != "per-input":
        return False
    LevelNoise(policy, key=secrets.token_bytes(32) if key is None else key)
    return True
