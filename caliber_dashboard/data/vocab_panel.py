"""The pages' parts for large-vocabulary files, streamed from the data root or uploaded (:mod:`.vocab_files`).

* Data: the streamed files, each with its shape and a remove button;
* Calibrate: targets and side in, each sigma with its certified bounds out, and the
  bound curves as a band (what the streamed engine gives: no Monte-Carlo sweep,
  so no logistic points, no bootstrap and no verify button);
* Export: each file's config to download, with the command lines that write,
  check and serve it;
* Policy: a file's targets as the throttle's levels.

A changed choice on Calibrate is solved on the reduction the process holds
(seconds) and stored with its config, which Export and Policy then read.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from caliber_core.config import SIDES, config_to_json

from caliber_dashboard.common import cache, names, ui
from caliber_dashboard.common.commands import cli_command, file_argument
from caliber_dashboard.common.figures import INTERVAL_FILL, LIGHT_LAYOUT, PALETTE, SIGMA_AXIS, chart_config
from caliber_dashboard.common.readouts import SIDE_HELP, SIDE_LABELS
from caliber_dashboard.common.targets import KIND_LABELS, target_list

from . import vocab_files

CHOSEN = "caliber_vocab_chosen"  # plain key: the file the Calibrate part last showed
_QUANTITIES = ("accuracy", "retention", "agreement")


def config_name(entry: dict) -> str:
    """The file name a streamed file's config is downloaded under (and a policy names it by)."""
    return f"{names.file_stem(entry['name'])}.caliber.json"


def label(entry: dict) -> str:
    """One line naming a streamed file: path, shape, side and each target's sigma."""
    sigmas = ", ".join(f"{t['kind']} {t['requested']:g} → σ {t['sigma']:.4g}" for t in entry["config"]["targets"])
    return f"{entry['path']} ({vocab_files.shape_text(entry)}, {entry['side']}): {sigmas}"


def _percents(values) -> str:
    return ", ".join(f"{100 * float(v):g}" for v in values)


# ------------------------------------------------------------------ Data page


def data_panel() -> None:
    """The Data page's list of streamed files (nothing when there are none)."""
    held = vocab_files.members()
    if not held:
        return
    st.subheader("Large-vocabulary files (streamed)")
    st.caption("Opened from the data root or uploaded, and read by the streamed engine: reduced once, "
               "calibrated from the reduction. They appear on Calibrate, Export and Policy, not in the models "
               "table.")
    for digest, entry in list(held.items()):
        c1, c2 = st.columns([8, 1], vertical_alignment="center")
        c1.markdown(ui.plain(label(entry)))
        c2.button("Remove", key=f"vocab_remove_{digest[:16]}", on_click=vocab_files.remove, args=(digest,),
                  type="tertiary")


# ------------------------------------------------------------------ Calibrate page


def bounds_figure(config: dict) -> go.Figure:
    """The certified bound curves over sigma as a band, and each target's sigma with its bounds."""
    b = config["bounds"]
    shown = "accuracy" if "accuracy_lower" in b else "agreement"
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=b["sigma"], y=b[f"{shown}_upper"], mode="lines", line=dict(width=1, color=PALETTE[0]),
                             name=f"upper bound of the {shown}",
                             hovertemplate=f"σ=%{{x:.4g}}<br>upper {shown}=%{{y:.4f}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=b["sigma"], y=b[f"{shown}_lower"], mode="lines", line=dict(width=1, color=PALETTE[1]),
                             fill="tonexty", fillcolor=INTERVAL_FILL, name=f"lower bound of the {shown}",
                             hovertemplate=f"σ=%{{x:.4g}}<br>lower {shown}=%{{y:.4f}}<extra></extra>"))
    for t in config["targets"]:
        q = "accuracy" if t["kind"] in ("accuracy", "retention") else "agreement"
        bounds = (t.get("interval") or {}).get(q)
        if not bounds or t["sigma"] <= 0:
            continue
        lo, hi = bounds
        fig.add_trace(go.Scatter(
            x=[t["sigma"], t["sigma"]], y=[lo, hi], mode="lines+markers", line=dict(color="#333", width=2),
            name=f"{t['kind']} {t['requested']:g} ({t['side']}): σ={t['sigma']:.4g}",
            hovertemplate=f"σ={t['sigma']:.5g}<br>{q} in [{lo:.4f}, {hi:.4f}]<extra></extra>"))
    fig.update_layout(template=dict(layout=LIGHT_LAYOUT), height=380, margin=dict(l=60, r=20, t=40, b=50),
                      title=f"{config['model']}: certified {shown} (top {b['k']} gaps exact, "
                            f"V={b['vocab_size']:,})")
    fig.update_xaxes(title_text=SIGMA_AXIS, type="log")
    fig.update_yaxes(title_text=f"{shown} under noise", range=[0, 1.02])
    return fig


