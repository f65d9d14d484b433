"""Policy: the throttle's levels from the model's targets, escalation, expiry, shadow mode, a simulation, export."""

from pathlib import PurePath

import streamlit as st

from caliber_core.config import config_to_json
from caliber_core.throttle.policy import PolicyError, policy_to_json
from caliber_dashboard import navigation
from caliber_dashboard.common import cache, names, state, ui
from caliber_dashboard.common.targets import target_list
from caliber_dashboard.data import log_store, vocab_files, vocab_panel
from caliber_dashboard.extraction import runs
from caliber_dashboard.policy import view

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Policy")
st.caption(
    "Serve the config to flagged accounts only, and raise the noise as a flagged account keeps querying. "
    "Level 0 is clean service; level j serves the j-th target below (σ increasing, each level's noise "
    "nested in the next). The same policy runs with `python -m caliber_core throttle` and "
    "`caliber_core.throttle.Throttle`."
)

data = ui.model_selector("Model", key="policy_model", labelled_only=True)
has_logs, has_streamed = bool(log_store.logs()), bool(vocab_files.members())
if data is None and not (has_logs or has_streamed):
    st.info("The policy needs a model with labels, a calibrated top-k logprob log or a streamed "
            "large-vocabulary file: add one on the Data page.")
    st.stop()
# The choices are remembered per model; without a labelled model the levels come from a log or a streamed file.
suffix = data.sha256[:12] if data is not None else "members"
saved = view.choices(state.model_options(data.sha256).get("policy") if data is not None else None)
retention_text = saved["retention"]
if data is not None:
    retention_text = st.text_input("Levels: retention targets (% of A0)", value=saved["retention"],
                                   key=f"policy_retention_{suffix}",
                                   help="Comma-separated; each becomes a level, in order of increasing σ.")
c1, c2, c3 = st.columns(3)
escalate_after = c1.number_input("Escalate after (queries at a level)", min_value=1, max_value=10**12,
                                 value=int(saved["escalate_after"]), step=1000,
                                 key=f"policy_escalate_{suffix}")
expire_hours = c2.number_input("Flags expire after (hours; 0 = never)", min_value=0.0, max_value=87_600.0,
                               value=float(saved["expire_hours"]), step=24.0,
                               key=f"policy_expire_{suffix}")
shadow = c3.checkbox("Shadow mode (decide and record, serve clean)", value=saved["shadow"],
                     key=f"policy_shadow_{suffix}")
groups_text = st.text_input(
    "Group kinds (descriptors that link accounts)", value=saved["groups"], key=f"policy_groups_{suffix}",
    help="Comma-separated kinds your auth layer attaches to each request, e.g. `card, org=50000`: each group "
    "(one card, one organisation) is counted, flagged and escalated like an account, and every member is served "
    "at least its group's level. A kind alone escalates after the accounts' threshold. Empty: accounts only "
    "(the simulation then links its campaign by a kind called link, at the accounts' rule).")

chosen = {"retention": retention_text, "escalate_after": int(escalate_after), "expire_hours": float(expire_hours),
          "shadow": bool(shadow), "groups": groups_text}

uploaded = st.file_uploader(
    "Or serve a config calibrated with your key (consistent seeding)", type=["json"], key="policy_config_upload",
    help="A config from `caliber calibrate --seeding consistent --key-file KEY`: its noise is calibrated for that "
    "key, so it is made on the command line, never here. Its targets become the levels.")
model_targets = "(no: the model's targets above)" if data is not None else None
served_log = (log_store.choose_for_policy(
    key="policy_log", none_label=model_targets or ("(no: a streamed file's targets below)" if has_streamed else None))
    if uploaded is None else None)
served_vocab = (vocab_panel.choose_for_policy(key="policy_vocab", none_label=model_targets)
                if uploaded is None and served_log is None else None)
