"""Targets and configs: the one contract calibration, serving, the CLI and the dashboard share.

This module imports only the standard library, so a serving process
that reads a config never loads the calibration numerics.

* :class:`TargetRecord` -- one target and the sigma that serves it (keyword-only).
* ``caliber.config/v2`` -- the JSON schema (README.md, section "Config JSON"),
  validated by :func:`validate_config`; :func:`load_config`,
  :func:`save_config` and :func:`config_to_json` read and write it, and are
  the only code that parses config JSON. ``caliber.config/v1`` files still
  load: they are upgraded in memory (``side="point"``, ``interval=None``).
* :func:`sigma_to_serve` -- the sigma a serving process uses for one target.

A saturated target (one the curve never reaches, kept with ``--saturate``)
serves the largest sigma the sweep actually measured. It is recorded with
``"saturated": true`` and that numeric ``sigma`` -- never null, never an
extrapolation past the sweep -- and serving it emits a
:class:`SaturatedTargetWarning`.

Floats are written with Python's shortest round-trip repr, so a save and a
load give back the identical numbers.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:  # annotations only: importing calibrate would load scipy
    from .calibration.calibrate import Calibration

SCHEMA = "caliber.config/v2"
SCHEMA_V1 = "caliber.config/v1"
SCHEMAS = (SCHEMA, SCHEMA_V1)

#: Every kind of target a config may hold. "surrogate-retention" targets are
#: measured on a distilled surrogate (their record carries ``attacker``).
TARGET_KINDS = ("retention", "accuracy", "agreement", "surrogate-retention")
#: The kinds solved from a model's logits by calibration.
CALIBRATED_KINDS = tuple(k for k in TARGET_KINDS if k != "surrogate-retention")
#: Which side of the target sigma is chosen on: the point estimate, or the end
#: of a confidence interval that keeps the delivered value at least / at most the target.
SIDES = ("point", "at-least", "at-most")

_REQUIRED = ("schema", "model", "n_classes", "n_samples", "statistic", "scale", "fit", "targets")
_TARGET_REQUIRED = ("kind", "accuracy", "retention", "v", "sigma")
_SATURATED_PREFIX = "saturated-"
_INTERVAL_QUANTITIES = ("accuracy", "retention", "agreement")


class ConfigError(ValueError):
    """A config file or dict that does not follow the schema."""


class SaturatedTargetWarning(UserWarning):
    """A saturated target is served: its sigma is the largest the sweep measured, not a solution."""


@dataclass(frozen=True, kw_only=True)
class TargetRecord:
    """sigma* for one target, with what it is predicted to deliver.

    Attributes
    ----------
    kind : one of :data:`TARGET_KINDS`
    requested : float
        The value as asked for.
    accuracy, retention : float or None
        Target accuracy in absolute terms and as a fraction of A0 (None for
        agreement targets).
    agreement : float or None
        Target agreement (agreement targets only).
    v, sigma : float
        Normalized and raw noise; sigma = S sqrt(v).
    sigma_logistic : float or None
        The closed-form logistic answer, for comparison (inf: out of the law's reach).
    method : str
        Which inversion produced ``sigma`` ("exact-curve", "monte-carlo-curve", "logistic",
        "exact-agreement", "monte-carlo-agreement", "shared-logistic", "none-needed"),
        prefixed "saturated-" for a saturated target.
    saturated : bool
        The target was out of reach and sigma is the largest sigma swept.
    side : {"point", "at-least", "at-most"}, default "point"
    interval : dict or None
        Confidence bounds: ``{"level", "method", "accuracy": [lo, hi] or None,
        "retention": ..., "agreement": ...}``.
    attacker : dict or None
        For "surrogate-retention" targets: the surrogate's training recipe and seeds.
    reference : dict or None
        For the drift check: what ``sigma`` delivers on the calibration sample and the
        per-row spreads, ``{"accuracy", "retention", "agreement", "row_sd": {same keys}}``.
    """

    kind: str
    requested: float
    accuracy: float | None
    retention: float | None
    agreement: float | None
    v: float
    sigma: float
    sigma_logistic: float | None
    method: str
    saturated: bool = False
    side: str = "point"
    interval: dict | None = None
    attacker: dict | None = None
    reference: dict | None = None

    def to_dict(self) -> dict:
        """Plain values; a non-finite ``sigma_logistic`` (no closed-form answer) becomes None."""
        out = {k: _plain(v) for k, v in asdict(self).items()}
        slog = out["sigma_logistic"]
        if isinstance(slog, float) and not math.isfinite(slog):
            out["sigma_logistic"] = None
        return out

    @property
    def inversion(self) -> str:
        """The ``inversion`` option that reproduces this record: "logistic" or "curve"."""
        return inversion_of_method(self.method)


def inversion_of_method(method: str) -> str:
    """"logistic" for a method solved on the logistic law (saturated or shared too), else "curve"."""
    base = str(method)
    if base.startswith(_SATURATED_PREFIX):
        base = base[len(_SATURATED_PREFIX):]
    return "logistic" if base in ("logistic", "shared-logistic") else "curve"


def build_config(
    cal: Calibration,
    targets: list[TargetRecord],
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
            "agreement_targets": "exact-agreement" if cal.curve_method == "exact" else "monte-carlo-agreement",
            "note": "sigma inverts the measured curve; sigma_logistic is the closed-form "
            "logistic answer (Eq. inverse-v) kept for comparison",
        },
        "targets": [t.to_dict() for t in targets],
    }


def _plain(obj):
    """numpy scalars unwrapped to Python numbers, containers walked."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def _clean(obj):
    """Plain JSON values: inf/nan (which validation allows only in display fields) as null."""
    obj = _plain(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def config_to_json(config: Mapping) -> str:
    """Serialize a config (validated first) as indented JSON text."""
    validate_config(config)
    return json.dumps(_clean(config), indent=2, allow_nan=False) + "\n"


def save_config(config: Mapping, path: str | os.PathLike) -> None:
    """Write a config to ``path`` as JSON (nothing is written if it does not validate)."""
    text = config_to_json(config)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_config(source) -> dict:
    """Read, validate and (for v1) upgrade a config.

    Parameters
    ----------
    source : str, os.PathLike, bytes or Mapping
        A path, JSON text or bytes, or an already parsed dict.

    Returns
    -------
    config : dict
        A ``caliber.config/v2`` dict (a v1 source is upgraded; the input is not modified).

    Raises
    ------
    ConfigError
        Unreadable file, invalid JSON, or a config that breaks the schema.
    """
    if isinstance(source, Mapping):
        config = _copy(source)
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
                raise ConfigError(f"{os.fspath(source)}: cannot read config ({exc.strerror})") from None
        else:
            raise ConfigError(f"config must be a path, JSON text or a dict, got {type(source).__name__}")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if isinstance(config, Mapping) and config.get("schema") == SCHEMA_V1:
        config = _upgrade_v1(config)
    validate_config(config)
    return config


def _copy(obj):
    if isinstance(obj, Mapping):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _upgrade_v1(config: Mapping) -> dict:
    """v1 -> v2 in memory: every target a point target; a null saturated sigma gets the sweep's end."""
    out = dict(config)
    out["schema"] = SCHEMA
    targets = out.get("targets")
    if not isinstance(targets, list):
        return out  # validation reports it
    upgraded = []
    for i, t in enumerate(targets):
        if not isinstance(t, Mapping):
            upgraded.append(t)
            continue
        t = dict(t)
        t.setdefault("side", "point")
        t.setdefault("interval", None)
        if t.get("sigma", 0) is None and t.get("saturated"):
            t["v"], t["sigma"] = _sweep_end(out, i)
        upgraded.append(t)
    out["targets"] = upgraded
    return out


def _sweep_end(config: Mapping, index: int) -> tuple[float, float]:
    sweep = config.get("sweep")
    v_max = sweep.get("v_max") if isinstance(sweep, Mapping) else None
    scale = config.get("scale")
    if not (_is_number(v_max) and v_max > 0 and _is_number(scale) and scale > 0):
        raise ConfigError(f"targets[{index}] is saturated with sigma null, and the config has no "
                          f"sweep.v_max and scale to recover the largest sigma swept from")
    # sigma = S sqrt(v) (margins.sigma_from_v), computed here without the calibration package.
    return float(v_max), float(scale) * math.sqrt(v_max)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_config(config) -> None:
    """Raise ConfigError unless ``config`` follows the caliber.config/v2 schema."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a JSON object, got {type(config).__name__}")
    schema = config.get("schema")
    if schema != SCHEMA:
        hint = " (load_config upgrades v1)" if schema == SCHEMA_V1 else ""
        raise ConfigError(f"config schema must be {SCHEMA!r}, got {schema!r}{hint}")
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ConfigError(f"config is missing field(s): {', '.join(missing)}")
    scale = config["scale"]
    if not (_is_number(scale) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"config scale must be a positive number, got {scale!r}")
    if not isinstance(config["targets"], list):
        raise ConfigError("config field 'targets' must be a list")
    for i, t in enumerate(config["targets"]):
        _validate_target(t, i)


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
        if not (_is_number(x) and math.isfinite(x) and x >= 0):
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
    if not (_is_number(level) and 0 < level < 1):
        raise ConfigError(f"{where}.level must be a number in (0, 1), got {level!r}")
    if not isinstance(interval.get("method"), str):
        raise ConfigError(f"{where}.method must be a string, got {interval.get('method')!r}")
    for q in _INTERVAL_QUANTITIES:
        bounds = interval.get(q)
        if bounds is None:
            continue
        ok = (isinstance(bounds, (list, tuple)) and len(bounds) == 2
              and all(_is_number(b) and math.isfinite(b) for b in bounds) and bounds[0] <= bounds[1])
        if not ok:
            raise ConfigError(f"{where}.{q} must be [lo, hi] with lo <= hi, or null, got {bounds!r}")


def _validate_reference(ref, i: int) -> None:
    spread = ref.get("row_sd") if isinstance(ref, Mapping) else None
    values = [] if not isinstance(spread, Mapping) else [d.get(q) for d in (ref, spread) for q in _INTERVAL_QUANTITIES]
    if not values or not all(x is None or (_is_number(x) and math.isfinite(x) and x >= 0) for x in values):
        raise ConfigError(f"targets[{i}].reference must be null or hold finite numbers >= 0 (or null) for "
                          f"accuracy, retention, agreement and their row_sd, got {ref!r}")


def sigma_to_serve(config, *, target: int = 0) -> float:
    """The sigma a serving process adds for ``config["targets"][target]``.

    Parameters
    ----------
    config : dict, str or os.PathLike
        A config (any form :func:`load_config` accepts).
    target : int, default 0
        Index into ``config["targets"]``.

    Returns
    -------
    sigma : float, finite and >= 0.

    Raises
    ------
    ConfigError
        An invalid config, no targets, or an index out of range.
    TypeError
        ``target`` is not an integer.

    Warns
    -----
    SaturatedTargetWarning
        The target is saturated: sigma is the largest the sweep measured, and
        the target itself is not reached at it.
    """
    if isinstance(target, bool) or not isinstance(target, numbers.Integral):
        raise TypeError(f"target must be an integer index, got {target!r}")
    config = load_config(config)
    targets = config["targets"]
    if not targets:
        raise ConfigError("config 'targets' is empty: there is no sigma to serve")
    if not 0 <= target < len(targets):
        raise ConfigError(f"target index {target} is out of range: it must be in [0, {len(targets)})")
    entry = targets[target]
    sigma = float(entry["sigma"])
    if entry.get("saturated"):
        warnings.warn(saturation_message(entry), SaturatedTargetWarning, stacklevel=2)
    return sigma


def saturation_message(entry: Mapping | TargetRecord) -> str:
    """One line saying what a saturated target serves (the CLI and the Perturber use it)."""
    get = entry.get if isinstance(entry, Mapping) else lambda k: getattr(entry, k)
    return (f"{get('kind')} target {get('requested')!r} is saturated: the curve never reaches it, "
            f"so sigma={float(get('sigma')):.5g}, the largest sigma the sweep measured, is served")


def target_records(config: Mapping) -> list[TargetRecord]:
    """The targets of a loaded config as :class:`TargetRecord` objects."""
    config = load_config(config)
    out = []
    for t in config["targets"]:
        fields = {k: t.get(k) for k in TargetRecord.__dataclass_fields__}
        fields["saturated"] = bool(t.get("saturated", False))
        fields["side"] = t.get("side", "point")
        fields["method"] = str(t.get("method", ""))
        fields["requested"] = t.get("requested")
        out.append(TargetRecord(**fields))
    return out
