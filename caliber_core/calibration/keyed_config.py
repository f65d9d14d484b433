"""A config for consistent noise, calibrated with one key (``calibrate --seeding consistent --key-file K``).

The usual per-input config (scale S, A0, fit, key-averaged targets) is built
first, then each target's sigma is replaced by the sigma at which *this key's*
function reaches it on the calibration rows (:mod:`.keyed_curve`), levels in
ascending sigma, each calibrated on top of the ones below. The config gains a
``noise`` record: the seeding, the noise version and design (v3, the default:
the smooth field with length-prefixed key labels, with its length scale and
feature count; v2: the balanced class cycle), a random ``noise_id`` minted here, the key's fingerprint (never the
key), and per level its sigma and what was fitted on the rows (v2: the class
amplitudes and gain; v1: the centring). Targets name their ``level``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import numpy as np

from ..serving.class_cycle_noise import ClassCycleNoise
from ..serving.consistent_levels import noise_binding
from ..serving.consistent_noise import (CYCLE_VERSION, DEFAULT_FEATURES, DEFAULT_LENGTH_SCALE, DESIGNS, FIELD_V3,
                                        VERSION_FIELD, ConsistentNoise)
from ..serving.keys import key_fingerprint
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


def consistent_config(config: dict, logits, labels, key: bytes, *, design: str = "field",
                      length_scale: float = DEFAULT_LENGTH_SCALE, features: int = DEFAULT_FEATURES, seed: int = 0,
                      confidence: float = 0.95, bootstrap: int = DEFAULT_BOOTSTRAP,
                      noise_id: str | None = None) -> dict:
    """``config`` (from :func:`.pipeline.config_for` on the same rows) recalibrated for consistent noise and ``key``.

    Parameters
    ----------
    config : dict
        The per-input config of these rows; its targets are re-solved.
    logits, labels : the calibration rows (labels may be None for agreement targets only).
    key : bytes
    design : {"field", "class-cycle"}
        ``field`` (noise version 3, the default and what ``calibrate --seeding consistent``
        serves): the smooth random field; ``class-cycle`` (version 2): the balanced keyed
        class cycle, each level balanced at its own target. The thief frontier
        (``benchmarks/bench_frontier.py``) keeps the field: a thief who knows the class-cycle
        design estimates the cycle from its answers and undoes it.
    length_scale : float
        The field's, in units of the config's scale S.
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
    if design not in DESIGNS.values():
        raise ValueError(f"consistent design must be one of {sorted(DESIGNS.values())}, got {design!r}")
    record = {"seeding": "consistent", "noise_id": noise_id or secrets.token_hex(16),
              "data_sha256": config.get("sha256"), "scale": float(config["scale"]),
              "key_fingerprint": key_fingerprint(key)}
    if design == "field":
        record.update({VERSION_FIELD: FIELD_V3, "design": design, "length_scale": float(length_scale),
                       "features": int(features)})
    else:
        record.update({VERSION_FIELD: CYCLE_VERSION, "design": design})
    binding = noise_binding(record)
    y = np.argmax(z, axis=1) if labels is None else np.asarray(labels)
    a0_rows = float(np.mean(np.argmax(z, axis=1) == y)) if labels is not None else 1.0

    def share(i):
        # the share of rows this target's level changes: what the class cycle is balanced for
        quantity, value = goals[i]
        top = a0_rows if quantity == "accuracy" else 1.0
        return min(max(1.0 - value / top, 0.01), 0.95)

    def noise_at(level, i, base):
        if design == "field":
            return ConsistentNoise(key, binding=binding, n_classes=z.shape[1], scale=record["scale"],
                                   length_scale=length_scale, level=level, features=features,
                                   version=FIELD_V3).centred_on(z)
        return ClassCycleNoise(key, binding=binding, n_classes=z.shape[1], level=level).balanced_on(
            z, share=share(i), base=base)

    # Levels in ascending sigma: for the field, by the sigma each target needs alone (level-1
    # noise); for the class cycle, by the share of rows the target changes.
    if design == "field":
        first = noise_at(1, 0, None)
        g1 = first(z)
        alone = [solve_keyed(z, y, g1, target=v, quantity=q, bootstrap=0).sigma for q, v in goals]
        order = sorted(range(len(goals)), key=lambda i: alone[i])
    else:
        order = sorted(range(len(goals)), key=share)
    levels, base, previous = [], None, 0.0
    targets = [dict(t) for t in config["targets"]]
    for j, i in enumerate(order, start=1):
        noise = first if (design == "field" and j == 1) else noise_at(j, i, base)
        g = noise(z)
        quantity, value = goals[i]
        solved = solve_keyed(z, y, g, target=value, quantity=quantity, base=base, previous_sigma=previous,
                             bootstrap=bootstrap, confidence=confidence, seed=seed)
        part = solved.step * g
        base = part if base is None else base + part
        previous = solved.sigma
        fitted = {"centring": noise.centring.to_dict()} if design == "field" else {"fit": noise.fit.to_dict()}
        levels.append({"sigma": solved.sigma, **fitted})
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
