"""Data: upload logits files (or use the demo set), see their margins, remove models."""

import pandas as pd
import streamlit as st

from caliber_core.loading import LABELS_EXTENSIONS, SUPPORTED_EXTENSIONS
from caliber_core.config import config_to_json
from caliber_dashboard import navigation
from caliber_dashboard.common import cache, figures, state, tables, ui, upload_boundary
from caliber_dashboard.data import log_store, logprob_log, server_panel, uploads, vocab_panel

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

HIST_SHOWN, HIST_SEEN = "caliber_hist_shown", "caliber_hist_seen"  # plain keys: outlive a page switch
_ICONS = {"success": ":material/check_circle:", "info": ":material/info:", "warning": ":material/warning:",
          "error": ":material/block:"}

st.title("Data")
st.caption(
    "Logits your classifier produced on a clean validation set, with the true labels. "
    "Uploads are kept in this workspace (its link is in the address bar; see the sidebar) and "
    "come back after a reload; files are validated before use and never unpickled."
)

def _on_upload():
    # Runs before the script body, so every part of this run (the sidebar's model
    # count included) already sees the new models.
    uploads.process(st.session_state.get("upload_logits"), st.session_state.get(uploads.labels_key()))


def _upload_limit_mb() -> int:
    """The server's per-file limit, lowered to the workspace's cap when that is smaller (a file the
    workspace cannot keep is refused in the browser, before it is sent)."""
    from caliber_dashboard.workspace.settings import upload_limit_mb

    server = int(st.get_option("server.maxUploadSize"))
    try:
        return min(server, upload_limit_mb())
    except ValueError:  # a bad cap variable: the workspace panel names it
        return server


UPLOAD_MB = _upload_limit_mb()
col_up, col_labels = st.columns([3, 2])
with col_up:
    # No `type=`: Streamlit would raise on another extension; the core's reader
    # refuses it with a one-line message instead.
    logits_uploads = st.file_uploader(
        f"Logits files ({', '.join(SUPPORTED_EXTENSIONS)}; .jsonl/.json: lm-eval samples)",
        accept_multiple_files=True, key="upload_logits", on_change=_on_upload, max_upload_size=UPLOAD_MB,
        help="npz with `logits` (N, K) and `labels` (N,), npy, pt (tensors), safetensors, "
             "csv or parquet (a `label` column). Several files at once are fine. "
             f"Up to {UPLOAD_MB:,} MB per file (the server's limit, never above the workspace's size cap): "
             "a larger upload is refused "
             f"before it is read; a file is also refused when it would become more than "
             f"{upload_boundary.max_elements():,} values, counted from its header before any is read.",
    )
    messages = st.container()
with col_labels:
    labels_upload = st.file_uploader(
        "Labels file (optional)",
        key=uploads.labels_key(), on_change=_on_upload,
        help=f"({', '.join(LABELS_EXTENSIONS)}) A 1-D integer .npy, one integer per line "
             "(.csv/.txt), or an .npz with `labels`. "
             "Used for the logits files on the left that carry no labels of their own (e.g. a bare "
             ".npy); with none there, it attaches to the loaded model without labels that has as "
             "many rows (if several do, the one whose file name begins the labels file's name). "
             "The box is cleared once the labels are used.",
    )

with messages:
    # One set of messages per file in the uploaders, gone with the file. File names and
    # messages come from uploads: shown verbatim, never as Markdown.
    for level, text in uploads.process(logits_uploads, labels_upload):  # a no-op after the callback
        getattr(st, level)(ui.plain(text), icon=_ICONS[level])

server_panel.draw()  # files under the data root, when the server has one
vocab_panel.data_panel()  # large-vocabulary files, from the data root or uploaded: the streamed engine's
models = state.models()


def _remove_selected():
    for sha in st.session_state.get("remove_select", []):
        state.remove_model(sha)
    st.session_state["remove_select"] = []


def _load_demo():
    state.load_demo()


def _remove_all():
    state.clear_models()
    st.session_state["remove_select"] = []


st.subheader("Loaded models")
if not models:
    st.info("No models loaded. Upload logits files above, or load the bundled demo set.")
else:
    table = pd.concat([cache.model_row(d) for d in models.values()], ignore_index=True)
    st.dataframe(
        table, hide_index=True, width="stretch",
        column_config={
            "A0": st.column_config.NumberColumn("A0 (clean acc.)", format="%.4f"),
            "S median": st.column_config.NumberColumn("S median", format="%.4g"),
            "S mean": st.column_config.NumberColumn("S mean", format="%.4g"),
            "S trimmed": st.column_config.NumberColumn("S trimmed 10%", format="%.4g"),
            "sha256": st.column_config.TextColumn("sha256 (prefix)"),
        },
    )
    ui.csv_download(table, label="Models table (CSV)", file_name="caliber_models.csv",
                    key="models_csv")
    unlabelled = [d.name for d in models.values() if not d.has_labels]
    if unlabelled:
        st.caption("Without labels only agreement targets are possible: " + ui.plain(", ".join(unlabelled)))

