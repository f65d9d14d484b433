"""Export: the config JSON (the CLI's own function) to download, with a σ aimed at the thief; review a saved config."""

import streamlit as st

from caliber_core.calibration.drift import check_drift
from caliber_core.calibration.intervals import DEFAULT_CONFIDENCE
from caliber_core.config import SIDES, ConfigError, config_from_bytes, config_to_json
from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_core.extraction.experiment import plan_runs
from caliber_dashboard import navigation
from caliber_dashboard.common import cache, names, state, ui
from caliber_dashboard.common.readouts import SIDE_HELP, SIDE_LABELS
from caliber_dashboard.common.targets import percent_to_fraction, target_list
from caliber_dashboard.common.ui import fmt
from caliber_dashboard.export import config as export_config
from caliber_dashboard.export import inputs as export_inputs
from caliber_dashboard.export import review as export_review
from caliber_dashboard.extraction import runs
from caliber_dashboard.extraction import view
from caliber_dashboard.extraction.codec import run_key
from caliber_dashboard.data import log_store, vocab_panel

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Export")
st.caption(
    "The config is built by `caliber_core.calibration.pipeline.config_for`, the function behind "
    "`python -m caliber_core calibrate FILE --retention …`: the same file and targets give the "
    "same σ* here and there."
)

log_store.export_panel()  # calibrated top-k logprob logs: configs of their own, no model needed
vocab_panel.export_panel()  # large-vocabulary files streamed from the data root: their configs

data = ui.model_selector("Model", key="export_model")
if data is None:
    st.info("No model loaded: add one on the Data page.")
    st.stop()

st.subheader("Targets")
export_inputs.seed(data.sha256, has_labels=data.has_labels)  # Calibrate's choice, or this page's saved inputs
t1, t2, t3 = st.columns(3)
retention_text = t1.text_input("Retention targets (% of A0)", key="export_retention",
                               help="Comma-separated percentages.")
accuracy_text = t2.text_input("Absolute accuracy targets (%)", key="export_accuracy")
agreement_text = t3.text_input("Agreement targets (%)", key="export_agreement")
with st.expander("Options (the CLI's defaults)"):
    o1, o2, o3 = st.columns(3)
    statistic = o1.selectbox("margin statistic (--margin-stat)", MARGIN_STATISTICS, key="export_statistic")
    inversion = o2.selectbox("inversion (--inversion)", ["curve", "logistic"], key="export_inversion")
    saturate = o3.checkbox("saturate unreachable targets (--saturate)", key="export_saturate",
                           help="An unreachable target serves the largest σ the sweep measured, "
                           "marked saturated, instead of failing.")
s1, s2 = st.columns(2)
side = s1.selectbox("side (--side)", SIDES, format_func=SIDE_LABELS.get, key="export_side",
                    help=" ".join(f"{SIDE_LABELS[k]}: {SIDE_HELP[k]}" for k in SIDES))
confidence = s2.number_input("confidence level (--confidence)", min_value=0.5, max_value=0.995,
                             step=0.005, format="%.3f", key="export_confidence",
                             help="Level of every target's interval, and of the bound a one-sided target keeps.")
export_inputs.remember(data.sha256)  # kept in the workspace: a reload brings them back

try:
    targets = target_list(retention_text, accuracy_text, agreement_text)
except ValueError as exc:
    st.error(ui.plain(str(exc)))
    st.stop()
if not targets:
    st.warning("Enter at least one target.")
    st.stop()

try:
    cal = cache.calibration(data, statistic=statistic)  # the Calibrate page's: no second sweep
    results, config = export_config.config(cal, data, targets, inversion=inversion, saturate=saturate,
                                           side=side, confidence=float(confidence))
except ValueError as exc:  # an unreachable target, a side out of reach, missing labels (LogitsFileError)
    st.error(ui.plain(str(exc)))
    st.stop()

# ------------------------------------------------------------------ surrogate target
st.subheader("Surrogate target (σ aimed at the thief)")
surrogate, surrogate_run = [], None  # the surrogate-retention record added to the config, and its run
archive = runs.archives().get(data.sha256)
latest = None if archive is None else runs.latest(archive)  # this session's or this workspace's run
for warning_text in runs.warnings():
    st.warning(ui.plain(warning_text), icon=":material/warning:")
if archive is None:
    st.caption("This file carries no inputs, so no thief can be simulated on it (the Extraction page "
               "needs the queried inputs).")
elif latest is None:
    st.caption("No finished extraction run for this model yet: run one on the Extraction page, then a "
               "σ at which the thief keeps a chosen share of its accuracy can be added here.")