def _bounds_text(bounds) -> str:
    if not bounds:
        return "—"
    low, high = math.floor(1e4 * bounds[0]) / 100, math.ceil(1e4 * bounds[1]) / 100
    return f"{low:.2f}–{high:.2f}%"


def target_table(config: dict) -> pd.DataFrame:
    """One row per target: sigma served, v, and the certified bounds of each quantity there."""
    rows = []
    for t in config["targets"]:
        interval = t.get("interval") or {}
        rows.append({"target": f"{t['kind']} {100 * t['requested']:g}%", "side": SIDE_LABELS.get(t["side"], t["side"]),
                     "σ served": t["sigma"], "v = σ²/S²": t["v"],
                     **{f"{q} (certified bounds)": _bounds_text(interval.get(q)) for q in _QUANTITIES},
                     "method": t["method"]})
    df = pd.DataFrame(rows)
    return df.loc[:, [c for c in df.columns if not (c.endswith("(certified bounds)") and (df[c] == "—").all())]]


def _choice_inputs(entry: dict, digest: str) -> tuple[list, str]:
    """The kind, targets and side inputs for one file, starting from its stored choice."""
    kinds = ("retention", "accuracy", "agreement") if entry["has_labels"] else ("agreement",)
    stored_kind = entry["targets"][0][0] if entry["targets"] else kinds[0]
    c1, c2, c3 = st.columns([1, 2, 1])
    kind = c1.selectbox("Target kind", kinds, index=kinds.index(stored_kind) if stored_kind in kinds else 0,
                        format_func=KIND_LABELS.get, key=f"vocab_kind_{digest[:12]}")
    same = [v for k, v in entry["targets"] if k == kind]
    text = c2.text_input("Targets (%)", value=_percents(same) if same else "90, 80",
                         key=f"vocab_targets_{digest[:12]}_{kind}",
                         help=f"Comma-separated percentages of the kind on the left ({KIND_LABELS[kind]}).")
    side = c3.selectbox("Side", SIDES, index=SIDES.index(entry["side"]), format_func=SIDE_LABELS.get,
                        key=f"vocab_side_{digest[:12]}", help=" ".join(f"{SIDE_LABELS[s]}: {SIDE_HELP[s]}"
                                                                    for s in SIDES))
    fields = {"retention": "", "accuracy": "", "agreement": ""} | {kind: text}
    return target_list(fields["retention"], fields["accuracy"], fields["agreement"]), side


def _solved(entry: dict, targets, side: str) -> dict:
    """The config of this choice: the stored one when unchanged, else solved on the reduction and stored."""
    if [[k, float(v)] for k, v in targets] == entry["targets"] and side == entry["side"]:
        return entry["config"]
    with cache.progress_bar(f"Streaming {ui.plain(entry['path'])} again (the process let its reduction go)…") as report:
        streamed = vocab_files.reopen(entry, progress=report)
    with st.spinner("Solving σ on the reduction…"):
        config = vocab_files.calibrate(streamed, targets, side=side)
    note = vocab_files.keep(vocab_files.entry_for(streamed, targets, side, config))
    if note:
        st.warning(ui.plain(note), icon=":material/warning:")
    return config