try:
    if uploaded is not None:
        config_text, config = view.config_from_upload(uploaded.getvalue(), name=uploaded.name)
        config_name = f"{names.file_stem(PurePath(uploaded.name).name.removesuffix('.json'))}.json"
    elif served_log is not None:  # a calibrated top-k logprob log: its agreement targets are the levels
        config = served_log["config"]
        config_text, config_name = config_to_json(config), log_store.config_name(served_log)
    elif served_vocab is not None:  # a streamed large-vocabulary file: its Calibrate targets are the levels
        config = served_vocab["config"]
        config_text, config_name = config_to_json(config), vocab_panel.config_name(served_vocab)
    else:
        targets = target_list(retention_text, "", "")
        if not targets:
            raise ValueError("enter at least one retention target")
        _, _, config = cache.config(data, targets)
        config_text = config_to_json(config)
        config_name = view.config_file_name(data.name)
    doc, policy = view.policy_document(config_text, config, config_name=config_name, chosen=chosen)
except (ValueError, PolicyError) as exc:
    st.error(ui.plain(str(exc)))
    st.stop()
st.caption(ui.plain(view.seeding_caption(policy)))
if data is not None:
    state.set_model_option(data.sha256, "policy", chosen)

archive = runs.archives().get(data.sha256) if data is not None else None
latest = None if archive is None or not view.config_matches(config, data.sha256) else runs.latest(archive)
extraction = None
if latest is not None:
    from caliber_core.extraction.report import to_report

    extraction = to_report(latest)

st.subheader("Levels")
st.dataframe(view.level_table(policy, extraction), hide_index=True, width="stretch")
st.caption("What a wrongly flagged user receives at each level is the config's own figure on the calibration "
           "sample, with its confidence interval"
           + ("; the thief's surrogate retention comes from this model's latest extraction run (mean and "
              "spread over its seeds)." if extraction is not None else
              ". Run an extraction on the Extraction page to see what a thief's surrogate keeps at each σ."))

st.subheader("Simulation")
detect_after = st.number_input("The detector flags an account after (queries)", min_value=1, max_value=10**9,
                               value=int(escalate_after), step=1000, key=f"policy_detect_after_{escalate_after}",
                               help="Starts at the escalation threshold; the campaign is sized to reach the "
                               "top level and stay there as long again.")


result = cache.policy_simulation(policy_to_json(doc), config_text, detect_after=int(detect_after),
                                extraction=extraction)
st.plotly_chart(view.trajectory_figure(result), key="policy_trajectories")
st.dataframe(view.outcome_table(result), hide_index=True, width="stretch")
st.caption(ui.plain(
    f"Each account sends its queries in requests of {result['batch']} over seven simulated days: a heavy "
    f"benign user flagged by mistake, one thief, the same campaign split over {result['sybils']} sybils (each "
    f"flagged only once its own share passes the detector), a repeater who sends each input "
    f"{result['repeats']} times, and the sybils' campaign again with every account carrying one shared "
    f"{result['group_kind']['name']} descriptor (the detector flags the group once the group's total passes). "
    "Every other account carries a descriptor of its own, so the benign user's levels come from its own "
    "traffic only. Accuracy lost is query-weighted over the levels served, with the interval the config's "
    "per-level intervals give."))
reach = view.reach_table(result)
if reach is not None:
    st.dataframe(reach, hide_index=True, width="stretch")
    st.caption(ui.plain(
        "Linked, the split campaign reaches each level after the same total as the single thief when the kind's "
        "threshold is the accounts'. Linking cannot catch sybils that share no descriptor (the unlinked rows "
        "above), and a false link escalates every member of the group."))

st.subheader("Export")
policy_stem = data.name if data is not None else config_name.removesuffix(".json").removesuffix(".caliber")
st.caption(ui.plain(f"Save both files in one folder: the policy names the config as {config_name} "
                    "and checks its sha256 on load."))
d1, d2 = st.columns(2)
d1.download_button("Download the policy JSON", policy_to_json(doc),
                   file_name=f"{names.file_stem(policy_stem)}.policy.json",
                   mime="application/json", key="policy_download", icon=":material/download:")
d2.download_button("Download its config JSON", config_text, file_name=config_name, mime="application/json",
                   key="policy_config_download", icon=":material/download:")
with st.expander("Policy JSON"):
    st.code(policy_to_json(doc), language="json")
