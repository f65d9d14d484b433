"""Serving a calibrated consistent config: its noise record, binding and nested levels.

A consistent config records the noise's identity (version, design, noise id,
data digest, scale, key fingerprint) and, per level, the sigma and what the
calibration rows measured (the field's centring or the class cycle's fit).
:class:`ConsistentLevels` rebuilds each level's function g_j from the key and
sums them as every nested level does (:func:`.keyed_noise.nested_noise`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from . import keyed_noise
from .class_cycle_noise import ClassCycleNoise, CycleFit
from .consistent_noise import (CYCLE_VERSION, FIELD_V3, FIELD_VERSION, VERSION_FIELD, VERSIONS, Centring,
                               ConsistentNoise)
from .keys import key_fingerprint


def level_noise(noises, sigmas, level: int, logits, *, torch_tensor: bool = False):
    """The nested noise of ``level`` (1-based): sum_{i<=level} sqrt(sigma_i^2 - sigma_{i-1}^2) g_i(z).

    ``noises[i]`` and ``sigmas[i]`` belong to level i + 1; sigmas ascend, so a
    lower level's noise is part of every higher level's and two accounts
    served different levels see consistent answers. The sum is the runtime's
    own (:func:`.keyed_noise.nested_noise`), so a Perturber serves exactly this.

    Parameters
    ----------
    noises : sequence of callable
        g_i per level (:class:`ConsistentNoise` or :class:`ClassCycleNoise`).
    sigmas : sequence of float
        sigma_i per level, ascending.
    level : int
        The served level, in [1, len(sigmas)].
    logits : ndarray or torch.Tensor of shape (N, K)
        The clean logits g is evaluated on.
    torch_tensor : bool, default False
        ``logits`` is a torch tensor: compute on its device.

    Returns
    -------
    ndarray or torch.Tensor of shape (N, K), float64
        The noise to add (zeros when every increment is 0).

    Raises
    ------
    ValueError
        ``level`` out of range, or not one noise per sigma.

    Notes
    -----
    Each level's noise has variance sigma_level^2 per class, as in Eq. logits-noise.
    """
    if not 1 <= level <= len(sigmas) or len(noises) != len(sigmas):
        raise ValueError(f"level must be in [1, {len(sigmas)}] with one noise per sigma, got level {level}")

    def draw(j):
        return noises[j - 1].torch_noise(logits) if torch_tensor else noises[j - 1](logits)

    total = keyed_noise.nested_noise(keyed_noise.level_increments(list(sigmas), level), draw)
    if total is None:
        total = (logits.detach().to(__import__("torch").float64) * 0.0) if torch_tensor else \
            np.zeros(np.shape(logits), dtype=np.float64)
    return total


# --------------------------------------------------------------------------
# serving a calibrated consistent config
# --------------------------------------------------------------------------

def noise_version(record) -> str:
    """The record's noise version: v1 for records written before versions were recorded.

    Parameters
    ----------
    record : Mapping
        A config's consistent ``noise`` record.

    Returns
    -------
    str
        One of ``VERSIONS``.

    Raises
    ------
    ValueError
        A version this Caliber does not serve.
    """
    version = record.get(VERSION_FIELD, FIELD_VERSION)
    if version not in VERSIONS:
        raise ValueError(f"this config's consistent noise version {version!r} is not one this Caliber serves "
                         f"({', '.join(VERSIONS)}): serve it with the Caliber that calibrated it, or recalibrate")
    return version


_BINDING_FIELDS = {
    FIELD_VERSION: ("noise_id", "data_sha256", "seeding", "length_scale", "features", "scale", "key_fingerprint"),
    FIELD_V3: (VERSION_FIELD, "design", "noise_id", "data_sha256", "seeding", "length_scale", "features", "scale",
               "key_fingerprint"),
    CYCLE_VERSION: (VERSION_FIELD, "design", "noise_id", "data_sha256", "seeding", "scale", "key_fingerprint"),
}


def noise_binding(record) -> bytes:
    """The generator's binding for a consistent config: a digest of the noise's identity.

    The full config cannot be bound (its sigmas come from this noise), so the
    identity is what fixes g before calibration: the version and design (v2),
    the random ``noise_id`` minted by ``calibrate``, the data digest, the
    seeding, the field's length scale and feature count (v1), the scale S and
    the key's fingerprint.

    Parameters
    ----------
    record : Mapping
        A config's consistent ``noise`` record.

    Returns
    -------
    bytes
        32-byte SHA-256 digest.

    Raises
    ------
    ValueError
        An unknown version, or a record missing one of the identity's fields.
    """
    fields = _BINDING_FIELDS[noise_version(record)]
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(f"consistent noise record is missing field(s): {', '.join(missing)}")
    text = "|".join(f"{f}={record[f]!r}" for f in fields)
    return hashlib.sha256(text.encode()).digest()


def level_functions(record, key: bytes, n_classes: int) -> tuple[list, list[float]]:
    """The function g_j (field for v1, class cycle for v2) and the sigma of every level of a consistent record.

    Parameters
    ----------
    record : Mapping
        A config's ``noise`` record with seeding "consistent".
    key : bytes
        The serving key; its fingerprint must be the record's.
    n_classes : int
        K of the config.

    Returns
    -------
    noises : list of ConsistentNoise or ClassCycleNoise
        g_j per level, in level order.
    sigmas : list of float
        sigma_j per level, ascending.

    Raises
    ------
    ValueError
        Another seeding, an unknown version, a key whose fingerprint differs,
        a malformed level fit, or sigmas that do not ascend.
    """
    if record.get("seeding") != "consistent":
        raise ValueError(f"the config's noise record has seeding {record.get('seeding')!r}, not 'consistent'")
    version = noise_version(record)
    expected = record["key_fingerprint"]
    if key_fingerprint(key) != expected:
        raise ValueError(f"this key's fingerprint {key_fingerprint(key)} differs from the one the config was "
                         f"calibrated with ({expected}): consistent noise is calibrated per key")
    binding = noise_binding(record)
    noises, sigmas = [], []
    for j, level in enumerate(record["levels"], start=1):
        if version == CYCLE_VERSION:
            noises.append(ClassCycleNoise(key, binding=binding, n_classes=n_classes, level=j,
                                          fit=CycleFit.from_dict(level["fit"], n_classes=n_classes)))
        else:
            features = int(record["features"])
            noises.append(ConsistentNoise(key, binding=binding, n_classes=n_classes, scale=float(record["scale"]),
                                          length_scale=float(record["length_scale"]), level=j, features=features,
                                          centring=Centring.from_dict(level["centring"], features=features),
                                          version=version))
        sigmas.append(float(level["sigma"]))
    if any(b <= a for a, b in zip(sigmas, sigmas[1:])):
        raise ValueError(f"consistent levels must have ascending sigmas, got {sigmas}")
    return noises, sigmas


class ConsistentLevels:
    """The nested consistent noise of one served target of a config (what the runtime adds).

    Parameters
    ----------
    config : dict
        A loaded config with a consistent ``noise`` record.
    target : int
        Index into ``config["targets"]``; served at its ``level``.
    key : bytes
        Must be the key the config was calibrated with (checked by fingerprint).
    """

    def __init__(self, config, *, target: int, key: bytes):
        record = config.get("noise")
        if not isinstance(record, dict):
            raise ValueError("this config has no consistent noise record: calibrate it with --seeding consistent")
        self.n_classes = int(config["n_classes"])
        self.noises, self.levels = level_functions(record, key, self.n_classes)
        entry = config["targets"][target]
        level = entry.get("level")
        if not isinstance(level, int) or not 1 <= level <= len(self.levels):
            raise ValueError(f"targets[{target}].level must be in [1, {len(self.levels)}], got {level!r}")
        self.level = level
        self.sigma = self.levels[level - 1]

    def noise(self, logits) -> np.ndarray:
        """sigma-scaled noise for (N, K) logits at the served level.

        Parameters
        ----------
        logits : ndarray or torch.Tensor of shape (N, K)
            The clean logits.

        Returns
        -------
        ndarray or torch.Tensor of shape (N, K), float64
            The nested noise of :func:`level_noise`; a tensor on the logits' device for torch input.

        Raises
        ------
        ValueError
            K differs from the config's.
        """
        if np.shape(logits)[-1] != self.n_classes:
            raise ValueError(f"logits have {np.shape(logits)[-1]} classes; the config was calibrated "
                             f"for n_classes={self.n_classes}")
        is_tensor = type(logits).__module__.startswith("torch")
        return level_noise(self.noises, self.levels, self.level, logits, torch_tensor=is_tensor)
