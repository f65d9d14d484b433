"""The Extraction page's pieces: archive list, cached runs, figures, tables, the slider readout.

Figures and tables are plain functions (result in, plotly figure or
DataFrame out) that tests call without Streamlit. Runs are cached in two
layers, both ``st.cache_resource`` keyed by content digest:

* a :class:`~caliber_core.extraction.attacker.Thief` per (archive sha256,
  student), whose memo keeps every trained surrogate by (answers digest --
  a function of sigma, seeding, M and seed --, recipe, seed): a second run
  with other targets retrains only what it has not seen;
* the whole result per (archive sha256, settings).

The progress bar is drawn outside the cache from the core's ``progress``
callback, so a cached rerun draws nothing (STREAMLIT.md). Both layers live
in this process only; :mod:`caliber_dashboard.extraction.runs` keeps finished
runs in the session's workspace, so a reload or a restart needs neither.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from caliber_core.extraction.archive import ExtractionArchive, load_archive, load_archive_bytes
from caliber_core.extraction.experiment import ExtractionResult, ExtractionSettings, Spread

from caliber_dashboard.common.names import markdown_text

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
COLORS = {"fresh": "#d62728", "per-input": "#1f77b4", "hard": "#ff7f0e", "clean": "#2ca02c"}


# ------------------------------------------------------------------------------ archives


@st.cache_resource(max_entries=1, show_spinner=False)
def demo_archives() -> dict[str, ExtractionArchive]:
    """The bundled demo files that carry inputs, by sha256 (read once per process)."""
    out = {}
    for path in sorted(DATA_DIR.glob("digits_*.npz")):
        try:
            a = load_archive(path)
        except ValueError:
            continue
        out[a.sha256] = a
    return out


def archive_from_upload(content: bytes, name: str) -> ExtractionArchive:
    """An uploaded archive under the dashboard's element limit (LogitsFileError, one line, otherwise)."""
    from caliber_dashboard.common.upload_boundary import max_elements

    return load_archive_bytes(content, name, max_elements=max_elements())


# ------------------------------------------------------------------------------ cached runs


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = None


@st.cache_resource(max_entries=8, show_spinner=False)
def _thief_slot(key: tuple) -> _Slot:
    return _Slot()


@st.cache_resource(max_entries=32, show_spinner=False)
def _result_slot(key: tuple) -> _Slot:
    return _Slot()


def settings_key(settings: ExtractionSettings) -> tuple:
    s = settings
    return (s.retention, s.surrogate_retention, s.seeds, s.m_values, s.attack, s.seed, s.architecture,
            s.hidden, s.schedule, s.folds, s.near_seeds, s.averaging, s.averaging_attacker)


def is_cached(archive: ExtractionArchive, settings: ExtractionSettings) -> bool:
    return _result_slot((archive.sha256, settings_key(settings))).value is not None


def run(archive: ExtractionArchive, settings: ExtractionSettings) -> ExtractionResult:
    """The experiment for (archive, settings), computed once with a progress bar."""
    from caliber_core.extraction.attacker import Thief  # torch: imported by the first training run
    from caliber_core.extraction.experiment import run_extraction

    slot = _result_slot((archive.sha256, settings_key(settings)))
    if slot.value is not None:
        return owned(slot.value, archive)
    thief_slot = _thief_slot((archive.sha256, settings.architecture, settings.hidden, settings.schedule,
                              settings.folds))
    with slot.lock, thief_slot.lock:
        if slot.value is not None:
            return owned(slot.value, archive)
        if thief_slot.value is None:
            ev = archive.evaluation
            thief_slot.value = Thief(archive.pool.inputs, ev.inputs, ev.labels, np.argmax(ev.logits, axis=1),
                                     n_classes=archive.n_classes, architecture=settings.architecture,
                                     hidden=settings.hidden, schedule=settings.schedule, folds=settings.folds)
        text = f"Training surrogates on {markdown_text(archive.name)}…"
        bar = st.progress(0.0, text=text)
        try:
            slot.value = run_extraction(unnamed_archive(archive), settings, thief=thief_slot.value,
                                        progress=lambda f: bar.progress(min(1.0, f), text=f"{text} {f:.0%}"))
        finally:
            bar.empty()
        return owned(slot.value, archive)


def unnamed_archive(archive: ExtractionArchive) -> ExtractionArchive:
    """The archive without its names (same arrays): a run cached by content is shared by every workspace."""
    from caliber_dashboard.common.cache import NO_NAME

    return replace(archive, name=NO_NAME, source=NO_NAME, eval_source=NO_NAME)


