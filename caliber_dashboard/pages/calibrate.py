"""Calibrate: one model's sweep, fit and corridor; a target in, sigma* and its interval out; verify it."""

import streamlit as st

from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_core.config import SIDES
from caliber_dashboard import navigation
from caliber_dashboard.calibrate import plots as calibrate_plots
from caliber_dashboard.calibrate import thief
from caliber_dashboard.calibrate.verification import check_verification, verify_realizations, verify_sigma
from caliber_dashboard.common import (attack_prefetch, background, cache, figures, precalibrate, readouts, state,
                                      tables, ui)
from caliber_dashboard.common.targets import percent_to_fraction, slider_range
from caliber_dashboard.common.ui import fmt
from caliber_dashboard.data import log_store, logprob_log, vocab_panel

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

VERIFY_RESULT = "caliber_verify_result"
VERIFY_REQUEST = "caliber_verify_request"
LAST_PERCENT = "caliber_calibrate_last_percent"
CURRENT_TARGET = "caliber_calibrate_current_target"
SESSION_FIGURE = "caliber_calibrate_figure"
EXPORT_REQUEST = "caliber_calibrate_export_request"
EXPORT_CHOICE = "caliber_calibrate_export_choice"
CAPTIONS = {
    "normalized": "Points: Monte-Carlo sweep with ±1 s.e. bars. Red: the logistic law fit to them. "
                  "Shaded green: the accuracy corridor of Corollary 1, normalized like Ã. Dashed: "
                  "agreement π(σ) on the same [chance, clean] scale.",
    "raw": "Points: Monte-Carlo sweep with ±1 s.e. bars. Red: expected accuracy under noise. "
           "Shaded green: the accuracy corridor of Corollary 1.",
    "residuals": "Sweep points minus the fitted logistic, with ±rmse.",
}

if st.session_state.pop(EXPORT_REQUEST, False):  # "Export this σ" was clicked: nothing to draw here
    st.switch_page("pages/export.py")

st.title("Calibrate")
st.caption(
    "Normalize noise by the median top-two margin S (v = σ²/S²) and accuracy by its range "
    "(Ã = (A − 1/K)/(A0 − 1/K)); a logistic law Ã(v) fits the sweep; a target in, σ* out."
)

log_config = log_store.current()  # this session's last log, else the workspace's latest
if log_config:  # calibrated on the Data page: a log is no model (no logits to sweep), its band shows here
    with st.expander(f"Top-k logprob log {log_config['model']}: certified agreement band", expanded=True):
        logprob_log.band_panel(log_config, key="calibrate_logprob_log_band")

streamed = vocab_panel.calibrate_panel()  # large-vocabulary files from the data root: their own engine
if streamed and state.models():
    st.subheader("Models")
c1, c2 = st.columns([3, 1])
with c1:
    data = ui.model_selector("Model", key="calibrate_model")
if data is None:
    if not streamed:
        st.info("No model loaded: add one on the Data page.")
    st.stop()
with c2:
    statistic = st.selectbox("Margin statistic for S", MARGIN_STATISTICS, key="calibrate_statistic",
                             help="The paper uses the median; mean and 10%-trimmed mean for the ablation.")

precalibrate.wait_with_progress(data, statistic=statistic)  # started when the file was loaded
try:
    cal = cache.calibration(data, statistic=statistic)
except ValueError as exc:
    st.error(ui.plain(f"{data.name}: {exc}"))
    st.stop()
estimator = cache.estimator(data, cal)
clean = estimator.at(0.0)

m = st.columns(6)
m[0].metric("inputs N", f"{cal.n_samples:,}")
m[1].metric("classes K", cal.n_classes)
if cal.has_labels:
    m[2].metric("clean accuracy A0", fmt(cal.clean_accuracy, ".4f"),
                delta=f"{clean.level:.0%}: {clean.accuracy.low:.3f}–{clean.accuracy.high:.3f}",
                delta_color="off", delta_arrow="off",
                help="The interval is for the population the file samples (row bootstrap).")
