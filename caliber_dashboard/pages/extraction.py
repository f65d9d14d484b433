"""Extraction: what a thief distills from the noisy answers, and σ aimed at the thief."""

import time

import streamlit as st

from caliber_core.extraction.experiment import ExtractionSettings
from caliber_dashboard import navigation
from caliber_dashboard.common import ui, upload_boundary
from caliber_dashboard.common.targets import percent_to_fraction
from caliber_dashboard.extraction import frontier_sizes
from caliber_dashboard.extraction import runs
from caliber_dashboard.extraction import seedings
from caliber_dashboard.extraction import view

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Extraction")
st.caption(
    "Caliber sets the noise on what the API returns; what matters to a provider is what a thief can "
    "distill from those answers. Here a surrogate (an MLP D-128-K) is trained on the answers to the "
    "query pool, as a thief would, and scored on held-out inputs: by its accuracy and by its agreement "
    "with the clean teacher. Several recipes attack; the headline is always the strongest one."
)

archives = runs.archives()  # the demo set and this workspace's uploads
with st.expander("Use your own archive (inputs + logits)"):
    up = st.file_uploader("An .npz with inputs, logits, labels and heldout_inputs, heldout_logits, heldout_labels",
                          key="extraction_upload")
    if up is not None:
        try:
            a = view.archive_from_upload(up.getvalue(), up.name)
        except Exception as exc:  # noqa: BLE001  (the one error boundary: one line, never a traceback)
            st.error(ui.plain(upload_boundary.message(exc, up.name)))
        else:
            runs.keep_upload(a, up.getvalue())
            archives[a.sha256] = a
            if st.session_state.get("extraction_upload_selected") != a.sha256:
                # a new upload is what the user means to run: select it, once
                st.session_state["extraction_upload_selected"] = a.sha256
                st.session_state["extraction_model"] = a.sha256
            st.success(ui.plain(f"Loaded {a.name}: {a.pool.n_samples} queries, {a.evaluation.n_samples} "
                                f"held-out inputs, {a.n_classes} classes. Selected below."),
                       icon=":material/check_circle:")
if not archives:
    st.info("No model with inputs is available: extraction needs the inputs the thief queried.")
    st.stop()

runs.seed_widgets(archives)  # drawn afresh (reload, restart, page switch): the last run's choices
options = list(archives)
sha = st.selectbox("Model (files that carry their inputs)", options, key="extraction_model",
                   format_func=lambda s: f"{archives[s].name} · {s[:8]} · pool {archives[s].pool.n_samples}")
archive = archives[sha]

c1, c2, c3 = st.columns(3)
# Defaults through Session State only: a widget given a default as well as a Session State value
# (set by seed_widgets from the last run) makes Streamlit warn.
st.session_state.setdefault("extraction_retention", [0.95, 0.85, 0.75])
st.session_state.setdefault("extraction_seeds", 3)
retention = c1.multiselect("Teacher retention targets", runs.RETENTION_CHOICES,
                           format_func=lambda r: f"{r:.0%}", key="extraction_retention")
seeds = c2.number_input("Seeds", min_value=1, max_value=runs.MAX_SEEDS, key="extraction_seeds",
                        help="Independent replicates (noise draws and student initializations).")
attack = c3.selectbox("Attackers", runs.ATTACKS, key="extraction_attack",
                      help="fixed: the light and strong recipes; tuned: chooses its own regularization by "
                           "k-fold agreement with its own noisy answers; all: every recipe.")
st.session_state.setdefault("extraction_retune", False)
retune = st.checkbox("Re-tune the attacker for averaged answers (slower)",
                     key="extraction_retune",
                     help="Off: averaged answers are attacked with the frontier attacker's recipe. On: the "
                          "tuned attacker chooses its recipe again for every M, as the command line does.")
settings = ExtractionSettings(retention=tuple(sorted(retention, reverse=True)), seeds=int(seeds),
                              attack=attack, averaging_attacker="tuned" if retune else "frontier")


def _request_run(key):
    st.session_state["extraction_run_key"] = key