elif st.checkbox("Add a surrogate-retention target from the extraction run", key="export_surrogate"):
    pct = st.number_input("Surrogate retention R (% of the thief's clean-answer accuracy)", min_value=50.0,
                          max_value=99.0, value=runs.surrogate_target(data.sha256), step=0.5, format="%.1f",
                          key=f"export_surrogate_r_{data.sha256[:12]}",
                          help="Starts at the Extraction page's surrogate-target slider.")
    requested = round(percent_to_fraction(pct), 6)
    found = runs.with_surrogate(archive, requested)
    search = runs.search_settings(latest.settings, requested)
    search_key = (data.sha256, run_key(archive.sha256, search))
    if found is None and st.session_state.get("export_surrogate_search") == search_key:
        runs.keep(view.run(archive, search), as_last=False)  # asked for with the button below
        found = runs.with_surrogate(archive, requested)
    if found is None:
        readout = view.surrogate_readout(latest, requested)
        st.caption(ui.plain(
            (f"The run's frontier crosses it between its measured points σ = {readout['bracket'][0]:.3g} and "
             f"{readout['bracket'][1]:.3g}" if readout else "The run's frontier does not reach it")
            + "; a config needs σ searched with "
            f"{search.n_near()} seeds near the crossing, as extract --surrogate-retention {requested:g} "
            f"does: up to {plan_runs(search)} training runs (fewer while this server still holds the run's "
            "surrogates)."))
        st.button(f"Search σ for R = {pct:g}%", key="export_surrogate_run", icon=":material/play_arrow:",
                  on_click=lambda: st.session_state.update(export_surrogate_search=search_key))
    else:
        found_run, condition = found
        if not condition.by_recipe:
            st.warning(ui.plain(f"Surrogate retention {pct:g}% is out of reach: "
                                f"{condition.root.reason if condition.root else 'no σ found'}."),
                       icon=":material/warning:")
        else:
            surrogate = export_config.surrogate_records(cal, data, found_run, requested)
            surrogate_run = found_run
            kept = condition.frontier_retention
            m = st.columns(3)
            m[0].metric("σ ± s.e. (surrogate target)", export_config.sigma_text(condition.sigma, condition.sigma_se))
            m[1].metric("thief keeps (mean ± sd)", view.pm(kept) + "%" if kept else "—")
            m[2].metric("teacher accuracy there (held-out)", f"{condition.teacher_accuracy * 100:.1f}%")
            for record in surrogate:
                st.caption(ui.plain(export_config.attacker_summary(record)))

try:
    if surrogate:
        config = export_config.with_surrogate(cal, results, data, surrogate)
    text = config_to_json(config)
except ValueError as exc:
    st.error(ui.plain(str(exc)))
    st.stop()

st.subheader("Config")
results_df = export_config.preview_table(list(results) + surrogate, cal=cal)
for r in results:
    if r.saturated:
        st.warning(ui.plain(f"{r.kind} {r.requested:g} is out of reach: the config serves σ = {r.sigma:.5g}, "
                            "the largest σ the sweep measured, marked saturated."), icon=":material/warning:")
# σ as the readouts show it (rounded to its range); the config JSON below holds it in full.
st.dataframe(results_df, hide_index=True, width="stretch",
             column_order=[c for c in results_df.columns if c != "σ served"],
             column_config={c: st.column_config.NumberColumn(format="%.3g")
                            for c in ("v = σ²/S²", "σ logistic")}
             | {"σ (range)": st.column_config.TextColumn(width="medium")}
             | {c: st.column_config.NumberColumn(format="%.2f")
                for c in ("accuracy %", "retention %", "agreement %")}
             | {"σ s.e.": st.column_config.NumberColumn(format="%.2g")})
if any(r.interval for r in results):
    level = results[0].interval["level"] if results[0].interval else confidence
    st.caption(f"Intervals: {100 * level:g}% confidence for what each σ delivers on the population the file "
               f"samples ({next(r.interval['method'] for r in results if r.interval)}). Side "
               f"{SIDE_LABELS[side]}: {SIDE_HELP[side]}"
               + (" The side applies to the calibrated targets; the surrogate-retention σ is searched on the "
                  "thief's surrogates, and its precision is its standard error (σ s.e.) and the spread over "
                  "seeds of what the thief keeps." if surrogate else ""))