else:
    m[2].metric("clean accuracy A0", "—", help="No labels in this file.")
m[3].metric(f"S ({statistic} margin)", fmt(cal.scale, ".4g"))
m[4].metric(f"logistic R² ({cal.fit_quantity})", fmt(cal.fit.r2, ".4f"))
if cal.intervals.realizations:
    m[5].metric("noise draws / input", cal.intervals.realizations,
                help="Monte-Carlo draws per input in the sweep (common random numbers over σ).")
else:
    m[5].metric("noise draws / input", "exact (K = 2)",
                help="No draws: with two classes each input's survival is Φ(gap / (σ√2)), so the curves are exact.")
st.caption("σ* inverts the " + ("exact expected-accuracy curve (quadrature, Proposition 1)."
                                if cal.curve_method == "exact" else
                                "Monte-Carlo sweep curve (the file is too large for quadrature)."))
if not cal.has_labels:
    st.info("This file has no labels: the fit is to normalized agreement and only agreement "
            "targets are possible.")


def _export_this():
    # At once, not after the run: the Export page reads this choice on its next run. The
    # choice is the fragment's latest (the slider may have moved since this button was drawn).
    choice = st.session_state.get(EXPORT_CHOICE)
    if choice is not None:
        state.remember_target(*choice)
        st.session_state[EXPORT_REQUEST] = True


def _request_verify():
    # The target is the fragment's latest (it may have moved since this button was drawn).
    st.session_state[VERIFY_REQUEST] = st.session_state.get(CURRENT_TARGET)


def _readout(record, intervals, kind, side, value):
    r = st.columns([3, 2, 2])  # σ with its range needs the width
    sigma_range = cache.sigma_range(data, cal, kind, value, side=side)
    r[0].metric(readouts.SIGMA_LABELS[side], readouts.sigma_text(record.sigma, sigma_range),
                help=readouts.SIDE_HELP[side] + " " + readouts.SIGMA_RANGE_HELP)
    r[1].metric(readouts.V_LABELS[side], readouts.rounded_like(record.v, record.sigma, sigma_range, power=2),
                help="Rounded like σ: its relative range, doubled (v grows as σ²).")
    r[2].metric("logistic σ (closed form)",
                readouts.rounded_like(record.sigma_logistic, record.sigma, sigma_range),
                help="Eq. inverse-v on the fitted law at the target itself (the point), for comparison; "
                     "σ* inverts the curve.")
    if side == "point":
        st.markdown(readouts.interval_line(intervals, first=kind))
    else:  # the guarantee first; the two-sided interval is secondary
        bound = cache.side_bound(data, cal, kind, value, side=side)
        st.markdown(f"**{readouts.guarantee(kind, bound, side=side, level=intervals.level)}**")
        st.caption("Two-sided, at the σ served: " + readouts.interval_line(intervals, first=kind))
    st.markdown(thief.readout_line(data.sha256, record.sigma))
    advice, wide = readouts.advice(intervals, kind=kind)
    method = (f"Method: {record.method}" + (" (saturated)" if record.saturated else "")
              + f" · side: {readouts.SIDE_LABELS[side]} · interval: {intervals.method}.")
    if wide:
        st.warning(f"{advice} Wider than ±2 points: more calibration rows narrow it. {method}",
                   icon=":material/warning:")
    else:
        st.caption(f"{advice} {method}")


def _plot(record, intervals, view, with_bands):
    """This session's copy of the view (made once per model and view), the target moved on it."""
    key = (cache.data_digest(data), statistic, view, with_bands)
    held = st.session_state.get(SESSION_FIGURE)
    if held is None or held["key"] != key:
        base = cache.figure(data, cal, view, with_bands=with_bands)
        held = {"key": key, "figure": calibrate_plots.target_figure(base, cal, None, view, delivered={})}
        st.session_state[SESSION_FIGURE] = held
    fig = calibrate_plots.move_target(held["figure"], cal, record, view,
                                      delivered=calibrate_plots.delivered(intervals))
    st.plotly_chart(fig, width="stretch", key=f"fig_{view}",
                    config=figures.chart_config(f"{data.name}_{view}"))