run_key = (sha, view.settings_key(settings))
if not retention:
    st.info("Choose at least one teacher retention target.")
    st.stop()
result = runs.find(archive, settings)  # this session's or this workspace's finished run
if result is None and not (view.is_cached(archive, settings)
                           or st.session_state.get("extraction_run_key") == run_key):
    for text in runs.warnings():
        st.warning(ui.plain(text), icon=":material/warning:")
    st.button("Run the extraction", key="extraction_run", type="primary", icon=":material/play_arrow:",
              on_click=_request_run, args=(run_key,))
    st.caption(f"{archive.pool.n_samples} queries, {archive.evaluation.n_samples} held-out inputs; "
               "about half a minute on a demo model. One progress tick per batch of training runs.")
    st.stop()

if result is None:
    result = view.run(archive, settings)
runs.keep(result)  # into the workspace: a reload or a restart shows it again without training
for text in runs.warnings():
    st.warning(ui.plain(text), icon=":material/warning:")

st.subheader("Defense frontier")


@st.fragment
def surrogate_target():
    pct = st.slider("Surrogate target: the thief keeps this share of its clean-answer accuracy",
                    min_value=50.0, max_value=99.0, value=90.0, step=0.5, format="%.1f%%",
                    key=f"extraction_surrogate_{sha[:12]}")
    runs.remember_surrogate_target(sha, pct)  # the Export page's starting value
    readout = view.surrogate_readout(result, percent_to_fraction(pct))
    m = st.columns(3)
    if readout is None:
        m[0].metric("σ", "out of reach")
        st.caption("The frontier attacker keeps more than this even where the teacher is near chance.")
    else:
        m[0].metric("σ (read off the frontier)", f"{readout['sigma']:.4g}")
        m[1].metric("teacher accuracy there", f"{readout['teacher_accuracy'] * 100:.1f}%")
        m[2].metric("teacher retention (cost to a flagged user)", f"{readout['teacher_retention'] * 100:.1f}%")
        st.caption(f"Interpolated between the measured frontier points σ={readout['bracket'][0]:.4g} and "
                   f"{readout['bracket'][1]:.4g}; `python -m caliber_core extract FILE --surrogate-retention "
                   f"{pct / 100:.3g} --out CONFIG` searches it with more seeds and writes it into a config; "
                   "the Export page does the same search on request and adds it to the config it downloads.")
    st.plotly_chart(view.frontier_figure(result, readout=readout), width="stretch", key="fig_extraction_frontier")


surrogate_target()
st.caption(
    "Each point is one σ: across, the accuracy a flagged legitimate user gets from the teacher (exact "
    f"expectation over the noise); up, the accuracy of the surrogate ({result.frontier_attacker.name}) "
    "distilled from answers at that σ, mean ± sd over seeds. Points above the dotted line mean the thief "
    "ends up with a better model than the flagged user is served."
)

st.subheader("Surrogates at the calibrated targets (Table 3 analogue)")
table = view.targets_table(result)
st.dataframe(table, hide_index=True, width="stretch", column_config=view.compact_columns(table))
st.caption(
    "Accuracies in %, mean ± sd over seeds, on held-out inputs. 'Drop recovered' is the share of the "
    "teacher's calibrated accuracy drop that the strongest surrogate wins back relative to its own "
    "clean-answer accuracy (100% = the noise costs the thief nothing)."
)

if result.averaging:
    st.subheader(f"Averaging M queries per input at σ={result.averaging_sigma:.4g} (Table 4 analogue)")
    st.plotly_chart(view.m_curve_figure(result), width="stretch", key="fig_extraction_m")
    averaged = view.averaging_table(result)
    st.dataframe(averaged, hide_index=True, width="stretch", column_config=view.compact_columns(averaged))
    st.caption(
        f"Soft answers attacked by {'the tuned attacker, re-tuned for every M' if retune else result.frontier_attacker.name}. "
        "Fresh noise per query lets a thief average M answers back towards the clean-answer surrogate "
        "(dashed), at M times the queries; per-input seeding answers repeats identically, so every M "
        "trains the same surrogate. Hard labels: the thief sees only the top class and takes a majority "
        "vote over the M answers (random tie-break)."
    )

