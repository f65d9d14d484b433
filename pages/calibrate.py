"""Calibrate: one model's sweep, fit and corridor; a target in, sigma* out; verify it."""

import math

import streamlit as st

from caliber_core.calibration.calibrate import measured_accuracy
from caliber_core.calibration.margins import MARGIN_STATISTICS, normalized_noise
from caliber_dashboard import cache, curves as plot, figures, navigation, state, tables, ui
from caliber_dashboard.verification import verify_realizations, verify_sigma
from caliber_dashboard.ui import fmt

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

VERIFY_RESULT = "caliber_verify_result"
VERIFY_REQUEST = "caliber_verify_request"

st.title("Calibrate")
st.caption(
    "Normalize noise by the median top-two margin S (v = σ²/S²) and accuracy by its range "
    "(Ã = (A − 1/K)/(A0 − 1/K)); a logistic law Ã(v) fits the sweep; a target in, σ* out."
)

c1, c2 = st.columns([3, 1])
with c1:
    data = ui.model_selector("Model", key="calibrate_model")
if data is None:
    st.info("No model loaded: add one on the Data page.")
    st.stop()
with c2:
    statistic = st.selectbox("Margin statistic for S", MARGIN_STATISTICS, key="calibrate_statistic",
                             help="The paper uses the median; mean and 10%-trimmed mean for the ablation.")

try:
    cal = cache.calibration(data, statistic=statistic)
except ValueError as exc:
    st.error(ui.plain(f"{data.name}: {exc}"))
    st.stop()

exact_ok = cal.curve_method == "exact"
if not exact_ok:
    exact_ok = st.checkbox(
        "Compute the exact agreement curve and accuracy corridor (quadrature; slow for a file this size)",
        key="calibrate_exact_big")
curves = cache.curves(data, cal) if exact_ok else None

m = st.columns(6)
m[0].metric("inputs N", f"{cal.n_samples:,}")
m[1].metric("classes K", cal.n_classes)
m[2].metric("clean accuracy A0", fmt(cal.clean_accuracy, ".4f"))
m[3].metric(f"S ({statistic} margin)", fmt(cal.scale, ".4g"))
m[4].metric(f"logistic R² ({cal.fit_quantity})", fmt(cal.fit.r2, ".4f"))
m[5].metric("noise draws / input", cal.intervals.realizations,
            help="Monte-Carlo draws per input in the sweep (common random numbers over σ).")
st.caption("σ* inverts the " + ("exact expected-accuracy curve (quadrature, Proposition 1)."
                                if cal.curve_method == "exact" else
                                "Monte-Carlo sweep curve (the file is too large for quadrature)."))
if not cal.has_labels:
    st.info("This file has no labels: the fit is to normalized agreement and only agreement "
            "targets are possible.")


def _figures(result):
    """Normalized and raw views, with the target marked when there is one."""
    v_pts, u_pts, u_se = plot.fitted_points(cal)
    if curves is not None:
        v_curve, sigma_curve = curves.v, curves.sigma
    else:
        sigma_curve = plot.sigma_grid(cal)
        v_curve = normalized_noise(sigma_curve, cal.scale)
    norm_kw = dict(v_points=v_pts, u_points=u_pts, u_se=u_se, v_curve=v_curve,
                   logistic=cal.fit.predict(v_curve))
    raw_kw = dict(sigma_points=cal.sweep.sigma, chance=cal.chance)
    if curves is not None:
        norm_kw["agreement"] = plot.normalized_agreement(curves.agreement, cal.n_classes)
    if cal.has_labels:
        raw_kw.update(y_points=cal.sweep.accuracy, y_se=cal.sweep.accuracy_se,
                      clean=cal.clean_accuracy)
        if curves is not None:
            norm_kw["corridor_lower"] = plot.normalized_accuracy(curves.corridor_lower, cal)
            norm_kw["corridor_upper"] = plot.normalized_accuracy(curves.corridor_upper, cal)
            raw_kw.update(sigma_curve=sigma_curve, exact=curves.accuracy,
                          corridor_lower=curves.corridor_lower, corridor_upper=curves.corridor_upper)
    else:
        norm_kw["y_title"] = figures.AGREEMENT_AXIS
        raw_kw.update(y_points=cal.sweep.agreement, y_se=cal.sweep.agreement_se, clean=1.0,
                      y_title="agreement with the clean prediction (fraction)",
                      exact_name="exact agreement π(σ)")
        if curves is not None:
            raw_kw.update(sigma_curve=sigma_curve, exact=curves.agreement)
    if result is not None and math.isfinite(result.sigma) and result.sigma > 0:
        norm_kw["target"] = plot.target_point(cal, result)
        if cal.has_labels:
            raw_kw["target"] = (result.sigma, float(measured_accuracy(cal, result.sigma)[0]))
        else:
            raw_kw["target"] = (result.sigma, result.agreement)
    tab_norm, tab_raw = st.tabs(["Normalized view (v, Ã)", "Raw view (σ, accuracy)"])
    with tab_norm:
        st.plotly_chart(figures.normalized_figure(**norm_kw), width="stretch", key="fig_normalized",
                        config=figures.chart_config(f"{data.name}_normalized"))
        st.caption("Points: Monte-Carlo sweep with ±1 s.e. bars. Shaded: the accuracy corridor of "
                   "Corollary 1 (exact quadrature), normalized like Ã. Dashed: exact agreement π(σ) "
                   "on the same [chance, clean] scale.")
    with tab_raw:
        st.plotly_chart(figures.raw_figure(**raw_kw), width="stretch", key="fig_raw",
                        config=figures.chart_config(f"{data.name}_raw"))