safe_name = names.file_stem(data.name)  # a visitor's name, never a path
st.download_button("Download config JSON", data=text.encode("utf-8"),
                   file_name=f"{safe_name}.caliber.json", mime="application/json",
                   on_click="ignore", key="export_download", icon=":material/download:", type="primary")
with st.expander("Config JSON preview", expanded=False):
    st.code(text, language="json")
command = export_config.calibrate_command(data, targets, statistic=statistic, inversion=inversion,
                                          saturate=saturate, side=side, confidence=float(confidence))
where = (f"{data.source} and its labels file {data.labels_source}"
         if data.labels_source not in (None, data.source) else data.source)
st.caption(ui.plain(f"Equivalent command (run in the folder holding {where}):"))
st.code(command, language="bash")  # a code block, not Markdown: the text shown is the text that runs
if surrogate:
    st.caption("The surrogate-retention target is the record that this command writes "
               "(caliber_core.extraction.targets), measured here against this config's calibration; a "
               "Perturber serves it like any other target:")
    st.code(export_config.extract_command(data.source, surrogate_run, surrogate[0].requested), language="bash")

# ------------------------------------------------------------------ import
st.divider()
st.subheader("Review a saved config")
upload = st.file_uploader("Config JSON (a saved `*.caliber.json`)", key="import_config")
if upload is None:
    st.stop()
try:
    saved = config_from_bytes(upload.getvalue())  # the bytes only: never read as a path
except ConfigError as exc:
    st.error(ui.plain(f"{upload.name}: {exc}"), icon=":material/block:")
    st.stop()
st.success(ui.plain(f"{upload.name}: schema {saved['schema']} OK — model {saved['model']!r}, "
                    f"{len(saved['targets'])} target(s), S ({saved['statistic']}) = {fmt(saved['scale'])}."))

models = state.models()
match = [sha for sha, d in models.items() if d.sha256 == saved.get("sha256")]
if not models:
    st.info("Load the model's logits on the Data page to compare.")
    st.stop()
options = list(models)
review_sha = st.selectbox("Compare with loaded model", options,
                          index=options.index(match[0]) if match else options.index(data.sha256),
                          format_func=lambda s: state.model_label(models[s]), key="import_model")
model = models[review_sha]
if saved.get("sha256") == model.sha256:
    st.success(ui.plain(f"sha256 matches {state.model_label(model)}: the config was made from this file."),
               icon=":material/verified:")
else:
    st.warning(ui.plain(f"sha256 mismatch: the config was made from {str(saved.get('sha256'))[:12]}…, "
                        f"the loaded model is {model.sha256[:12]}…; the numbers below are recomputed "
                        "on the loaded model."), icon=":material/warning:")
if saved["n_classes"] != model.n_classes:
    st.error(ui.plain(f"The config is for K={saved['n_classes']} classes; {model.name} has "
                      f"K={model.n_classes}."))
    st.stop()

sweep = saved.get("sweep") or {}
statistic_saved = saved["statistic"] if saved["statistic"] in MARGIN_STATISTICS else "median"
try:
    cal = cache.calibration(model, statistic=statistic_saved, seed=sweep.get("seed", 0) or 0,
                            realizations=sweep.get("realizations"))
except ValueError as exc:
    st.error(ui.plain(f"{model.name}: {exc}"))
    st.stop()

review_df = export_review.review_table(saved, model, cal)
st.dataframe(review_df, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.5g") for c in ("σ in file", "σ recomputed now")}
             | {c: st.column_config.NumberColumn(format="%.2f") for c in
                ("accuracy in file %", "predicted accuracy at file σ %", "predicted agreement at file σ %")}
             | {"Δσ %": st.column_config.NumberColumn(format="%+.3f")})
st.caption("σ recomputed now: the same target on the loaded model with the config's statistic, seed "
           "and noise draws. Predicted accuracy: the loaded model's measured curve at the file's σ.")

# The verdict of `python -m caliber_core check CONFIG FILE` on the loaded model's logits.
try:
    report = check_drift(saved, model.logits, model.labels)
except ValueError as exc:
    st.error(ui.plain(f"check: {exc}"))
    st.stop()
if report.consistent:
    st.success(ui.plain(f"check: consistent with the config — {len(report.findings)} comparisons at "
                        f"{report.level:.0%} (simultaneous), N={report.n_samples:,} against the config's "
                        f"N={report.n_calibration:,}."), icon=":material/check_circle:")
else:
    st.error("  \n".join(ui.plain(f.message) for f in report.problems), icon=":material/sync_problem:")
st.dataframe(export_review.drift_table(report, saved), hide_index=True, width="stretch")
