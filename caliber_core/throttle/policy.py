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
* ``seeding`` -- ``"per-input"`` or ``"consistent"``: the seeding the config
  was calibrated for (a consistent config carries it in its ``noise``
  record). ``throttle init`` writes it from the config, and a policy that
  names another seeding than its config's is refused (so is ``"fresh"``:
  exact repeats would average away).
* ``groups`` -- optional: the group descriptor kinds a request may carry
  (``{"card": {"escalation": {"after_queries": 5000}, "expiry": {"after_seconds": 604800}}}``).
  Each group (one value of a kind: one card) is counted, flagged and
  escalated like an account, on the same levels, with its kind's own
  threshold and flag lifetime; a request is served the highest level of its
  account and its groups. A v1 file without ``groups`` reads as before (and
  an older reader refuses a file with it, rather than serving it without
  its groups).
* ``on_store_error`` -- the fail-closed rule, for when the ledger store cannot
  be reached (an object; the old string form still reads):

  - ``serve``: ``"refuse"`` raises ``StoreUnavailable`` for every request;
    ``"last-known"`` serves an account the level this process last saw for
    it, without counting it.
  - ``unseen``: under ``"last-known"``, what an account this process has not
    seen gets: ``"refuse"`` (the default) or a level >= 1. Never clean.
  - ``start``: ``"refuse"`` (the default) makes a Throttle whose store cannot
    be reached when it is built refuse to start; ``"degraded"`` lets it start
    and serve by the two rules above.

Unknown fields are refused at every depth. Every check fails with
:class:`PolicyError`, one line naming the field and the bad value.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Mapping

from ..serving.runtime import KEYED_SEEDINGS
from ..config import ConfigError, config_from_text, load_config
# The schema's names are this module's too: callers import them from here.
from .policy_schema import (GROUP_KIND_PATTERN, MAX_GROUP_KINDS, MAX_INT_DIGITS, MAX_LEVELS,  # noqa: F401
                            SCHEMA, START_MODES, STORE_ERROR_MODES, GroupKind, Level, Policy, PolicyError, check_fields, check_path, is_int, parse_levels,
                            parse_store_error, policy_dict, policy_json, show_value, target_sigma)

SEEDINGS = KEYED_SEEDINGS  # a policy serves keyed noise only
# Bounds that keep a hostile file from asking for absurd work or overflow.
MAX_QUERIES = 10**12          # escalation threshold, in queries
MAX_SECONDS = 10 * 366 * 86400  # ten years
MAX_POLICY_BYTES = 1 << 20


def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes (what ``sha256sum`` prints).

    Parameters
    ----------
    path : str or os.PathLike
        The file, read in 1 MiB blocks.

    Returns
    -------
    str
        64 lowercase hex characters.

    Raises
    ------
    PolicyError
        The file cannot be read (the message names the path and the reason).
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise PolicyError(f"{os.fspath(path)}: cannot read config ({exc.strerror})") from None
    return digest.hexdigest()


def config_seeding(config: Mapping) -> str:
    """The seeding a loaded config was calibrated for: its ``noise`` record's, else ``"per-input"``.

    Parameters
    ----------
    config : Mapping
        A loaded config (``caliber.config/v2``).

    Returns
    -------
    str
        The seeding name.
    """
    record = config.get("noise")
    if isinstance(record, Mapping) and record.get("seeding") is not None:
        return str(record["seeding"])
    return "per-input"


def _config_and_sigmas(source, targets, *, text: bool = False) -> tuple[dict, list]:
    """The config (a path, or with ``text`` its JSON text, never read as a path) and the sigma each
    listed target serves, as PolicyError."""
    try:
        config = config_from_text(source) if text else load_config(source)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    if not isinstance(targets, (list, tuple)) or not targets:
        raise PolicyError(f"a policy needs at least one level (a config target index), got {targets!r}")
    return config, [target_sigma(config, t, f"level {j}") for j, t in enumerate(targets, start=1)]


