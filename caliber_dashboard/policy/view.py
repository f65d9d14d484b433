"""The Policy page's pieces: the level table, the simulation's trajectories, the saved choices.

Plain functions (data in, table or figure out) over ``caliber_core.throttle``;
tests call them without Streamlit.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from caliber_core.throttle.simulate import surrogate_at

DEFAULT_CHOICES = {"retention": "90, 70, 50", "escalate_after": 10_000, "expire_hours": 720.0, "shadow": False,
                   "groups": ""}
SCENARIO_COLOURS = {"benign": "#2a9d8f", "thief": "#e63946", "repeater": "#f4a261", "linked": "#6a4c93"}


def group_kinds(text: str, *, escalate_after: int, expire_after) -> dict:
    """The page's group kinds, ``card, org=5000``: each kind's threshold (default: the accounts'), their expiry.

    Returns ``{kind: (escalate_after, expire_after)}``; ValueError in one line for a malformed entry
    (the kind's name itself is checked by the policy).
    """
    out = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        kind, sep, threshold = (x.strip() for x in entry.partition("="))
        try:
            after = int(threshold) if sep else int(escalate_after)
        except ValueError:
            raise ValueError(f"group kind {kind[:32]!r}: the threshold must be a whole number of queries") from None
        if kind in out:
            raise ValueError(f"group kind {kind[:32]!r} is listed twice")
        out[kind] = (after, expire_after)
    return out


def policy_document(config_text: str, config: dict, *, config_name: str, chosen: dict):
    """(policy document, Policy) of the page's choices (:func:`choices`' keys) over a config.

    What the page shows, replays and exports; the background job that prepares the
    page's default replay builds it with the same call. ValueError or PolicyError for
    choices a policy refuses.
    """
    from caliber_core.throttle.policy import policy_for_config_text

    escalate_after, expire_after = int(chosen["escalate_after"]), expire_seconds(chosen["expire_hours"])
    return policy_for_config_text(
        config_text, config_name=config_name, targets=level_targets(config), escalate_after=escalate_after,
        expire_after=expire_after, shadow=bool(chosen["shadow"]),
        groups=group_kinds(chosen["groups"], escalate_after=escalate_after, expire_after=expire_after) or None)


def config_file_name(model_name: str) -> str:
    """The config's file name beside the policy (Export's name for the same config)."""
    from caliber_dashboard.common.names import file_stem

    return f"{file_stem(model_name)}.caliber.json"


def level_targets(config: dict) -> list[int]:
    """Config target indices as levels: ascending sigma, one per distinct sigma > 0."""
    order, seen = [], set()
    for i in sorted(range(len(config["targets"])), key=lambda i: config["targets"][i]["sigma"]):
        sigma = config["targets"][i]["sigma"]
        if sigma > 0 and sigma not in seen:
            seen.add(sigma)
            order.append(i)
    return order


def config_from_upload(raw: bytes, *, name: str) -> tuple[str, dict]:
    """(its text, the loaded config) of an uploaded config JSON; ValueError in one line naming the file.

    Only the uploaded bytes are parsed (:func:`caliber_core.config.config_from_bytes`):
    content that names a server path is refused as text that is not JSON,
    by the same message whether that path exists or not, and nothing is opened.
    """
    from caliber_core.config import ConfigError, config_from_bytes

    try:
        config = config_from_bytes(raw)
    except ConfigError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return bytes(raw).decode("utf-8-sig"), config


def config_matches(config: dict, data_sha256: str) -> bool:
    """Whether a config was calibrated on the selected model's data (its extraction run then applies)."""
    return config.get("sha256") in (None, data_sha256)


def seeding_caption(policy) -> str:
    """One line on the policy's seeding and what a repeater gets from it."""
    if policy.seeding == "consistent":
        return ("Consistent seeding: the noise is a keyed function of the logits, calibrated for one key (serve it "
                "with that key). Repeats and near-duplicates get nearly the same noise, so averaging them gains "
                "nothing, and no request id is needed.")
    return ("Per-input seeding: the noise follows each request's id. Repeats with the same id get the same answer, "
            "but every near-duplicate with a new id is a fresh draw, so ids should be canonical "
            "(caliber_core.serving.canonical_id). A config from calibrate --seeding consistent binds a thief better.")


def choices(saved) -> dict:
    """The stored policy choices merged over the defaults, bad values dropped."""
    out = dict(DEFAULT_CHOICES)
    if isinstance(saved, dict):
        for name, default in DEFAULT_CHOICES.items():
            value = saved.get(name)
            if type(value) is type(default) or (isinstance(default, float) and isinstance(value, int)
                                                  and not isinstance(value, bool)):
                out[name] = value
    return out


def _pct(value, interval) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.1%}"
    if interval and interval[0] != interval[1]:
        text += f" ({interval[0]:.1%}–{interval[1]:.1%})"
    return text


