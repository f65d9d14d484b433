"""Adding calibrated Gaussian noise to served logits (numpy and torch).

A :class:`Perturber` applies Eq. ``logits-noise`` of the paper,
z' = z + eps with eps_k ~ N(0, sigma^2) i.i.d., to a batch of logits.

Two seedings are offered (Proposition 2):

* ``"per-input"`` -- the noise of a row is a pure function of
  (secret key, config, level, input id, number of classes K). Repeating a
  query returns the identical response, so averaging M repeats yields no
  variance reduction (Proposition 2(ii)).
* ``"consistent"`` -- a keyed smooth random function of the clean logits
  (:mod:`.consistent_noise`): repeats and near-duplicates get (nearly) the
  same noise, and no id is needed. Calibrated per key, so it is served from
  a config made by ``calibrate --seeding consistent`` and that key only.
* ``"fresh"`` -- independent noise on every call. Averaging M repeats cuts
  the noise variance to sigma^2 / M (Proposition 2(i)); offered for
  comparison and for accounts where repeats are not a concern.

Nested levels. A config's levels are its targets' sigmas, distinct and
sorted, sigma_1 < ... < sigma_L. Level j serves
eps_j = sum_{i<=j} sqrt(sigma_i^2 - sigma_{i-1}^2) xi_i (sigma_0 = 0), each xi_i
a keyed draw of its own. The answers at levels 1..L are then the least-noisy
answer plus noise independent of z and of it, so together they tell a thief
no more than the least-noisy answer alone. The draws are bound to the
config's digest: two configs never share one.

torch is never imported here (seconds); tensors are known by their type's module, and drawn on their device.
"""

from __future__ import annotations

import math
import struct
import sys

import numpy as np

from ..config import config_digest, load_config, sigma_to_serve
from ..validation import check_key, check_sigma
from . import fused_noise, keyed_noise
from .rows import check_request, encode_row_ids

#: Every seeding a Perturber serves (the one list: the throttle and the extraction
#: experiment name subsets of it): fresh draws per call, or keyed draws.
SEEDINGS = ("per-input", "fresh", "consistent")
#: The keyed seedings: the same input gets the same noise (what a policy can serve).
KEYED_SEEDINGS = tuple(s for s in SEEDINGS if s != "fresh")

#: The binding of a Perturber built from a bare sigma: the sigma is part of it,
#: so two bare Perturbers at different sigmas never share a draw.
BARE_BINDING_LABEL = b"caliber.bare-sigma\x00"


def per_input_noise(ids, n_classes: int, *, key: bytes, binding: bytes = b"", level: int = 1) -> np.ndarray:
    """Standard-normal draws, one row per id: ``keyed_noise.unit_normals`` for str/bytes ids.

    Parameters
    ----------
    ids : sequence of str or bytes
        One id per row; str ids are UTF-8 encoded, so ``"a"`` and ``b"a"`` are one id.
    n_classes : int
        K, >= 1.
    key : bytes
        The serving key, at least 16 bytes.
    binding : bytes, default b""
        What the stream is bound to (a config digest, say).
    level : int, default 1
        The noise level.

    Returns
    -------
    ndarray of shape (n_rows, n_classes), float64
        A pure function of (key, binding, level, id, K).

    Raises
    ------
    TypeError
        ``ids`` is a bare str/bytes or not a sequence, an id of another type, or a key that is not bytes.
    ValueError
        A bad K or key.

    Notes
    -----
    Per-input seeding, Proposition cost (ii): a repeated id gets the same draw.
    """
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
        raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
    key = check_key(key)
    if not hasattr(ids, "__len__") or isinstance(ids, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"ids must be a sequence of str/bytes, got {type(ids).__name__}")
    encoded = encode_row_ids(ids, len(ids), single_row=False)
    return keyed_noise.unit_normals(key, binding, level, keyed_noise.row_digests(encoded), n_classes)


level_increments = keyed_noise.level_increments  # re-exported: the throttle and tests import it here


