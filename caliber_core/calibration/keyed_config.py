"""A config for consistent noise, calibrated with one key (``calibrate --seeding consistent --key-file K``).

The usual per-input config (scale S, A0, fit, key-averaged targets) is built
first, then each target's sigma is replaced by the sigma at which *this key's*
function reaches it on the calibration rows (:mod:`.keyed_curve`), levels in
ascending sigma, each calibrated on top of the ones below. The config gains a
``noise`` record: the seeding, a random ``noise_id`` minted here, the length
scale, the feature count, the key's fingerprint (never the key), and per level
its sigma and the centring measured on the rows. Targets name their ``level``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import numpy as np

from ..serving.consistent_noise import (DEFAULT_FEATURES, DEFAULT_LENGTH_SCALE, ConsistentNoise,
                                        key_fingerprint, noise_binding)
from .keyed_curve import DEFAULT_BOOTSTRAP, solve_keyed

NOISE_FIELD = "noise"


def _goal(kind: str, requested: float, clean_accuracy: float) -> tuple[str, float]:
    if kind == "retention":
        return "accuracy", requested * clean_accuracy
    if kind == "accuracy":
        return "accuracy", requested
    if kind == "agreement":
        return "agreement", requested
    raise ValueError(f"consistent seeding calibrates retention, accuracy and agreement targets, got {kind!r}")


def consistent_config(config: dict, logits, labels, key: bytes, *, length_scale: float = DEFAULT_LENGTH_SCALE,
                      features: int = DEFAULT_FEATURES, seed: int = 0, confidence: float = 0.95,
                      bootstrap: int = DEFAULT_BOOTSTRAP, noise_id: str | None = None) -> dict:
    """``config`` (from :func:`.pipeline.config_for` on the same rows) recalibrated for consistent noise and ``key``.

    Parameters
    ----------
    config : dict
        The per-input config of these rows; its targets are re-solved.
    logits, labels : the calibration rows (labels may be None for agreement targets only).
    key : bytes
    length_scale : float
        In units of the config's scale S.
    features, seed, confidence, bootstrap
        Random Fourier features; bootstrap seed, level and resamples of each sigma's interval.
    noise_id : str, optional
        Default: 16 random bytes in hex (a new noise for every calibration).

    Returns
    -------
    dict : a new config; ``config`` is not modified.

    Raises
    ------
    ValueError
        A target this key cannot reach on the rows, or a saturated/unsupported target.
    """
    z = np.asarray(logits, dtype=np.float64)
    if not (isinstance(length_scale, (int, float)) and math.isfinite(length_scale) and length_scale > 0):
        raise ValueError(f"length scale must be a finite number > 0, got {length_scale!r}")
    a0 = config["clean_accuracy"]
    goals = []
    for i, t in enumerate(config["targets"]):
        quantity, value = _goal(t["kind"], float(t["requested"]), a0 if a0 is not None else float("nan"))
        if quantity == "accuracy" and labels is None:
            raise ValueError(f"target {i} ({t['kind']}) needs labels")
        goals.append((quantity, value))
    record = {
        "seeding": "consistent", "noise_id": noise_id or secrets.token_hex(16), "data_sha256": config.get("sha256"),
        "length_scale": float(length_scale), "features": int(features), "scale": float(config["scale"]),
        "key_fingerprint": key_fingerprint(key),
    }
    binding = noise_binding(record)
    y = np.argmax(z, axis=1) if labels is None else np.asarray(labels)
    # Order levels by the sigma each target needs alone (level-1 noise): ascending sigma.
    first = ConsistentNoise(key, binding=binding, n_classes=z.shape[1], scale=record["scale"],
                            length_scale=length_scale, level=1, features=features).centred_on(z)
    g1 = first(z)
    alone = [solve_keyed(z, y, g1, target=v, quantity=q, bootstrap=0).sigma for q, v in goals]
    order = sorted(range(len(goals)), key=lambda i: alone[i])
    levels, base, previous = [], None, 0.0
    targets = [dict(t) for t in config["targets"]]
    for j, i in enumerate(order, start=1):
        noise = first if j == 1 else ConsistentNoise(
            key, binding=binding, n_classes=z.shape[1], scale=record["scale"], length_scale=length_scale,
            level=j, features=features).centred_on(z)
        g = g1 if j == 1 else noise(z)
        quantity, value = goals[i]
        solved = solve_keyed(z, y, g, target=value, quantity=quantity, base=base, previous_sigma=previous,
                             bootstrap=bootstrap, confidence=confidence, seed=seed)
        part = solved.step * g
        base = part if base is None else base + part
        previous = solved.sigma
        levels.append({"sigma": solved.sigma, "centring": noise.centring.to_dict()})
        t = targets[i]
        t.update(sigma=solved.sigma, v=(solved.sigma / record["scale"]) ** 2, sigma_logistic=None,
                 method="keyed-exact-curve", saturated=False, side="point", level=j, reference=None,
                 interval=None, sigma_interval={"level": confidence, "method": "bootstrap over rows, this key",
                                                "sigma": list(solved.interval), "draws": solved.sigma_draws})
        delivered = solved.delivered
        if quantity == "accuracy":
            t.update(accuracy=delivered, retention=delivered / a0 if a0 else None)
        else:
            t["agreement"] = delivered
    out = dict(config)
    out["targets"] = targets
    record["levels"] = levels
    out[NOISE_FIELD] = record
    return out
