"""A top-k logprob log on the dashboard: an agreement-only calibration and its certified band.

A log holds no labels and no full rows, so it is not a workspace model (no
logits matrix to sweep): the Data page calibrates it on its own (the same call
as ``calibrate LOG --vocab-size V``, the same one-line errors) and keeps the
last result in the session under :data:`LOG_RESULT`; :mod:`.log_store` keeps
every calibrated log's config in the workspace. The Data and Calibrate pages
both show the certified bounds of the agreement curve as a band
(:func:`band_panel`), the Data page with the config to download. A log that
fails to calibrate changes nothing in the workspace.
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from caliber_core.calibration.llm_inputs import config_for_llm_file
from caliber_dashboard.common import upload_boundary

from caliber_dashboard.common.figures import INTERVAL_FILL, LIGHT_LAYOUT, PALETTE, SIGMA_AXIS, chart_config

#: Session key of the last log calibration: (config, None) or (None, error line).
LOG_RESULT = "caliber_logprob_log"


def calibrate_log(content: bytes, filename: str, *, vocab_size: int, targets, side: str = "at-least"):
    """(config, None) for a calibrated log, or (None, the CLI's one-line error).

    Parameters
    ----------
    content : bytes
    filename : str
    vocab_size : int
    targets : sequence of float
        Agreement targets.
    side : {"at-least", "at-most", "point"}
    """
    try:
        result = config_for_llm_file(content, filename, [("agreement", float(t)) for t in targets],
                                     vocab_size=int(vocab_size), side=side)
    except Exception as exc:  # noqa: BLE001  (the one error boundary: one line, never a traceback)
        return None, upload_boundary.message(exc, filename)
    if result.kind != "logprob-logs":
        return None, (f"{filename}: lm-eval samples, not a logprob log: upload it with the logits "
                      "files above (it loads as a labelled model)")
    return result.config, None


def bounds_figure(config: dict) -> go.Figure:
    """The certified lower and upper agreement curves as a band, and each target's sigma."""
    b = config["bounds"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=b["sigma"], y=b["agreement_upper"], mode="lines", line=dict(width=1, color=PALETTE[0]),
                             name="upper bound (tail spread evenly)",
                             hovertemplate="σ=%{x:.4g}<br>upper agreement=%{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=b["sigma"], y=b["agreement_lower"], mode="lines", line=dict(width=1, color=PALETTE[1]),
                             fill="tonexty", fillcolor=INTERVAL_FILL, name="lower bound (worst unseen tail)",
                             hovertemplate="σ=%{x:.4g}<br>lower agreement=%{y:.4f}<extra></extra>"))
    for t in config["targets"]:
        lo, hi = t["interval"]["agreement"]
        fig.add_trace(go.Scatter(
            x=[t["sigma"], t["sigma"]], y=[lo, hi], mode="lines+markers", line=dict(color="#333", width=2),
            name=f"agreement {t['requested']:g} ({t['side']}): σ={t['sigma']:.4g}",
            hovertemplate=f"σ={t['sigma']:.5g}<br>agreement in [{lo:.4f}, {hi:.4f}]<extra></extra>"))
    fig.update_layout(template=dict(layout=LIGHT_LAYOUT), height=380, margin=dict(l=60, r=20, t=40, b=50),
                      title=f"{config['model']}: certified agreement (k={b['k']}, V={b['vocab_size']:,})")
    fig.update_xaxes(title_text=SIGMA_AXIS, type="log")
    fig.update_yaxes(title_text="agreement with the clean top token", range=[0, 1.02])
    return fig


def band_panel(config: dict, *, key: str) -> None:
    """Draw the certified band of a calibrated log and the bound's width at each target.

    Parameters
    ----------
    config : dict
        A logprob-log config (:func:`calibrate_log`).
    key : str
        The chart's widget key (one per page).
    """
    st.plotly_chart(bounds_figure(config), width="stretch", config=chart_config("caliber_logprob_log"), key=key)
    st.caption("Band: the agreement lies between the bounds for every tail the log allows. "
               "Bound width at each target: "
               + ", ".join(f"{w:.4f}" for w in config["bounds"]["widths"]) + ".")