def _request_verify(key):
    st.session_state[VERIFY_REQUEST] = key


@st.fragment
def target_panel():
    """Target control, sigma* readout, plots with the target, verify. Reruns alone."""
    st.subheader("Target → σ*")
    kind, value, percent = ui.target_control(data, cal, key_prefix="calibrate")
    result = None
    try:
        result = cache.target(data, cal, kind, value)
    except ValueError as exc:
        st.warning(ui.plain(str(exc)))
    if result is not None:
        r = st.columns(5)
        r[0].metric("σ* (logit units)", fmt(result.sigma, ".5g"))
        r[1].metric("v* = σ*²/S²", fmt(result.v, ".5g"))
        if cal.has_labels:
            predicted = float(measured_accuracy(cal, result.sigma)[0])
            r[2].metric("predicted accuracy at σ*", fmt(predicted, ".4f"),
                        help="The measured curve (exact quadrature when available) at σ*.")
        if kind == "agreement":
            r[3 if cal.has_labels else 2].metric("target agreement", fmt(result.agreement, ".4f"))
        else:
            r[3].metric("retention of A0", fmt(predicted / cal.clean_accuracy * 100, ".1f") + "%")
        r[4].metric("logistic σ (closed form)", fmt(result.sigma_logistic, ".5g"),
                    help="Eq. inverse-v on the fitted law, for comparison; σ* inverts the curve.")
        st.caption(f"Method: {result.method}" + (" (saturated)" if result.saturated else ""))
    _figures(result)

    st.markdown("**Verify** σ* with fresh Monte-Carlo noise (a new seed every click).")
    key = (cache.data_digest(data), statistic, kind, value)
    # A callback, not `if st.button(...)`: the request survives a rerun.
    st.button("Verify", key="verify_btn", icon=":material/science:", disabled=result is None,
              on_click=_request_verify, args=(key,))
    if result is not None and st.session_state.pop(VERIFY_REQUEST, None) == key:
        reps = verify_realizations(cal.n_samples)
        seed = state.next_verify_seed()
        bar = st.progress(0.0, text=f"Adding fresh noise: {reps} draws × {cal.n_samples} inputs…")
        ver = verify_sigma(data.logits, data.labels, result.sigma, realizations=reps,
                                  seed=seed, progress=lambda f: bar.progress(f))
        bar.empty()
        st.session_state[VERIFY_RESULT] = {"key": key, "result": ver}
    stored = st.session_state.get(VERIFY_RESULT)
    if result is not None and stored and stored["key"] == key:
        ver = stored["result"]
        if kind == "agreement" or not cal.has_labels:
            measured, se, wanted, what = ver.agreement, ver.agreement_se, result.agreement, "agreement"
        else:
            measured, se, wanted, what = ver.accuracy, ver.accuracy_se, result.accuracy, "accuracy"
        rel = (measured - wanted) / wanted * 100.0
        v = st.columns(4)
        v[0].metric(f"measured {what}", fmt(measured, ".4f"), help=f"± {1.96 * se:.4f} (95%, binomial)")
        v[1].metric(f"target {what}", fmt(wanted, ".4f"))
        v[2].metric("relative error", f"{rel:+.2f}%")
        v[3].metric("draws", f"{ver.realizations} × {cal.n_samples}", help=f"seed {ver.seed}")
        ok = abs(measured - wanted) <= 1.96 * se + 1e-12
        (st.success if ok else st.warning)(
            f"Measured {what} {measured:.4f} ± {1.96 * se:.4f} at σ* = {ver.sigma:.5g}; target "
            f"{wanted:.4f}: {'within' if ok else 'outside'} the 95% Monte-Carlo band "
            f"(relative error {rel:+.2f}%).")


target_panel()

st.subheader("Fit quality")
f = st.columns(6)
f[0].metric("R²", fmt(cal.fit.r2, ".5f"))
f[1].metric("rmse", fmt(cal.fit.rmse, ".4f"))
f[2].metric("v50", fmt(cal.fit.v50, ".4g"))
f[3].metric("p", fmt(cal.fit.p, ".4g"))
f[4].metric("c", fmt(cal.fit.c, ".4g"))
f[5].metric("points", cal.fit.n_points)
v_res, res = plot.residuals(cal)
st.plotly_chart(figures.residual_figure(v_res, res, rmse=cal.fit.rmse), width="stretch",
                key="fig_residuals", config=figures.chart_config(f"{data.name}_residuals"))
ui.csv_download(tables.sweep_table(cal), label="Sweep data (CSV)",
                file_name=f"{data.name}.sweep.csv", key="sweep_csv")
