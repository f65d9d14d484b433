"""Plotly figure builders: plain functions, data in, figure out (no Streamlit).

Every figure has axis titles with units, hover templates showing the values,
and a white template that prints well; the Streamlit modebar offers the PNG
download (see :func:`chart_config`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
CORRIDOR_FILL = "rgba(44, 160, 44, 0.18)"
V_AXIS = "normalized noise v = σ²/S² (log scale)"
SIGMA_AXIS = "noise σ (logit units, log scale)"
UTILITY_AXIS = "normalized accuracy Ã"
AGREEMENT_AXIS = "normalized agreement"


def chart_config(filename: str) -> dict:
    """Plotly config for ``st.plotly_chart``: PNG download named after the figure."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in filename) or "figure"
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": safe, "scale": 2},
    }


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _layout(fig: go.Figure, *, title: str | None, x_title: str, y_title: str,
            x_log: bool = False, height: int = 460) -> go.Figure:
    fig.update_layout(
        template="plotly_white",
        title=dict(text=title) if title else None,
        height=height,
        margin=dict(l=70, r=20, t=100 if title else 70, b=60),
        hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0),
    )
    fig.update_xaxes(title_text=x_title, type="log" if x_log else "linear",
                     showline=True, linecolor="#888", mirror=True, ticks="outside")
    fig.update_yaxes(title_text=y_title, showline=True, linecolor="#888", mirror=True,
                     ticks="outside")
    return fig


def _band(fig: go.Figure, x, lower, upper, *, name: str, hover_x: str, hover_y: str) -> None:
    """Shaded band: the upper bound (no line), then the lower bound filled to it."""
    fig.add_trace(go.Scatter(
        x=_arr(x), y=_arr(upper), mode="lines", line=dict(width=0, color=CORRIDOR_FILL),
        name=f"{name} (upper)", showlegend=False, legendgroup=name,
        hovertemplate=f"{hover_x}=%{{x:.4g}}<br>upper {hover_y}=%{{y:.4f}}<extra>{name}</extra>",
    ))
    fig.add_trace(go.Scatter(
        x=_arr(x), y=_arr(lower), mode="lines", line=dict(width=0, color=CORRIDOR_FILL),
        fill="tonexty", fillcolor=CORRIDOR_FILL, name=name, legendgroup=name,
        hovertemplate=f"{hover_x}=%{{x:.4g}}<br>lower {hover_y}=%{{y:.4f}}<extra>{name}</extra>",
    ))


def _sweep_points(fig: go.Figure, x, y, se, *, name: str, hover: str) -> None:
    """The Monte-Carlo sweep as markers with +-1 s.e. bars (the normalized and raw views)."""
    fig.add_trace(go.Scatter(
        x=_arr(x), y=_arr(y), mode="markers", name=name,
        marker=dict(color=PALETTE[0], size=7),
        error_y=None if se is None else dict(type="data", array=_arr(se), visible=True,
                                             thickness=1.2, width=3),
        hovertemplate=hover,
    ))


def _target_marker(fig: go.Figure, x: float, y: float, *, label: str, hover: str) -> None:
    fig.add_trace(go.Scatter(
        x=[x], y=[y], mode="markers", name=label,
        marker=dict(symbol="star", size=16, color="#000", line=dict(width=1, color="#fff")),
        hovertemplate=hover + "<extra></extra>",
    ))
    fig.add_vline(x=x, line=dict(color="#444", width=1, dash="dot"))
    fig.add_hline(y=y, line=dict(color="#444", width=1, dash="dot"))


# --------------------------------------------------------------------- data page


