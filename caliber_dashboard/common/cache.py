"""Results cached by content digest, computed with a progress bar only on a miss.

The dashboard's one cache registry: every page and helper that keeps a
computed result asks this module (the extraction runs keep theirs in
``extraction.view``, beside the training code).

A Streamlit cache replays the ``st.*`` calls made inside a cached function,
and a progress bar created outside it cannot be replayed
(``CacheReplayClosureError``). So the cached functions here hold no numerics
and call no ``st.*``: each ``_*_slot`` is an ``st.cache_resource`` table (made by
:func:`_slots`, one per kind of result) keyed by the content digest (sha256 of
the file and labels) plus the options, bounded with ``max_entries``; it returns
a slot that the first caller fills *outside* the cache, drawing ``st.progress``
from the core's ``progress`` callback. Later reruns, pages and sessions with
the same content find the slot filled and draw nothing. Uploaded data never enters a cache key other than by digest.

A result keyed by content is shared by every workspace holding those bytes, so it carries no
name: calibrations and configs are built from :func:`unnamed` data and each caller gets a copy
with its own model and file names put back; the fleet tables, which name each pooled model,
have the names in their keys.

The server's warm-up thread (``warmup``) fills the same slots for the demo
set before anyone asks; it runs inside :func:`quietly`, so a miss there draws
no progress bar (there is no page to draw on).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

import plotly.graph_objects as go

from caliber_core.calibration import fleet
from caliber_core.calibration import pipeline
from caliber_core.calibration.corridor import ModelCurves, model_curves
from caliber_core.calibration.engine import choose_method
from caliber_core.calibration.margins import MARGIN_STATISTICS, scale_from_margins
from caliber_core.calibration.intervals import DEFAULT_CONFIDENCE, BootstrapIntervals, IntervalBands, IntervalSet
from caliber_core.calibration.target_intervals import interval_estimator, with_interval
from caliber_core.simulation.attack_estimate import estimate_averaging_attack
from caliber_core.calibration.calibrate import Calibration, sigma_for_target
from caliber_core.config import TargetRecord
from caliber_core.loading import LogitsData
from caliber_core.loading.checks import margins_in_chunks

from caliber_dashboard.calibrate import plots as calibrate_plots
from caliber_dashboard.common import figures, names, readouts, tables
from caliber_dashboard.common.curves import sigma_grid

_EMPTY = object()
_thread = threading.local()  # marks the warm-up thread: fill without drawing


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Fill caches in this thread without progress bars or spinners (no page to draw on)."""
    _thread.quiet = True
    try:
        yield
    finally:
        _thread.quiet = False


def data_digest(data: LogitsData) -> str:
    """Content digest of a loaded model, the key of every cache here: the file's sha256 plus its labels.

    The file digest alone is not enough: the same ``.npy`` logits can be
    loaded with and without a separate labels file.
    """
    h = hashlib.sha256(data.sha256.encode())
    if data.labels is not None:
        h.update(np.ascontiguousarray(data.labels, dtype=np.int64).tobytes())
    else:
        h.update(b"no-labels")
    return h.hexdigest()