def _verification(record, intervals, kind, side, key):
    """Fresh-noise measurement at the served sigma, when the Verify button asked for this target."""
    if record is not None and st.session_state.get(VERIFY_REQUEST) == key:
        st.session_state.pop(VERIFY_REQUEST)
        reps = verify_realizations(cal.n_samples, cal.n_classes)
        seed = state.next_verify_seed()
        text = f"Adding fresh noise: {reps} draws × {cal.n_samples:,} inputs…"
        with cache.progress_bar(text) as report:
            ver = verify_sigma(data.logits, data.labels, record.sigma, realizations=reps, seed=seed, progress=report)
        st.session_state[VERIFY_RESULT] = {"key": key, "result": ver}
    stored = st.session_state.get(VERIFY_RESULT)
    if record is None or not stored or stored["key"] != key:
        return
    ver = stored["result"]
    what = "agreement" if kind == "agreement" or not cal.has_labels else "accuracy"
    measured, se = (ver.agreement, ver.agreement_se) if what == "agreement" else (ver.accuracy, ver.accuracy_se)
    if side == "point":
        wanted, wanted_label = getattr(record, what), f"target {what}"
    else:  # off the point: compare with what the sample predicts at the sigma served
        wanted, wanted_label = intervals.get(what).estimate, f"predicted {what}"
    check = check_verification(measured, se, wanted)
    band = f"± {check.half_width:.4f}"
    level = f"{check.confidence:.0%}"
    v = st.columns(4)
    v[0].metric(f"measured {what}", fmt(measured, ".4f"), help=f"{band} ({level}, binomial)")
    v[1].metric(wanted_label, fmt(wanted, ".4f"))
    v[2].metric("relative error", f"{check.relative_error:+.2%}")
    v[3].metric("draws", f"{ver.realizations} × {cal.n_samples}", help=f"seed {ver.seed}")
    (st.success if check.within else st.warning)(
        f"Measured {what} {measured:.4f} {band} at σ = {ver.sigma:.5g}; {wanted_label} "
        f"{wanted:.4f}: {'within' if check.within else 'outside'} the {level} Monte-Carlo band "
        f"(relative error {check.relative_error:+.2%}).")


# Only what a step changes is in the fragment: the slider, the readout, the plot and a
# verification of this target (its button too: a click reruns the fragment, not the page).
# A step re-sends and redraws those elements and nothing else; Export this σ and the
# Extraction link below it do not change with the target (the button's callback reads the
# fragment's latest target), so they are drawn by the page's full runs only. Kind, side, view and band are chosen outside it too (a change there
# reruns the page, which is rare). The plot follows every step: a marker that stays
# behind while the numbers move reads as stale. Measured in Chromium next to a minimal
# one-figure page: benchmarks/bench_dashboard.py, figures in docs/figures/dashboard-timings.md.
@st.fragment
def target_panel(kind, side, view, with_bands):
    """Slider, readout with intervals, the plot with the target, verification. Reruns alone."""
    attack_prefetch.calibrate_run_started()
    value, percent = ui.target_slider(data, cal, kind, key_prefix="calibrate", remember=False)
    key = (cache.data_digest(data), statistic, kind, value, side)
    st.session_state[CURRENT_TARGET] = key
    record = intervals = None
    try:
        record, intervals = cache.served(data, cal, kind, value, side=side)
    except ValueError as exc:
        st.warning(ui.plain(str(exc)))
    st.session_state[EXPORT_CHOICE] = None if record is None else (kind, percent, side)
    if record is not None:
        _readout(record, intervals, kind, side, value)
    _plot(record, intervals, view, with_bands)
    if record is not None:  # in the fragment: a click reruns this part only, and its result shows below it
        st.button("Verify", key="verify_btn", icon=":material/science:", on_click=_request_verify,
                  help="Measure what this σ delivers with fresh Monte-Carlo noise (a new seed every click); "
                       "the result appears right below.")
    _verification(record, intervals, kind, side, key)
    # The slider's neighbours, the next one in the direction of the last move first.
    rng = slider_range(kind, clean_accuracy=cal.clean_accuracy, n_classes=cal.n_classes)
    last = st.session_state.get(LAST_PERCENT, percent)
    st.session_state[LAST_PERCENT] = percent
    ahead = [percent - rng.step, percent + rng.step][:: 1 if last >= percent else -1]
    cache.prefetch(data, cal, kind, [percent_to_fraction(p) for p in ahead if rng.lo <= p <= rng.hi],
                   side=side)
    # The workspace write (two database commits) need not hold up the readout and plot.
    background.run_after(state.remember_target, kind, percent, side)
    # The Attack cost page's simulation at this side (and retention target), once the page settles.
    attack_prefetch.after_calibrate_run(data, cal, side=side, retention=percent if kind == "retention" else None)


