"""The Extraction page's seeding comparison: per-input against consistent noise, side by side.

Figures are plain functions (comparison in, plotly figure out). The run is
cached per (archive sha256, options) in this process, with the progress bar
drawn outside the cache. The page never asks for a key: it simulates
several and shows what calibrating with *a* key will settle (the spread).
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from caliber_core.extraction.archive import ExtractionArchive
from caliber_core.extraction.seedings import SeedingComparison

from caliber_dashboard.common.names import markdown_text
from caliber_dashboard.extraction import view

#: Numbers: the served field at that length scale; None: the class cycle (version 2), for comparison.
LENGTH_SCALES = (None, 1.0, 2.0, 4.0, 8.0)
FRONTIER_JSON = Path(__file__).resolve().parents[2] / "docs" / "figures" / "frontier.json"


def design_label(length_scale) -> str:
    """How the page names a consistent design."""
    return "class cycle, v2" if length_scale is None else f"ℓ = {length_scale:g} S"
COLORS = {"per-input": "#1f77b4", "consistent": "#9467bd"}


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = None


@st.cache_resource(max_entries=16, show_spinner=False)
def _slot(key: tuple) -> _Slot:
    return _Slot()


def options_key(levels, keys: int, seeds: int, length_scale: float | None) -> tuple:
    return (tuple(sorted(levels, reverse=True)), int(keys), int(seeds),
            None if length_scale is None else float(length_scale))


def is_cached(archive: ExtractionArchive, options: tuple) -> bool:
    return _slot((archive.sha256,) + options).value is not None


def run(archive: ExtractionArchive, options: tuple) -> SeedingComparison:
    """compare_seedings for (archive, options), computed once, with a progress bar."""
    from caliber_core.extraction.seedings import compare_seedings

    slot = _slot((archive.sha256,) + options)
    with slot.lock:
        if slot.value is None:
            levels, keys, seeds, length = options
            text = f"Serving both seedings and training surrogates on {markdown_text(archive.name)}…"
            bar = st.progress(0.0, text=text)
            try:
                slot.value = compare_seedings(view.unnamed_archive(archive), levels=levels, keys=keys, seeds=seeds, length_scale=length,
                                              near_duplicates=16,
                                              progress=lambda f: bar.progress(min(1.0, f), text=f"{text} {f:.0%}"))
            finally:
                bar.empty()
        # Shared by every workspace with these bytes: built without a name, shown with this visitor's.
        return replace(slot.value, archive=archive.name)


def _layout(fig: go.Figure, x_title: str, y_title: str) -> go.Figure:
    fig.update_layout(height=420, margin=dict(l=70, r=20, t=60, b=60), plot_bgcolor="white", hovermode="closest",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0))
    fig.update_xaxes(title_text=x_title, showline=True, linecolor="#888", mirror=True, gridcolor="#eee")
    fig.update_yaxes(title_text=y_title, showline=True, linecolor="#888", mirror=True, gridcolor="#eee")
    return fig


def seedings_frontier_figure(result: SeedingComparison) -> go.Figure:
    """Teacher retention (a wrongly flagged user) across, the strongest thief's retention up; one line per seeding."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 100], y=[0, 100], mode="lines", line=dict(color="#bbb", dash="dot"),
                             name="thief = flagged user", hoverinfo="skip"))
    for seeding in ("per-input", "consistent"):
        pts = sorted(result.at(seeding), key=lambda p: p.level)
        if not pts:
            continue
        label = seeding if seeding == "per-input" else f"consistent ({design_label(result.length_scale)})"
        fig.add_trace(go.Scatter(
            x=[p.teacher_retention.mean * 100 for p in pts], y=[p.thief_retention.mean * 100 for p in pts],
            mode="lines+markers", name=label, line=dict(color=COLORS[seeding]),
            error_x=dict(type="data", array=[(p.teacher_retention.sd or 0) * 100 for p in pts], visible=True),
            error_y=dict(type="data", array=[(p.thief_retention.sd or 0) * 100 for p in pts], visible=True),
            customdata=[[p.level * 100, p.sigma.mean] for p in pts],
            hovertemplate="target %{customdata[0]:.0f}%<br>σ=%{customdata[1]:.4g}<br>flagged user keeps %{x:.1f}%"
                          "<br>thief keeps %{y:.1f}%<extra></extra>"))
    fig.update_xaxes(range=[40, 101])
    return _layout(fig, "teacher retention, % of A0 (what a wrongly flagged user keeps)",
                   "thief retention, % of its clean-answer surrogate (strongest attacker)")


