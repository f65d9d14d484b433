"""The ``caliber.policy/v1`` schema: its types, its JSON form and the check of each field.

:class:`Policy` and :class:`Level` are what a validated policy is;
:func:`policy_dict` is its JSON form. Each field rule (known names, integers
and their bounds, the levels against the config, the ``on_store_error``
object, strict JSON) fails with one :class:`PolicyError` line naming the
field. Reading and writing files, and the whole-document check, are
:mod:`.policy`'s.
"""

from __future__ import annotations

import json
import math
import re
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import sigma_to_serve

SCHEMA = "caliber.policy/v1"

STORE_ERROR_MODES = ("last-known", "refuse")
START_MODES = ("refuse", "degraded")
# The fields each object of the schema may hold; anything else is refused.
FIELDS = {
    "": {"schema", "config", "levels", "escalation", "expiry", "shadow", "seeding", "on_store_error", "groups"},
    "config": {"path", "sha256", "n_classes"},
    "levels": {"level", "target", "sigma"},
    "escalation": {"after_queries"},
    "expiry": {"after_seconds"},
    "on_store_error": {"serve", "unseen", "start"},
    "group": {"escalation", "expiry"},
}
#: Integers longer than this are refused while parsing (Python refuses > 4,300 digits with no field named).
MAX_INT_DIGITS = 40

MAX_LEVELS = 32
#: Group kinds a policy may declare (a request carries at most this many descriptors, one per kind).
MAX_GROUP_KINDS = 16
#: A group kind's name: a lowercase identifier (it names the kind in files, headers' configuration and the CLI).
GROUP_KIND_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")


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
class GroupKind:
    """A kind of group descriptor the policy counts (a payment card, an organisation, an IP range...).

    A group of the kind (one value, e.g. one card) is counted, flagged and
    escalated like an account, over the same ladder of levels, with the kind's
    own threshold and flag lifetime.

    Attributes
    ----------
    name : str
        The kind, as requests name it (``card``).
    escalate_after : int
        Rows at its level after which a flagged group moves up one level.
    expire_after : float or None
        Seconds after it was set that a group's flag lapses; None: never.
    """

    name: str
    escalate_after: int
    expire_after: float | None


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
    groups : tuple of GroupKind
        The group descriptor kinds requests may carry (empty: accounts only).
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
    groups: tuple = ()  # GroupKind, in the file's order

    def group_kind(self, name) -> GroupKind | None:
        """The declared kind called ``name``, or None."""
        for kind in self.groups:
            if kind.name == name:
                return kind
        return None

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
            on_store_error=self.on_store_error, unseen_level=self.unseen_level, start_degraded=self.start_degraded,
            groups={g.name: (g.escalate_after, g.expire_after) for g in self.groups})


def policy_dict(*, config_path: str, config_sha256: str, n_classes: int, targets, sigmas, escalate_after: int,
                expire_after=None, shadow: bool = False, seeding: str = "per-input",
                on_store_error: str = "last-known", unseen_level: int | None = None,
                start_degraded: bool = False, groups=None) -> dict:
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
    groups : Mapping of str to (int, float or None), optional
        Group kinds: ``{kind: (escalate_after, expire_after)}``; written as the
        ``groups`` object only when given (a file without it reads as before).

    Returns
    -------
    dict
        The ``caliber.policy/v1`` document; :func:`parse_policy` validates it.
    """
    levels = [{"level": 0, "target": None, "sigma": 0.0}]
    levels += [{"level": j, "target": int(t), "sigma": float(s)}
               for j, (t, s) in enumerate(zip(targets, sigmas), start=1)]
    doc = {
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
    if groups:
        doc["groups"] = {str(name): {"escalation": {"after_queries": after}, "expiry": {"after_seconds": expire}}
                         for name, (after, expire) in groups.items()}
    return doc


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


def policy_json(text: str):
    """Parse policy JSON text strictly: NaN and infinities refused, over-long integers kept for the field's message.

    Parameters
    ----------
    text : str

    Returns
    -------
    object
        The parsed document (integers of more than :data:`MAX_INT_DIGITS` digits
        come back as placeholders that name their length).

    Raises
    ------
    PolicyError
        Not JSON, a NaN or infinity, or nesting too deep.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"policy is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise PolicyError("policy JSON is nested too deeply") from None


