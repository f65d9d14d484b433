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
from dataclasses import dataclass

from ..serving.runtime import KEYED_SEEDINGS
from ..config import ConfigError, load_config, sigma_to_serve

SCHEMA = "caliber.policy/v1"
STORE_ERROR_MODES = ("last-known", "refuse")
START_MODES = ("refuse", "degraded")
SEEDINGS = KEYED_SEEDINGS  # a policy serves keyed noise only
# The fields each object of the schema may hold; anything else is refused.
_FIELDS = {
    "": {"schema", "config", "levels", "escalation", "expiry", "shadow", "seeding", "on_store_error"},
    "config": {"path", "sha256", "n_classes"},
    "levels": {"level", "target", "sigma"},
    "escalation": {"after_queries"},
    "expiry": {"after_seconds"},
    "on_store_error": {"serve", "unseen", "start"},
}
#: Integers longer than this are refused while parsing (Python refuses > 4,300 digits with no field named).
MAX_INT_DIGITS = 40

# Bounds that keep a hostile file from asking for absurd work or overflow.
MAX_LEVELS = 32
MAX_QUERIES = 10**12          # escalation threshold, in queries
MAX_SECONDS = 10 * 366 * 86400  # ten years
MAX_POLICY_BYTES = 1 << 20


class PolicyError(ValueError):
    """A policy file or dict that does not follow ``caliber.policy/v1``, or that does not match its config."""


@dataclass(frozen=True)
class Level:
    """One rung of the escalation ladder: ``index`` 0 is clean (``target`` None, ``sigma`` 0).

    Attributes
    ----------
    index : int
        The level, 0 (clean) to the policy's top.
    target : int or None
        The index of the config target this level serves; None at level 0.
    sigma : float
        The noise the level adds (the target's sigma; 0 at level 0).
    """

    index: int
    target: int | None
    sigma: float


@dataclass(frozen=True)
class Policy:
    """A validated policy with its config loaded (``config`` is the parsed ``caliber.config/v2`` dict).

    Made by :func:`load_policy` or :func:`parse_policy`, never by hand: the
    fields have been checked against the schema and the config.

    Attributes
    ----------
    levels : tuple of Level
        Level 0 (clean) first, then one per flagged level.
    escalate_after : int
        Queries (rows) at its level after which a flagged account moves up one level.
    expire_after : float or None
        Seconds after it was set that a flag lapses; None: never.
    shadow : bool
        Count and decide, but serve every account clean.
    seeding : str
        ``"per-input"`` or ``"consistent"``: how each answer's noise is drawn.
    on_store_error : str
        While the ledger is unreachable: ``"last-known"`` (an account's last seen level,
        uncounted) or ``"refuse"``.
    config : dict
        The config the levels serve.
    config_path, config_sha256 : str
        Where the config is, and the sha256 of its bytes the policy was written for.
    unseen_level : int or None
        The level served to an account this process has not seen during an outage; None: refused.
    start_degraded : bool
        Start without the ledger (serving as during an outage) instead of refusing to start.
    """

    levels: tuple[Level, ...]
    escalate_after: int
    expire_after: float | None
    shadow: bool
    seeding: str
    on_store_error: str
    config: dict
    config_path: str
    config_sha256: str
    unseen_level: int | None = None  # None: refuse an account this process has not seen during an outage
    start_degraded: bool = False

    @property
    def top(self) -> int:
        """The highest level index."""
        return len(self.levels) - 1

    def check_level(self, level) -> int:
        """A flag level of this policy.

        Parameters
        ----------
        level : int
            The level asked for.

        Returns
        -------
        int
            ``level``, an integer in 1..:attr:`top`.

        Raises
        ------
        PolicyError
            Not an integer, or outside 1..top (the message names both).
        """
        if isinstance(level, bool) or not isinstance(level, numbers.Integral) or not 1 <= level <= self.top:
            raise PolicyError(f"level {level!r} is not a flagged level of this policy: use 1..{self.top}")
        return int(level)

    def to_dict(self) -> dict:
        """The policy as the JSON-able dict :func:`policy_dict` writes (the file format)."""
        return policy_dict(
            config_path=self.config_path, config_sha256=self.config_sha256,
            n_classes=self.config["n_classes"], targets=[lv.target for lv in self.levels[1:]],
            sigmas=[lv.sigma for lv in self.levels[1:]], escalate_after=self.escalate_after,
            expire_after=self.expire_after, shadow=self.shadow, seeding=self.seeding,
            on_store_error=self.on_store_error, unseen_level=self.unseen_level, start_degraded=self.start_degraded)


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