def margin_histogram(
    margins: Mapping[str, Sequence[float]],
    *,
    x_title: str = "top-two logit margin m (logit units)",
    nbins: int = 40,
    title: str | None = None,
) -> go.Figure:
    """Overlaid histograms of the per-input top-two margins, one per model (% of its inputs)."""
    fig = go.Figure()
    for i, (name, m) in enumerate(margins.items()):
        fig.add_trace(go.Histogram(
            x=_arr(m), name=name, nbinsx=nbins, histnorm="percent", opacity=0.55,
            marker_color=PALETTE[i % len(PALETTE)],
            hovertemplate="m=%{x}<br>%{y:.1f}% of inputs<extra>" + name + "</extra>",
        ))
    fig.update_layout(barmode="overlay")
    return _layout(fig, title=title, x_title=x_title, y_title="share of the model's inputs (%)")


# --------------------------------------------------------------------- calibrate page


def normalized_figure(
    *,
    v_points,
    u_points,
    u_se=None,
    v_curve=None,
    logistic=None,
    corridor_lower=None,
    corridor_upper=None,
    agreement=None,
    target: tuple[float, float] | None = None,
    y_title: str = UTILITY_AXIS,
    points_name: str = "Monte-Carlo sweep (±1 s.e.)",
    title: str | None = None,
) -> go.Figure:
    """The normalized view: sweep points, fitted logistic, corridor band, exact agreement.

    All y values on the normalized scale; v on a log axis. ``target`` is (v*, y*).
    """
    fig = go.Figure()
    if corridor_lower is not None and corridor_upper is not None and v_curve is not None:
        _band(fig, v_curve, corridor_lower, corridor_upper,
              name="accuracy corridor (Corollary 1, exact)", hover_x="v", hover_y="Ã")
    if agreement is not None and v_curve is not None:
        fig.add_trace(go.Scatter(
            x=_arr(v_curve), y=_arr(agreement), mode="lines", name="exact agreement π(σ), normalized",
            line=dict(color=PALETTE[4], width=2, dash="dash"),
            hovertemplate="v=%{x:.4g}<br>(π−1/K)/(1−1/K)=%{y:.4f}<extra>exact agreement</extra>",
        ))
    if logistic is not None and v_curve is not None:
        fig.add_trace(go.Scatter(
            x=_arr(v_curve), y=_arr(logistic), mode="lines", name="fitted logistic Ã(v)",
            line=dict(color=PALETTE[1], width=2.5),
            hovertemplate="v=%{x:.4g}<br>logistic=%{y:.4f}<extra>fitted logistic</extra>",
        ))
    _sweep_points(fig, v_points, u_points, u_se, name=points_name,
                  hover="v=%{x:.4g}<br>value=%{y:.4f}<extra>sweep</extra>")
    if target is not None:
        _target_marker(fig, target[0], target[1], label="target σ*",
                       hover=f"v*={target[0]:.4g}<br>target={target[1]:.4f}")
    _layout(fig, title=title, x_title=V_AXIS, y_title=y_title, x_log=True)
    fig.update_yaxes(range=[-0.05, 1.08])
    return fig


def raw_figure(
    *,
    sigma_points,
    y_points,
    y_se=None,
    sigma_curve=None,
    exact=None,
    corridor_lower=None,
    corridor_upper=None,
    clean: float | None = None,
    chance: float | None = None,
    target: tuple[float, float] | None = None,
    y_title: str = "accuracy (fraction correct)",
    points_name: str = "Monte-Carlo sweep (±1 s.e.)",
    exact_name: str = "exact expected accuracy",
    title: str | None = None,
) -> go.Figure:
    """The raw view: accuracy (or agreement) against sigma in logit units."""
    fig = go.Figure()
    if corridor_lower is not None and corridor_upper is not None and sigma_curve is not None:
        _band(fig, sigma_curve, corridor_lower, corridor_upper,
              name="accuracy corridor (Corollary 1, exact)", hover_x="σ", hover_y="A")
    if exact is not None and sigma_curve is not None:
        fig.add_trace(go.Scatter(
            x=_arr(sigma_curve), y=_arr(exact), mode="lines", name=exact_name,
            line=dict(color=PALETTE[1], width=2.5),
            hovertemplate="σ=%{x:.4g}<br>%{y:.4f}<extra>" + exact_name + "</extra>",
        ))
    _sweep_points(fig, sigma_points, y_points, y_se, name=points_name,
                  hover="σ=%{x:.4g}<br>%{y:.4f}<extra>sweep</extra>")
    if clean is not None:
        fig.add_hline(y=clean, line=dict(color="#2ca02c", width=1, dash="dash"),
                      annotation_text=f"clean {clean:.3f}", annotation_position="top right")
    if chance is not None:
        fig.add_hline(y=chance, line=dict(color="#7f7f7f", width=1, dash="dash"),
                      annotation_text=f"chance 1/K = {chance:.3f}",
                      annotation_position="bottom left")
    if target is not None:
        _target_marker(fig, target[0], target[1], label="target σ*",
                       hover=f"σ*={target[0]:.4g}<br>target={target[1]:.4f}")
    return _layout(fig, title=title, x_title=SIGMA_AXIS, y_title=y_title, x_log=True)


