"""The config schema's field rules: every check a parsed config document must pass past its name.

:mod:`caliber_core.config` loads, validates and writes configs, and alone knows the
schema's name; it checks that name, then :func:`check_document` the fields. This
module holds the field rules alone, so the two stay short. It imports only the
standard library and the target record's names.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from .target_record import SIDES, TARGET_KINDS

_REQUIRED = ("schema", "model", "n_classes", "n_samples", "statistic", "scale", "fit", "targets")
_TARGET_REQUIRED = ("kind", "accuracy", "retention", "v", "sigma")
_INTERVAL_QUANTITIES = ("accuracy", "retention", "agreement")


class ConfigError(ValueError):
    """A config file or dict that does not follow the schema (a ValueError naming the field and value)."""


def is_number(x) -> bool:
    """A real number that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_document(config: Mapping) -> None:
    """Check the fields of a parsed config document whose schema name the caller has checked.

    Raises
    ------
    ConfigError
        The first rule broken, naming the field and showing its value.
    """
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ConfigError(f"config is missing field(s): {', '.join(missing)}")
    scale = config["scale"]
    if not (is_number(scale) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"config scale must be a positive number, got {scale!r}")
    for name, least in (("n_classes", 2), ("n_samples", 1)):
        n = config[name]
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < least:
            raise ConfigError(f"config {name} must be an integer >= {least}, got {n!r}")
    if not isinstance(config["targets"], list):
        raise ConfigError("config field 'targets' must be a list")
    largest = largest_sigma_measured(config)
    for i, t in enumerate(config["targets"]):
        _validate_target(t, i)
        if largest is not None and t["sigma"] > largest * (1 + 1e-9):
            raise ConfigError(f"targets[{i}].sigma={t['sigma']!r} exceeds the largest sigma the config's "
                              f"sweep measured ({largest:.6g} = scale * sqrt(sweep.v_max))")


def largest_sigma_measured(config: Mapping) -> float | None:
    """S * sqrt(sweep.v_max), Eq. normalized-noise: the largest sigma the sweep measured (None without a sweep).

    Returns
    -------
    float or None

    Raises
    ------
    ConfigError
        A sweep whose ``v_max`` is not a finite number > 0.
    """
    sweep = config.get("sweep")
    if sweep is None:
        return None
    v_max = sweep.get("v_max") if isinstance(sweep, Mapping) else None
    if not (is_number(v_max) and math.isfinite(v_max) and v_max > 0):
        raise ConfigError(f"config sweep.v_max must be a finite number > 0, got {v_max!r}")
    return float(config["scale"]) * math.sqrt(v_max)


def _validate_target(t, i: int) -> None:
    if not isinstance(t, Mapping):
        raise ConfigError(f"targets[{i}] must be an object")
    gone = [k for k in _TARGET_REQUIRED if k not in t]
    if gone:
        raise ConfigError(f"targets[{i}] is missing field(s): {', '.join(gone)}")
    if t["kind"] not in TARGET_KINDS:
        raise ConfigError(f"targets[{i}].kind must be one of {TARGET_KINDS}, got {t['kind']!r}")
    for name in ("sigma", "v"):
        x = t[name]
        if not (is_number(x) and math.isfinite(x) and x >= 0):
            raise ConfigError(f"targets[{i}].{name} must be a finite number >= 0, got {x!r}")
    side = t.get("side", "point")
    if side not in SIDES:
        raise ConfigError(f"targets[{i}].side must be one of {SIDES}, got {side!r}")
    if not isinstance(t.get("saturated", False), bool):
        raise ConfigError(f"targets[{i}].saturated must be true or false, got {t['saturated']!r}")
    interval = t.get("interval")
    if interval is not None:
        _validate_interval(interval, i)
    if t.get("reference") is not None:
        _validate_reference(t["reference"], i)
    attacker = t.get("attacker")
    if t["kind"] == "surrogate-retention" and not isinstance(attacker, Mapping):
        raise ConfigError(f"targets[{i}] (surrogate-retention) needs an 'attacker' object "
                          f"with the surrogate's recipe and seeds, got {attacker!r}")
    if attacker is not None and not isinstance(attacker, Mapping):
        raise ConfigError(f"targets[{i}].attacker must be an object or null, got {attacker!r}")


def _validate_interval(interval, i: int) -> None:
    where = f"targets[{i}].interval"
    if not isinstance(interval, Mapping):
        raise ConfigError(f"{where} must be an object or null, got {interval!r}")
    level = interval.get("level")
    if not (is_number(level) and 0 < level < 1):
        raise ConfigError(f"{where}.level must be a number in (0, 1), got {level!r}")
    if not isinstance(interval.get("method"), str):
        raise ConfigError(f"{where}.method must be a string, got {interval.get('method')!r}")
    for q in _INTERVAL_QUANTITIES:
        bounds = interval.get(q)
        if bounds is None:
            continue
        ok = (isinstance(bounds, (list, tuple)) and len(bounds) == 2
              and all(is_number(b) and math.isfinite(b) for b in bounds) and bounds[0] <= bounds[1])
        if not ok:
            raise ConfigError(f"{where}.{q} must be [lo, hi] with lo <= hi, or null, got {bounds!r}")


def _validate_reference(ref, i: int) -> None:
    spread = ref.get("row_sd") if isinstance(ref, Mapping) else None
    values = [] if not isinstance(spread, Mapping) else [d.get(q) for d in (ref, spread) for q in _INTERVAL_QUANTITIES]
    if not values or not all(x is None or (is_number(x) and math.isfinite(x) and x >= 0) for x in values):
        raise ConfigError(f"targets[{i}].reference must be null or hold finite numbers >= 0 (or null) for "
                          f"accuracy, retention, agreement and their row_sd, got {ref!r}")
