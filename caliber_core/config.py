"""The calibrated config: a versioned JSON document, saved and loaded exactly.

Schema ``caliber.config/v1`` (documented in README.md, section "Config JSON").
Floats are written with Python's shortest round-trip repr, so a save and a load
give back the identical numbers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

from . import __version__
from .calibration.calibrate import Calibration, TargetResult

SCHEMA = "caliber.config/v1"
_REQUIRED = ("schema", "model", "n_classes", "n_samples", "statistic", "scale", "fit", "targets")
_TARGET_REQUIRED = ("kind", "accuracy", "retention", "v", "sigma")


class ConfigError(ValueError):
    """A config file or dict that does not follow the schema."""


def build_config(
    cal: Calibration,
    targets: list[TargetResult],
    *,
    sha256: str | None = None,
    source: str | None = None,
) -> dict:
    """The config dict for a calibration and its targets (in the order given)."""
    sweep = cal.sweep
    return {
        "schema": SCHEMA,
        "generator": f"caliber_core {__version__}",
        "model": cal.name,
        "source": source,
        "sha256": sha256,
        "n_samples": cal.n_samples,
        "n_classes": cal.n_classes,
        "statistic": cal.statistic,
        "scale": cal.scale,
        "scales": dict(cal.scales),
        "clean_accuracy": cal.clean_accuracy,
        "chance": cal.chance,
        "sweep": {
            "realizations": cal.intervals.realizations,
            "seed": cal.seed,
            "n_points": int(sweep.v.size),
            "v_min": float(sweep.v[0]),
            "v_max": float(sweep.v[-1]),
        },
        "fit": {
            "mode": "per-model",
            "law": "logistic",
            "quantity": cal.fit_quantity,
            "v50": cal.fit.v50,
            "p": cal.fit.p,
            "c": cal.fit.c,
            "r2": cal.fit.r2,
            "rmse": cal.fit.rmse,
            "n_points": cal.fit.n_points,
        },
        "inversion": {
            "accuracy_targets": "exact-curve" if cal.curve_method == "exact" else "monte-carlo-curve",
            "agreement_targets": "exact-agreement",
            "note": "sigma inverts the measured curve; sigma_logistic is the closed-form "
            "logistic answer (Eq. inverse-v) kept for comparison",
        },
        "targets": [t.to_dict() for t in targets],
    }


def _finite_or_none(x):
    # JSON has no inf/nan: a saturated sigma is written as null.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _clean(obj):
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()  # numpy scalars
    return _finite_or_none(obj)


def config_to_json(config: Mapping) -> str:
    """Serialize a config (validated first) as indented JSON text."""
    validate_config(config)
    return json.dumps(_clean(config), indent=2, allow_nan=False) + "\n"


def save_config(config: Mapping, path: str | os.PathLike) -> None:
    """Write a config to ``path`` as JSON."""
    text = config_to_json(config)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_config(source) -> dict:
    """Read and validate a config from a path, a JSON string/bytes, or a mapping."""
    if isinstance(source, Mapping):
        config = dict(source)
    else:
        if isinstance(source, (bytes, bytearray)):
            text = bytes(source).decode("utf-8", errors="replace")
        elif isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        elif isinstance(source, (str, os.PathLike)):
            try:
                with open(source, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                raise ConfigError(f"{source}: cannot read config ({exc.strerror})") from None
        else:
            raise ConfigError(f"config must be a path, JSON text or a dict, got {type(source).__name__}")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    validate_config(config)
    return config


def validate_config(config) -> None:
    """Raise ConfigError unless ``config`` follows the caliber.config/v1 schema."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a JSON object, got {type(config).__name__}")
    schema = config.get("schema")
    if schema != SCHEMA:
        raise ConfigError(f"config schema must be {SCHEMA!r}, got {schema!r}")
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ConfigError(f"config is missing field(s): {', '.join(missing)}")
    if not isinstance(config["targets"], list):
        raise ConfigError("config field 'targets' must be a list")
    for i, t in enumerate(config["targets"]):
        if not isinstance(t, Mapping):
            raise ConfigError(f"targets[{i}] must be an object")
        gone = [k for k in _TARGET_REQUIRED if k not in t]
        if gone:
            raise ConfigError(f"targets[{i}] is missing field(s): {', '.join(gone)}")
        sigma = t["sigma"]
        valid = isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and sigma >= 0
        if sigma is not None and not valid:
            raise ConfigError(f"targets[{i}].sigma must be a number >= 0 or null, got {sigma!r}")
    scale = config["scale"]
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ConfigError(f"config scale must be a positive number, got {scale!r}")