st.subheader("Seedings side by side: per-input against consistent noise")
st.caption(
    "Per-input noise gives every request its own draw, which a thief averages away over many inputs. "
    "Consistent noise is a keyed smooth function of the logits: repeats and near-duplicates get the same "
    "noise. It is calibrated per key; the page simulates several keys and shows the spread, so a provider "
    "sees what calibrating with their own key will settle. The thief is the strongest of five recipes, each "
    "plain or prior-corrected."
)
s1, s2, s3 = st.columns(3)
length = s1.selectbox("Length scale ℓ (units of S)", seedings.LENGTH_SCALES, index=3, key="extraction_length",
                      format_func=seedings.design_label,
                      help="Small ℓ behaves like per-input noise; large ℓ acts more and more like a class bias. "
                      "The class cycle (version 2) is there for comparison: a thief who knows it undoes it.")
keys = s2.number_input("Keys", min_value=1, max_value=5, value=3, key="extraction_keys")
seed_opts = seedings.options_key(settings.retention, int(keys), 1, length)
if not (seedings.is_cached(archive, seed_opts) or st.session_state.get("extraction_seedings_key") == (sha, seed_opts)):
    s3.button("Compare the seedings", key="extraction_seedings_run", icon=":material/compare_arrows:",
              on_click=lambda: st.session_state.update(extraction_seedings_key=(sha, seed_opts)))
else:
    compared = seedings.run(archive, seed_opts)
    st.plotly_chart(seedings.seedings_frontier_figure(compared), width="stretch", key="fig_extraction_seedings")
    st.plotly_chart(seedings.key_curve_figure(compared), width="stretch", key="fig_extraction_key_curve")
    st.dataframe(seedings.sigma_spread(compared), hide_index=True, width="stretch")
    st.caption("Mean ± sd over keys. Across: what a wrongly flagged user keeps; up: what the strongest thief "
               "keeps. The second chart is the teacher's retention over σ for each simulated key (band: "
               "min–max; crosses: the σ each key's calibration chose).")

measured = seedings.measured_frontier()
if measured:
    st.subheader("The thief's frontier per noise design (measured on the demo data)")
    st.dataframe(measured, hide_index=True, width="stretch")
    st.caption("What the strongest label-free thief keeps of its clean accuracy where a flagged user keeps 75% "
               "(± half the 95% interval over keys and seeds), and beside it a thief holding 10 labels a class. "
               "From benchmarks/bench_frontier.py (docs/figures/frontier.md has every point); "
               "`caliber extract FILE --frontier` measures your own file.")

by_size = frontier_sizes.measured_sizes()
if by_size:
    st.subheader("The thief across campaign sizes (measured on a synthetic archive)")
    st.plotly_chart(frontier_sizes.sizes_figure(by_size), width="stretch", key="fig_extraction_sizes")
    st.caption(f"On {by_size['archive']}: what the strongest label-free thief keeps of a clean-answer thief's "
               "accuracy at the same number of queries (bars: 95% interval over keys), and what the flagged user "
               "keeps (dotted). From benchmarks/bench_frontier_sizes.py (docs/figures/frontier-sizes.md); "
               "`caliber extract FILE --pool-sizes 500,2000,8000` measures your own file.")

from caliber_core.extraction.report import report_to_json, to_report  # noqa: E402

st.download_button("Report (caliber.extraction/v1 JSON)", data=report_to_json(to_report(result)).encode(),
                   file_name=f"{archive.name}.extraction.json", mime="application/json",
                   key="extraction_report", on_click="ignore", icon=":material/download:")
saved = runs.saved_at(result)
st.caption(f"{result.runs} training runs in {result.seconds:.0f} s"
           + (f", finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(saved))}" if saved else "")
           + "; kept in this workspace for this file and these settings (a reload or a restart shows it "
           "again without training).")