class _Slot:
    """One cached value, filled once under a lock (concurrent sessions wait)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Any = _EMPTY


def _slots(kind: str, *, max_entries: int, make: Callable[[], Any] = _Slot) -> Callable[[Hashable], Any]:
    """The table of one kind of result: ``table(key)`` is that key's slot, the same object
    for every rerun, page and session of this server until the table evicts it.

    Parameters
    ----------
    kind : str
        The result's name; it names the Streamlit cache, so two tables never share entries.
    max_entries : int
        How many keys the table keeps (least recently used goes first): bounds memory.
    make : callable, optional
        Makes a key's empty entry: a :class:`_Slot` (filled by :func:`_fill`), or a lock.

    Returns
    -------
    callable
        ``key -> entry``; the key is hashed by value (tuples of the content digest and options).

    Notes
    -----
    A Streamlit cache is identified by its function's module and qualified
    name, so each table's function is given its own name before it is cached.
    One table per kind of result: a flood of cheap entries cannot evict the
    expensive ones.
    """
    def entry(key: Hashable) -> Any:
        return make()

    entry.__name__ = entry.__qualname__ = f"_{kind}_slot"
    return st.cache_resource(max_entries=max_entries, show_spinner=False)(entry)


# Sizes bound memory: a Calibration holds its logits, a target or readout is small.
_calibration_slot = _slots("calibration", max_entries=24)
_curves_slot = _slots("curves", max_entries=24)
_target_slot = _slots("target", max_entries=512)
_estimator_slot = _slots("estimator", max_entries=24)
_served_slot = _slots("served", max_entries=512)
_model_lock = _slots("model_lock", max_entries=24, make=threading.Lock)  # one computation per model at a time
_bands_slot = _slots("bands", max_entries=24)
_figure_slot = _slots("figure", max_entries=72)
_config_slot = _slots("config", max_entries=32)
_margins_slot = _slots("margins", max_entries=64)
_histogram_slot = _slots("histogram", max_entries=16)
_model_row_slot = _slots("model_row", max_entries=64)
_attack_slot = _slots("attack", max_entries=32)
_fleet_slot = _slots("fleet", max_entries=32)
_policy_slot = _slots("policy_simulation", max_entries=16)

# Neighbouring slider targets are computed here while the page is drawn (see served()).
_prefetcher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-prefetch")
#: Seconds a prefetch waits before it starts: the step that asked for it is still
#: sending its elements, and a thread computing beside it holds the interpreter lock
#: in 5 ms turns that the server's sending thread would wait for.
PREFETCH_PAUSE_S = 0.25


def _fill(slot: _Slot, compute: Callable[[Callable[[float], None] | None], Any], *,
          progress_text: str | None = None, spinner_text: str | None = None) -> Any:
    """The slot's value; on a miss compute it, with a progress bar or a spinner."""
    if slot.value is not _EMPTY:
        return slot.value
    quiet = getattr(_thread, "quiet", False)
    if not slot.lock.acquire(blocking=False):  # another session, or a background thread, is computing it
        if quiet or (progress_text is None and spinner_text is None):
            slot.lock.acquire()
        else:
            with st.spinner(f"{(progress_text or spinner_text).rstrip('…')}: already under way…"):
                slot.lock.acquire()
    try:
        if slot.value is not _EMPTY:  # filled while we waited
            return slot.value
        if quiet:
            progress_text = spinner_text = None
        if progress_text is not None:
            with progress_bar(progress_text) as report:
                value = compute(report)
        elif spinner_text is not None:
            with st.spinner(spinner_text):
                value = compute(None)
        else:
            value = compute(None)
        slot.value = value
        return value
    finally:
        slot.lock.release()


#: Seconds between two redraws of a progress bar: each redraw is a message the browser renders
#: while the computation it reports on wants the same cores (0.1-0.3 s of a Verify click here).
PROGRESS_EVERY_S = 0.25


def progress_report(bar, text: str | None = None) -> Callable[[float], None]:
    """``report(fraction)`` for a computation's progress: redraws ``bar`` at most every
    :data:`PROGRESS_EVERY_S`, and at the end."""
    last = [time.monotonic()]

    def report(fraction: float) -> None:
        f = min(1.0, max(0.0, float(fraction)))
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or f >= 1.0:
            last[0] = now
            bar.progress(f, text=text)

    return report


@contextlib.contextmanager
def progress_bar(text: str) -> Iterator[Callable[[float], None]]:
    """A progress bar for work the page waits on: yields its ``report(fraction)`` (redrawn as
    :func:`progress_report` does); the bar is gone once the work ends, or fails."""
    bar = st.progress(0.0, text=text)
    try:
        yield progress_report(bar, text)
    finally:
        bar.empty()


def _realizations(realizations: int | None) -> int | None:
    # None means "the core's default" (a function of N and K): a stable key in one process.
    return None if realizations is None else int(realizations)


def calibration(data: LogitsData, *, statistic: str = "median", seed: int = 0,
                realizations: int | None = None) -> Calibration:
    """``pipeline.calibrate_data`` with the CLI's defaults, cached by content digest."""
    from caliber_dashboard.common import calibration_store  # not in this process: the workspace's copy, else compute and keep

    key = (data_digest(data), statistic, seed, _realizations(realizations))
    shared = _fill(
        _calibration_slot(key),
        lambda progress: _unnamed_calibration(calibration_store.stored_or_computed(
            data, statistic=statistic, seed=seed, realizations=realizations,
            compute=lambda: pipeline.calibrate_data(unnamed(data), statistic=statistic, seed=seed,
                                                    realizations=realizations, progress=progress))),
        progress_text=f"Calibrating {names.markdown_text(data.name)}: noise sweep over {data.n_samples} inputs…",
    )
    return _named_calibration(shared, data)