def policy_dict(*, config_path: str, config_sha256: str, n_classes: int, targets, sigmas, escalate_after: int,
                expire_after=None, shadow: bool = False, seeding: str = "per-input",
                on_store_error: str = "last-known", unseen_level: int | None = None,
                start_degraded: bool = False) -> dict:
    """The JSON-able policy (level 0 added in front of the given targets), not validated.

    Parameters
    ----------
    config_path, config_sha256 : str
        The config as the policy names it, and the sha256 of its bytes.
    n_classes : int
        The config's number of classes.
    targets : sequence of int
        The config target index of each flagged level, level 1 first.
    sigmas : sequence of float
        The sigma each of those levels serves.
    escalate_after : int
        Queries (rows) at its level after which a flagged account moves up one level.
    expire_after : float or None, optional
        Seconds after it was set that a flag lapses; None: never.
    shadow : bool, optional
        Count and decide, but serve clean.
    seeding : str, optional
        ``"per-input"`` or ``"consistent"``.
    on_store_error : str, optional
        What a seen account gets while the ledger is down.
    unseen_level : int or None, optional
        The level an unseen account gets while the ledger is down; None: refused.
    start_degraded : bool, optional
        Start without the ledger instead of refusing to start.

    Returns
    -------
    dict
        The ``caliber.policy/v1`` document; :func:`parse_policy` validates it.
    """
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
        "on_store_error": {"serve": on_store_error, "unseen": "refuse" if unseen_level is None else int(unseen_level),
                           "start": "degraded" if start_degraded else "refuse"},
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
                 seeding: str | None = None, on_store_error: str = "last-known", unseen_level: int | None = None,
                 start_degraded: bool = False, out_path=None) -> dict:
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
    _check_path(config_path, "config path")
    config, sigmas = _config_and_sigmas(config_path, targets)
    base_dir = None if out_path is None else os.path.dirname(os.path.abspath(os.fspath(out_path)))
    written = config_path if base_dir is None else os.path.relpath(os.path.abspath(config_path), base_dir)
    doc = policy_dict(config_path=written, config_sha256=file_sha256(config_path),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow,
                      seeding=config_seeding(config) if seeding is None else seeding,
                      on_store_error=on_store_error, unseen_level=unseen_level, start_degraded=start_degraded)
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


def _reject_constant(name):
    raise PolicyError(f"policy JSON holds {name}, which is not a number")


class _LongInteger:
    """An integer too long to convert, kept as its digit count so the field's check can name the field."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits:,}-digit integer"


def _parse_int(text: str):
    digits = len(text.lstrip("-"))
    return _LongInteger(digits) if digits > MAX_INT_DIGITS else int(text)


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
        try:
            doc = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"policy is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except RecursionError:
            raise PolicyError("policy JSON is nested too deeply") from None
    return parse_policy(doc, base_dir=base_dir)


def _show(value) -> str:
    """A value for a message, cut to 40 characters (a hostile file may hold a 10,000-digit number)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
        return f"a {len(str(abs(value))):,}-digit integer" if abs(value) < 10**4000 else "an integer of over 4,000 digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_fields(obj, where: str, kind: str) -> None:
    """Refuse any field of ``obj`` (an object at ``where``) that the schema does not name."""
    extra = sorted(set(obj) - _FIELDS[kind], key=str)
    if extra:
        shown = [str(x).encode("unicode_escape").decode("ascii") for x in extra[:5]]  # one line, whatever it holds
        name = ", ".join(x if len(x) <= 40 else x[:37] + "..." for x in shown)
        raise PolicyError(f"policy {where} has unknown field(s): {name}" if where else
                          f"policy has unknown field(s): {name}")


def _check_path(path, where: str) -> None:
    if "\x00" in path:
        raise PolicyError(f"policy {where} holds a NUL character: not a file path")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _target_sigma(config: dict, target, where: str) -> float:
    n = len(config["targets"])
    if not _is_int(target) or not 0 <= target < n:
        raise PolicyError(f"{where}: target {_show(target)} is not a target index of the config: use 0..{n - 1}")
    import warnings

    with warnings.catch_warnings():  # a saturated target still serves; the page and CLI say so
        warnings.simplefilter("ignore")
        return sigma_to_serve(config, target=int(target))