def owned(result: ExtractionResult, archive: ExtractionArchive) -> ExtractionResult:
    """A shared run as this visitor's: their archive (its names) and a calibration named like it."""
    if result.archive is archive:
        return result
    calibration = result.calibration
    if calibration is not None and calibration.name != archive.name:
        calibration = copy.copy(calibration)
        calibration.name = archive.name
    return replace(result, archive=archive, calibration=calibration)


# ------------------------------------------------------------------------------ numbers


def pm(s: Spread | None, *, scale: float = 100.0, digits: int = 1) -> str:
    """'mean ± sd' in percent (or just the mean for one seed)."""
    if s is None or s.n == 0 or math.isnan(s.mean):
        return "—"
    if s.sd is None:
        return f"{s.mean * scale:.{digits}f}"
    return f"{s.mean * scale:.{digits}f} ± {s.sd * scale:.{digits}f}"


def targets_table(result: ExtractionResult) -> pd.DataFrame:
    """Table-3 analogue: one row per condition, one column per recipe (accuracy %, mean ± sd)."""
    rows = []
    for c in [result.clean] + result.targets:
        if not c.by_recipe:
            continue
        label = "clean answers" if c.kind == "clean" else (
            f"{'teacher retention' if c.kind == 'retention' else 'surrogate retention'} {c.requested:.0%}")
        row = {"condition": label, "σ": f"{c.sigma:.4g}", "teacher accuracy %": f"{c.teacher_accuracy * 100:.1f}"}
        for name in result.recipes:
            row[f"surrogate {name} %"] = pm(c.by_recipe[name].accuracy)
        row["strongest"] = c.headline
        row["agreement with teacher %"] = pm(c.best.agreement)
        row["drop recovered %"] = pm(c.best.drop_recovered, digits=0) if c.best.drop_recovered.n else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def compact_columns(table: pd.DataFrame) -> dict:
    """Short headers and narrow numeric columns, so a table fits the page instead of scrolling off its right edge."""
    short = {"teacher accuracy %": "teacher %", "agreement with teacher %": "agreement %",
             "drop recovered %": "recovered %"}
    out = {}
    for name in table.columns:
        label = short.get(name, name.replace("surrogate ", "") if name.startswith("surrogate ") else name)
        wide = name in ("condition", "answers")
        out[name] = st.column_config.TextColumn(label, width="medium" if wide else "small", help=name)
    return out


def averaging_table(result: ExtractionResult) -> pd.DataFrame:
    """Table-4 analogue plus the hard-label rows: surrogate accuracy % over M."""
    ms = sorted({r.m for r in result.averaging if r.sigma > 0})
    rows = []
    for labels in ("soft", "hard"):
        for seeding in ("fresh", "per-input"):
            cells = {r.m: pm(r.surrogate_accuracy) for r in result.averaging
                     if r.sigma > 0 and r.labels == labels and r.seeding == seeding}
            if cells:
                rows.append({"answers": f"{labels}, {seeding}", **{f"M={m}": cells.get(m, "—") for m in ms}})
    return pd.DataFrame(rows)


def surrogate_readout(result: ExtractionResult, retention: float) -> dict | None:
    """σ where the frontier attacker's mean retention crosses ``retention``, read off the frontier.

    Log-linear interpolation between the measured frontier points; the
    teacher's accuracy there is exact (quadrature). None when the frontier never
    falls to ``retention``.
    """
    from caliber_core.calibration.engine import CurveEngine

    pts = [(p.sigma, p.surrogate_retention.mean) for p in result.frontier]
    for (s0, r0), (s1, r1) in zip(pts, pts[1:]):
        if r0 > retention >= r1:
            t = (r0 - retention) / (r0 - r1) if r0 != r1 else 0.5
            sigma = s0 + t * (s1 - s0) if s0 <= 0 else math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0)))
            ev = result.archive.evaluation
            teacher = float(CurveEngine(ev.logits, ev.labels).accuracy(sigma)[0])
            clean = result.frontier[0].surrogate_accuracy.mean
            return {"sigma": sigma, "teacher_accuracy": teacher, "surrogate": retention * clean * 100,
                    "teacher_retention": teacher / result.clean_accuracy_eval, "bracket": (s0, s1)}
    return None


# ------------------------------------------------------------------------------ figures