#: The name every shared result carries: a result cached by content is shared by every workspace
#: that uploads those bytes, so it holds no visitor's name; each caller gets its own name put back.
NO_NAME = "model"


def unnamed(data: LogitsData) -> LogitsData:
    """``data`` without its names (the same arrays): what a result shared across workspaces is built from."""
    return dataclasses.replace(data, name=NO_NAME, source=NO_NAME,
                               labels_source=None if data.labels_source is None else NO_NAME)


def _unnamed_calibration(cal: Calibration) -> Calibration:
    if cal.name == NO_NAME:
        return cal
    out = copy.copy(cal)
    out.name = NO_NAME
    return out


def _named_calibration(cal: Calibration, data: LogitsData) -> Calibration:
    """A shallow copy of a shared calibration carrying this visitor's name for ``data``."""
    out = copy.copy(cal)
    out.name = data.name
    return out


def _named_config(config: dict, data: LogitsData) -> dict:
    """A shared config with this visitor's model name and file name put in."""
    return {**config, "model": data.name, "source": data.source}


def has_calibration(data: LogitsData, *, statistic: str = "median", seed: int = 0,
                    realizations: int | None = None) -> bool:
    """Whether :func:`calibration` would answer from this process's cache at once."""
    key = (data_digest(data), statistic, seed, _realizations(realizations))
    return _calibration_slot(key).value is not _EMPTY


def fill_calibration(data: LogitsData, *, statistic: str = "median", seed: int = 0,
                     realizations: int | None = None,
                     progress: Callable[[float], None] | None = None,
                     save_later: list | None = None) -> Calibration:
    """:func:`calibration` without drawing, reporting to ``progress``: for a background thread.

    Fills the same slot (the workspace's stored copy, else computed and stored),
    so the page that asks later reads the result. With ``save_later`` the storing
    is left to the caller (``calibration_store.stored_or_computed``).
    """
    from caliber_dashboard.common import calibration_store

    slot = _calibration_slot((data_digest(data), statistic, seed, _realizations(realizations)))
    if slot.value is not _EMPTY:
        return slot.value
    with slot.lock:
        if slot.value is _EMPTY:
            slot.value = calibration_store.stored_or_computed(
                data, statistic=statistic, seed=seed, realizations=realizations, save_later=save_later,
                compute=lambda: pipeline.calibrate_data(data, statistic=statistic, seed=seed,
                                                        realizations=realizations, progress=progress))
        return slot.value


def _model_key(data: LogitsData, cal: Calibration) -> tuple:
    return (data_digest(data), cal.statistic, cal.seed, cal.intervals.realizations)


def curves(data: LogitsData, cal: Calibration, *, n_points: int = 60) -> ModelCurves:
    """Agreement, expected accuracy and the corridor on the page's grid, cached.

    Exact by quadrature when the whole grid is cheap, else from the sweep's draws
    (``engine.choose_method`` for ``n_points`` sigmas decides; the curves say which).
    """
    method = choose_method(cal.n_samples, cal.n_classes, n_points)
    return _fill(
        _curves_slot(_model_key(data, cal) + (n_points,)),
        lambda progress: model_curves(cal.logits, cal.labels, sigma_grid(cal, n_points),
                                      draws=cal.intervals, method=method, progress=progress),
        progress_text=f"Curves and accuracy corridor for {names.markdown_text(data.name)}…",
    )


def estimator(data: LogitsData, cal: Calibration) -> BootstrapIntervals:
    """The row bootstrap of one model (``target_intervals.interval_estimator``), cached."""
    return _fill(_estimator_slot(_model_key(data, cal)), lambda _: interval_estimator(cal))


def served(data: LogitsData, cal: Calibration, kind: str, value: float, *,
           side: str = "point") -> tuple[TargetRecord, IntervalSet]:
    """The target as a config serves it, and the intervals of what its sigma delivers. Cached.

    Off the point, the sigma and record are ``target_intervals.with_interval``'s,
    the function the command line writes into a config, so the readout and an
    exported config agree. Raises ValueError (not cached) for a target out of
    reach or a side that cannot be guaranteed.
    """
    model = _model_key(data, cal)

    def compute(_):
        # One computation per model at a time: the bootstrap's own cache is not thread-safe.
        with _model_lock(model):
            record = target(data, cal, kind, value)
            est = estimator(data, cal)
            # The point needs no drift reference for a readout: sigma* and its intervals only.
            rec = record if side == "point" else with_interval(cal, record, est, side=side)
            return rec, est.at(rec.sigma)

    return _fill(_served_slot(model + (kind, float(value), side)), compute)


