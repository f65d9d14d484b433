"""The throttle policy: ``caliber.policy/v1``, the only code that reads or writes policy JSON.

A policy names the calibrated config it serves (path and sha256 of the file's
bytes) and says, for an account the provider has flagged:

* ``levels`` -- ordered; level 0 is clean service, level j >= 1 serves the
  config's target ``target`` (index into ``config["targets"]``) at its sigma.
  Sigmas strictly increase with j, so each level's noise nests the one below.
* ``escalation.after_queries`` -- a flagged account moves up one level after
  that many queries (rows) at its current level; the top level is final.
* ``expiry.after_seconds`` -- a flag lapses that long after it was set (null: never).
* ``shadow`` -- decide and record everything, but serve clean logits.
* ``on_store_error`` -- what ``respond`` does when the ledger store cannot be
  reached: ``"last-known"`` serves the level this process last saw for the
  account (clean if none) without counting, ``"refuse"`` raises.

Every check fails with :class:`PolicyError`, one line naming the bad value.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import ConfigError, load_config, sigma_to_serve

SCHEMA = "caliber.policy/v1"
STORE_ERROR_MODES = ("last-known", "refuse")
SEEDINGS = ("per-input", "fresh")

# Bounds that keep a hostile file from asking for absurd work or overflow.
MAX_LEVELS = 32
MAX_QUERIES = 10**12          # escalation threshold, in queries
MAX_SECONDS = 10 * 366 * 86400  # ten years
MAX_POLICY_BYTES = 1 << 20


class PolicyError(ValueError):
    """A policy file or dict that does not follow ``caliber.policy/v1``, or that does not match its config."""


@dataclass(frozen=True)
class Level:
    """One rung: ``index`` 0 is clean (``target`` None, ``sigma`` 0)."""

    index: int
    target: int | None
    sigma: float


@dataclass(frozen=True)
class Policy:
    """A validated policy with its config loaded (``config`` is the parsed ``caliber.config/v2`` dict)."""

    levels: tuple[Level, ...]
    escalate_after: int
    expire_after: float | None
    shadow: bool
    seeding: str
    on_store_error: str
    config: dict
    config_path: str
    config_sha256: str

    @property
    def top(self) -> int:
        """The highest level index."""
        return len(self.levels) - 1

    def check_level(self, level) -> int:
        """A flag level: an integer in 1..top, else PolicyError naming it."""
        if isinstance(level, bool) or not isinstance(level, numbers.Integral) or not 1 <= level <= self.top:
            raise PolicyError(f"level {level!r} is not a flagged level of this policy: use 1..{self.top}")
        return int(level)

    def to_dict(self) -> dict:
        return policy_dict(
            config_path=self.config_path, config_sha256=self.config_sha256,
            n_classes=self.config["n_classes"], targets=[lv.target for lv in self.levels[1:]],
            sigmas=[lv.sigma for lv in self.levels[1:]], escalate_after=self.escalate_after,
            expire_after=self.expire_after, shadow=self.shadow, seeding=self.seeding,
            on_store_error=self.on_store_error)


def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes (what ``sha256sum`` prints)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise PolicyError(f"{os.fspath(path)}: cannot read config ({exc.strerror})") from None
    return digest.hexdigest()


def policy_dict(*, config_path: str, config_sha256: str, n_classes: int, targets, sigmas, escalate_after: int,
                expire_after=None, shadow: bool = False, seeding: str = "per-input",
                on_store_error: str = "last-known") -> dict:
    """The JSON-able policy (level 0 added in front of the given targets)."""
    levels = [{"level": 0, "target": None, "sigma": 0.0}]
    levels += [{"level": j, "target": int(t), "sigma": float(s)}
               for j, (t, s) in enumerate(zip(targets, sigmas), start=1)]
    return {
        "schema": SCHEMA,
        "config": {"path": str(config_path), "sha256": config_sha256, "n_classes": int(n_classes)},
        "levels": levels,
        "escalation": {"after_queries": escalate_after},
        "expiry": {"after_seconds": expire_after},
        "shadow": bool(shadow),
        "seeding": seeding,
        "on_store_error": on_store_error,
    }


def _config_and_sigmas(source, targets) -> tuple[dict, list]:
    """The config (a path or its JSON text) and the sigma each listed target serves, as PolicyError."""
    try:
        config = load_config(source)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    if not isinstance(targets, (list, tuple)) or not targets:
        raise PolicyError(f"a policy needs at least one level (a config target index), got {targets!r}")
    return config, [_target_sigma(config, t, f"level {j}") for j, t in enumerate(targets, start=1)]


def build_policy(config_path, *, targets, escalate_after: int, expire_after=None, shadow: bool = False,
                 seeding: str = "per-input", on_store_error: str = "last-known", out_path=None) -> dict:
    """A validated policy dict whose level j >= 1 serves ``config["targets"][targets[j-1]]``.

    The config path is written relative to ``out_path``'s folder when given
    (so the pair can move together), else as given.
    """
    config_path = os.fspath(config_path)
    config, sigmas = _config_and_sigmas(config_path, targets)
    base_dir = None if out_path is None else os.path.dirname(os.path.abspath(os.fspath(out_path)))
    written = config_path if base_dir is None else os.path.relpath(os.path.abspath(config_path), base_dir)
    doc = policy_dict(config_path=written, config_sha256=file_sha256(config_path),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow,
                      seeding=seeding, on_store_error=on_store_error)
    parse_policy(doc, base_dir=base_dir)
    return doc


def policy_to_json(doc: Mapping) -> str:
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def save_policy(doc: Mapping, path) -> None:
    text = policy_to_json(doc)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _reject_constant(name):
    raise PolicyError(f"policy JSON holds {name}, which is not a number")


def load_policy(source) -> Policy:
    """Read and validate a policy (path, JSON text or dict) and the config it names.

    A relative config path is resolved against the policy file's folder (the
    current folder for text or a dict).
    """
    base_dir = None
    if isinstance(source, Mapping):
        doc = source
    else:
        if isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        elif isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            base_dir = os.path.dirname(os.path.abspath(path))
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(MAX_POLICY_BYTES + 1)
            except OSError as exc:
                raise PolicyError(f"{path}: cannot read policy ({exc.strerror})") from None
            if len(raw) > MAX_POLICY_BYTES:
                raise PolicyError(f"{path}: policy is larger than {MAX_POLICY_BYTES} bytes")
            text = raw.decode("utf-8", errors="replace")
        else:
            raise PolicyError(f"policy must be a path, JSON text or a dict, got {type(source).__name__}")
        try:
            doc = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"policy is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except RecursionError:
            raise PolicyError("policy JSON is nested too deeply") from None
    return parse_policy(doc, base_dir=base_dir)


def _show(value) -> str:
    """A value for a message, cut to 40 characters (a hostile file may hold a 10,000-digit number)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _target_sigma(config: dict, target, where: str) -> float:
    n = len(config["targets"])
    if not _is_int(target) or not 0 <= target < n:
        raise PolicyError(f"{where}: target {target!r} is not a target index of the config: use 0..{n - 1}")
    import warnings

    with warnings.catch_warnings():  # a saturated target still serves; the page and CLI say so
        warnings.simplefilter("ignore")
        return sigma_to_serve(config, target=int(target))