def policy_for_config_text(config_text: str, *, config_name: str, targets, escalate_after: int,
                           expire_after=None, shadow: bool = False) -> tuple[dict, Policy]:
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
    escalate_after, expire_after, shadow :
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
    config, sigmas = _config_and_sigmas(config_text, targets)
    doc = policy_dict(config_path=config_name, config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
                      n_classes=config["n_classes"], targets=list(targets), sigmas=sigmas,
                      escalate_after=escalate_after, expire_after=expire_after, shadow=shadow,
                      seeding=config_seeding(config))
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
        raise PolicyError(f"policy schema must be {SCHEMA!r}, got {_show(doc.get('schema'))}")
    _check_fields(doc, "", "")
    ref = doc.get("config")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("path"), str) or not ref["path"]:
        raise PolicyError(f"policy 'config' must be an object with a 'path' string, got {_show(ref)}")
    _check_fields(ref, "config", "config")
    _check_path(ref["path"], "config.path")
    sha = ref.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise PolicyError(f"policy config.sha256 must be 64 lowercase hex characters, got {_show(sha)}")
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
        raise PolicyError(f"policy config.n_classes is {_show(k)} but the config has K={config['n_classes']}")
    levels = _parse_levels(doc.get("levels"), config)
    escalation = doc.get("escalation")
    if not isinstance(escalation, Mapping):
        raise PolicyError(f"policy 'escalation' must be an object with 'after_queries', got {_show(escalation)}")
    _check_fields(escalation, "escalation", "escalation")
    after = escalation.get("after_queries")
    if not _is_int(after) or not 1 <= after <= MAX_QUERIES:
        raise PolicyError(f"escalation.after_queries must be an integer in [1, {MAX_QUERIES}], got {_show(after)}")
    expiry = doc.get("expiry")
    if not isinstance(expiry, Mapping) or "after_seconds" not in expiry:
        raise PolicyError(f"policy 'expiry' must be an object with 'after_seconds' (null: never), got {_show(expiry)}")
    _check_fields(expiry, "expiry", "expiry")
    seconds = expiry["after_seconds"]
    if seconds is not None and not (isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise PolicyError(f"expiry.after_seconds must be null or a number in (0, {MAX_SECONDS}], got {_show(seconds)}")
    shadow = doc.get("shadow")
    if not isinstance(shadow, bool):
        raise PolicyError(f"policy 'shadow' must be true or false, got {_show(shadow)}")
    calibrated = config_seeding(config)
    seeding = doc.get("seeding", calibrated)
    if seeding not in SEEDINGS:
        raise PolicyError(f"policy 'seeding' must be one of {SEEDINGS}, got {_show(seeding)}")
    if seeding != calibrated:
        raise PolicyError(f"policy 'seeding' is {seeding!r} but config {ref['path']} was calibrated for "
                          f"{calibrated!r} seeding: write the policy again with 'throttle init'")
    mode, unseen, start_degraded = _parse_store_error(doc.get("on_store_error", "last-known"), len(levels) - 1)
    return Policy(levels=levels, escalate_after=int(after),
                  expire_after=None if seconds is None else float(seconds), shadow=shadow, seeding=seeding,
                  on_store_error=mode, config=config, config_path=ref["path"], config_sha256=sha,
                  unseen_level=unseen, start_degraded=start_degraded)


def _parse_store_error(raw, top: int) -> tuple[str, int | None, bool]:
    """(serve mode, unseen level or None for refuse, start degraded) from ``on_store_error``.

    The old string form (``"last-known"`` or ``"refuse"``) reads as that mode
    with the fail-closed defaults: unseen accounts refused, no start without the store.
    """
    if isinstance(raw, str):
        raw = {"serve": raw}
    if not isinstance(raw, Mapping):
        raise PolicyError(f"policy 'on_store_error' must be an object with 'serve', 'unseen' and 'start', "
                          f"got {_show(raw)}")
    _check_fields(raw, "on_store_error", "on_store_error")
    mode = raw.get("serve", "last-known")
    if mode not in STORE_ERROR_MODES:
        raise PolicyError(f"on_store_error.serve must be one of {STORE_ERROR_MODES}, got {_show(mode)}")
    unseen = raw.get("unseen", "refuse")
    if unseen != "refuse" and not (_is_int(unseen) and 1 <= unseen <= top):
        raise PolicyError(f"on_store_error.unseen must be \"refuse\" or a flagged level in 1..{top} (an account "
                          f"this process has not seen is never served clean during an outage), got {_show(unseen)}")
    start = raw.get("start", "refuse")
    if start not in START_MODES:
        raise PolicyError(f"on_store_error.start must be one of {START_MODES}, got {_show(start)}")
    return mode, None if unseen == "refuse" else int(unseen), start == "degraded"


def _parse_levels(raw, config: dict) -> tuple[Level, ...]:
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_LEVELS + 1:
        n = len(raw) if isinstance(raw, list) else raw
        raise PolicyError(f"policy 'levels' must list level 0 and 1..{MAX_LEVELS} flagged levels, got {n!r}")
    out = []
    for j, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or entry.get("level") != j or isinstance(entry.get("level"), bool):
            got = entry.get("level") if isinstance(entry, Mapping) else entry
            raise PolicyError(f"levels[{j}] must be an object with \"level\": {j}, got {_show(got)}")
        _check_fields(entry, f"levels[{j}]", "levels")
        if j == 0:
            if entry.get("target") is not None or entry.get("sigma") not in (0, 0.0):
                raise PolicyError("level 0 is clean service: its target must be null and its sigma 0")
            out.append(Level(0, None, 0.0))
            continue
        sigma = _target_sigma(config, entry.get("target"), f"level {j}")
        written = entry.get("sigma")
        if not (isinstance(written, numbers.Real) and not isinstance(written, bool)
                and math.isfinite(written) and written == sigma):
            raise PolicyError(f"levels[{j}].sigma is {_show(written)} but config target {entry['target']} "
                              f"serves sigma {sigma!r}")
        if sigma <= out[-1].sigma:
            raise PolicyError(f"level {j} serves sigma {sigma:.6g}, not above level {j - 1}'s "
                              f"{out[-1].sigma:.6g}: levels must add noise as they go up")
        out.append(Level(j, int(entry["target"]), sigma))
    return tuple(out)