def build_policy(config_path, *, targets, escalate_after: int, expire_after=None, shadow: bool = False,
                 seeding: str | None = None, on_store_error: str = "last-known", unseen_level: int | None = None,
                 start_degraded: bool = False, groups=None, out_path=None) -> dict:
    """A validated policy dict whose level j >= 1 serves ``config["targets"][targets[j-1]]``.

    Parameters
    ----------
    config_path : str or os.PathLike
        The config file the levels serve.
    targets : sequence of int
        Config target indices, one per flagged level, level 1 first.
    escalate_after : int
        Queries (rows) at its level after which a flagged account moves up one level.
    expire_after : float or None, optional
        Seconds after it was set that a flag lapses; None: never.
    shadow : bool, optional
        Count and decide, but serve clean.
    seeding : str or None, optional
        Defaults to the config's own (:func:`config_seeding`); another is refused.
    on_store_error, unseen_level, start_degraded : optional
        The outage behaviour (see :func:`policy_dict`).
    groups : Mapping of str to (int, float or None), optional
        Group kinds, ``{kind: (escalate_after, expire_after)}`` (see :func:`policy_dict`).
    out_path : str or os.PathLike, optional
        Where the policy will be saved: the config path is then written
        relative to its folder, so the pair can move together.

    Returns
    -------
    dict
        The ``caliber.policy/v1`` document, already validated by :func:`parse_policy`.

    Raises
    ------
    PolicyError
        The config does not load, a target index is out of range, or any field
        is invalid (the message names it).
    """
    config_path = os.fspath(config_path)
    check_path(config_path, "config path")
    config, sigmas = _config_and_sigmas(config_path, targets)
    base_dir = None if out_path is None else os.path.dirname(os.path.abspath(os.fspath(out_path)))
    written = config_path if base_dir is None else os.path.relpath(os.path.abspath(config_path), base_dir)
    doc = policy_dict(config_path=written, config_sha256=file_sha256(config_path),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow,
                      seeding=config_seeding(config) if seeding is None else seeding,
                      on_store_error=on_store_error, unseen_level=unseen_level, start_degraded=start_degraded,
                      groups=groups)
    parse_policy(doc, base_dir=base_dir)
    return doc