def level_table(policy, extraction: dict | None = None) -> pd.DataFrame:
    """One row per level: sigma, what a wrongly flagged user receives (with the config's intervals),
    and, with an extraction report, the surrogate retention its frontier measured at that sigma."""
    config = policy.config
    rows = []
    for lv in policy.levels:
        if lv.index == 0:
            acc, acc_i, ret, ret_i, label = config.get("clean_accuracy"), None, 1.0, None, "clean service"
        else:
            t = config["targets"][lv.target]
            ref, interval = t.get("reference") or {}, t.get("interval") or {}
            acc, ret = ref.get("accuracy", t.get("accuracy")), ref.get("retention", t.get("retention"))
            acc_i, ret_i = interval.get("accuracy"), interval.get("retention")
            label = f"{t['kind']} {t['requested']:g}"
        row = {"level": lv.index, "target": label, "σ": round(lv.sigma, 4),
               "accuracy a wrongly flagged user gets": _pct(acc, acc_i),
               "retention (of A0)": _pct(ret, ret_i)}
        if extraction is not None:
            sur = surrogate_at(extraction, lv.sigma)
            row["thief's surrogate keeps"] = ("outside the run's σ range" if sur is None else
                                              f"{sur['mean']:.1%}" + (f" ± {sur['sd']:.1%} (sd, {sur['n']} seeds)"
                                                                      if sur.get("n") else ""))
        rows.append(row)
    return pd.DataFrame(rows)


def trajectory_figure(result: dict) -> go.Figure:
    """Level served against queries sent, one line per account (sybils thin and grey)."""
    fig = go.Figure()
    named = 0
    for account in result["accounts"]:
        name = account["account"]
        xs, ys = zip(*account["trajectory"])
        sybil = name.startswith("sybil-")
        show = not sybil or name == "sybil-01"
        # Two accounts can share a trajectory (a thief escalating like a repeater): each named
        # line is thinner and dashed differently from the one drawn before it, so both show.
        style = {"color": "#8d99ae", "width": 1} if sybil else {
            "color": SCENARIO_COLOURS.get(name, "#264653"), "width": max(1.5, 4.5 - 1.0 * named),
            "dash": _DASHES[named % len(_DASHES)]}
        named += 0 if sybil else 1
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", line_shape="hv", name="sybils (each)" if sybil else name,
            legendgroup="sybils" if sybil else name, showlegend=show, line=style))
    top = max(lv["level"] for lv in result["levels"])
    # The legend above the plot: below it, a horizontal legend shares its row with the x-axis title.
    fig.update_layout(xaxis_title="queries sent by the account (the linked campaign: by all its accounts together)",
                      yaxis_title="level served",
                      yaxis={"tickmode": "linear", "dtick": 1, "range": [-0.2, top + 0.2]},
                      height=380, margin={"t": 60, "b": 50},
                      legend={"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"})
    return fig


_DASHES = ("solid", "dash", "dot", "dashdot")


def reach_table(result: dict) -> pd.DataFrame | None:
    """When the thief and the linked campaign first reach each level (queries in total), side by side."""
    by = {a["account"]: a for a in result["accounts"]}
    if "linked" not in by or "thief" not in by:
        return None
    levels = sorted(set(by["thief"]["first_at_level"]) | set(by["linked"]["first_at_level"]) - {0})
    return pd.DataFrame([{"level": lv, "thief reaches it after": by["thief"]["first_at_level"].get(lv),
                          "linked campaign after (all accounts)": by["linked"]["first_at_level"].get(lv)}
                         for lv in levels])


def outcome_table(result: dict) -> pd.DataFrame:
    """Per account: top level, queries per level, accuracy lost against clean (with its interval)."""
    rows = []
    for a in result["accounts"]:
        lost = a["accuracy_lost"]
        text = "n/a" if lost is None else _pct(lost["value"], lost["interval"])
        name = a["account"] if a["account"] != "linked" else f"linked ({a['members']} accounts, one descriptor)"
        rows.append({"account": name, "highest level": a["max_level"],
                     "queries per level": ", ".join(f"L{lv}: {n:,}" for lv, n in sorted(a["queries_per_level"].items())
                                                    if n),
                     "accuracy lost vs clean": text,
                     "flag events": len(a["flag_events"])})
    return pd.DataFrame(rows)


def policy_from_text(policy_text: str, config_text: str):
    """The Policy of a policy JSON text whose config is held as JSON text."""
    import json

    from caliber_core.throttle.policy import parse_policy

    return parse_policy(json.loads(policy_text), config_text=config_text)


def frontier_key(extraction: dict | None) -> str:
    """What identifies an extraction report's frontier for caching ('' without one)."""
    import json

    return "" if extraction is None else json.dumps(extraction.get("frontier"), sort_keys=True)


def expire_seconds(hours: float) -> float | None:
    """Hours from the page (0: never) as the policy's seconds."""
    return None if not hours or not math.isfinite(hours) or hours <= 0 else float(hours) * 3600.0
