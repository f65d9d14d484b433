"""Fleet: one shared logistic law over several models; calibrate a new model from S alone."""

import pandas as pd
import streamlit as st

from caliber_core.calibration import fleet
from caliber_core.calibration.margins import MARGIN_STATISTICS, normalized_utility
from caliber_dashboard import navigation
from caliber_dashboard.common import cache, figures, state, tables, ui
from caliber_dashboard.common.targets import percent_to_fraction
from caliber_dashboard.common.ui import fmt
from caliber_dashboard.fleet import view as fleet_view

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Fleet")
st.caption(
    "Shared per-task fit: pool the (v, Ã) points of several architectures into one logistic law; "
    "a new model serving the task then needs only its margin scale S (no sweep of its own)."
)

models = state.models()
labelled = state.labelled_models()
if len(labelled) < 2:
    st.info(f"The fleet view needs at least 2 models with labels; {len(labelled)} "
            f"{'is' if len(labelled) == 1 else 'are'} loaded. Add some on the Data page "
            "(or load the demo set there).")
    st.stop()

default, left_out = fleet_view.default_pool(models)
c1, c2 = st.columns([3, 1])
chosen = c1.multiselect("Models to pool", list(labelled), default=default, key="fleet_pool",
                        format_func=lambda s: state.model_label(labelled[s]),
                        help="One shared law is meant for models serving one task: by default, the "
                             "labelled models with the most common K.")
statistic = c2.selectbox("Margin statistic for S", MARGIN_STATISTICS, key="fleet_statistic",
                         help="Which S normalizes v for the shared fit (the paper's ablation).")
still_out = {sha: why for sha, why in left_out.items() if sha not in chosen}  # added back: not "left out"
if still_out:
    st.caption("Left out by default: " + ui.plain("; ".join(
        f"{state.model_label(models[sha])} ({why})" for sha, why in still_out.items())) + ".")

datas = [labelled[sha] for sha in chosen if sha in labelled]
usable, cals = [], []
for d in datas:
    try:
        cals.append(cache.calibration(d))  # the CLI's fleet calibrations: median, seed 0
        usable.append(d)
    except ValueError as exc:
        st.warning(ui.plain(f"{d.name} left out: {exc}"))
datas = usable
if len(cals) < 2:
    st.info("Choose at least 2 models that can be calibrated: nothing to pool yet.")
    st.stop()

report = cache.fleet_report(datas, cals, statistic=statistic)
shared = report["shared_fit"]
for warning in fleet_view.pool_warnings(cals, report["leave_one_out"]):
    # Mixing K is a mistake in the pool; a large held-out error is what the pool measures (the demo's
    # seven digits models have some): said plainly, not as a failure.
    if warning.startswith("The pool mixes K"):
        st.warning(ui.plain(warning), icon=":material/warning:")
    else:
        st.info(ui.plain(warning), icon=":material/info:")

s = st.columns(5)
s[0].metric("models pooled", len(cals))
s[1].metric("shared v50", fmt(shared.v50, ".4g"))
s[2].metric("shared p", fmt(shared.p, ".4g"))
s[3].metric("shared c", fmt(shared.c, ".4g"))
s[4].metric("shared R²", fmt(shared.r2, ".4f"))

points, v_curve = fleet_view.pooled_points({state.model_label(d): c for d, c in zip(datas, cals)},
                                           statistic=statistic)
st.plotly_chart(
    figures.fleet_figure(points, v_curve=v_curve, shared=shared.predict(v_curve), statistic=statistic),
    width="stretch", key="fig_fleet", config=figures.chart_config(f"caliber_fleet_{statistic}"))

st.subheader("Models")
model_df = tables.fleet_model_table(cals)
st.dataframe(model_df, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.4g")
                            for c in model_df.columns if c not in ("model", "K")})

st.subheader("Leave one architecture out")
st.caption(
    "Mean |relative error| (%) of each model's accuracy at the σ* a shared law gives it, over "
    "retention targets 90/80/70/60%: in-sample (the law fit on every model) vs held out (fit "
    "without that model), as in the paper's appendix."
)
loo_df = tables.with_mean_row(report["leave_one_out"], "model", text_columns={"scale": ".4g"})
st.dataframe(
    loo_df.rename(columns={"scale": f"S ({statistic})", "in_sample_error": "in-sample error %",
                           "held_out_error": "held-out error %"}),
    hide_index=True, width="stretch",
    column_config={"in-sample error %": st.column_config.NumberColumn(format="%.2f"),
                   "held-out error %": st.column_config.NumberColumn(format="%.2f")})