# The model the other pages open on (the latest upload, else the first): its next step.
selected = models.get(st.session_state.get(state.SELECTED)) or next(iter(models.values()), None)
if selected is not None:
    # Its metrics and the link are also the first of their kind a visitor's browser draws, so the
    # code that draws them is loaded before the Calibrate page needs it (0.2-0.3 s off its first visit).
    box = st.container(border=True)
    box.caption("The model the other pages open on (the latest upload, or pick another on each page):")
    s = box.columns([1, 1, 1, 2], vertical_alignment="center")
    s[0].metric("inputs N", f"{selected.n_samples:,}")
    s[1].metric("classes K", f"{selected.n_classes:,}")
    s[2].metric("labels", "yes" if selected.has_labels else "none",
                help=None if selected.has_labels else "Without labels only agreement targets are possible.")
    s[3].page_link("pages/calibrate.py", label=f"Calibrate {ui.plain(state.model_label(selected))}",
                   icon=":material/tune:", help="The σ for a target, with its interval.")

c1, c2, c3 = st.columns([3, 1, 1], vertical_alignment="bottom")
with c1:
    st.multiselect("Models to remove", list(models), key="remove_select",
                   format_func=lambda s: state.model_label(models[s]) if s in models else s)
with c2:
    st.button("Remove selected", key="remove_btn", on_click=_remove_selected,
              icon=":material/delete:", disabled=not models)
with c3:
    st.button("Load demo set", key="demo_btn", on_click=_load_demo, icon=":material/dataset:")
if models:
    st.button("Remove all models", key="remove_all_btn", on_click=_remove_all, type="tertiary")

if models:
    st.subheader("Top-two margin distributions")
    h1, h2 = st.columns([1, 3])
    with h1:
        scale_mode = st.segmented_control("Axis", ["logit units", "divided by S (median)"], key="hist_mode",
                                          default="logit units", required=True)
    with h2:
        # Every upload joins the plot at once (the widget alone would keep its old selection).
        st.session_state["hist_models"] = tables.shown_models(
            st.session_state.get("hist_models", st.session_state.get(HIST_SHOWN)),
            st.session_state.get(HIST_SEEN), list(models))
        shown = st.multiselect("Models shown", list(models), key="hist_models",
                               format_func=lambda s: models[s].name)
        st.session_state[HIST_SHOWN], st.session_state[HIST_SEEN] = list(shown), list(models)
    sampled = []
    for sha in shown:
        m = cache.margins(models[sha])
        if (drawn := tables.histogram_rows(m).size) < m.size:
            sampled.append(f"{models[sha].name} ({drawn:,} of {m.size:,} rows)")
    fig = cache.margin_histogram([(state.model_label(models[sha]), models[sha]) for sha in shown],
                                 normalized=scale_mode != "logit units")
    st.plotly_chart(fig, width="stretch", config=figures.chart_config("caliber_margins"),
                    key="margin_hist")
    st.caption("S is the median margin: v = σ²/S² puts every model's noise on one scale."
               + (" One row a model, each scaled to its tallest bin: hover a bin for its share of the "
                  "model's inputs." if len(shown) > figures.MAX_OVERLAID else ""))
    if sampled:
        st.caption("Histogram drawn from evenly spaced rows of the larger files (every row "
                   "enters S and the table): " + ui.plain(", ".join(sampled)) + ".")

def _calibrate_log():
    # A callback: the result and its workspace record exist before the page is drawn.
    ss = st.session_state
    upload, targets = ss.get("upload_logprob_log"), ss.get("logprob_log_targets")
    if upload is None or not targets:
        return
    vocab, side = int(ss.get("logprob_log_vocab", 32_000)), ss.get("logprob_log_side", "at-least")
    ss[logprob_log.LOG_RESULT] = logprob_log.calibrate_log(
        upload.getvalue(), upload.name, vocab_size=vocab, targets=sorted(targets, reverse=True), side=side)
    if ss[logprob_log.LOG_RESULT][0]:  # a workspace member, like a model
        note = log_store.save(ss[logprob_log.LOG_RESULT][0], filename=upload.name, vocab_size=vocab,
                              side=side, targets=targets)
        if note:
            state.add_warning(note)


st.subheader("Top-k logprob log (agreement only)")
with st.expander("Calibrate an API log of top-k logprobs", expanded=False):
    st.caption(
        "One OpenAI-compatible response per line (chat `logprobs.content[].top_logprobs` or legacy "
        "`logprobs.top_logprobs`). The log has no labels, so it calibrates agreement only, at a σ "
        "certified over every unseen tail; it is not added to the models above. lm-eval samples "
        "files load with the logits files instead."
    )
    lc1, lc2, lc3 = st.columns([3, 1, 1])
    with lc1:
        log_upload = st.file_uploader("Log file (.jsonl, .json)", key="upload_logprob_log")
    with lc2:
        st.number_input("Vocabulary size V", min_value=3, value=32_000, step=1,
                                    key="logprob_log_vocab")
    with lc3:
        st.selectbox("Side", ["at-least", "point", "at-most"], key="logprob_log_side")
    log_targets = st.multiselect("Agreement targets", [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6],
                                 default=[0.9, 0.8], key="logprob_log_targets")
    if log_upload is not None and log_targets:
        st.button("Calibrate log", key="logprob_log_btn", on_click=_calibrate_log)
    log_config, log_error = st.session_state.get(logprob_log.LOG_RESULT, (None, None))
    if log_error:
        st.error(ui.plain(log_error), icon=_ICONS["error"])
    elif log_config:
        logprob_log.band_panel(log_config, key="logprob_log_band")
        st.caption("Kept in this workspace: the Calibrate page shows this band, Export offers the config "
                   "and Policy can serve its targets.")
        st.download_button("Config (JSON)", config_to_json(log_config), file_name="logprob_log.caliber.json",
                           mime="application/json", key="logprob_log_download")
    if log_store.logs():
        st.caption("Calibrated logs in this workspace:")
        log_store.members_panel(key="logprob_logs")
