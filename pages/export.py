"""Export: the config JSON (the CLI's own function) to download; review a saved config."""

import re

import pandas as pd
import streamlit as st

from caliber_core.calibration.calibrate import measured_accuracy
from caliber_core.calibration.drift import check_drift
from caliber_core.calibration.intervals import DEFAULT_CONFIDENCE
from caliber_core.calibration.target_intervals import interval_estimator, side_sigma
from caliber_core.config import CALIBRATED_KINDS, ConfigError, config_to_json, inversion_of_method, load_config
from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_dashboard import cache, navigation, state, ui
from caliber_dashboard.targets import target_list
from caliber_dashboard.ui import fmt

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Export")
st.caption(
    "The config is built by `caliber_core.calibration.pipeline.config_for`, the function behind "
    "`python -m caliber_core calibrate FILE --retention …`: the same file and targets give the "
    "same σ* here and there."
)

data = ui.model_selector("Model", key="export_model")
if data is None:
    st.info("No model loaded: add one on the Data page.")
    st.stop()

st.subheader("Targets")
t1, t2, t3 = st.columns(3)
retention_text = t1.text_input("Retention targets (% of A0)", value="90, 80, 70, 60" if data.has_labels else "",
                               key="export_retention", help="Comma-separated percentages.")
accuracy_text = t2.text_input("Absolute accuracy targets (%)", value="", key="export_accuracy")
agreement_text = t3.text_input("Agreement targets (%)", value="" if data.has_labels else "90, 80, 70, 60",
                               key="export_agreement")
with st.expander("Options (the CLI's defaults)"):
    o1, o2, o3 = st.columns(3)
    statistic = o1.selectbox("margin statistic (--margin-stat)", MARGIN_STATISTICS, key="export_statistic")
    inversion = o2.selectbox("inversion (--inversion)", ["curve", "logistic"], key="export_inversion")
    saturate = o3.checkbox("saturate unreachable targets (--saturate)", key="export_saturate",
                           help="An unreachable target serves the largest σ the sweep measured, "
                           "marked saturated, instead of failing.")

try:
    targets = target_list(retention_text, accuracy_text, agreement_text)
except ValueError as exc:
    st.error(ui.plain(str(exc)))
    st.stop()
if not targets:
    st.warning("Enter at least one target.")
    st.stop()

try:
    _, results, config = cache.config(data, targets, statistic=statistic, inversion=inversion,
                                      saturate=saturate)
    text = config_to_json(config)
except ValueError as exc:  # an unreachable target, missing labels (LogitsFileError)
    st.error(ui.plain(str(exc)))
    st.stop()

rows = [{"target": f"{r.kind} {r.requested:g}", "σ*": r.sigma, "v*": r.v, "accuracy": r.accuracy,
         "retention": r.retention, "agreement": r.agreement, "σ logistic": r.sigma_logistic,
         "method": r.method} for r in results]
results_df = pd.DataFrame(rows).dropna(axis=1, how="all")
for r in results:
    if r.saturated:
        st.warning(ui.plain(f"{r.kind} {r.requested:g} is out of reach: the config serves σ = {r.sigma:.5g}, "
                            "the largest σ the sweep measured, marked saturated."), icon=":material/warning:")
st.dataframe(results_df, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.5g")
                            for c in ("σ*", "v*", "accuracy", "retention", "agreement", "σ logistic")})

safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", data.name).strip("._") or "model"
st.download_button("Download config JSON", data=text.encode("utf-8"),
                   file_name=f"{safe_name}.caliber.json", mime="application/json",
                   on_click="ignore", key="export_download", icon=":material/download:", type="primary")
flags = []
for kind, value in targets:  # consecutive targets of one kind share a flag (order kept)
    flag = "--target-accuracy" if kind == "accuracy" else f"--{kind}"
    if not flags or flags[-1][0] != flag:
        flags.append((flag, []))
    flags[-1][1].append(repr(value))
st.caption(f"Equivalent command: `python -m caliber_core calibrate {data.source.replace('`', '')} "
           + " ".join(f"{flag} {' '.join(values)}" for flag, values in flags)
           + ("" if statistic == "median" else f" --margin-stat {statistic}")
           + ("" if inversion == "curve" else f" --inversion {inversion}")
           + (" --saturate" if saturate else "") + " --out cfg.json`")
with st.expander("Config JSON preview", expanded=False):
    st.code(text, language="json")

# ------------------------------------------------------------------ import
st.divider()
st.subheader("Review a saved config")
upload = st.file_uploader("Config JSON (a saved `*.caliber.json`)", key="import_config")
if upload is None:
    st.stop()
try:
    saved = load_config(upload.getvalue())
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

review = []
estimators = {}  # one interval bootstrap per confidence level, for side targets
for t in saved["targets"]:
    kind, requested = t.get("kind"), t.get("requested")
    sigma_file = t.get("sigma")
    now = note = None
    try:
        if kind not in CALIBRATED_KINDS or requested is None:
            raise ValueError(f"a {kind} target is not recomputed from logits here")
        # The same inversion the file used: the method says which ("saturated-logistic" is logistic).
        now_target = cache.target(model, cal, kind, float(requested),
                                  inversion=inversion_of_method(t.get("method", "")),
                                  saturate=bool(t.get("saturated")))
        now = now_target.sigma
        if t.get("side", "point") != "point":  # the same side of the same interval level
            level = (t.get("interval") or {}).get("level", DEFAULT_CONFIDENCE)
            if level not in estimators:
                estimators[level] = interval_estimator(cal, confidence=level, seed=sweep.get("seed", 0) or 0)
            now = side_sigma(cal, now_target, estimators[level], side=t["side"],
                             saturate=bool(t.get("saturated")))[0]
    except ValueError as exc:
        note = str(exc)
    pred_acc = float(measured_accuracy(cal, sigma_file)[0]) if cal.has_labels else None
    pred_agr = float(cal.exact.agreement(sigma_file)[0]) if kind == "agreement" else None
    rel = None if now is None or sigma_file == 0 else (now - sigma_file) / sigma_file * 100
    review.append({
        "target": f"{kind} {requested}", "σ in file": sigma_file, "σ recomputed now": now,
        "Δσ %": rel, "accuracy in file": t.get("accuracy"),
        "predicted accuracy at file σ": pred_acc, "predicted agreement at file σ": pred_agr,
        "note": note or "",
    })
review_df = pd.DataFrame(review).dropna(axis=1, how="all")
if not review_df["note"].any():
    review_df = review_df.drop(columns="note")
st.dataframe(review_df, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.5g") for c in
                            ("σ in file", "σ recomputed now", "accuracy in file",
                             "predicted accuracy at file σ", "predicted agreement at file σ")}
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
st.dataframe(pd.DataFrame([{"compared": f.quantity, "target": f.target, "σ": f.sigma, "config": f.expected,
                            "this model": f.observed, "expected from": f.low, "expected to": f.high,
                            "consistent": f.consistent} for f in report.findings]),
             hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.4g")
                            for c in ("σ", "config", "this model", "expected from", "expected to")})