def residual_figure(v, residuals, *, rmse: float | None = None,
                    y_title: str = "residual (sweep − logistic)",
                    title: str | None = None) -> go.Figure:
    """Fit residuals against v (log axis), with zero and ±rmse guides."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=_arr(v), y=_arr(residuals), mode="markers+lines", name="residual",
        marker=dict(color=PALETTE[0], size=6), line=dict(color="rgba(31,119,180,0.35)"),
        hovertemplate="v=%{x:.4g}<br>residual=%{y:+.4f}<extra></extra>",
    ))
    fig.add_hline(y=0.0, line=dict(color="#444", width=1))
    if rmse is not None:
        fig.add_hline(y=rmse, line=dict(color="#d62728", width=1, dash="dot"),
                      annotation_text=f"+rmse = {rmse:.4f}", annotation_position="top right")
        fig.add_hline(y=-rmse, line=dict(color="#d62728", width=1, dash="dot"),
                      annotation_text=f"−rmse", annotation_position="bottom right")
    return _layout(fig, title=title, x_title=V_AXIS, y_title=y_title, x_log=True, height=320)


# --------------------------------------------------------------------- fleet page


def fleet_figure(
    points: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    v_curve,
    shared,
    statistic: str = "median",
    title: str | None = None,
) -> go.Figure:
    """Every model's (v, A~) sweep points with the shared logistic curve."""
    fig = go.Figure()
    symbols = ("circle", "square", "diamond", "triangle-up", "cross", "x", "triangle-down",
               "pentagon", "hexagon", "star-square")
    for i, (name, (v, u)) in enumerate(points.items()):
        fig.add_trace(go.Scatter(
            x=_arr(v), y=_arr(u), mode="markers", name=name,
            marker=dict(color=PALETTE[i % len(PALETTE)], size=6, symbol=symbols[i % len(symbols)],
                        opacity=0.8),
            hovertemplate="v=%{x:.4g}<br>Ã=%{y:.4f}<extra>" + name + "</extra>",
        ))
    fig.add_trace(go.Scatter(
        x=_arr(v_curve), y=_arr(shared), mode="lines", name=f"shared logistic (S = {statistic})",
        line=dict(color="#000", width=3),
        hovertemplate="v=%{x:.4g}<br>shared Ã=%{y:.4f}<extra>shared fit</extra>",
    ))
    _layout(fig, title=title, x_title=f"normalized noise v = σ²/S², S = {statistic} margin (log scale)",
            y_title=UTILITY_AXIS, x_log=True, height=500)
    fig.update_yaxes(range=[-0.05, 1.08])
    return fig


# --------------------------------------------------------------------- attack page

_SIM_STYLE = {
    ("fresh", "soft-average"): (PALETTE[0], "circle", "simulated: fresh noise, soft average"),
    ("fresh", "majority-vote"): (PALETTE[3], "square", "simulated: fresh noise, hard-label majority vote"),
    ("per-input", "soft-average"): (PALETTE[2], "diamond", "simulated: per-input seeding, soft average"),
    ("per-input", "majority-vote"): (PALETTE[4], "x", "simulated: per-input seeding, majority vote"),
}