def target_actions():
    """Export this target, or see the thief's side: the same two at every target."""
    b1, b2 = st.columns([3, 1], vertical_alignment="center")
    b1.button("Export this σ", key="export_this_btn", icon=":material/download:", on_click=_export_this,
              help="Opens Export with this target, kind and side.")
    b2.page_link("pages/extraction.py", label="Extraction", icon=":material/content_copy:",
                 help="The extraction frontier: what a distilled surrogate keeps at each σ.")


st.subheader("Target → σ*")
left, right = st.columns([3, 1])
with right:
    st.session_state.setdefault("calibrate_side", "point")  # or the model's stored side (state)
    side = st.segmented_control(
        "Side", SIDES, format_func=readouts.SIDE_LABELS.get, required=True,
        key="calibrate_side", help=" ".join(f"{readouts.SIDE_LABELS[s]}: {readouts.SIDE_HELP[s]}"
                                            for s in SIDES))
    view = st.radio("View", calibrate_plots.VIEWS, format_func=calibrate_plots.VIEW_LABELS.get,
                    key="calibrate_view", help="One view at a time: only the one shown is built and sent.")
    with_bands = st.toggle(f"{estimator.confidence:.0%} interval band", key="calibrate_bands",
                           disabled=view == "residuals",
                           help="The row bootstrap's band around the curve σ* inverts.")
    with_bands = with_bands and view != "residuals"
    st.caption(CAPTIONS[view])
with left:
    target_panel(ui.target_kind(cal, key_prefix="calibrate"), side, view, with_bands)
    attack_prefetch.calibrate_run_started()  # a full run goes on below the panel: held until its end
    target_actions()
    # Read after the readout is drawn: on a first visit the background job may still be computing them.
    st.caption(calibrate_plots.curves_note(cache.curves(data, cal), cal.n_samples, cal.n_classes))

st.subheader("Fit quality")
# Two rows of three: a coefficient such as c = 9.094e-05 needs the width.
f = st.columns(3) + st.columns(3)
f[0].metric("R²", fmt(cal.fit.r2, ".4f"))  # as in the header above
f[1].metric("rmse", fmt(cal.fit.rmse, ".4f"))
f[2].metric("points", cal.fit.n_points)
f[3].metric("v50", fmt(cal.fit.v50, ".4g"))
f[4].metric("p", fmt(cal.fit.p, ".4g"))
f[5].metric("c", fmt(cal.fit.c, ".4g"))
st.caption("The residuals are the third view of the plot above.")
ui.csv_download(tables.sweep_table(cal), label="Sweep data (CSV)",
                file_name=f"{data.name}.sweep.csv", key="sweep_csv")

precalibrate.page_drawn(data, statistic=statistic)  # the job's last stage waits for this visit
attack_prefetch.calibrate_run_ended()
