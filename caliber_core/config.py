"""Targets and configs: the one contract calibration, serving, the CLI and the dashboard share.

This module imports only the standard library, so a serving process
that reads a config never loads the calibration numerics.

* :class:`TargetRecord` -- one target and the sigma that serves it (module ``target_record``, re-exported).
* ``caliber.config/v2`` -- the JSON schema (README.md, section "Config JSON"),
  validated by :func:`validate_config` (field rules in :mod:`.config_schema`);
  :func:`load_config`, :func:`config_from_text`, :func:`config_from_bytes`,
  :func:`save_config` and :func:`config_to_json` read and write it, and are
  the only code that parses config JSON. An upload goes through
  :func:`config_from_bytes`, which never reads its content as a path. ``caliber.config/v1`` files still
  load: they are upgraded in memory (``side="point"``, ``interval=None``).
* :func:`sigma_to_serve` -- the sigma a serving process uses for one target.
* :func:`config_digest` -- a config's identity, which keyed serving noise binds.

A saturated target (one the curve never reaches, kept with ``--saturate``)
serves the largest sigma the sweep actually measured. It is recorded with
``"saturated": true`` and that numeric ``sigma`` -- never null, never an
extrapolation past the sweep -- and serving it emits a
:class:`SaturatedTargetWarning`.

Floats are written with Python's shortest round-trip repr, so a save and a
load give back the identical numbers.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import numbers
import os
import warnings
from collections.abc import Mapping

from .config_schema import (  # noqa: F401  (re-exported: the schema's names are the config's)
    ConfigError, check_document, is_number, largest_sigma_measured)
from .frozen_json import FrozenDict, frozen, json_depth, nested_deeper, refuse
from .target_record import (  # noqa: F401  (re-exported: the config's public names)
    CALIBRATED_KINDS, CERTIFIED_LEVEL, SIDES, TARGET_KINDS, TargetRecord, inversion_of_method, plain_values)

SCHEMA = "caliber.config/v2"
SCHEMA_V1 = "caliber.config/v1"
SCHEMAS = (SCHEMA, SCHEMA_V1)
#: Deepest nesting a config may have (real ones nest 4 levels); deeper JSON is refused
#: before parsing, which would otherwise exhaust the interpreter's recursion limit.
MAX_DEPTH = 32
#: Largest config read (file, text or bytes), checked before parsing: a calibrated config is a few
#: kilobytes, a drift reference with every sigma a few hundred.
MAX_CONFIG_BYTES = 4 << 20


class SaturatedTargetWarning(UserWarning):
    """A saturated target is served (by :func:`sigma_to_serve`): its sigma is the largest the sweep measured."""


class Config(FrozenDict):
    """A validated ``caliber.config/v2`` config, read-only all the way down; :func:`load_config` makes it.

    It is the parsed JSON (a ``dict``: ``config["targets"][0]["sigma"]``,
    ``json.dumps(config)``), with every change refused, so what one reader
    sees no other can alter. Every function that accepts a config takes a
    ``Config`` as it is, without validating it again, and still accepts today's
    dict, path or JSON text (validated once, there). ``copy.deepcopy(config)``
    is a plain, mutable dict.

    Attributes
    ----------
    digest : str
        The config's identity (:func:`config_digest`), computed once.
    """

    __slots__ = ("digest",)

    def __init__(self, document: Mapping, digest: str):
        dict.__init__(self, {k: frozen(v) for k, v in document.items()})
        object.__setattr__(self, "digest", digest)

    def __setattr__(self, name, value):
        refuse(self)

    def __reduce__(self):
        return Config, (dict(self), self.digest)


def _clean(obj):
    """Plain JSON values: inf/nan (which validation allows only in display fields) as null."""
    obj = plain_values(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def config_to_json(config: Mapping) -> str:
    """A config (validated first) as indented JSON text, floats in their shortest round-trip form.

    Returns
    -------
    str

    Raises
    ------
    ConfigError
        The config breaks the schema (nothing is returned).
    """
    validate_config(config)
    return json.dumps(_clean(config), indent=2, allow_nan=False) + "\n"


def save_config(config: Mapping, path: str | os.PathLike) -> None:
    """Write a config to ``path`` as JSON (:func:`config_to_json`; OSError when it cannot be written).

    Raises
    ------
    ConfigError
        The config breaks the schema: nothing is written.
    """
    text = config_to_json(config)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_config(source) -> Config:
    """Read, validate and (for v1) upgrade a config: the one place a config is parsed.

    Parameters
    ----------
    source : Config, str, os.PathLike, bytes or Mapping
        A loaded config (returned as it is), a path, JSON text or bytes, or an
        already parsed dict.

    Returns
    -------
    config : Config
        A read-only ``caliber.config/v2`` config (a v1 source is upgraded; the
        input is not modified).

    Raises
    ------
    ConfigError
        Unreadable file, invalid JSON, or a config that breaks the schema.
    """
    if isinstance(source, Config):
        return source
    if isinstance(source, Mapping):
        config = _copy(source, 0)
    else:
        if isinstance(source, (bytes, bytearray)):
            _check_config_size(len(source), "config")
            text = bytes(source).decode("utf-8", errors="replace")
        elif isinstance(source, str) and source.lstrip().startswith("{"):
            _check_config_size(len(source), "config")
            text = source
        elif isinstance(source, (str, os.PathLike)):
            try:
                # Read one byte past the cap and no more: the size is known before any parsing.
                with open(source, "rb") as fh:
                    raw = fh.read(MAX_CONFIG_BYTES + 1)
            except OSError as exc:
                raise ConfigError(f"{os.fspath(source)}: cannot read config ({exc.strerror})") from None
            _check_config_size(len(raw), f"{os.fspath(source)}: config")
            text = raw.decode("utf-8", errors="replace")
        else:
            raise ConfigError(f"config must be a path, JSON text or a dict, got {type(source).__name__}")
        config = _parse_json(text)
    return _validated(config)


def config_from_text(text: str) -> Config:
    """Parse and validate a config held as JSON text; the text is never taken for a path.

    Parameters
    ----------
    text : str
        The config's JSON text (what a file holds).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Not a str, too large, not JSON (a path is refused like any other text
        that is not JSON), nested too deep, or a config that breaks the schema.
    """
    if not isinstance(text, str):
        raise ConfigError(f"config text must be a str, got {type(text).__name__}")
    _check_config_size(len(text), "config")
    return _validated(_parse_json(text))


def config_from_bytes(raw: bytes) -> Config:
    """Parse and validate an uploaded config from its bytes; they are never taken for a path.

    The dashboard's one entry point for config uploads: whatever the bytes
    hold (a server path included), only they are read, and the refusal of text
    that is not a config depends on that text alone, never on what exists on
    the server.

    Parameters
    ----------
    raw : bytes
        The uploaded file's bytes (UTF-8 JSON).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Too large, not UTF-8, not JSON, nested too deep, or a config that breaks the schema.
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ConfigError(f"config bytes must be bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    _check_config_size(len(raw), "config")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config is not UTF-8 text (invalid byte at offset {exc.start})") from None
    return _validated(_parse_json(text))