class Perturber:
    """Adds N(0, sigma^2) noise to served logits (Eq. ``logits-noise``).

    Parameters
    ----------
    sigma : float
        Noise standard deviation, >= 0, in logit units (sigma* of
        Eq. ``inverse-v``). ``sigma == 0`` is the identity: ``perturb``
        returns an equal *copy* of the input (never the input object itself).
        A bare sigma is a one-level config; :meth:`from_config` knows all of a
        config's levels.
    seeding : {"per-input", "fresh"}, default "per-input"
        "per-input": the noise of a row is a pure function of (key, config,
        level, id, K), so repeated queries get identical responses
        (Proposition 2(ii)). "fresh": independent noise on every call
        (Proposition 2(i)). "consistent": a keyed function of the logits,
        from a config calibrated for that key only (:meth:`from_config`).
    key : bytes
        Secret for per-input seeding, at least 16 bytes (see
        :mod:`caliber_core.serving.keys`); required there. Ignored for "fresh".
    generator : numpy.random.Generator, optional
        Source of fresh noise (for a torch tensor, of the seed of a torch
        generator on its device). Default: an OS-seeded SFC64 generator.
        Pass a seeded generator only for reproducible simulations and tests.

    Attributes
    ----------
    sigma, seeding : as given.
    levels : tuple of float
        The config's distinct sigmas, ascending (``(sigma,)`` for a bare sigma).
    level : int
        1-based index of ``sigma`` in ``levels``.
    n_classes : int or None
        The config's K (None for a bare sigma): other logits are refused.
    config_digest : str or None
        The config's identity, which the noise is bound to (None for a bare sigma).

    Examples
    --------
    >>> p = Perturber.from_config("caliber.json", target=0, key=read_key_file("caliber.key"))  # doctest: +SKIP
    >>> noisy = p.perturb(logits, ids=["req-17", "req-18"])  # doctest: +SKIP

    Notes
    -----
    Noise is drawn in float64, added to the logits in float64 and rounded once
    to the input dtype. A torch tensor's noise is made on the tensor's device
    (8 bytes a row of seed leave the host): on the CPU by :mod:`.fused_noise`'s
    kernel, on CUDA by :mod:`.compiled_noise`'s, each built when a per-input
    Perturber is constructed, elsewhere by torch's ops; the same bits either
    way. The result has the input's dtype and device and tracks no gradients.
    """

    def __init__(self, sigma, *, seeding: str = "per-input", key: bytes | None = None, generator=None):
        sigma = check_sigma(sigma)
        binding = BARE_BINDING_LABEL + struct.pack(">d", sigma)
        self._setup((sigma,), 1, None, None, binding, seeding, key, generator)

    def _setup(self, levels, level, n_classes, digest, binding, seeding, key, generator) -> None:
        if seeding not in SEEDINGS:
            raise ValueError(f"seeding must be one of {SEEDINGS}, got {seeding!r}")
        self._levels, self._level = tuple(levels), int(level)
        self._sigma = self._levels[self._level - 1]
        self._increments = level_increments(self._levels, self._level)
        # The largest |noise| this Perturber can add: every unit draw is at most MAX_ABS_NORMAL.
        self._noise_bound = keyed_noise.MAX_ABS_NORMAL * math.fsum(self._increments)
        if not self._noise_bound < np.finfo(np.float64).max / 2:
            raise ValueError(f"sigma={self._sigma!r} is too large: its noise could reach "
                             f"{self._noise_bound:.3g}, beyond what float64 holds")
        self._n_classes, self._digest, self._binding = n_classes, digest, bytes(binding)
        self._seeding = seeding
        self._key = self._consistent = None
        if seeding == "consistent" and digest is None:
            raise ValueError("consistent seeding is calibrated per key: serve it with Perturber.from_config on a "
                             "config from 'calibrate --seeding consistent'")
        if seeding in ("per-input", "consistent"):
            if key is None:
                raise ValueError(f"{seeding} seeding needs key=<secret bytes>, got key=None")
            self._key = check_key(key)
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
        # OS-seeded; SFC64 because it is numpy's fastest bit generator here.
        self._generator = generator if generator is not None else np.random.Generator(np.random.SFC64())
        if seeding == "per-input":
            fused_noise.prepare()  # built or loaded now, never on a request (warns once if it cannot be)
            if "torch" in sys.modules:  # a server of tensors: on a CUDA machine, compiled now (warns if it cannot be)
                from . import compiled_noise
                if compiled_noise.prepare(n_levels=sum(inc != 0.0 for inc in self._increments) or 1):
                    # one request now: CUDA loads a kernel on its first use, which is then not a client's
                    self.perturb(sys.modules["torch"].zeros((2, self._n_classes or 8), device="cuda"), [b"0", b"1"])

    @classmethod
    def from_config(cls, config, *, target: int = 0, seeding: str = "per-input", key: bytes | None = None,
                    generator=None) -> "Perturber":
        """A Perturber serving ``config["targets"][target]`` at its level among the config's sigmas.

        Parameters
        ----------
        config : dict or str or os.PathLike
            A config dict, its JSON text, or the path of its JSON file
            (``caliber.config/v2``, or v1, upgraded on load).
        target : int, default 0
            Index into ``config["targets"]``.
        seeding, key, generator
            As for :class:`Perturber`.

        Raises
        ------
        caliber_core.config.ConfigError
            An invalid or unreadable config, no targets, target out of range,
            a sigma beyond what the config's sweep measured.
        TypeError
            ``target`` is not an integer.

        Warns
        -----
        caliber_core.config.SaturatedTargetWarning
            The target is saturated: it serves the largest sigma the sweep measured.
        """
        config = load_config(config)
        record = config.get("noise")
        if seeding == "consistent" or (isinstance(record, dict) and record.get("seeding") == "consistent"):
            return cls._from_consistent_config(config, target, seeding, key)
        sigma = sigma_to_serve(config, target=target)  # checks the index; warns for a saturated target
        # Every target's sigma is a level, whichever one this Perturber serves.
        levels = sorted({float(entry["sigma"]) for entry in config["targets"]})
        digest = config_digest(config)
        self = cls.__new__(cls)
        self._setup(levels, levels.index(sigma) + 1, int(config["n_classes"]), digest, bytes.fromhex(digest),
                    seeding, key, generator)
        return self

    @classmethod
    def _from_consistent_config(cls, config, target, seeding, key) -> "Perturber":
        # The calibration bound this noise, not the config digest (its sigmas come from the noise itself).
        from .consistent_levels import ConsistentLevels, noise_binding

        if seeding != "consistent":
            raise ValueError(f"this config was calibrated for consistent seeding (its sigmas hold for that noise "
                             f"and key only); serve it with seeding='consistent', got {seeding!r}")
        if key is None:
            raise ValueError("consistent seeding needs key=<the key the config was calibrated with>, got key=None")
        sigma_to_serve(config, target=target)  # index and type checks, as for any config
        served = ConsistentLevels(config, target=target, key=check_key(key))
        self = cls.__new__(cls)
        self._setup(served.levels, served.level, served.n_classes, config_digest(config),
                    noise_binding(config["noise"]), seeding, key, None)
        self._consistent = served.noises
        return self

    @property
    def sigma(self) -> float:
        """The served noise standard deviation (the served level's sigma)."""
        return self._sigma

    @property
    def seeding(self) -> str:
        """"per-input", "fresh" or "consistent"."""
        return self._seeding

    @property
    def levels(self) -> tuple[float, ...]:
        """The config's distinct sigmas, ascending (``(sigma,)`` for a bare sigma)."""
        return self._levels

    @property
    def level(self) -> int:
        """1-based index of :attr:`sigma` in :attr:`levels`."""
        return self._level

    @property
    def n_classes(self) -> int | None:
        """The config's K (None for a bare sigma): logits of another K are refused."""
        return self._n_classes

    @property
    def config_digest(self) -> str | None:
        """The config's identity, which the noise is bound to (None for a bare sigma)."""
        return self._digest

    @property
    def binding(self) -> bytes:
        """What the keyed draws are bound to: the config digest's bytes, or the bare-sigma label and sigma."""
        return self._binding

    def __repr__(self) -> str:  # never shows the key
        where = "" if self._digest is None else \
            f", level={self._level} of {len(self._levels)}, config={self._digest[:12]}"
        return f"Perturber(sigma={self._sigma!r}, seeding={self._seeding!r}{where})"

    def __getstate__(self):
        # A pickled generator would replay one "fresh" noise in every process: each copy seeds its own.
        return {**self.__dict__, "_generator": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._generator = np.random.Generator(np.random.SFC64())

    def perturb(self, logits, ids=None, *, digests=None):
        """Return ``logits + noise`` with the input's type, shape and dtype.

        Parameters
        ----------
        logits : ndarray or torch.Tensor of shape (n_samples, n_classes) or (n_classes,)
            Floating dtype (float16, bfloat16 (torch), float32, float64).
            +-inf entries (masked classes) stay +-inf; NaN is rejected.
        ids : sequence of str or bytes, length n_samples; or one str/bytes for a single row
            Required for per-input seeding unless ``digests`` are given. For fresh
            seeding it may be omitted; if given its length is still checked.
        digests : array_like of shape (n_samples, 32), uint8, optional
            ``keyed_noise.row_digests(ids)`` in place of ids: the same answer, the ids not hashed again.

        Returns
        -------
        noisy : same type, shape, dtype (and device) as ``logits``
            A new array/tensor; for sigma == 0 an equal copy. Finite wherever
            the input is finite.

        Raises
        ------
        TypeError
            Non-floating logits, unsupported type, ids of the wrong type.
        ValueError
            Wrong shape, fewer than 2 classes, K other than the config's, NaN,
            a value whose noisy version would overflow the dtype, missing ids or
            wrong count, both ids and digests. Every check runs before any draw.
        """
        n_rows, n_classes, single_row, encoded, torch_in = check_request(
            logits, ids, n_classes=self._n_classes, seeding=self._seeding, noise_bound=self._noise_bound,
            source=f"sigma={self._sigma!r}", digests=digests)
        if self._sigma == 0.0:
            return logits.detach().clone() if torch_in else np.array(logits, copy=True)
        if self._seeding == "fresh":
            return self._perturb_fresh(logits, n_rows, n_classes, torch_in)
        if digests is None:  # None for consistent seeding without ids: it needs none
            digests = None if encoded is None else keyed_noise.row_digests(encoded)
        if self._seeding != "per-input":  # any other keyed seeding: the level-by-level path
            return self._add_level_noise(logits, digests, n_rows, n_classes, torch_in)
        levels = [(level, inc) for level, inc in enumerate(self._increments, start=1) if inc != 0.0]
        seeds = [keyed_noise.row_seeds(self._key, self._binding, level, digests, n_classes) for level, _ in levels]
        increments = [inc for _, inc in levels]
        if torch_in:
            from . import keyed_noise_torch

            values = logits.detach()
            out = keyed_noise_torch.add_keyed_noise(values.reshape(n_rows, n_classes), seeds, increments)
            return out.reshape(values.shape)
        arr = np.asarray(logits)  # the fused kernel once loaded, numpy's ops otherwise: the same bits
        return fused_noise.add_to_array(arr.reshape(n_rows, n_classes), seeds, increments).reshape(arr.shape)

    def _add_level_noise(self, logits, digests, n_rows: int, n_classes: int, torch_in: bool):
        """``logits + level_noise(...)`` in float64, rounded once to the logits' dtype."""
        if torch_in:
            values = logits.detach()
            rows = values.reshape(n_rows, n_classes)
            noise = self.level_noise(digests, rows, n_classes, device=values.device)
            noise += rows
            from .keyed_noise_torch import round_once  # float16/bfloat16 rounded once, as numpy's float16
            return round_once(noise, values.dtype).reshape(values.shape)
        arr = np.asarray(logits)
        rows = arr.reshape(n_rows, n_classes)
        noise = self.level_noise(digests, rows, n_classes)
        noise += rows
        return noise.reshape(arr.shape).astype(arr.dtype, copy=False)

    # -- the noise ---------------------------------------------------------------------------------

    def unit_draw(self, level: int, digests, rows, n_classes: int, device=None):
        """xi for one level (1-based): (n_rows, K) standard normals, float64; a torch tensor when ``device`` is given.

        The one place a seeding decides where its unit draws come from; per-input
        seeding reads the row digests, and ``rows`` (the logits as served) is
        there for a seeding whose draw depends on the logits themselves. A new
        keyed seeding adds its name to :data:`SEEDINGS` and its draw here; it is
        then served level by level through :meth:`level_noise`, with the same
        nesting and the same binding to the config.

        Parameters
        ----------
        level : int
            The level, in [1, len(levels)].
        digests : ndarray of shape (n_rows, 32), uint8
            :func:`.keyed_noise.row_digests` of the ids (unused by consistent seeding).
        rows : ndarray or torch.Tensor of shape (n_rows, K)
            The logits as served (read by consistent seeding only).
        n_classes : int
            K.
        device : torch.device, optional
            Draw a torch tensor there; None draws numpy.

        Returns
        -------
        ndarray or torch.Tensor of shape (n_rows, n_classes), float64
        """
        if self._consistent is not None:  # a keyed smooth function of the logits, no ids needed
            g = self._consistent[level - 1]
            return g(rows) if device is None else g.torch_noise(rows)
        if device is None:
            return keyed_noise.unit_normals(self._key, self._binding, level, digests, n_classes)
        from . import keyed_noise_torch  # torch is imported only when a tensor is served

        return keyed_noise_torch.unit_normals_torch(self._key, self._binding, level, digests, n_classes, device)

    def level_noise(self, digests, rows, n_classes: int, device=None):
        """eps at the served level, sum_{i <= level} increment_i * unit_draw(i), in float64.

        The path any keyed seeding can take; per-input serving takes a fused,
        blockwise version of it (``keyed_noise.add_keyed_noise``) whose
        ``level_noise + logits`` is bit for bit the same.

        Parameters
        ----------
        digests : ndarray of shape (n_rows, 32), uint8
            Row digests of the ids.
        rows : ndarray or torch.Tensor of shape (n_rows, K)
            The logits as served.
        n_classes : int
            K.
        device : torch.device, optional
            Draw a torch tensor there; None draws numpy.

        Returns
        -------
        ndarray or torch.Tensor of shape (n_rows, n_classes), float64
            Noise of variance sigma^2 per class.

        Notes
        -----
        Eq. logits-noise at the served sigma.
        """
        return keyed_noise.nested_noise(
            self._increments, lambda level: self.unit_draw(level, digests, rows, n_classes, device=device))

    def _perturb_fresh(self, logits, n_rows: int, n_classes: int, torch_in: bool):
        if torch_in:
            import torch

            # On the tensor's device, seeded from the Perturber's generator (a seeded one gives reproducible runs).
            values = logits.detach()
            device_generator = torch.Generator(device=values.device)
            device_generator.manual_seed(int(self._generator.integers(0, 2**63)))
            noise = torch.randn((n_rows, n_classes), generator=device_generator, dtype=torch.float64,
                                device=values.device)
            noise *= self._sigma
            noise += values.reshape(n_rows, n_classes)
            from .keyed_noise_torch import round_once
            return round_once(noise, values.dtype).reshape(values.shape)
        noise = self._generator.standard_normal((n_rows, n_classes))
        noise *= self._sigma
        arr = np.asarray(logits)
        noise += arr.reshape(n_rows, n_classes)
        return noise.reshape(arr.shape).astype(arr.dtype, copy=False)