def policy_to_json(doc: Mapping) -> str:
    """A policy dict as the file's text: indented JSON and a final newline.

    Raises
    ------
    ValueError
        The dict holds NaN or an infinity (JSON has neither).
    """
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def save_policy(doc: Mapping, path) -> None:
    """Write a policy dict to ``path`` (UTF-8, :func:`policy_to_json`'s text).

    Raises
    ------
    ValueError
        The dict holds NaN or an infinity.
    OSError
        The file cannot be written.
    """
    text = policy_to_json(doc)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_policy(source) -> Policy:
    """Read and validate a policy (path, JSON text or dict) and the config it names.

    Parameters
    ----------
    source : str, os.PathLike or Mapping
        A policy file (at most 1 MiB), its JSON text (starting with ``{``) or the parsed dict.
        A relative config path is resolved against the policy file's folder
        (the current folder for text or a dict).

    Returns
    -------
    Policy
        The validated policy, its config loaded.

    Raises
    ------
    PolicyError
        The file cannot be read or is too large, the text is not JSON (or holds
        NaN, an infinity or nesting too deep), or :func:`parse_policy` refuses it.
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
        doc = policy_json(text)
    return parse_policy(doc, base_dir=base_dir)


def policy_for_config_text(config_text: str, *, config_name: str, targets, escalate_after: int,
                           expire_after=None, shadow: bool = False, groups=None) -> tuple[dict, Policy]:
    """A policy for a config held in memory as JSON text (the dashboard's).

    Parameters
    ----------
    config_text : str
        The config's JSON text.
    config_name : str
        The file name the policy gives the config: save ``config_text`` under
        that name beside the policy (the policy holds the sha256 of its UTF-8 bytes).
    targets : sequence of int
        Config target indices, one per flagged level, level 1 first.
    escalate_after, expire_after, shadow, groups :
        As in :func:`build_policy`.

    Returns
    -------
    tuple of (dict, Policy)
        The policy document and the validated policy.

    Raises
    ------
    PolicyError
        The config does not load, a target index is out of range, or a field is invalid.
    """
    config, sigmas = _config_and_sigmas(config_text, targets, text=True)
    doc = policy_dict(config_path=config_name, config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow,
                      seeding=config_seeding(config), groups=groups)
    return doc, parse_policy(doc, config_text=config_text)


def parse_policy(doc, *, base_dir=None, config_text: str | None = None) -> Policy:
    """Validate a parsed policy dict against the schema and its config.

    Parameters
    ----------
    doc : Mapping
        The parsed ``caliber.policy/v1`` document.
    base_dir : str, optional
        The folder a relative config path is read from (default: the current folder).
    config_text : str, optional
        The config's JSON text, used instead of reading the path the policy names.

    Returns
    -------
    Policy
        The validated policy, its config loaded.

    Raises
    ------
    PolicyError
        On the first problem: an unknown or missing field at any depth, a value
        out of its bounds, a config whose sha256 differs from the policy's, or a
        config that does not load (the message names the field).
    """
    if not isinstance(doc, Mapping):
        raise PolicyError(f"policy must be a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise PolicyError(f"policy schema must be {SCHEMA!r}, got {show_value(doc.get('schema'))}")
    check_fields(doc, "", "")
    ref = doc.get("config")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("path"), str) or not ref["path"]:
        raise PolicyError(f"policy 'config' must be an object with a 'path' string, got {show_value(ref)}")
    check_fields(ref, "config", "config")
    check_path(ref["path"], "config.path")
    sha = ref.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise PolicyError(f"policy config.sha256 must be 64 lowercase hex characters, got {show_value(sha)}")
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
        config = load_config(path) if config_text is None else config_from_text(config_text)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    k = ref.get("n_classes")
    if not is_int(k) or k != config["n_classes"]:
        raise PolicyError(f"policy config.n_classes is {show_value(k)} but the config has K={config['n_classes']}")
    levels = parse_levels(doc.get("levels"), config)
    after = _escalation(doc.get("escalation"), "")
    seconds = _expiry(doc.get("expiry"), "")
    shadow = doc.get("shadow")
    if not isinstance(shadow, bool):
        raise PolicyError(f"policy 'shadow' must be true or false, got {show_value(shadow)}")
    calibrated = config_seeding(config)
    seeding = doc.get("seeding", calibrated)
    if seeding not in SEEDINGS:
        raise PolicyError(f"policy 'seeding' must be one of {SEEDINGS}, got {show_value(seeding)}")
    if seeding != calibrated:
        raise PolicyError(f"policy 'seeding' is {seeding!r} but config {ref['path']} was calibrated for "
                          f"{calibrated!r} seeding: write the policy again with 'throttle init'")
    mode, unseen, start_degraded = parse_store_error(doc.get("on_store_error", "last-known"), len(levels) - 1)
    return Policy(levels=levels, escalate_after=after, expire_after=seconds, shadow=shadow, seeding=seeding,
                  on_store_error=mode, config=config, config_path=ref["path"], config_sha256=sha,
                  unseen_level=unseen, start_degraded=start_degraded, groups=_groups(doc.get("groups", {})))


def _escalation(escalation, where: str) -> int:
    """``escalation.after_queries`` of the policy (``where`` ""), or of a group kind (``where`` "groups.card.")."""
    if not isinstance(escalation, Mapping):
        raise PolicyError(f"policy '{where}escalation' must be an object with 'after_queries', "
                          f"got {show_value(escalation)}")
    check_fields(escalation, f"{where}escalation", "escalation")
    after = escalation.get("after_queries")
    if not is_int(after) or not 1 <= after <= MAX_QUERIES:
        raise PolicyError(f"{where}escalation.after_queries must be an integer in [1, {MAX_QUERIES}], "
                          f"got {show_value(after)}")
    return int(after)


def _expiry(expiry, where: str) -> float | None:
    """``expiry.after_seconds`` (None: never) of the policy or of a group kind, as :func:`_escalation`."""
    if not isinstance(expiry, Mapping) or "after_seconds" not in expiry:
        raise PolicyError(f"policy '{where}expiry' must be an object with 'after_seconds' (null: never), "
                          f"got {show_value(expiry)}")
    check_fields(expiry, f"{where}expiry", "expiry")
    seconds = expiry["after_seconds"]
    if seconds is not None and not (isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise PolicyError(f"{where}expiry.after_seconds must be null or a number in (0, {MAX_SECONDS}], "
                          f"got {show_value(seconds)}")
    return None if seconds is None else float(seconds)


def _groups(raw) -> tuple[GroupKind, ...]:
    """The ``groups`` object: each declared kind with its own escalation and expiry (both required)."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"policy 'groups' must be an object of group kinds, got {show_value(raw)}")
    if len(raw) > MAX_GROUP_KINDS:
        raise PolicyError(f"policy 'groups' declares {len(raw)} kinds: at most {MAX_GROUP_KINDS}")
    kinds = []
    for name, spec in raw.items():
        if not (isinstance(name, str) and GROUP_KIND_PATTERN.fullmatch(name)):
            raise PolicyError(f"policy groups: kind {show_value(name)} must be a lowercase identifier "
                              "([a-z][a-z0-9_]*, at most 32 characters)")
        where = f"groups.{name}."
        if not isinstance(spec, Mapping):
            raise PolicyError(f"policy '{where[:-1]}' must be an object with 'escalation' and 'expiry', "
                              f"got {show_value(spec)}")
        check_fields(spec, where[:-1], "group")
        kinds.append(GroupKind(name, _escalation(spec.get("escalation"), where), _expiry(spec.get("expiry"), where)))
    return tuple(kinds)