def sigma_range(data: LogitsData, cal: Calibration, kind: str, value: float, *,
                side: str = "point") -> tuple[float, float] | None:
    """The σ range of the σ served: where the measured curve crosses the ends of the
    quantity's interval at that σ (:func:`served`'s bootstrap). Cached.

    Meaning: the σ values whose sample ``kind`` lies within the interval of what the
    σ served delivers; it contains the σ served. None when an end is out of the
    curve's reach (e.g. an interval end above the clean value).
    """
    record, intervals = served(data, cal, kind, value, side=side)
    interval = intervals.get(kind)
    if interval is None or not record.sigma > 0:
        return None

    def compute(_):
        return readouts.sigma_range(cal, record.sigma, interval, kind)

    return _fill(_served_slot(_model_key(data, cal) + (kind, float(value), side, "sigma-range")), compute)


def side_bound(data: LogitsData, cal: Calibration, kind: str, value: float, *, side: str) -> float:
    """The one-sided bound of ``kind`` at the sigma :func:`served` serves on ``side``. Cached.

    "at-least": the lower confidence bound (a fraction), "at-most": the upper one:
    what the side guarantees the population at the bootstrap's level.
    """
    if side not in ("at-least", "at-most"):
        raise ValueError(f"side must be 'at-least' or 'at-most', got {side!r}")
    record, _ = served(data, cal, kind, value, side=side)
    model = _model_key(data, cal)

    def compute(_):
        with _model_lock(model):
            return float(estimator(data, cal).bound(record.sigma, kind=kind, side=side)[0])

    return _fill(_served_slot(model + (kind, float(value), side, "bound")), compute)


def prefetch(data: LogitsData, cal: Calibration, kind: str, values: Sequence[float], *,
             side: str = "point") -> None:
    """Compute what a readout shows for ``values`` (the slider's neighbours) in the background.

    :func:`served`, :func:`sigma_range` and, off the point, :func:`side_bound`:
    the next step then finds its readout ready (the σ range alone is two curve
    inversions, 30-60 ms a step here when left to the step itself).
    """
    key = _model_key(data, cal) + (kind,)
    for v in values:
        if _served_slot(key + (float(v), side, "sigma-range")).value is _EMPTY:  # filled last
            _prefetcher.submit(_prefetch_one, data, cal, kind, float(v), side)


def _prefetch_one(data, cal, kind, value, side) -> None:
    time.sleep(PREFETCH_PAUSE_S)
    fill_readout(data, cal, kind, value, side=side)


def fill_readout(data: LogitsData, cal: Calibration, kind: str, value: float, *, side: str = "point") -> None:
    """Compute into the cache what the readout of one target shows; a target out of reach is left to the page."""
    try:
        with quietly():
            served(data, cal, kind, value, side=side)
            sigma_range(data, cal, kind, value, side=side)
            if side != "point":
                side_bound(data, cal, kind, value, side=side)
    except ValueError:
        pass  # out of reach: the page says so if that value is ever asked for


def margin_histogram(shown: Sequence[tuple[str, LogitsData]], *, normalized: bool) -> go.Figure:
    """The Data page's margin histograms of ``shown`` ((label, model) pairs), built once per models and axis.

    Plotly builds a figure of eight models slowly (0.1-0.4 s, much of a Data page
    run), and every upload or visit redraws the page. Shared by every session:
    never modify it.
    """
    key = (tuple((label, data_digest(data)) for label, data in shown), bool(normalized))

    def compute(_):
        hist_data = {}
        for label, data in shown:
            m = margins(data)
            x = tables.histogram_rows(m)
            hist_data[label] = x / scale_from_margins(m) if normalized else x
        return figures.margin_histogram(
            hist_data, x_title="top-two margin m / S (dimensionless)" if normalized
            else "top-two logit margin m (logit units)")

    return _fill(_histogram_slot(key), compute)


