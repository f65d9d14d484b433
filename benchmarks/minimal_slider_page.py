"""The floor for a slider step: a minimal Streamlit page with one plotly figure.

``benchmarks/bench_dashboard.py`` serves this page next to the dashboard and
times a slider step on both, interleaved. The figure has the size of the
Calibrate page's plot (460 px high, the full width, a 60-point band, two
60-point curves, 24 points with error bars and a target marker), and the page
is written the plain way: read the slider, compute a number, draw the metric
and the figure again. Nothing is cached or held back, so a step here costs
what Streamlit and plotly cost for one figure and one number.

Run alone with ``python -m streamlit run benchmarks/minimal_slider_page.py``.
"""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="Minimal slider page", layout="wide")
st.title("Minimal slider page")

V = np.geomspace(1e-2, 1e2, 60)
CURVE = 1.0 / (1.0 + V**1.2)
POINTS_V = np.geomspace(1.5e-2, 60.0, 24)
POINTS_Y = 1.0 / (1.0 + POINTS_V**1.2) + 0.01 * np.sin(7.0 * POINTS_V)

target = st.slider("Target retention", min_value=30.0, max_value=99.5, value=80.0, step=0.5,
                   format="%.1f%%", key="minimal_target")
u = (target - 30.0) / 69.5
v_star = float(((1.0 - u) / max(u, 1e-9)) ** (1 / 1.2)) if u < 1 else 0.0
st.metric("v*", f"{v_star:.5g}")

fig = go.Figure()
fig.add_trace(go.Scatter(x=V, y=CURVE + 0.05, mode="lines", line=dict(width=0), showlegend=False))
fig.add_trace(go.Scatter(x=V, y=CURVE - 0.05, mode="lines", line=dict(width=0), fill="tonexty",
                         name="band"))
fig.add_trace(go.Scatter(x=V, y=CURVE, mode="lines", name="curve"))
fig.add_trace(go.Scatter(x=V, y=np.sqrt(CURVE), mode="lines", name="second curve",
                         line=dict(dash="dash")))
fig.add_trace(go.Scatter(x=POINTS_V, y=POINTS_Y, mode="markers", name="points",
                         error_y=dict(type="data", array=np.full(24, 0.01), visible=True)))
fig.add_trace(go.Scatter(x=[max(v_star, 1e-2)], y=[u], mode="markers", name="target",
                         marker=dict(symbol="star", size=16)))
fig.update_layout(height=460, xaxis_type="log")
st.plotly_chart(fig, width="stretch", key="minimal_figure")
