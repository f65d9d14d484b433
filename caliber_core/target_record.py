"""One target of a config and the sigma that serves it: :class:`TargetRecord` and the target vocabulary.

Standard library only; :mod:`caliber_core.config` re-exports every name here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass

#: Every kind of target a config may hold. "surrogate-retention" targets are
#: measured on a distilled surrogate (their record carries ``attacker``).
TARGET_KINDS = ("retention", "accuracy", "agreement", "surrogate-retention")
#: The kinds solved from a model's logits by calibration.
CALIBRATED_KINDS = tuple(k for k in TARGET_KINDS if k != "surrogate-retention")
#: Which side of the target sigma is chosen on: the point estimate, or the end
#: of a confidence interval that keeps the delivered value at least / at most the target.
SIDES = ("point", "at-least", "at-most")
#: The confidence level of every target's interval and side unless one is asked for.
DEFAULT_CONFIDENCE = 0.95
#: The ``level`` a certified bound records (top-k logs, full-vocabulary dumps): bounds that hold
#: over every unseen or binned tail, not a sampling interval; the schema wants a level in (0, 1).
CERTIFIED_LEVEL = 0.999999


def check_side(side) -> str:
    """``side`` itself when it is one of :data:`SIDES`.

    Parameters
    ----------
    side : str
        "point", "at-least" or "at-most".

    Returns
    -------
    str
        ``side``.

    Raises
    ------
    ValueError
        Any other value (the message shows it).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return side


def check_confidence(level) -> float:
    """A confidence level as a float in [0.5, 1): the one rule for every interval and side.

    Below 0.5 a "confidence" interval would be narrower than the estimate's own
    error half the time, and 1 has no finite bootstrap quantile.

    Parameters
    ----------
    level : float
        The confidence level.

    Returns
    -------
    float
        ``level`` as a Python float.

    Raises
    ------
    ValueError
        Not a real number (bools refused), or outside [0.5, 1) (the message shows it).
    """
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.5 <= float(level) < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {level!r}")
    return float(level)

_SATURATED_PREFIX = "saturated-"


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
        out = {k: plain_values(v) for k, v in asdict(self).items()}
        slog = out["sigma_logistic"]
        if isinstance(slog, float) and not math.isfinite(slog):
            out["sigma_logistic"] = None
        return out

    @property
    def inversion(self) -> str:
        """The ``inversion`` option that reproduces this record: "logistic" or "curve"."""
        return inversion_of_method(self.method)


def inversion_of_method(method: str) -> str:
    """The ``inversion`` option that reproduces a target's ``method``.

    Parameters
    ----------
    method : str
        A :attr:`TargetRecord.method`, possibly prefixed "saturated-".

    Returns
    -------
    {"logistic", "curve"}
        "logistic" for a method solved on the logistic law (saturated or
        shared too), else "curve".

    Notes
    -----
    "logistic" is the closed form of Eq. inverse-v.
    """
    base = str(method)
    if base.startswith(_SATURATED_PREFIX):
        base = base[len(_SATURATED_PREFIX):]
    return "logistic" if base in ("logistic", "shared-logistic") else "curve"


def plain_values(obj):
    """numpy scalars unwrapped to Python numbers, containers walked.

    Parameters
    ----------
    obj : object
        A value, mapping, list or tuple.

    Returns
    -------
    object
        Mappings as dicts with str keys, lists and tuples as lists, anything
        with ``.item()`` (numpy scalars) as its Python value, the rest as is.
    """
    if isinstance(obj, Mapping):
        return {str(k): plain_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_values(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


