"""Plotly figure builders: plain functions, data in, figure out (no Streamlit).

Every figure has axis titles with units, hover templates showing the values,
and a white look that prints well; the Streamlit modebar offers the PNG
download (see :func:`chart_config`).

Cheap to build and to send, because the Calibrate page redraws one on every
step of its target slider:

* the look is a plain layout dict (:data:`LIGHT_LAYOUT`) with an empty
  template, not ``plotly_white``, which plotly validates and copies into every
  figure (about 7 KB of each figure's JSON and most of its build time);
* guide lines are shapes written directly (:func:`_hline`, :func:`_vline`),
  not ``add_hline``/``add_vline``, which resolve axis domains on every call;
* a page builds a figure without its target once per model and view, and
  :func:`with_target` puts the target marker and its guide lines on a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from caliber_dashboard.common.names import plotly_text

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
CORRIDOR_FILL = "rgba(44, 160, 44, 0.18)"
INTERVAL_FILL = "rgba(214, 39, 40, 0.12)"
TARGET_NAME = "target σ*"
CORRIDOR_NAME = "accuracy corridor (Corollary 1, exact)"
_GRID = "#EBF0F8"
_AXIS = dict(showline=True, linecolor="#888", mirror=True, ticks="outside", gridcolor=_GRID,
             zerolinecolor=_GRID)
#: The white look of every figure: a plain layout dict, set as the figure's
#: whole template (assigned, so plotly's and Streamlit's default templates are
#: replaced rather than merged into it).
LIGHT_LAYOUT = dict(
    paper_bgcolor="white",
    plot_bgcolor="white",
    font=dict(color="#2a3f5f"),
    colorway=list(PALETTE),
    hovermode="closest",
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0),
    xaxis=_AXIS,
    yaxis=_AXIS,
)
V_AXIS = "normalized noise v = σ²/S² (log scale)"
SIGMA_AXIS = "noise σ (logit units, log scale)"
UTILITY_AXIS = "normalized accuracy Ã"
AGREEMENT_AXIS = "normalized agreement"


def distinct_colors(n: int) -> list[str]:
    """``n`` colours, no two alike: the palette up to its 10, else hues spread evenly around the wheel."""
    if n <= len(PALETTE):
        return list(PALETTE[:n])
    return [f"hsl({round(360 * i / n)}, {65 if i % 2 else 80}%, {38 if i % 2 else 52}%)" for i in range(n)]


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
    fig.layout.template = {"layout": LIGHT_LAYOUT}
    if title:
        fig.layout.title = dict(text=title)
    fig.update_layout(
        height=height,
        margin=dict(l=70, r=20, t=100 if title else 70, b=60),
        # A log axis labels its 2s and 5s with the digit alone by default ("5 0.1 2 5 1"):
        # 1, 2 and 5 of each decade, written in full, read "0.05 0.1 0.2 0.5 1".
        xaxis=dict(title=dict(text=x_title), type="log" if x_log else "linear",
                   tickformat="~g" if x_log else None, dtick=_log_dtick(fig) if x_log else None),
        yaxis=dict(title=dict(text=y_title)),
    )
    return fig


#: Decades a log axis may span and still label 1, 2 and 5 of each without the labels running together.
LOG_LABELS_125_DECADES = 2.5


def _log_dtick(fig: go.Figure):
    """"D2" (1, 2, 5 of each decade) over a short span; every decade (1) over a long one.

    Over many decades the 1-2-5 labels of a ~900 px axis run into each other ("0.00050.001").
    """
    xs = [np.asarray(t.x, dtype=float) for t in fig.data if getattr(t, "x", None) is not None]
    xs = [x[np.isfinite(x) & (x > 0)] for x in xs]
    xs = np.concatenate(xs) if xs else np.array([])
    if xs.size < 2:
        return "D2"
    return "D2" if np.log10(xs.max() / xs.min()) <= LOG_LABELS_125_DECADES else 1


_ANCHOR = {"top right": (1.0, "right", "bottom"), "top left": (0.0, "left", "bottom"),
           "bottom right": (1.0, "right", "top"), "bottom left": (0.0, "left", "top")}


def _hline(y: float, *, color: str, dash: str = "dash", width: float = 1.0) -> dict:
    """A horizontal line across the plot at data y (a shape, as add_hline draws it)."""
    return dict(type="line", xref="x domain", x0=0.0, x1=1.0, yref="y", y0=y, y1=y,
                line=dict(color=color, width=width, dash=dash))


def _vline(x: float, *, color: str, dash: str = "dash", width: float = 1.0) -> dict:
    """A vertical line across the plot at data x."""
    return dict(type="line", yref="y domain", y0=0.0, y1=1.0, xref="x", x0=x, x1=x,
                line=dict(color=color, width=width, dash=dash))


def _label(text: str, *, y: float | None = None, x: float | None = None, x_log: bool = False,
           position: str = "top right") -> dict:
    """The text beside a guide line: at data y on a horizontal one, data x on a vertical one."""
    along, xanchor, yanchor = _ANCHOR[position]
    if y is not None:
        # On a light box: markers sitting on the line (per-input seeding, at the target) stay readable around it.
        return dict(text=text, showarrow=False, xref="x domain", x=along, yref="y", y=y,
                    xanchor=xanchor, yanchor=yanchor, bgcolor="rgba(255,255,255,0.85)",
                    yshift=6 if yanchor == "bottom" else -6)
    # Annotations (unlike shapes) sit at log10(x) on a log axis.
    xa = float(np.log10(x)) if x_log else x
    return dict(text=text, showarrow=False, xref="x", x=xa, yref="y domain",
                y=0.0 if position.startswith("bottom") else 1.0,
                xanchor="left", yanchor="bottom" if position.startswith("bottom") else "top")


#: Widest point (in y units) below which a band's edges are drawn as lines to stay visible.
THIN_BAND = 0.01
THIN_BAND_EDGE = "rgba(44, 160, 44, 0.9)"


def _band(fig: go.Figure, x, lower, upper, *, name: str, hover_x: str, hover_y: str,
          fill: str = CORRIDOR_FILL) -> None:
    """Shaded band: the upper bound (no line), then the lower bound filled to it.

    A band narrower than :data:`THIN_BAND` (e.g. the corridor of a model with A0 near 1)
    would be listed in the legend yet invisible: its edges are then drawn as lines.
    """
    width = np.asarray(upper, dtype=float) - np.asarray(lower, dtype=float)
    thin = bool(np.all(~np.isfinite(width)) or np.nanmax(width) < THIN_BAND)
    edge = dict(width=1.5, color=THIN_BAND_EDGE) if thin else dict(width=0, color=fill)
    fig.add_trace(go.Scatter(
        x=_arr(x), y=_arr(upper), mode="lines", line=edge,
        name=f"{name} (upper)", showlegend=False, legendgroup=name,
        hovertemplate=f"{hover_x}=%{{x:.4g}}<br>upper {hover_y}=%{{y:.4f}}<extra>{name}</extra>",
    ))
    fig.add_trace(go.Scatter(
        x=_arr(x), y=_arr(lower), mode="lines", line=edge,
        fill="tonexty", fillcolor=fill, name=name, legendgroup=name,
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


def with_target(base: go.Figure, target: tuple[float, float] | None, *,
                x_name: str = "v*", label: str = TARGET_NAME) -> go.Figure:
    """A copy of ``base`` with the target marker and its two guide lines; ``base`` is untouched.

    ``target`` is (x, y) in data units, or None (marker and lines hidden). The
    marker is the last trace and the guide lines the last two shapes, so
    :func:`move_target` can move them in place.
    """
    fig = go.Figure(base)
    fig.add_trace(go.Scatter(
        x=[], y=[], mode="markers", name=label,
        marker=dict(symbol="star", size=16, color="#000", line=dict(width=1, color="#fff")),
    ))
    fig.layout.shapes = tuple(fig.layout.shapes) + (
        _vline(1.0, color="#444", dash="dot"), _hline(0.0, color="#444", dash="dot"))
    return move_target(fig, target, x_name=x_name)


def move_target(fig: go.Figure, target: tuple[float, float] | None, *,
                x_name: str = "v*") -> go.Figure:
    """Move (or hide) the marker and guide lines of a :func:`with_target` figure, in place.

    The cheap update of a slider step: three small properties of one trace
    and two shapes, nothing else validated again.
    """
    marker, (vline, hline) = fig.data[-1], fig.layout.shapes[-2:]
    with fig.batch_update():
        if target is None:
            marker.update(x=[], y=[], showlegend=False, hovertemplate=None)
            vline.visible = hline.visible = False
            return fig
        x, y = float(target[0]), float(target[1])
        marker.update(x=[x], y=[y], showlegend=True,
                      hovertemplate=f"{x_name}={x:.4g}<br>target={y:.4f}<extra></extra>")
        vline.update(x0=x, x1=x, visible=True)
        hline.update(y0=y, y1=y, visible=True)
    return fig


# --------------------------------------------------------------------- data page


#: Histograms overlaid on one axis up to this many models; more are drawn as one row each (a ridgeline).
MAX_OVERLAID = 3
#: Height of a ridgeline row's tallest bin, in rows: neighbouring rows do not touch.
RIDGE_HEIGHT = 0.85


def margin_histogram(
    margins: Mapping[str, Sequence[float]],
    *,
    x_title: str = "top-two logit margin m (logit units)",
    nbins: int = 40,
    title: str | None = None,
) -> go.Figure:
    """Histograms of the per-input top-two margins, one per model (% of its inputs).

    Up to :data:`MAX_OVERLAID` models overlaid on one axis; more one row each on
    one shared x axis (a ridgeline, :func:`margin_ridges`), since 8 overlaid
    histograms cannot be told apart.
    """
    margins = {plotly_text(name): m for name, m in margins.items()}  # names are text, never markup
    if len(margins) > MAX_OVERLAID:
        return margin_ridges(margins, x_title=x_title, nbins=nbins, title=title)
    fig = go.Figure()
    for i, (name, m) in enumerate(margins.items()):
        fig.add_trace(go.Histogram(
            x=_arr(m), name=name, nbinsx=nbins, histnorm="percent", opacity=0.55,
            marker_color=PALETTE[i % len(PALETTE)],
            hovertemplate="m=%{x}<br>%{y:.1f}% of inputs<extra>%{fullData.name}</extra>",
        ))
    fig.update_layout(barmode="overlay")
    return _layout(fig, title=title, x_title=x_title, y_title="share of the model's inputs (%)")


def margin_ridges(margins: Mapping[str, Sequence[float]], *, x_title: str, nbins: int = 40,
                  title: str | None = None) -> go.Figure:
    """Each model's margin histogram on a row of its own, over one shared x axis (names already plain text).

    The bins are counted here (``nbins`` equal bins over each model's range, as
    a plotly histogram would) and each row is one filled outline scaled to its
    own tallest bin; hovering a bin gives its share of the model's inputs. One
    axis pair for every model: small multiples (an axis pair a model) took the
    browser most of a second to draw for the demo set and an upload.
    """
    fig = go.Figure()
    names = list(margins)
    for i, name in enumerate(names):
        m = _arr(margins[name])
        m = m[np.isfinite(m)]
        counts, edges = np.histogram(m, bins=nbins) if m.size else (np.zeros(1), np.array([0.0, 1.0]))
        share = 100.0 * counts / max(1, m.size)
        base = float(len(names) - 1 - i)  # the first model on top, as in the table
        height = RIDGE_HEIGHT * share / share.max() if share.max() > 0 else share
        # One closed outline a model: up and across each bin, back along the row's baseline.
        x = np.concatenate([np.repeat(edges, 2)[1:-1], [edges[-1], edges[0]]])
        y = np.concatenate([base + np.repeat(height, 2), [base, base]])
        centre = np.concatenate([np.repeat((edges[:-1] + edges[1:]) / 2, 2), [np.nan, np.nan]])
        fig.add_trace(go.Scatter(
            x=x, y=y, name=name, mode="lines", fill="toself", line=dict(width=1, color=PALETTE[i % len(PALETTE)]),
            opacity=0.8, showlegend=False, hoveron="points",
            customdata=np.column_stack([centre, np.concatenate([np.repeat(share, 2), [np.nan, np.nan]])]),
            hovertemplate="m=%{customdata[0]:.4g}<br>%{customdata[1]:.1f}% of inputs<extra>%{fullData.name}</extra>",
        ))
    fig = _layout(fig, title=title, x_title=x_title, y_title="",
                  height=max(300, 42 * len(names) + 140))
    fig.update_yaxes(tickvals=[float(len(names) - 1 - i) for i in range(len(names))], ticktext=names,
                     showgrid=False, zeroline=False, range=[-0.15, len(names) - 1 + RIDGE_HEIGHT + 0.15])
    fig.update_layout(margin=dict(l=160))
    return fig


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
    corridor_name: str = CORRIDOR_NAME,
    agreement_name: str = "exact agreement π(σ), normalized",
    interval_lower=None,
    interval_upper=None,
    interval_name: str = "95% interval",
    title: str | None = None,
) -> go.Figure:
    """The normalized view: sweep points, fitted logistic, corridor band, exact agreement.

    All y values on the normalized scale; v on a log axis. ``target`` is (v*, y*)
    (see :func:`with_target`). ``interval_lower``/``interval_upper`` shade a
    confidence band (on ``v_curve``) around the curve the targets invert.
    """
    fig = go.Figure()
    if corridor_lower is not None and corridor_upper is not None and v_curve is not None:
        _band(fig, v_curve, corridor_lower, corridor_upper,
              name=corridor_name, hover_x="v", hover_y="Ã")
    if interval_lower is not None and interval_upper is not None and v_curve is not None:
        _band(fig, v_curve, interval_lower, interval_upper, name=interval_name, hover_x="v",
              hover_y="value", fill=INTERVAL_FILL)
    if agreement is not None and v_curve is not None:
        fig.add_trace(go.Scatter(
            x=_arr(v_curve), y=_arr(agreement), mode="lines", name=agreement_name,
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
    _layout(fig, title=title, x_title=V_AXIS, y_title=y_title, x_log=True)
    fig.layout.yaxis.range = [-0.05, 1.08]
    return fig if target is None else with_target(fig, target, x_name="v*")


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
    corridor_name: str = CORRIDOR_NAME,
    interval_lower=None,
    interval_upper=None,
    interval_name: str = "95% interval",
    title: str | None = None,
) -> go.Figure:
    """The raw view: accuracy (or agreement) against sigma in logit units.

    ``target`` is (sigma*, y*) (see :func:`with_target`); the interval band,
    when given, lies on ``sigma_curve``.
    """
    fig = go.Figure()
    if corridor_lower is not None and corridor_upper is not None and sigma_curve is not None:
        _band(fig, sigma_curve, corridor_lower, corridor_upper,
              name=corridor_name, hover_x="σ", hover_y="A")
    if interval_lower is not None and interval_upper is not None and sigma_curve is not None:
        _band(fig, sigma_curve, interval_lower, interval_upper, name=interval_name, hover_x="σ",
              hover_y="value", fill=INTERVAL_FILL)
    if exact is not None and sigma_curve is not None:
        fig.add_trace(go.Scatter(
            x=_arr(sigma_curve), y=_arr(exact), mode="lines", name=exact_name,
            line=dict(color=PALETTE[1], width=2.5),
            hovertemplate="σ=%{x:.4g}<br>%{y:.4f}<extra>" + exact_name + "</extra>",
        ))
    _sweep_points(fig, sigma_points, y_points, y_se, name=points_name,
                  hover="σ=%{x:.4g}<br>%{y:.4f}<extra>sweep</extra>")
    shapes, notes = [], []
    if clean is not None:
        shapes.append(_hline(clean, color="#2ca02c"))
        notes.append(_label(f"clean {clean:.3f}", y=clean, position="top right"))
    if chance is not None:
        shapes.append(_hline(chance, color="#7f7f7f"))
        notes.append(_label(f"chance 1/K = {chance:.3f}", y=chance, position="bottom left"))
    _layout(fig, title=title, x_title=SIGMA_AXIS, y_title=y_title, x_log=True)
    fig.update_layout(shapes=shapes, annotations=notes)
    return fig if target is None else with_target(fig, target, x_name="σ*")


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
    shapes, notes = [_hline(0.0, color="#444", dash="solid")], []
    if rmse is not None:
        shapes += [_hline(rmse, color="#d62728", dash="dot"), _hline(-rmse, color="#d62728", dash="dot")]
        notes += [_label(f"+rmse = {rmse:.4f}", y=rmse, position="top right"),
                  _label("−rmse", y=-rmse, position="bottom right")]
    _layout(fig, title=title, x_title=V_AXIS, y_title=y_title, x_log=True, height=460)
    fig.update_layout(shapes=shapes, annotations=notes)
    return fig


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
    colors = distinct_colors(len(points))
    for i, (name, (v, u)) in enumerate(points.items()):
        fig.add_trace(go.Scatter(
            x=_arr(v), y=_arr(u), mode="markers", name=plotly_text(name),
            marker=dict(color=colors[i], size=6, symbol=symbols[i % len(symbols)],
                        opacity=0.8),
            hovertemplate="v=%{x:.4g}<br>Ã=%{y:.4f}<extra>%{fullData.name}</extra>",
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
    shapes = [_hline(clean, color="#2ca02c")]
    notes = [_label(f"clean A0 = {clean:.3f}", y=clean, position="top left")]
    if chance >= y_lo:
        shapes.append(_hline(chance, color="#7f7f7f"))
        notes.append(_label(f"chance 1/K = {chance:.3f}", y=chance, position="bottom left"))
    if target is not None:
        shapes.append(_hline(target, color="#d62728", dash="dot"))
        notes.append(_label(f"served (target) {target:.3f}", y=target, position="bottom right"))
    if usable is not None:
        shapes.append(_hline(usable, color="#ff7f0e", dash="dot", width=1.5))
        notes.append(_label(f"usable level {usable:.3f}", y=usable, position="top right"))
    if m_bound is not None:
        shapes.append(_vline(m_bound, color="#ff7f0e", dash="dot", width=1.5))
        notes.append(_label(f"M ≥ v/v_use = {m_bound}", x=m_bound, x_log=True,
                            position="bottom right"))
    _layout(fig, title=title, x_title="queries per input M (log scale)",
            y_title=f"{column} the attacker recovers", x_log=True, height=500)
    fig.update_layout(shapes=shapes, annotations=notes)
    m_max = float(np.nanmax(_arr(m_curve)))
    fig.update_xaxes(dtick=np.log10(2), range=[np.log10(0.8), np.log10(m_max * 1.25)])
    fig.update_yaxes(range=[y_lo, min(1.0, max(ys)) + 0.02])
    return fig