def policy_for_config_text(config_text: str, *, config_name: str, targets, escalate_after: int,
                           expire_after=None, shadow: bool = False) -> tuple[dict, Policy]:
    """A policy for a config held in memory as JSON text (the dashboard's): (policy dict, Policy).

    The policy names the config as ``config_name`` with the sha256 of
    ``config_text``'s UTF-8 bytes: save that text under that name beside the policy.
    """
    config, sigmas = _config_and_sigmas(config_text, targets)
    doc = policy_dict(config_path=config_name, config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow)
    return doc, parse_policy(doc, config_text=config_text)


def parse_policy(doc, *, base_dir=None, config_text: str | None = None) -> Policy:
    """Validate a parsed policy dict against the schema and its config; PolicyError on the first problem.

    The config is read from the path the policy names (relative to
    ``base_dir``), or taken from ``config_text`` when given.
    """
    if not isinstance(doc, Mapping):
        raise PolicyError(f"policy must be a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise PolicyError(f"policy schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    known = {"schema", "config", "levels", "escalation", "expiry", "shadow", "seeding", "on_store_error"}
    extra = sorted(set(doc) - known)
    if extra:
        raise PolicyError(f"policy has unknown field(s): {', '.join(map(str, extra[:5]))}")
    ref = doc.get("config")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("path"), str) or not ref["path"]:
        raise PolicyError(f"policy 'config' must be an object with a 'path' string, got {ref!r}")
    sha = ref.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise PolicyError(f"policy config.sha256 must be 64 lowercase hex characters, got {sha!r}")
    path = ref["path"]
    if base_dir is not None and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    if config_text is None:
        actual = file_sha256(path)
    else:
        actual = hashlib.sha256(config_text.encode()).hexdigest()
    if actual != sha:
        raise PolicyError(f"config {ref['path']} has sha256 {actual[:16]}..., the policy names {sha[:16]}...: "
                          "the config changed since the policy was written")
    try:
        config = load_config(path if config_text is None else config_text)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    k = ref.get("n_classes")
    if not _is_int(k) or k != config["n_classes"]:
        raise PolicyError(f"policy config.n_classes is {k!r} but the config has K={config['n_classes']}")
    levels = _parse_levels(doc.get("levels"), config)
    escalation = doc.get("escalation")
    after = escalation.get("after_queries") if isinstance(escalation, Mapping) else None
    if not _is_int(after) or not 1 <= after <= MAX_QUERIES:
        raise PolicyError(f"escalation.after_queries must be an integer in [1, {MAX_QUERIES}], got {_show(after)}")
    expiry = doc.get("expiry")
    if not isinstance(expiry, Mapping) or "after_seconds" not in expiry:
        raise PolicyError(f"policy 'expiry' must be an object with 'after_seconds' (null: never), got {expiry!r}")
    seconds = expiry["after_seconds"]
    if seconds is not None and not (isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise PolicyError(f"expiry.after_seconds must be null or a number in (0, {MAX_SECONDS}], got {_show(seconds)}")
    shadow = doc.get("shadow")
    if not isinstance(shadow, bool):
        raise PolicyError(f"policy 'shadow' must be true or false, got {shadow!r}")
    seeding = doc.get("seeding", "per-input")
    if seeding not in SEEDINGS:
        raise PolicyError(f"policy 'seeding' must be one of {SEEDINGS}, got {seeding!r}")
    mode = doc.get("on_store_error", "last-known")
    if mode not in STORE_ERROR_MODES:
        raise PolicyError(f"policy 'on_store_error' must be one of {STORE_ERROR_MODES}, got {mode!r}")
    return Policy(levels=levels, escalate_after=int(after),
                  expire_after=None if seconds is None else float(seconds), shadow=shadow, seeding=seeding,
                  on_store_error=mode, config=config, config_path=ref["path"], config_sha256=sha)


def _parse_levels(raw, config: dict) -> tuple[Level, ...]:
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_LEVELS + 1:
        n = len(raw) if isinstance(raw, list) else raw
        raise PolicyError(f"policy 'levels' must list level 0 and 1..{MAX_LEVELS} flagged levels, got {n!r}")
    out = []
    for j, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or entry.get("level") != j or isinstance(entry.get("level"), bool):
            got = entry.get("level") if isinstance(entry, Mapping) else entry
            raise PolicyError(f"levels[{j}] must be an object with \"level\": {j}, got {got!r}")
        if j == 0:
            if entry.get("target") is not None or entry.get("sigma") not in (0, 0.0):
                raise PolicyError("level 0 is clean service: its target must be null and its sigma 0")
            out.append(Level(0, None, 0.0))
            continue
        sigma = _target_sigma(config, entry.get("target"), f"level {j}")
        written = entry.get("sigma")
        if not (isinstance(written, numbers.Real) and not isinstance(written, bool)
                and math.isfinite(written) and written == sigma):
            raise PolicyError(f"level {j} says sigma {written!r} but config target {entry['target']} "
                              f"serves sigma {sigma!r}")
        if sigma <= out[-1].sigma:
            raise PolicyError(f"level {j} serves sigma {sigma:.6g}, not above level {j - 1}'s "
                              f"{out[-1].sigma:.6g}: levels must add noise as they go up")
        out.append(Level(j, int(entry["target"]), sigma))
    return tuple(out)
