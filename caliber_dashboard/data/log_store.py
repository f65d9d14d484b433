"""Calibrated top-k logprob logs as workspace members: kept, restored, exported, served by a policy.

A log calibrated on the Data page (:mod:`.logprob_log`) is saved in the
session's workspace as its config (result kind :data:`KIND`, keyed by the log
file's sha256: calibrating the same log again with other targets replaces it),
with the file name and the options it was calibrated with. The config is all
the other pages need: the Calibrate page draws its certified band, the Export
page offers it for download with the commands that use it, and the Policy page
can serve its targets as levels. The log's bytes are not kept (the config
holds every number taken from them).

The session keeps the workspace's logs under :data:`LOGS` together with the
workspace token they were read for, so a reload, a server restart or a switch
to another workspace reads them again.
"""

from __future__ import annotations

import time

import streamlit as st

from caliber_core.config import config_to_json

from caliber_dashboard.common import names, state, ui
from caliber_dashboard.common.commands import cli_command, file_argument
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

from .logprob_log import LOG_RESULT

KIND = "logprob_log"
LOGS = "caliber_logprob_logs"
_ABSENT = object()


def _valid(entry) -> bool:
    config = entry.get("config") if isinstance(entry, dict) else None
    return (isinstance(config, dict) and isinstance(config.get("bounds"), dict)
            and isinstance(config.get("targets"), list) and bool(config["targets"])
            and isinstance(entry.get("filename"), str))


def logs() -> dict[str, dict]:
    """The workspace's calibrated logs by the log's sha256, oldest first (read once per workspace)."""
    ss = st.session_state
    token = workspace.token()
    held = ss.get(LOGS)
    if isinstance(held, tuple) and held[0] == token:
        return held[1]
    if held is not None:  # another workspace now: its last result is not this one's
        ss.pop(LOG_RESULT, None)
    stored, bad = workspace.load_results(KIND)
    found = {k: v for k, v in stored.items() if _valid(v)}
    skipped = bad + [k for k in stored if k not in found]
    for key in skipped:
        state.add_warning(f"Skipped an unreadable calibrated log ({key[:8]}).")
    ordered = dict(sorted(found.items(), key=lambda kv: (kv[1].get("saved", 0), kv[0])))
    ss[LOGS] = (token, ordered)
    return ordered


def current() -> dict | None:
    """The log whose band the pages show: the one calibrated last in this session, else the workspace's latest."""
    config, _ = st.session_state.get(LOG_RESULT, (None, None))
    if config:
        return config
    held = logs()
    return next(reversed(held.values()))["config"] if held else None


def save(config: dict, *, filename: str, vocab_size: int, side: str, targets) -> str | None:
    """Keep a calibrated log in the workspace; a warning line when it could not be kept, else None."""
    entry = {"config": config, "filename": filename, "vocab_size": int(vocab_size), "side": side,
             "targets": [float(t) for t in targets], "saved": time.time()}
    key = config["sha256"]
    held = logs()
    try:
        kept = workspace.save_result(KIND, key, entry)
    except (CapExceeded, *workspace.STORE_ERRORS, ValueError) as exc:
        held[key] = entry
        return f"{filename} is calibrated for this browser session only: the workspace refused it ({exc})."
    held.pop(key, None)
    held[key] = entry  # the newest last
    return None if kept else f"{filename} is calibrated for this browser session only: storage is unavailable."


def remove(key: str) -> None:
    """Forget one calibrated log (in the session and the workspace)."""
    logs().pop(key, None)
    config, _ = st.session_state.get(LOG_RESULT, (None, None))
    if config and config.get("sha256") == key:
        st.session_state.pop(LOG_RESULT, None)
    try:
        workspace.delete_result(KIND, key)
    except workspace.STORE_ERRORS as exc:
        state.add_warning(f"Could not remove the calibrated log from the workspace: {exc}")


def config_name(entry: dict) -> str:
    """The file name a log's config is downloaded under (and a policy names it by)."""
    stem = str(entry["filename"]).rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return f"{names.file_stem(stem, default='logprob_log')}.caliber.json"  # Export's safe name rule


def label(entry: dict) -> str:
    """One line naming a log: file, vocabulary, side and its targets' sigmas."""
    config = entry["config"]
    sigmas = ", ".join(f"{t['requested']:g} → σ {t['sigma']:.4g}" for t in config["targets"])
    return (f"{entry['filename']} (V={config['bounds']['vocab_size']:,}, {config['targets'][0]['side']}): "
            f"agreement {sigmas}")


def commands(entry: dict) -> list[str]:
    """The command lines that use a log's config: recalibrate, check a new log, a throttle policy."""
    name, log = config_name(entry), entry["filename"]
    config = entry["config"]
    targets = " ".join(f"{t['requested']:g}" for t in config["targets"])
    levels = " ".join(str(i) for i in range(len(config["targets"])))
    side = config["targets"][0]["side"]
    # Every word quoted by the one rule of every shown command (a log's name is the visitor's text).
    return [cli_command("calibrate", file_argument(log), "--agreement", *targets.split(), "--vocab-size",
                        str(config["bounds"]["vocab_size"]), "--side", side, "--out", file_argument(name)),
            cli_command("check", file_argument(name), "NEW_LOG.jsonl"),
            cli_command("throttle", "init", file_argument(name), "--levels", *levels.split(), "--escalate-after",
                        "10000", "--out", "policy.json")]


def members_panel(*, key: str) -> None:
    """The workspace's calibrated logs, each with its config to download and a remove button."""
    held = logs()
    if not held:
        return
    for digest, entry in list(held.items()):
        c1, c2, c3 = st.columns([6, 2, 1], vertical_alignment="center")
        c1.markdown(ui.plain(label(entry)))
        c2.download_button("Config (JSON)", config_to_json(entry["config"]), file_name=config_name(entry),
                           mime="application/json", key=f"{key}_download_{digest[:16]}", on_click="ignore")
        c3.button("Remove", key=f"{key}_remove_{digest[:16]}", on_click=remove, args=(digest,),
                  type="tertiary")


def export_panel() -> None:
    """The Export page's part: each calibrated log's config and the commands that use it."""
    held = logs()
    if not held:
        return
    with st.expander(f"Calibrated top-k logprob logs ({len(held)})", expanded=False):
        st.caption("Agreement-only configs, calibrated on the Data page. `check` compares a new log "
                   "against one; `throttle init` (or the Policy page) serves its targets as levels.")
        for digest, entry in held.items():
            st.markdown(ui.plain(label(entry)))
            st.download_button("Download config JSON", config_to_json(entry["config"]),
                               file_name=config_name(entry), mime="application/json",
                               key=f"export_log_{digest[:16]}", on_click="ignore", icon=":material/download:")
            st.code("\n".join(commands(entry)), language="bash")


def choose_for_policy(*, key: str, none_label: str | None) -> dict | None:
    """A selectbox of the calibrated logs for the Policy page; the chosen entry, or None (``none_label``'s
    choice: another source of targets). Without ``none_label`` a log must be chosen."""
    held = logs()
    if not held:
        return None
    keys = ([None] if none_label is not None else []) + list(held)
    chosen = st.selectbox("Or serve a calibrated top-k logprob log's targets", keys, key=key,
                          format_func=lambda k: none_label if k is None else label(held[k]),
                          help="Calibrated on the Data page: its agreement targets become the levels.")
    return held.get(chosen) if chosen is not None else None