def show_value(value) -> str:
    """A value for a message, cut to 40 characters (a hostile file may hold a 10,000-digit number)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
        return f"a {len(str(abs(value))):,}-digit integer" if abs(value) < 10**4000 else "an integer of over 4,000 digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: An unknown field whose name looks like it holds a credential: its value is never shown.
_SECRET_NAME = re.compile(r"pass|secret|token|key|credential|auth|cookie|session|private", re.I)
#: A string value that looks like a credential or carries one (a URL with a user or password).
_SECRET_VALUE = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]*@|^(sk|pk|ghp|gho|xox[abp])[-_]", re.I)


def show_field_value(name, value) -> str:
    """An unknown field's value for a message: short, on one line, and never a credential.

    Objects and lists are described by their size, not shown (they may hold anything);
    a value whose field name or text looks like a credential is withheld; any other
    value is :func:`show_value` (cut to 40 characters).
    """
    if isinstance(value, dict):
        return f"an object of {len(value)} field(s)"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if _SECRET_NAME.search(str(name)) or (isinstance(value, str) and _SECRET_VALUE.search(value)):
        return "withheld: it may be a credential"
    return show_value(value).encode("unicode_escape").decode("ascii")


def check_fields(obj, where: str, kind: str) -> None:
    """Refuse any field of ``obj`` (an object at ``where``) that the schema does not name.

    The message names each unknown field (up to five) and its value, e.g.
    ``policy escalation has unknown field(s): after_querys = 5``.
    """
    extra = sorted(set(obj) - FIELDS[kind], key=str)
    if extra:
        shown = []
        for key in extra[:5]:
            name = str(key).encode("unicode_escape").decode("ascii")  # one line, whatever it holds
            name = name if len(name) <= 40 else name[:37] + "..."
            shown.append(f"{name} = {show_field_value(key, obj[key])}")
        fields = ", ".join(shown)
        raise PolicyError(f"policy {where} has unknown field(s): {fields}" if where else
                          f"policy has unknown field(s): {fields}")


def check_path(path, where: str) -> None:
    """Refuse a path holding a NUL character (no file can have it)."""
    if "\x00" in path:
        raise PolicyError(f"policy {where} holds a NUL character: not a file path")


def is_int(x) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def target_sigma(config: dict, target, where: str) -> float:
    """The sigma config target ``target`` serves, or PolicyError naming ``where``."""
    n = len(config["targets"])
    if not is_int(target) or not 0 <= target < n:
        raise PolicyError(f"{where}: target {show_value(target)} is not a target index of the config: use 0..{n - 1}")
    import warnings

    with warnings.catch_warnings():  # a saturated target still serves; the page and CLI say so
        warnings.simplefilter("ignore")
        return sigma_to_serve(config, target=int(target))


def parse_store_error(raw, top: int) -> tuple[str, int | None, bool]:
    """(serve mode, unseen level or None for refuse, start degraded) from ``on_store_error``.

    The old string form (``"last-known"`` or ``"refuse"``) reads as that mode
    with the fail-closed defaults: unseen accounts refused, no start without the store.
    """
    if isinstance(raw, str):
        raw = {"serve": raw}
    if not isinstance(raw, Mapping):
        raise PolicyError(f"policy 'on_store_error' must be an object with 'serve', 'unseen' and 'start', "
                          f"got {show_value(raw)}")
    check_fields(raw, "on_store_error", "on_store_error")
    mode = raw.get("serve", "last-known")
    if mode not in STORE_ERROR_MODES:
        raise PolicyError(f"on_store_error.serve must be one of {STORE_ERROR_MODES}, got {show_value(mode)}")
    unseen = raw.get("unseen", "refuse")
    if unseen != "refuse" and not (is_int(unseen) and 1 <= unseen <= top):
        raise PolicyError(f"on_store_error.unseen must be \"refuse\" or a flagged level in 1..{top} (an account "
                          f"this process has not seen is never served clean during an outage), got {show_value(unseen)}")
    start = raw.get("start", "refuse")
    if start not in START_MODES:
        raise PolicyError(f"on_store_error.start must be one of {START_MODES}, got {show_value(start)}")
    return mode, None if unseen == "refuse" else int(unseen), start == "degraded"


def parse_levels(raw, config: dict) -> tuple[Level, ...]:
    """The levels of a policy, checked against its config: level 0 clean, sigmas rising with the level."""
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_LEVELS + 1:
        n = len(raw) if isinstance(raw, list) else raw
        raise PolicyError(f"policy 'levels' must list level 0 and 1..{MAX_LEVELS} flagged levels, got {n!r}")
    out = []
    for j, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or entry.get("level") != j or isinstance(entry.get("level"), bool):
            got = entry.get("level") if isinstance(entry, Mapping) else entry
            raise PolicyError(f"levels[{j}] must be an object with \"level\": {j}, got {show_value(got)}")
        check_fields(entry, f"levels[{j}]", "levels")
        if j == 0:
            if entry.get("target") is not None or entry.get("sigma") not in (0, 0.0):
                raise PolicyError("level 0 is clean service: its target must be null and its sigma 0")
            out.append(Level(0, None, 0.0))
            continue
        sigma = target_sigma(config, entry.get("target"), f"level {j}")
        written = entry.get("sigma")
        if not (isinstance(written, numbers.Real) and not isinstance(written, bool)
                and math.isfinite(written) and written == sigma):
            raise PolicyError(f"levels[{j}].sigma is {show_value(written)} but config target {entry['target']} "
                              f"serves sigma {sigma!r}")
        if sigma <= out[-1].sigma:
            raise PolicyError(f"level {j} serves sigma {sigma:.6g}, not above level {j - 1}'s "
                              f"{out[-1].sigma:.6g}: levels must add noise as they go up")
        out.append(Level(j, int(entry["target"]), sigma))
    return tuple(out)