def bands(data: LogitsData, cal: Calibration) -> IntervalBands:
    """The bootstrap's confidence bands on the page's grid, from the curves' own per-row values."""
    def compute(_):
        est, curve_set = estimator(data, cal), curves(data, cal)
        # Same weights as the readout's bootstrap (same seed), over the rows the curves kept.
        boot = BootstrapIntervals(curve_set.rows, confidence=est.confidence,
                                  resamples=est.resamples, seed=est.seed)
        return boot.bands(curve_set.sigma)

    return _fill(_bands_slot(_model_key(data, cal)), compute,
                 spinner_text=f"Confidence bands for {data.name}…")


def figure(data: LogitsData, cal: Calibration, view: str, *, with_bands: bool = False) -> go.Figure:
    """One view of the Calibrate page without its target, built once per model and view.

    Shared by every session: never modify it; ``calibrate_plots.target_figure`` copies it
    (once per session and view; a slider step then moves the target on that copy).
    """
    def compute(_):
        return calibrate_plots.base_figure(cal, curves(data, cal), view,
                           bands=bands(data, cal) if with_bands else None)

    return _fill(_figure_slot(_model_key(data, cal) + (view, bool(with_bands))), compute)


def target(data: LogitsData, cal: Calibration, kind: str, value: float, *,
           inversion: str = "curve", saturate: bool = False) -> TargetRecord:
    """``sigma_for_target`` cached per (content, statistic, kind, value).

    Raises ValueError (not cached) for an unreachable target.
    """
    key = (data_digest(data), cal.statistic, cal.seed, cal.intervals.realizations,
           kind, float(value), inversion, bool(saturate))
    return _fill(_target_slot(key),
                 lambda _: sigma_for_target(cal, value, kind=kind, inversion=inversion,
                                            saturate=saturate))


def config(data: LogitsData, targets: Sequence[tuple[str, float]], *, statistic: str = "median",
           seed: int = 0, realizations: int | None = None, inversion: str = "curve",
           saturate: bool = False, side: str = "point", confidence: float = DEFAULT_CONFIDENCE):
    """The CLI's config on the calibration :func:`calibration` holds: (calibration, results, config)."""
    cal = calibration(data, statistic=statistic, seed=seed, realizations=realizations)
    results, built = config_on(data, cal, targets, inversion=inversion, saturate=saturate, side=side,
                               confidence=confidence)
    return cal, results, built


def config_on(data: LogitsData, cal: Calibration, targets: Sequence[tuple[str, float]], *,
              inversion: str = "curve", saturate: bool = False, side: str = "point",
              confidence: float = DEFAULT_CONFIDENCE):
    """``pipeline.config_from_calibration`` on a calibration the caller holds, cached: (results, config).

    No sweep runs here: the calibration is the Calibrate page's (:func:`calibration`).
    """
    key = _model_key(data, cal) + (tuple((k, float(v)) for k, v in targets), inversion, bool(saturate),
                                   side, float(confidence))
    model = _model_key(data, cal)

    def compute(_):
        # The page's bootstrap when it is the one the config needs (0.3 s at 10,000 x 1,000 not spent
        # again); one computation per model at a time: the bootstrap's own cache is not thread-safe.
        with _model_lock(model):
            est = estimator(data, cal)
            shared = est if (est.confidence, est.seed) == (float(confidence), cal.seed) else None
            return pipeline.config_from_calibration(_unnamed_calibration(cal), unnamed(data), list(targets),
                                                    inversion=inversion, saturate=saturate, side=side,
                                                    confidence=confidence, estimator=shared)

    results, shared = _fill(_config_slot(key), compute, spinner_text=f"Building the {side} config for {data.name}…")
    return results, _named_config(shared, data)


def margins(data: LogitsData) -> np.ndarray:
    """The model's top-two margins (read-only), taken once per content digest.

    The loader's margin check already has them; a model restored without them
    gets them a block of rows at a time (~0.3 s per pass on 45,000 x 1,000).
    """
    def compute(_):
        m = data.margins
        if m is None:
            m = margins_in_chunks(data.logits)
            m.flags.writeable = False  # shared by every session
        return m

    return _fill(_margins_slot(data_digest(data)), compute)


def model_row(data: LogitsData) -> pd.DataFrame:
    """The Data page's table row of one model (``tables.model_table``), cached by digest, name and file."""
    return _fill(_model_row_slot((data_digest(data), data.name, data.source)),
                 lambda _: tables.model_table([data], margins=[margins(data)]))