def _layout(fig: go.Figure, *, x_title: str, y_title: str, x_log: bool = False) -> go.Figure:
    fig.update_layout(height=440, margin=dict(l=70, r=20, t=60, b=60), hovermode="closest",
                      plot_bgcolor="white",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0))
    fig.update_xaxes(title_text=x_title, type="log" if x_log else "linear", showline=True,
                     linecolor="#888", mirror=True, gridcolor="#eee")
    fig.update_yaxes(title_text=y_title, showline=True, linecolor="#888", mirror=True, gridcolor="#eee")
    return fig


def frontier_figure(result: ExtractionResult, *, readout: dict | None = None) -> go.Figure:
    """Teacher accuracy (what a flagged user gets) against surrogate accuracy (what the thief gets)."""
    fr = result.frontier
    x = [p.teacher_accuracy * 100 for p in fr]
    y = [p.surrogate_accuracy.mean * 100 for p in fr]
    err = [(p.surrogate_accuracy.sd or 0.0) * 100 for p in fr]
    fig = go.Figure()
    lo = min(x + y) - 2
    fig.add_trace(go.Scatter(x=[lo, 100], y=[lo, 100], mode="lines", line=dict(color="#bbb", dash="dot"),
                             name="surrogate = teacher", hoverinfo="skip"))
    fig.add_trace(go.Scatter(
        x=x, y=y, mode="lines+markers", name=f"surrogate ({result.frontier_attacker.name})",
        error_y=dict(type="data", array=err, visible=True), line=dict(color=COLORS["fresh"]),
        customdata=[[p.sigma, (p.surrogate_accuracy.sd or 0) * 100] for p in fr],
        hovertemplate="σ=%{customdata[0]:.4g}<br>teacher %{x:.1f}%<br>surrogate %{y:.1f} ± "
                      "%{customdata[1]:.1f}%<extra></extra>"))
    for c in result.targets:
        if c.by_recipe and c.kind == "retention":
            fig.add_trace(go.Scatter(
                x=[c.teacher_accuracy * 100], y=[c.best.accuracy.mean * 100], mode="markers",
                marker=dict(symbol="diamond", size=11, color=COLORS["per-input"]),
                error_y=dict(type="data", array=[(c.best.accuracy.sd or 0) * 100], visible=True),
                name=f"retention {c.requested:.0%} (strongest: {c.headline})",
                hovertemplate="σ=" + f"{c.sigma:.4g}" + "<br>teacher %{x:.1f}%<br>surrogate %{y:.1f}%<extra></extra>"))
    if readout is not None:
        fig.add_trace(go.Scatter(x=[readout["teacher_accuracy"] * 100], y=[readout.get("surrogate", math.nan)],
                                 mode="markers", marker=dict(symbol="x", size=13, color="black"),
                                 name="surrogate target (slider)",
                                 hovertemplate="σ=" + f"{readout['sigma']:.4g}" + "<br>teacher %{x:.1f}%<extra></extra>"))
    return _layout(fig, x_title="teacher accuracy under noise, % (flagged legitimate user)",
                   y_title="surrogate accuracy, % (thief)")


def m_curve_figure(result: ExtractionResult) -> go.Figure:
    """Surrogate accuracy against M: fresh versus per-input seeding, clean-answer surrogate as ceiling."""
    fig = go.Figure()
    rows = [r for r in result.averaging if r.sigma > 0]
    ms = sorted({r.m for r in rows})
    ceiling = result.clean.best.accuracy
    if ms:
        fig.add_trace(go.Scatter(x=[ms[0], ms[-1]], y=[ceiling.mean * 100] * 2, mode="lines",
                                 line=dict(color=COLORS["clean"], dash="dash"),
                                 name=f"clean-answer surrogate {pm(ceiling)}%", hoverinfo="skip"))
    for labels, dash in (("soft", "solid"), ("hard", "dot")):
        for seeding in ("fresh", "per-input"):
            sel = sorted((r for r in rows if r.labels == labels and r.seeding == seeding), key=lambda r: r.m)
            if not sel:
                continue
            fig.add_trace(go.Scatter(
                x=[r.m for r in sel], y=[r.surrogate_accuracy.mean * 100 for r in sel], mode="lines+markers",
                line=dict(color=COLORS[seeding], dash=dash),
                error_y=dict(type="data", array=[(r.surrogate_accuracy.sd or 0) * 100 for r in sel], visible=True),
                name=f"{seeding} seeding, {labels} {'answers' if labels == 'soft' else 'labels (vote)'}",
                hovertemplate="M=%{x}<br>surrogate %{y:.1f}%<extra></extra>"))
    fig.update_xaxes(tickvals=ms)
    return _layout(fig, x_title="queries per input M (log scale)", y_title="surrogate accuracy, %", x_log=True)
