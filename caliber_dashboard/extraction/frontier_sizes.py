"""The Extraction page's frontier across campaign sizes, read from ``benchmarks/bench_frontier_sizes.py``'s JSON."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go

SIZES_JSON = Path(__file__).resolve().parents[2] / "docs" / "figures" / "frontier-sizes.json"
SCHEMA = "caliber.frontier-sizes/v1"
COLORS = {"per-input": "#1f77b4", "field-4": "#9467bd"}


def measured_sizes(path: Path = SIZES_JSON) -> dict | None:
    """The benchmark's points across pool sizes (None: not measured, or another schema).

    Parameters
    ----------
    path : Path
        The ``caliber.frontier-sizes/v1`` JSON.

    Returns
    -------
    dict or None
        ``{"archive", "curves": {design: [(pool rows, user, thief mean, thief lo, thief hi)]}}``, sizes ascending.
    """
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        return None
    curves: dict[str, list] = {}
    for size in sorted(doc["sizes"], key=lambda s: s["pool_rows"]):
        for p in size["points"]:
            curves.setdefault(p["design"], []).append(
                (size["pool_rows"], p["teacher"]["mean"], p["thief"]["mean"], p["thief"]["lo"], p["thief"]["hi"]))
    return {"archive": doc["archive"], "curves": curves}


def sizes_figure(measured: dict) -> go.Figure:
    """The thief's retention over the pool size, one line per design, with 95% intervals; the user's dotted.

    Parameters
    ----------
    measured : dict
        From :func:`measured_sizes`.

    Returns
    -------
    plotly.graph_objects.Figure
    """
    fig = go.Figure()
    for name, pts in measured["curves"].items():
        n = [p[0] for p in pts]
        color = COLORS.get(name)
        fig.add_trace(go.Scatter(
            x=n, y=[p[2] for p in pts], mode="lines+markers", name=f"{name}: thief keeps", line={"color": color},
            error_y={"type": "data", "symmetric": False, "array": [p[4] - p[2] for p in pts],
                     "arrayminus": [p[2] - p[3] for p in pts]}))
        fig.add_trace(go.Scatter(x=n, y=[p[1] for p in pts], mode="lines", name=f"{name}: user keeps",
                                 line={"color": color, "dash": "dot"}))
    fig.update_layout(xaxis={"title": "queries in the campaign (pool rows)", "type": "log"},
                      yaxis={"title": "retention (of clean accuracy)", "tickformat": ".0%"},
                      margin={"t": 30}, height=380)
    return fig