def attack(data: LogitsData, *, sigma: float, m_values: Sequence[int], repeats: int = 1,
           seed: int = 0) -> pd.DataFrame:
    """``estimate_averaging_attack`` (both seedings, both estimators), cached."""
    key = (data_digest(data), float(sigma), tuple(int(m) for m in m_values), int(repeats), int(seed))
    return _fill(
        _attack_slot(key),
        lambda progress: estimate_averaging_attack(
            data.logits, data.labels, sigma=sigma, m_values=tuple(m_values), seed=seed,
            repeats=repeats, progress=progress),
        progress_text=f"Simulating the averaging attack on {names.markdown_text(data.name)}…",
    )


def policy_simulation(policy_text: str, config_text: str, *, detect_after: int,
                      extraction: dict | None = None) -> dict:
    """The Policy page's replay of its accounts (``throttle.simulate``), cached by the two JSON texts.

    Shared by every session (the texts name the model): never modify it. The
    background job of a new model fills the page's default (:mod:`.precalibrate`).
    """
    from caliber_core.throttle.simulate import simulate
    from caliber_dashboard.policy import view as policy_view

    key = (policy_text, config_text, int(detect_after), policy_view.frontier_key(extraction))
    return _fill(_policy_slot(key),
                 lambda _: simulate(policy_view.policy_from_text(policy_text, config_text),
                                    detect_after=int(detect_after), extraction=extraction),
                 spinner_text="Replaying the accounts…")


def fleet_report(datas: Sequence[LogitsData], cals: Sequence[Calibration], *,
                 statistic: str) -> dict:
    """Shared fit and leave-one-architecture-out table over several models, cached."""
    key = ("loo", tuple(data_digest(d) for d in datas), tuple(c.statistic for c in cals), statistic,
           _names(cals))

    def compute(_):
        return {
            "shared_fit": fleet.shared_fit(cals, statistic=statistic),
            "leave_one_out": fleet.leave_one_out(cals, statistic=statistic),
        }

    return _fill(_fleet_slot(key), compute,
                 spinner_text=f"Leave-one-architecture-out fits over {len(cals)} models…")


def fleet_sigma_spread(datas: Sequence[LogitsData], cals: Sequence[Calibration], *, statistic: str,
                       value: float) -> np.ndarray:
    """``fleet_view.sigma_spread`` (each pooled model's held-out σ against its own), cached."""
    from caliber_dashboard.fleet.view import sigma_spread

    key = ("spread", tuple(data_digest(d) for d in datas), tuple(c.statistic for c in cals), statistic,
           float(value), _names(cals))
    return _fill(_fleet_slot(key), lambda _: sigma_spread(cals, statistic=statistic, value=value),
                 spinner_text=f"Leave-one-out σ over {len(cals)} models…")


def _names(cals: Sequence[Calibration]) -> tuple:
    """The pooled models' names: a fleet table names its rows, so each set of names has its own entry."""
    return tuple(c.name for c in cals)


def _ablation_key(datas: Sequence[LogitsData], cals: Sequence[Calibration]) -> tuple:
    return ("ablation", tuple(data_digest(d) for d in datas), tuple(c.statistic for c in cals), _names(cals))


def margin_ablation(datas: Sequence[LogitsData], cals: Sequence[Calibration]) -> list[dict]:
    """``fleet.margin_ablation`` (every statistic), cached.

    A leave-one-out table this cache already holds for a statistic is reused,
    not recomputed.
    """
    def compute(_):
        known = {}
        for stat in MARGIN_STATISTICS:
            slot = _fleet_slot(("loo", tuple(data_digest(d) for d in datas),
                                tuple(c.statistic for c in cals), stat, _names(cals)))
            if slot.value is not _EMPTY:
                known[stat] = slot.value["leave_one_out"]
        return fleet.margin_ablation(cals, known=known)

    return _fill(_fleet_slot(_ablation_key(datas, cals)), compute,
                 spinner_text="Margin-statistic ablation (median, mean, trimmed)…")


def has_margin_ablation(datas: Sequence[LogitsData], cals: Sequence[Calibration]) -> bool:
    """Whether :func:`margin_ablation` would answer from the cache."""
    return _fleet_slot(_ablation_key(datas, cals)).value is not _EMPTY