ui.csv_download(loo_df, label="Leave-one-out table (CSV)", file_name=f"caliber_loo_{statistic}.csv",
                key="loo_csv")

st.subheader("Margin-statistic ablation")
ABLATION_REQUEST = "caliber_fleet_ablation_request"


def _request_ablation():
    st.session_state[ABLATION_REQUEST] = True


# On request: it repeats leave-one-out for every statistic (the one above is
# reused). The server's warm-up has it ready for the demo set.
if cache.has_margin_ablation(datas, cals) or st.session_state.pop(ABLATION_REQUEST, False):
    ablation = cache.margin_ablation(datas, cals)
    abl_df = pd.DataFrame(ablation)
    st.dataframe(
        abl_df.rename(columns={"r2": "shared R²", "in_sample_error": "in-sample error %",
                               "held_out_error": "held-out error %"}),
        hide_index=True, width="stretch",
        column_config={"shared R²": st.column_config.NumberColumn(format="%.4f"),
                       "in-sample error %": st.column_config.NumberColumn(format="%.2f"),
                       "held-out error %": st.column_config.NumberColumn(format="%.2f")})
else:
    st.caption("Leave-one-out repeated with S as the median, the mean and the 10%-trimmed mean "
               f"of the margins (the paper's appendix), over these {len(cals)} models.")
    st.button("Run the ablation", key="fleet_ablation_btn", icon=":material/play_arrow:",
              on_click=_request_ablation)

st.subheader("Calibrate a model from its S alone")
st.caption(f"Through the shared law above (S = {statistic} margin of the new model on a clean probe). "
           "Enter the new model's own values.")
i = st.columns(4)
scale = i[0].number_input(f"S ({statistic} top-two margin)", min_value=1e-6, value=None, format="%.4f",
                          key="fleet_scale", placeholder="e.g. 2.5")
a0 = i[1].number_input("clean accuracy A0", min_value=0.0, max_value=1.0, value=None, step=0.001,
                       format="%.4f", key="fleet_a0", placeholder="e.g. 0.92")
k = i[2].number_input("classes K", min_value=2, value=None, step=1, key="fleet_k", placeholder="e.g. 10")
retention = i[3].slider("target retention (% of A0)", min_value=10.0, max_value=100.0,
                        value=state.remembered_target("retention", 80.0), step=0.5, format="%.1f%%",
                        key="fleet_retention")
if scale is None or a0 is None or k is None:
    st.info("Enter S, A0 and K of the new model to get its σ.")
    st.stop()
value = percent_to_fraction(retention)
try:
    res = fleet.calibrate_from_scale(shared, scale=scale, clean_accuracy=a0, n_classes=int(k),
                                     value=value, kind="retention", saturate=True, v_max=float(v_curve[-1]))
except ValueError as exc:
    st.warning(ui.plain(str(exc)))
    st.stop()
spread = cache.fleet_sigma_spread(datas, cals, statistic=statistic, value=value)
found = fleet_view.from_scale(res.sigma, spread)
o = st.columns([2, 1, 1, 1])
o[0].metric("σ from S alone (leave-one-out range)", fleet_view.sigma_with_interval(found),
            help="The range: σ divided and multiplied by the largest error factor of the σ a law fit "
                 "without a model gave that model, against its own σ*, over "
                 f"{found.models} pooled models. A model the law misses no worse than the worst held-out "
                 "model has its own σ* inside it.")
o[1].metric("v = σ²/S²", fmt(res.v, ".2g"))
o[2].metric("target accuracy", fmt(res.accuracy, ".4f"))
o[3].metric("target Ã", fmt(normalized_utility(res.accuracy, clean=a0, n_classes=int(k)), ".4f"))
if found.low is None:
    st.caption(f"No range: fewer than 2 pooled models gave a held-out σ at {retention:g}% retention.")
if res.saturated:
    st.warning("The target is at or below the shared curve's floor c: no σ reaches it. σ shown is "
               "the largest σ the pooled sweeps measured (v = the largest v above), served as "
               "a saturated target.")
