"""Widgets shared by several pages: the model picker and the target control."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from caliber_core.calibration.calibrate import Calibration
from caliber_core.loading import LogitsData

from caliber_core.config import CALIBRATED_KINDS

from caliber_dashboard.common import names, state
from caliber_dashboard.common.targets import KIND_LABELS, kinds_for, percent_to_fraction, slider_range

_KIND_KEY = "_kind"


def model_selector(label: str, *, key: str, labelled_only: bool = False) -> LogitsData | None:
    """A selectbox over the loaded models; remembers the choice across pages."""
    store = state.labelled_models() if labelled_only else state.models()
    if not store:
        return None
    options = list(store)
    current = st.session_state.get(state.SELECTED)
    index = options.index(current) if current in options else 0
    sha = st.selectbox(label, options, index=index, key=key,
                       format_func=lambda s: state.model_label(store[s]))
    if sha not in store:  # a stale widget value after a removal
        sha = options[index]
    st.session_state[state.SELECTED] = sha
    return store[sha]


def target_kind(cal: Calibration, *, key_prefix: str,
                kinds: tuple[str, ...] = CALIBRATED_KINDS) -> str:
    """The kind radio (none when only one kind fits the file); remembers the choice across pages."""
    kinds = kinds_for(cal.has_labels, kinds)
    if len(kinds) == 1:
        return kinds[0]
    remembered = st.session_state.get(state.TARGETS, {}).get(_KIND_KEY, kinds[0])
    kind = st.radio("Target", kinds, index=kinds.index(remembered) if remembered in kinds else 0,
                    format_func=lambda k: KIND_LABELS[k], horizontal=True,
                    key=f"{key_prefix}_kind")
    st.session_state.setdefault(state.TARGETS, {})[_KIND_KEY] = kind
    return kind


def slider_start(cal: Calibration, kind: str):
    """(the slider's range, where it opens) for one kind: the last target chosen for that kind, within range.

    Every page's target slider opens here; the Attack cost page's simulation is
    prepared at the same target (``attack_prefetch``).
    """
    rng = slider_range(kind, clean_accuracy=cal.clean_accuracy, n_classes=cal.n_classes)
    return rng, min(rng.hi, max(rng.lo, state.remembered_target(kind, rng.default)))


def target_slider(data: LogitsData, cal: Calibration, kind: str, *, key_prefix: str,
                  remember: bool = True) -> tuple[float, float]:
    """The percent slider for one kind. Returns (value as a fraction, percent).

    The slider's key carries the model's digest (ranges differ per model); its
    starting value is the last target chosen for that kind on any page.
    ``remember=False`` leaves storing the choice (``state.remember_target``, a
    workspace write) to the caller, e.g. after the results are on the page.
    """
    rng, start = slider_start(cal, kind)
    percent = st.slider(
        f"Target {KIND_LABELS[kind]}", min_value=rng.lo, max_value=rng.hi, value=start,
        step=rng.step, format="%.1f%%", key=f"{key_prefix}_{kind}_{data.sha256[:12]}",
        help="Move it: σ* follows at once, the sweep is not recomputed.",
    )
    if remember:
        state.remember_target(kind, percent)
    return percent_to_fraction(percent), percent


def target_control(data: LogitsData, cal: Calibration, *, key_prefix: str,
                   kinds: tuple[str, ...] = CALIBRATED_KINDS) -> tuple[str, float, float]:
    """Kind radio + percent slider (:func:`target_kind`, :func:`target_slider`).

    Returns (kind, value as a fraction, percent).
    """
    kind = target_kind(cal, key_prefix=key_prefix, kinds=kinds)
    value, percent = target_slider(data, cal, kind, key_prefix=key_prefix)
    return kind, value, percent


def csv_download(df: pd.DataFrame, *, label: str, file_name: str, key: str) -> None:
    """A CSV download of ``df``; text cells that a spreadsheet would run as formulas are neutralized."""
    st.download_button(label, data=names.csv_text(df).encode(), file_name=file_name,
                       mime="text/csv", key=key, on_click="ignore", icon=":material/download:")


def plain(text: str) -> str:
    """Escape Markdown so an untrusted string (a file name, a message) shows verbatim."""
    return names.markdown_text(text)


def fmt(x, spec: str = ".4g", none: str = "—") -> str:
    """Format a number, or a dash for None/NaN/inf."""
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return none
    if xf != xf or xf in (float("inf"), float("-inf")):
        return none
    return format(xf, spec)