def key_curve_figure(result: SeedingComparison) -> go.Figure:
    """Consistent noise: the key-averaged teacher retention over σ, with the band of min..max across keys."""
    s = result.curve_sigmas
    curves = result.curves * 100
    mean, low, high = curves.mean(axis=0), curves.min(axis=0), curves.max(axis=0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=s, y=high, mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=s, y=low, mode="lines", line=dict(width=0), fill="tonexty",
                             fillcolor="rgba(148,103,189,0.25)", name=f"range over {len(curves)} keys",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=s, y=mean, mode="lines", line=dict(color=COLORS["consistent"]),
                             name="key-averaged", hovertemplate="σ=%{x:.4g}<br>%{y:.1f}%<extra></extra>"))
    for p in result.at("consistent"):
        fig.add_trace(go.Scatter(x=p.sigmas, y=[p.level * 100] * len(p.sigmas), mode="markers",
                                 marker=dict(symbol="x", size=9, color="black"), showlegend=False,
                                 hovertemplate="σ calibrated for one key: %{x:.4g}<extra></extra>"))
    return _layout(fig, "σ (logit units)", "teacher retention on held-out inputs, %")


def sigma_spread(result: SeedingComparison) -> list[dict]:
    """Per level: the consistent σ over keys (min, max) and the relative spread: what one key settles."""
    out = []
    for p in result.at("consistent"):
        v = np.asarray(p.sigmas)
        out.append({"target": f"{p.level:.0%}", "σ (key mean)": f"{v.mean():.4g}",
                    "σ range over keys": f"{v.min():.4g}–{v.max():.4g}",
                    "teacher retention": f"{p.teacher_retention.mean:.1%}"})
    return out


def measured_frontier(path: Path = FRONTIER_JSON) -> list[dict] | None:
    """The benchmark's frontier at a flagged-user retention of 0.75, one row per design (None: not measured).

    Read from ``benchmarks/bench_frontier.py``'s JSON; each cell is the strongest label-free thief's
    retention there (linear between measured targets) with half its 95% interval, and the thief
    holding 10 labels per class beside it.
    """
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    rows: dict[str, dict] = {}
    for f in doc["frontiers"]:
        by_design: dict[str, list] = {}
        for p in f["points"]:
            by_design.setdefault(p["design"], []).append(p)
        for name, pts in by_design.items():
            pts.sort(key=lambda p: p["teacher"]["mean"])
            xs = [p["teacher"]["mean"] for p in pts]
            row = rows.setdefault(name, {"design": name})
            if not xs[0] <= 0.75 <= xs[-1]:
                row[f"{f['archive']}: thief keeps"] = "–"
                continue
            j = max(1, int(np.searchsorted(xs, 0.75)))
            a, b = pts[j - 1], pts[j]
            w = 0.0 if xs[j] == xs[j - 1] else (0.75 - xs[j - 1]) / (xs[j] - xs[j - 1])

            def mix(get):
                return (1 - w) * get(a) + w * get(b)

            mean = mix(lambda p: p["thief"]["mean"])
            half = mix(lambda p: (p["thief"]["hi"] - p["thief"]["lo"]) / 2)
            row[f"{f['archive']}: thief keeps"] = f"{mean:.1%} ± {half:.1%}"
            if a.get("labelled") and b.get("labelled"):
                row[f"{f['archive']}: with labels"] = f"{mix(lambda p: p['labelled']['mean']):.1%}"
    return list(rows.values())
