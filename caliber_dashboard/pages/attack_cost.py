"""Attack cost: what averaging M repeated queries per input buys an attacker (Proposition 2)."""

import streamlit as st

from caliber_core.calibration.cost import analytic_attack, query_bound
from caliber_core.simulation.attack_estimate import DEFAULT_MAX_DRAWS
from caliber_dashboard import navigation
from caliber_dashboard.common import attack_prefetch, cache, figures, readouts, state, ui
from caliber_dashboard.common.curves import m_grid, powers_of_two
from caliber_dashboard.common.rounding import normal_half_width, plus_minus
from caliber_dashboard.common.targets import percent_to_fraction
from caliber_dashboard.common.ui import fmt

navigation.page_prelude()  # a deep link on a fresh server: let app.py run first

st.title("Attack cost")
st.caption(
    "Zero-mean noise invites averaging: M fresh answers to one input leave noise σ/√M, so reaching "
    "a usable level v_use costs M ≥ v/v_use queries per input (Proposition 2(i)). Per-input "
    "deterministic seeding returns the same answer every time, and averaging recovers nothing (ii)."
)

data = ui.model_selector("Model", key="attack_model", labelled_only=True)
if data is None:
    st.info("The attack-cost view needs a model with labels: add one on the Data page.")
    st.stop()
try:
    cal = cache.calibration(data)
except ValueError as exc:
    st.error(ui.plain(f"{data.name}: {exc}"))
    st.stop()

c1, c2 = st.columns(2)
with c1:
    kind, value, percent = ui.target_control(data, cal, key_prefix="attack", kinds=("retention",))
# The side served on Calibrate for this model: the attack is run at the sigma a config would serve.
side = state.model_options(data.sha256).get("side", "point")
if side not in readouts.SIDE_LABELS:
    side = "point"
try:
    result, served_intervals = cache.served(data, cal, kind, value, side=side)
except ValueError as exc:
    st.warning(ui.plain(str(exc)))
    st.stop()
sigma, v_star = result.sigma, result.v
served_accuracy = served_intervals.get("accuracy").estimate  # at the sigma served, on this sample
if not sigma > 0:
    st.info("This target needs no noise (σ* = 0): there is nothing to average away.")
    st.stop()
with c2:
    usable_pct = st.slider(
        "Usable level for the attacker (retention, % of A0)", min_value=min(percent + 0.5, 99.5),
        max_value=99.5, value=min(99.5, max(percent + 0.5, 95.0)), step=0.5, format="%.1f%%",
        key=f"attack_usable_{data.sha256[:12]}",
        help="The accuracy an attacker would call usable; read on the measured curve, as v* is, it gives v_use.")
bound = query_bound(cal, v_star, percent_to_fraction(usable_pct))

m = st.columns([2, 1, 1]) + st.columns([2, 1, 1])[:2]  # two rows: σ and its range need the width
m[0].metric(readouts.SIGMA_LABELS[side],
            readouts.sigma_text(sigma, cache.sigma_range(data, cal, kind, value, side=side)),
            help=f"The side served on Calibrate: {readouts.SIDE_LABELS[side]}. {readouts.SIDE_HELP[side]} "
                 + readouts.SIGMA_RANGE_HELP)
m[1].metric("v* = σ*²/S²", fmt(v_star, ".4g"))
m[2].metric("served accuracy", fmt(served_accuracy, ".4f"))
m[3].metric("v_use (measured curve)", fmt(bound.v_use, ".4g"))
m[4].metric("M ≥ v*/v_use", "∞" if bound.queries is None else f"{bound.queries:,}")

if bound.queries is None:
    st.markdown(f"A usable level of {usable_pct:.1f}% retention means the clean model itself: no finite "
                "number of averaged queries reaches it.")
else:
    st.markdown(
        # The * of v* escaped: bare, it would close the bold early.
        f"Under fresh i.i.d. noise an attacker needs **M ≥ v\\*/v_use = {v_star:.4g}/{bound.v_use:.4g} → "
        f"{bound.queries:,} queries per input** to bring the effective intensity down to the level "
        f"where the measured curve gives {usable_pct:.1f}% retention (accuracy {bound.usable_accuracy:.4f}). "
        "Under per-input deterministic seeding, repeats return identical logits and no M helps.")