def calibrate_panel() -> bool:
    """The Calibrate page's part for streamed files; whether there were any."""
    held = vocab_files.members()
    if not held:
        return False
    st.subheader("Large-vocabulary files (streamed engine)")
    options = list(held)
    chosen = st.session_state.get(CHOSEN)
    digest = st.selectbox("Streamed file", options, index=options.index(chosen) if chosen in options else
                          len(options) - 1, format_func=lambda k: f"{held[k]['path']} · {k[:8]}",
                          key="vocab_file") if len(options) > 1 else options[0]
    st.session_state[CHOSEN] = digest
    entry = held[digest]
    try:
        targets, side = _choice_inputs(entry, digest)
        config = _solved(entry, targets, side)
    except Exception as exc:  # noqa: BLE001  (the one error boundary of this part: one line, never a traceback)
        from caliber_dashboard.data import server_files

        st.error(ui.plain(server_files.one_line(exc)), icon=":material/block:")
        return True
    m = st.columns(4)
    m[0].metric("inputs N", f"{config['n_samples']:,}")
    m[1].metric("vocabulary V", f"{config['n_classes']:,}")
    a0 = config["clean_accuracy"]
    m[2].metric("clean accuracy A0", "—" if a0 is None else f"{a0:.4f}")
    m[3].metric("S (median margin)", f"{config['scale']:.4g}")
    df = target_table(config)
    st.dataframe(df, hide_index=True, width="stretch",
                 column_config={"σ served": st.column_config.NumberColumn(format="%.5g"),
                                "v = σ²/S²": st.column_config.NumberColumn(format="%.4g")})
    st.plotly_chart(bounds_figure(config), width="stretch", key=f"vocab_band_{digest[:12]}",
                    config=chart_config(f"{names.file_stem(entry['name'])}_bounds"))
    widths = ", ".join(f"{w:.2g}" for w in config["bounds"]["widths"])
    st.caption(ui.plain(
        "Streamed once (the command line's engine for a vocabulary this large): each row's top "
        f"{config['bounds']['k']} gaps exactly, the rest as a gap histogram. σ inverts the side's certified "
        "bound of the mean (point: their midpoint); the bounds hold for every way the binned tail can fall, "
        f"so there is no sampling band and no verification draw. Bound width at each target: {widths}. "
        "The band is drawn from evenly spaced rows."))
    return True


# ------------------------------------------------------------------ Export page


def commands(entry: dict) -> list[str]:
    """The command lines that write, check and serve a streamed file's config (run in the data root)."""
    name, config = config_name(entry), entry["config"]
    words = [file_argument(entry["path"])]
    if entry.get("labels"):
        words += ["--labels", file_argument(entry["labels"])]
    flags: list[tuple[str, list[str]]] = []
    for kind, value in entry["targets"]:
        flag = "--target-accuracy" if kind == "accuracy" else f"--{kind}"
        if not flags or flags[-1][0] != flag:
            flags.append((flag, []))
        flags[-1][1].append(f"{float(value):g}")
    for flag, values in flags:
        words += [flag, *values]
    if entry["side"] != "point":
        words += ["--side", entry["side"]]
    check = [file_argument(name), file_argument(entry["path"])]
    if entry.get("labels"):
        check += ["--labels", file_argument(entry["labels"])]
    levels = [str(i) for i, t in enumerate(config["targets"]) if t["sigma"] > 0]
    return [cli_command("calibrate", *words, "--out", file_argument(name)),
            cli_command("check", *check),
            cli_command("throttle", "init", file_argument(name), "--levels", *levels, "--escalate-after", "10000",
                        "--out", "policy.json")]


def export_panel() -> None:
    """The Export page's part: each streamed file's config and the commands that use it."""
    held = vocab_files.members()
    if not held:
        return
    with st.expander(f"Large-vocabulary files, streamed ({len(held)})", expanded=True):
        st.caption("Configs from the streamed engine (the targets chosen on Calibrate), the same as "
                   "`calibrate` writes for these files: `check` compares a new dump against one; "
                   "`throttle init` (or the Policy page) serves its targets as levels. Run the commands "
                   "where the files are (the data root for files opened from it).")
        for digest, entry in held.items():
            st.markdown(ui.plain(label(entry)))
            text = config_to_json(entry["config"])
            st.download_button("Download config JSON", text, file_name=config_name(entry),
                               mime="application/json", key=f"export_vocab_{digest[:16]}", on_click="ignore",
                               icon=":material/download:")
            st.code("\n".join(commands(entry)), language="bash")


# ------------------------------------------------------------------ Policy page


def choose_for_policy(*, key: str, none_label: str | None) -> dict | None:
    """A selectbox of the streamed files for the Policy page; the chosen record, or None (``none_label``'s
    choice). Without ``none_label`` a file must be chosen."""
    held = vocab_files.members()
    if not held:
        return None
    keys = ([None] if none_label is not None else []) + list(held)
    chosen = st.selectbox("Or serve a streamed large-vocabulary file's targets", keys, key=key,
                          format_func=lambda k: none_label if k is None else label(held[k]),
                          help="Opened from the data root or uploaded; its targets, as last chosen on Calibrate, "
                               "become the levels.")
    return held.get(chosen) if chosen is not None else None
