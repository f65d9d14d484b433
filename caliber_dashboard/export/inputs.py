"""Where the Export page's inputs start, and keeping them in the workspace.

For the model shown, Export starts from the target last chosen on Calibrate
(kind, percent and side: the model's ``"calibrate"`` option, see
:func:`caliber_dashboard.common.state.remember_target`). Whatever is then typed on
Export is stored as the model's ``"export"`` option together with the
Calibrate choice it started from, so a reload or a page switch brings it back.
A new choice on Calibrate (a different kind, percent or side) starts Export
from that choice again. With neither, the command line's defaults.
"""

from __future__ import annotations

import math

import streamlit as st

from caliber_core.calibration.intervals import DEFAULT_CONFIDENCE
from caliber_core.config import CALIBRATED_KINDS, SIDES

from caliber_dashboard.common import state

FIELDS = {kind: f"export_{kind}" for kind in CALIBRATED_KINDS}  # one percent list per kind
SIDE, CONFIDENCE = "export_side", "export_confidence"
WIDGETS = (*FIELDS.values(), SIDE, CONFIDENCE)
_SEEDED = "caliber_export_seeded"  # (model, the Calibrate choice) the widgets were last set for


def defaults(*, has_labels: bool) -> dict:
    """The command line's default targets (90/80/70/60% retention; agreement without labels), point side."""
    values = {key: "" for key in FIELDS.values()}
    values[FIELDS["retention" if has_labels else "agreement"]] = "90, 80, 70, 60"
    return values | {SIDE: "point", CONFIDENCE: DEFAULT_CONFIDENCE}


def valid_choice(choice) -> bool:
    """A stored Calibrate choice that Export can start from."""
    return (isinstance(choice, dict) and choice.get("kind") in CALIBRATED_KINDS
            and choice.get("side") in SIDES and isinstance(choice.get("percent"), (int, float))
            and math.isfinite(choice["percent"]) and 0 < choice["percent"] <= 100)


def from_choice(choice: dict) -> dict:
    """Export's inputs for one Calibrate choice: that target alone, on that side."""
    values = {key: "" for key in FIELDS.values()}
    values[FIELDS[choice["kind"]]] = f"{choice['percent']:g}"
    return values | {SIDE: choice["side"], CONFIDENCE: DEFAULT_CONFIDENCE}


def _valid_saved(saved) -> bool:
    return (isinstance(saved, dict) and all(isinstance(saved.get(k), str) for k in FIELDS.values())
            and saved.get(SIDE) in SIDES and isinstance(saved.get(CONFIDENCE), (int, float))
            and 0.5 <= saved[CONFIDENCE] <= 0.995)


def initial(*, has_labels: bool, choice, saved) -> dict:
    """The inputs Export opens with: the saved ones unless Calibrate has chosen anew since; else the choice."""
    choice = choice if valid_choice(choice) else None
    if _valid_saved(saved) and saved.get("from") == choice:
        return {k: saved[k] for k in WIDGETS}
    if choice is not None:
        return from_choice(choice)
    return defaults(has_labels=has_labels)


def seed(sha256: str, *, has_labels: bool) -> None:
    """Set Export's widgets before they are drawn, when the model or its Calibrate choice changed,
    or when the widgets were dropped (after a page switch)."""
    ss = st.session_state
    options = state.model_options(sha256)
    choice = options.get("calibrate")
    marker = (sha256, repr(choice))
    if ss.get(_SEEDED) == marker and all(k in ss for k in WIDGETS):
        return
    ss.update(initial(has_labels=has_labels, choice=choice, saved=options.get("export")))
    ss[_SEEDED] = marker


def remember(sha256: str) -> None:
    """Store the inputs as drawn (written only when they changed), with the choice they started from."""
    ss = st.session_state
    choice = state.model_options(sha256).get("calibrate")
    values = {k: ss.get(k) for k in WIDGETS} | {"from": choice if valid_choice(choice) else None}
    values[CONFIDENCE] = float(values[CONFIDENCE])
    if state.model_options(sha256).get("export") != values:
        state.set_model_option(sha256, "export", values)