o1, o2, o3 = st.columns(3)
# The simulation at these three defaults is computed once the Calibrate page settles (attack_prefetch).
m_max = o1.selectbox("largest M", attack_prefetch.M_MAX_CHOICES,
                     index=attack_prefetch.M_MAX_CHOICES.index(attack_prefetch.DEFAULT_M_MAX), key="attack_m_max")
repeats = o2.number_input("simulation repeats", min_value=1, max_value=50, value=attack_prefetch.DEFAULT_REPEATS,
                          key="attack_repeats",
                          help="Independent passes over all inputs; more = smaller error bars. "
                               "The fresh-noise estimators take at most "
                               f"{DEFAULT_MAX_DRAWS:,} noise values each (fewer inputs when that binds).")
seed = o3.number_input("simulation seed", min_value=0, value=attack_prefetch.DEFAULT_SEED, key="attack_seed")
m_values = powers_of_two(m_max)

m_curve = m_grid(m_max)
measured, logistic = analytic_attack(cal, sigma, m_curve)


def _request_run(key):
    # A callback, not `if st.button(...)`: the request survives a rerun.
    st.session_state["attack_run_key"] = key


run_key = (data.sha256, sigma, m_max, repeats, seed)
simulation = None
if attack_prefetch.runs_at_once(data, repeats) or st.session_state.get("attack_run_key") == run_key:
    simulation = cache.attack(data, sigma=sigma, m_values=m_values, repeats=repeats, seed=seed)
else:
    st.button("Run the Monte-Carlo simulation", key="attack_run", icon=":material/play_arrow:",
              on_click=_request_run, args=(run_key,))

st.plotly_chart(
    figures.attack_figure(
        m_curve=m_curve, measured=measured, logistic=logistic, simulation=simulation,
        clean=cal.clean_accuracy, chance=cal.chance, target=served_accuracy,
        usable=bound.usable_accuracy,
        m_bound=bound.queries if bound.queries is not None and bound.queries <= m_max else None),
    width="stretch", key="fig_attack", config=figures.chart_config(f"{data.name}_attack_cost"))
st.caption(
    "Lines: Proposition 2 analytically, the measured curve at σ/√M and the logistic at v/M. "
    "Markers: the averaging attack simulated on these logits through the serving runtime, "
    "with fresh i.i.d. noise per query and with per-input deterministic seeding; soft average of "
    "the M logit vectors, and the hard-label variant (majority vote of the M top-1 answers)."
)

if simulation is not None:
    last = m_values[-1]

    def _headline(seeding, estimator):
        row = simulation[(simulation["seeding"] == seeding) & (simulation["estimator"] == estimator)
                         & (simulation["m"] == last)].iloc[0]
        return plus_minus(row["accuracy"], normal_half_width(row["accuracy_se"])), int(row["trials"])

    s = st.columns(3)
    for col, (seeding, estimator, label) in zip(s, (
            ("fresh", "soft-average", f"fresh noise, soft average, M={last}"),
            ("fresh", "majority-vote", f"fresh noise, majority vote, M={last}"),
            ("per-input", "soft-average", f"per-input seeding, M={last}"))):
        shown, trials = _headline(seeding, estimator)
        note = ("Identical answers to repeats: the same accuracy as one query. " if seeding == "per-input"
                else "")
        col.metric(label, shown, help=f"{note}Mean accuracy ± its 95% Monte-Carlo half-width over "
                                      f"{trials:,} (input, repeat) trials.")
    passes = simulation.attrs.get("per_input_passes", ())
    if len(passes) > 1:
        st.caption("Per-input seeding, accuracy of each repeat: " + ", ".join(f"{p:.4f}" for p in passes)
                   + f". Expected (measured curve at σ): {served_accuracy:.4f}.")
    with st.expander("Simulation table"):
        st.dataframe(simulation, hide_index=True, width="stretch")
        ui.csv_download(simulation, label="Simulation (CSV)", file_name=f"{data.name}.attack.csv",
                        key="attack_csv")
else:
    st.info(f"The simulation on this file ({data.n_samples:,} × {data.n_classes} logits, M up to "
            f"{m_max}) takes a while: press the button to run it.")
