"""Results cached by content digest, computed with a progress bar only on a miss.

A Streamlit cache replays the ``st.*`` calls made inside a cached function,
and a progress bar created outside it cannot be replayed
(``CacheReplayClosureError``). So the cached functions here hold no numerics
and call no ``st.*``: each ``_*_slot`` is an ``st.cache_resource`` keyed by the
content digest (sha256 of the file and labels) plus the options, bounded with
``max_entries``, and returns a slot that the first caller fills *outside* the
cache, drawing ``st.progress`` from the core's ``progress`` callback. Later
reruns, pages and sessions with the same content find the slot filled and
draw nothing. Uploaded data never enters a cache key other than by digest.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from caliber_core.calibration import fleet
from caliber_core.calibration import pipeline
from caliber_core.simulation.attack import simulate_averaging_attack
from caliber_core.calibration.calibrate import Calibration, sigma_for_target
from caliber_core.config import TargetRecord
from caliber_core.loading import LogitsData

from .curves import CalibrationCurves, exact_curves

_EMPTY = object()


def data_digest(data: LogitsData) -> str:
    """Content digest of a loaded model, the key of every cache here: the file's sha256 plus its labels.

    The file digest alone is not enough: the same ``.npy`` logits can be
    loaded with and without a separate labels file.
    """
    h = hashlib.sha256(data.sha256.encode())
    if data.labels is not None:
        h.update(np.ascontiguousarray(data.labels, dtype=np.int64).tobytes())
    else:
        h.update(b"no-labels")
    return h.hexdigest()


class _Slot:
    """One cached value, filled once under a lock (concurrent sessions wait)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Any = _EMPTY


# One cache per kind of result, so a flood of cheap entries cannot evict the
# expensive ones; sizes bound memory (a Calibration holds its logits).
@st.cache_resource(max_entries=24, show_spinner=False)
def _calibration_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=24, show_spinner=False)
def _curves_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=512, show_spinner=False)
def _target_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=32, show_spinner=False)
def _config_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=32, show_spinner=False)
def _attack_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=16, show_spinner=False)
def _fleet_slot(key: tuple) -> _Slot:
    return _Slot()


def _fill(slot: _Slot, compute: Callable[[Callable[[float], None] | None], Any], *,
          progress_text: str | None = None, spinner_text: str | None = None) -> Any:
    """The slot's value; on a miss compute it, with a progress bar or a spinner."""
    if slot.value is not _EMPTY:
        return slot.value
    with slot.lock:
        if slot.value is not _EMPTY:  # filled while we waited
            return slot.value
        if progress_text is not None:
            bar = st.progress(0.0, text=progress_text)
            last = [-1.0]

            def report(fraction: float) -> None:
                f = min(1.0, max(0.0, float(fraction)))
                if f - last[0] >= 0.01 or f >= 1.0:
                    last[0] = f
                    bar.progress(f, text=progress_text)

            try:
                value = compute(report)
            finally:
                bar.empty()
        elif spinner_text is not None:
            with st.spinner(spinner_text):
                value = compute(None)
        else:
            value = compute(None)
        slot.value = value
        return value


def _realizations(realizations: int | None) -> int | None:
    # None means "the core's default" (a function of N and K): a stable key in one process.
    return None if realizations is None else int(realizations)


def calibration(data: LogitsData, *, statistic: str = "median", seed: int = 0,
                realizations: int | None = None) -> Calibration:
    """``pipeline.calibrate_data`` with the CLI's defaults, cached by content digest."""
    key = (data_digest(data), statistic, seed, _realizations(realizations))
    return _fill(
        _calibration_slot(key),
        lambda progress: pipeline.calibrate_data(data, statistic=statistic, seed=seed,
                                                 realizations=realizations, progress=progress),
        progress_text=f"Calibrating {data.name}: noise sweep over {data.n_samples} inputs…",
    )


def curves(data: LogitsData, cal: Calibration, *, n_points: int = 60) -> CalibrationCurves:
    """Exact agreement, accuracy and corridor on a grid (quadrature), cached."""
    key = (data_digest(data), cal.statistic, cal.seed, cal.intervals.realizations, n_points)
    return _fill(
        _curves_slot(key),
        lambda progress: exact_curves(cal, n_points=n_points, progress=progress),
        progress_text=f"Exact curves and accuracy corridor for {data.name}…",
    )


def target(data: LogitsData, cal: Calibration, kind: str, value: float, *,
           inversion: str = "curve", saturate: bool = False) -> TargetRecord:
    """``sigma_for_target`` cached per (content, statistic, kind, value).

    Raises ValueError (not cached) for an unreachable target.
    """
    key = (data_digest(data), cal.statistic, cal.seed, cal.intervals.realizations,
           kind, float(value), inversion, bool(saturate))
    return _fill(_target_slot(key),
                 lambda _: sigma_for_target(cal, value, kind=kind, inversion=inversion,
                                            saturate=saturate))


def config(data: LogitsData, targets: Sequence[tuple[str, float]], *, statistic: str = "median",
           seed: int = 0, realizations: int | None = None, inversion: str = "curve",
           saturate: bool = False):
    """``pipeline.config_for`` (the CLI's function), cached: (calibration, results, config)."""
    key = (data_digest(data), tuple((k, float(v)) for k, v in targets), statistic, seed,
           _realizations(realizations), inversion, bool(saturate))
    return _fill(
        _config_slot(key),
        lambda progress: pipeline.config_for(
            data, list(targets), statistic=statistic, seed=seed, realizations=realizations,
            inversion=inversion, saturate=saturate, progress=progress),
        progress_text=f"Building the config for {data.name}…",
    )


def attack(data: LogitsData, *, sigma: float, m_values: Sequence[int], repeats: int = 1,
           seed: int = 0) -> pd.DataFrame:
    """``simulate_averaging_attack`` (both seedings, both estimators), cached."""
    key = (data_digest(data), float(sigma), tuple(int(m) for m in m_values), int(repeats), int(seed))
    return _fill(
        _attack_slot(key),
        lambda progress: simulate_averaging_attack(
            data.logits, data.labels, sigma=sigma, m_values=tuple(m_values), seed=seed,
            repeats=repeats, progress=progress),
        progress_text=f"Simulating the averaging attack on {data.name}…",
    )


def fleet_report(datas: Sequence[LogitsData], cals: Sequence[Calibration], *,
                 statistic: str) -> dict:
    """Shared fit and leave-one-architecture-out table over several models, cached."""
    key = ("loo", tuple(data_digest(d) for d in datas), tuple(c.statistic for c in cals), statistic)

    def compute(_):
        return {
            "shared_fit": fleet.shared_fit(cals, statistic=statistic),
            "leave_one_out": fleet.leave_one_out(cals, statistic=statistic),
        }

    return _fill(_fleet_slot(key), compute,
                 spinner_text=f"Leave-one-architecture-out fits over {len(cals)} models…")


def margin_ablation(datas: Sequence[LogitsData], cals: Sequence[Calibration]) -> list[dict]:
    """``fleet.margin_ablation`` (every statistic), cached."""
    key = ("ablation", tuple(data_digest(d) for d in datas), tuple(c.statistic for c in cals))
    return _fill(_fleet_slot(key), lambda _: fleet.margin_ablation(cals),
                 spinner_text="Margin-statistic ablation (median, mean, trimmed)…")