def attack_figure(
    *,
    m_curve,
    measured,
    logistic=None,
    simulation: pd.DataFrame | None = None,
    clean: float,
    chance: float,
    target: float | None = None,
    usable: float | None = None,
    m_bound: int | None = None,
    column: str = "accuracy",
    title: str | None = None,
) -> go.Figure:
    """Utility an averaging attacker recovers against M queries per input (Proposition 2)."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=_arr(m_curve), y=_arr(measured), mode="lines", name="analytic: measured curve at σ/√M",
        line=dict(color="#000", width=2.5),
        hovertemplate="M=%{x}<br>accuracy=%{y:.4f}<extra>measured curve at σ/√M</extra>",
    ))
    if logistic is not None:
        fig.add_trace(go.Scatter(
            x=_arr(m_curve), y=_arr(logistic), mode="lines", name="analytic: logistic at v/M",
            line=dict(color=PALETTE[1], width=2, dash="dash"),
            hovertemplate="M=%{x}<br>accuracy=%{y:.4f}<extra>logistic at v/M</extra>",
        ))
    if simulation is not None and not simulation.empty:
        for (seeding, estimator), grp in simulation.groupby(["seeding", "estimator"], sort=False):
            color, symbol, name = _SIM_STYLE.get(
                (seeding, estimator), ("#333", "circle", f"simulated: {seeding}, {estimator}"))
            se = grp.get(f"{column}_se")
            fig.add_trace(go.Scatter(
                x=grp["m"].to_numpy(), y=grp[column].to_numpy(), mode="markers+lines", name=name,
                marker=dict(color=color, symbol=symbol, size=9),
                line=dict(color=color, width=1, dash="dot"),
                error_y=None if se is None else dict(type="data", array=se.to_numpy(), visible=True,
                                                     thickness=1, width=3),
                hovertemplate="M=%{x}<br>" + column + "=%{y:.4f}<extra>" + name + "</extra>",
            ))
    # Zoom on the recovered range; chance is drawn only when it falls inside.
    ys = [np.nanmin(_arr(measured)), clean]
    if target is not None:
        ys.append(target)
    if simulation is not None and not simulation.empty:
        ys.append(float(np.nanmin(simulation[column].to_numpy(dtype=float))))
    y_lo = max(0.0, min(ys) - 0.08)
    fig.add_hline(y=clean, line=dict(color="#2ca02c", width=1, dash="dash"),
                  annotation_text=f"clean A0 = {clean:.3f}", annotation_position="top left")
    if chance >= y_lo:
        fig.add_hline(y=chance, line=dict(color="#7f7f7f", width=1, dash="dash"),
                      annotation_text=f"chance 1/K = {chance:.3f}", annotation_position="bottom left")
    if target is not None:
        fig.add_hline(y=target, line=dict(color="#d62728", width=1, dash="dot"),
                      annotation_text=f"served (target) {target:.3f}",
                      annotation_position="bottom right")
    if usable is not None:
        fig.add_hline(y=usable, line=dict(color="#ff7f0e", width=1.5, dash="dot"),
                      annotation_text=f"usable level {usable:.3f}", annotation_position="top right")
    if m_bound is not None:
        fig.add_vline(x=m_bound, line=dict(color="#ff7f0e", width=1.5, dash="dot"),
                      annotation_text=f"M ≥ v/v_use = {m_bound}", annotation_position="bottom right")
    _layout(fig, title=title, x_title="queries per input M (log scale)",
            y_title=f"{column} the attacker recovers", x_log=True, height=500)
    m_max = float(np.nanmax(_arr(m_curve)))
    fig.update_xaxes(dtick=np.log10(2), range=[np.log10(0.8), np.log10(m_max * 1.25)])
    fig.update_yaxes(range=[y_lo, min(1.0, max(ys)) + 0.02])
    return fig