def _parse_json(text: str):
    """JSON text parsed with the depth and integer-length guards; ConfigError in one line otherwise."""
    too_deep = False
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:  # the parser stops at the interpreter's recursion limit
        too_deep = True
    except ValueError as exc:  # an integer of more digits than int() converts (sys.int_info)
        raise ConfigError(f"config is not valid JSON ({_first_clause(exc)})") from None
    if too_deep or nested_deeper(config, MAX_DEPTH):
        raise ConfigError(f"config JSON is nested {json_depth(text)} levels deep; "
                          f"a config nests at most {MAX_DEPTH}")
    return config


def _first_clause(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.split(";")[0][:120] or type(exc).__name__


def _validated(config) -> Config:
    if isinstance(config, Mapping) and config.get("schema") == SCHEMA_V1:
        config = _upgrade_v1(config)
    validate_config(config)
    try:
        text = json.dumps(_clean(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. NaN in a field validation does not read
        raise ConfigError(f"config holds a value JSON cannot write ({_first_clause(exc)})") from None
    return Config(config, hashlib.sha256(text.encode("ascii")).hexdigest())


def _check_config_size(size: int, what: str) -> None:
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} is larger than {MAX_CONFIG_BYTES:,} bytes ({MAX_CONFIG_BYTES >> 20} MiB), "
                          f"the most a config may hold")


def _copy(obj, depth: int):
    if depth > MAX_DEPTH:
        raise ConfigError(f"config is nested more than {MAX_DEPTH} levels deep")
    if isinstance(obj, Mapping):
        return {k: _copy(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v, depth + 1) for v in obj]
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
    if not (is_number(v_max) and v_max > 0 and is_number(scale) and scale > 0):
        raise ConfigError(f"targets[{index}] is saturated with sigma null, and the config has no "
                          f"sweep.v_max and scale to recover the largest sigma swept from")
    # sigma = S sqrt(v) (margins.sigma_from_v), computed here without the calibration package.
    return float(v_max), float(scale) * math.sqrt(v_max)


def validate_config(config) -> None:
    """Check ``config`` against the ``caliber.config/v2`` schema (a :class:`Config` passes as it is).

    Raises
    ------
    ConfigError
        The first rule broken, naming the field and showing its value.
    """
    if isinstance(config, Config):
        return
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a JSON object, got {type(config).__name__}")
    schema = config.get("schema")
    if schema != SCHEMA:
        hint = " (load_config upgrades v1)" if schema == SCHEMA_V1 else ""
        raise ConfigError(f"config schema must be {SCHEMA!r}, got {schema!r}{hint}")
    check_document(config)


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


def config_digest(config) -> str:
    """A config's identity: hex SHA-256 of its canonical JSON (sorted keys, compact separators).

    Taken after loading (a v1 config is digested as its v2 upgrade), so a dict,
    its JSON text and its file give the same digest; any edited number gives another.

    Returns
    -------
    str
        64 hex digits (a :class:`Config`'s own ``digest``, computed when it was loaded).

    Raises
    ------
    ConfigError
        A config that does not load.
    """
    return load_config(config).digest


def saturation_message(entry: Mapping | TargetRecord) -> str:
    """One line saying what a saturated ``entry`` (target dict or record) serves; the CLI and the Perturber use it.

    Returns
    -------
    str
    """
    get = entry.get if isinstance(entry, Mapping) else lambda k: getattr(entry, k)
    return (f"{get('kind')} target {get('requested')!r} is saturated: the curve never reaches it, "
            f"so sigma={float(get('sigma')):.5g}, the largest sigma the sweep measured, is served")


def target_records(config: Mapping) -> list[TargetRecord]:
    """The targets of a config (anything :func:`load_config` takes) as :class:`TargetRecord` objects, in order.

    Raises
    ------
    ConfigError
        A config that does not load.
    """
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
