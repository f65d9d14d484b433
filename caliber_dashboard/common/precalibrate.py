"""Calibrate a model in the background as soon as it is loaded, so the Calibrate page reads a result.

The calibration is the dashboard's slowest step (about 4 s for a 10,000 x 1,000
file here). It used to start when a visitor first opened the Calibrate page,
who then waited for it. Now :func:`start` is called whenever a model joins a
session (an upload, a file opened from the data root, a restored workspace):
one background worker fills the same process-wide slots the page reads
(:func:`.cache.fill_calibration` with the model's margin statistic, then the
bootstrap and the first readout, while a second thread takes the curves and the
default view's figure), while the visitor is still looking at the Data page. A visitor who reaches the
Calibrate page first sees the job's own progress bar
(:func:`wait_with_progress`) instead of a second computation, until the readout's
part is there: the page draws its header and readout while the job finishes
the curves its plot needs, and the browser's drawing overlaps that computation.
At 10,000 x 1,000 the two parts take about 0.15 and 0.35 s here: side by side,
the plot's part is over about 0.1-0.5 s sooner than after the readout's.

What no page waits for comes last, on a second thread: the workspace's copy,
then the Policy page's default config and its replay of the accounts (0.3 s here).
They wait until the first Calibrate visit has been sent (:func:`page_drawn`) and
drawn, or at most :data:`LATER_WAIT_S`: started at once, they shared the two cores
here with that visit's script run and the browser's drawing of it.

The replay runs on a thread of its own at the lowest CPU priority
(:func:`.background.lowest_priority`): a visitor's own runs and the browser's drawing
go first. Nothing else here does: the first Calibrate visit waits for the calibration,
and the config and the workspace's copy hold locks a page may wait for.

Each job runs with the submitting session's script context attached, so the
workspace's stored copy is read (or the result stored) exactly as when the
page computes it. Only inside a running server (:func:`.background.serving`):
under ``AppTest`` and in scripts nothing starts, and the page computes as before.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from dataclasses import dataclass, field

import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_core.loading import LogitsData

from caliber_dashboard.calibrate import plots as calibrate_plots
from caliber_dashboard.common.targets import kinds_for, percent_to_fraction, slider_range

from . import background, cache, names, state

_LOG = logging.getLogger(__name__)
_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-precalibrate")
_later = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-precalibrate-later")
# The Policy page's replay alone yields the cores: it holds no lock a page waits for (the config before it
# holds the model's, and the workspace's copy the database's, so those run at the normal priority).
_replay = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-precalibrate-replay",
                                                initializer=background.lowest_priority)
_plot = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-precalibrate-plot")
_lock = threading.Lock()
_MAX_JOBS = 64
#: How long the Policy page's config waits for the first Calibrate visit to be drawn (s).
LATER_WAIT_S = 8.0
#: Then how long the browser gets to draw what that visit's run sent (0.5-1 s here).
BROWSER_DRAW_S = 1.0


@dataclass
class Job:
    """One background calibration: its progress (0..1) and its stages.

    ``readout``: the calibration, its bootstrap and the first readout are cached (the
    Calibrate page draws its header and readout); ``ready``: the curves and the default
    view's figure too; ``drawn``: the page's first visit has been sent; ``done``: the
    whole job (the workspace's copy, the Policy page's default config and replay) has ended.
    """

    name: str
    fraction: float = 0.0
    readout: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    drawn: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)


_jobs: dict[tuple, Job] = {}


def _key(data: LogitsData, statistic: str) -> tuple:
    return (cache.data_digest(data), statistic)


def start(data: LogitsData, *, statistic: str = "median") -> Job | None:
    """Queue the calibration of ``data`` unless it is cached or queued already; the job, or None.

    Parameters
    ----------
    data : LogitsData
        A model that just joined the session.
    statistic : str
        The margin statistic the Calibrate page will ask for (the model's stored choice).
    """
    ctx = get_script_run_ctx()
    if ctx is None or not background.serving() or cache.has_calibration(data, statistic=statistic):
        return None
    key = _key(data, statistic)
    with _lock:
        job = _jobs.get(key)
        if job is not None and not job.done.is_set():
            return job
        job = _jobs[key] = Job(data.name)
        while len(_jobs) > _MAX_JOBS:  # forget the oldest finished ones
            oldest = next((k for k, j in _jobs.items() if j.done.is_set()), None)
            if oldest is None:
                break
            del _jobs[oldest]
    _worker.submit(_run, ctx, job, data, statistic)
    return job


def _run(ctx, job: Job, data: LogitsData, statistic: str) -> None:
    add_script_run_ctx(threading.current_thread(), ctx)

    def report(fraction: float) -> None:  # the sweep is most of the work: 0..0.8
        job.fraction = min(0.8, max(job.fraction, 0.8 * float(fraction)))

    save_later: list = []  # the workspace's copy: written once the page's first visit has what it reads
    cal = plot = None
    try:
        with cache.quietly():
            cal = cache.fill_calibration(data, statistic=statistic, progress=report, save_later=save_later)
            # What its plot reads, on a second thread while this one takes the readout's part: the
            # two need a core each for a fraction of a second, and the page's run is waiting.
            plot = _plot.submit(_plot_part, ctx, data, cal)
            # What the page's header and first readout read: the bootstrap, then the default kind
            # and target on the point (the kind the page opens on is ui.target_kind's).
            cache.estimator(data, cal)
            job.fraction = 0.88
            kind = kinds_for(cal.has_labels)[0]
            start = slider_range(kind, clean_accuracy=cal.clean_accuracy, n_classes=cal.n_classes).default
            cache.fill_readout(data, cal, kind, percent_to_fraction(start))
            job.fraction = 0.9
            job.readout.set()  # a visitor waiting on the Calibrate page draws from here
            plot.result()
            plot = None
    except Exception:  # noqa: BLE001  (the page computes again and shows the error where it belongs)
        cal = None
        _LOG.info("background calibration of a model failed; the Calibrate page will report it", exc_info=True)
    finally:
        job.fraction = 1.0
        job.readout.set()
        if plot is not None:  # the readout's part failed: the plot's still ends before "ready"
            concurrent.futures.wait([plot])
        job.ready.set()
        try:
            _later.submit(_after_ready, ctx, job, data, cal, save_later)
        except RuntimeError:  # the interpreter is shutting down: nothing more to keep
            job.done.set()


def _plot_part(ctx, data: LogitsData, cal) -> None:
    """The curves and the default view's figure (the Calibrate page's plot)."""
    add_script_run_ctx(threading.current_thread(), ctx)
    with cache.quietly():
        cache.curves(data, cal)
        cache.figure(data, cal, calibrate_plots.VIEWS[0])


def _after_ready(ctx, job: Job, data: LogitsData, cal, save_later: list) -> None:
    """The workspace's copy, then (once the first visit is drawn) the Policy page's default config and replay."""
    add_script_run_ctx(threading.current_thread(), ctx)
    try:
        for save in save_later:  # a failure to keep it warns on the page itself
            save()
    except Exception:  # noqa: BLE001  (not kept: a server restart computes it again)
        _LOG.info("background calibration: keeping it in the workspace failed", exc_info=True)
    try:
        if cal is not None and data.has_labels and cal.statistic == "median":  # the Policy page's default levels
            if job.drawn.wait(LATER_WAIT_S):
                time.sleep(BROWSER_DRAW_S)
            with cache.quietly():  # a Policy visit in the meantime computed it, or waits for it here
                replay = _policy_default(data)
            _replay.submit(_quietly, ctx, replay).result()
    except Exception:  # noqa: BLE001  (the Policy page computes it again and reports the error)
        _LOG.info("background calibration: the Policy page's default config failed", exc_info=True)
    finally:
        job.done.set()


def _policy_default(data: LogitsData):
    """The Policy page's config for the model's saved (else default) choices, as the page builds it; its replay,
    to call."""
    from caliber_core.config import config_to_json
    from caliber_core.throttle.policy import policy_to_json
    from caliber_dashboard.common.targets import target_list
    from caliber_dashboard.policy import view as policy_view

    chosen = policy_view.choices(state.model_options(data.sha256).get("policy"))
    _, _, config = cache.config(data, target_list(chosen["retention"], "", ""))
    config_text = config_to_json(config)
    doc, _ = policy_view.policy_document(config_text, config, config_name=policy_view.config_file_name(data.name),
                                         chosen=chosen)
    # Without an extraction run (a model just loaded has none): the page replays with one only if it has one.
    return functools.partial(cache.policy_simulation, policy_to_json(doc), config_text,
                             detect_after=int(chosen["escalate_after"]))


def _quietly(ctx, func) -> None:
    add_script_run_ctx(threading.current_thread(), ctx)
    with cache.quietly():
        func()


def _job(data: LogitsData, statistic: str) -> Job | None:
    with _lock:
        return _jobs.get(_key(data, statistic))


def running(data: LogitsData, *, statistic: str = "median") -> Job | None:
    """The background job for this model and statistic while the readout's part is not ready."""
    job = _job(data, statistic)
    return job if job is not None and not job.readout.is_set() else None


def page_drawn(data: LogitsData, *, statistic: str = "median") -> None:
    """Say that a Calibrate run for this model has been sent: the job's last stage may start."""
    job = _job(data, statistic)
    if job is not None:
        job.drawn.set()


def wait_with_progress(data: LogitsData, *, statistic: str = "median", poll_s: float = 0.2) -> None:
    """If a background job is calibrating this model, show its progress until the readout's part is ready.

    The page then reads the result from the cache (or, if the job failed,
    computes it itself and shows the error); the curves may still be on their
    way, and the plot waits for them.
    """
    job = running(data, statistic=statistic)
    if job is None:
        return
    text = f"Calibrating {names.markdown_text(data.name)}: noise sweep over {data.n_samples:,} inputs (started when it was loaded)…"
    bar = st.progress(job.fraction, text=text)
    try:
        while not job.readout.wait(poll_s):
            bar.progress(job.fraction, text=text)
    finally:
        bar.empty()


def start_for_model(data: LogitsData) -> None:
    """Start a newly added model's calibration (with its statistic); the demo set is the warm-up's."""
    if data.sha256 in {d.sha256 for d in state.demo_models()}:
        return  # the server's warm-up calibrates the demo set
    statistic = state.model_options(data.sha256).get("statistic")
    start(data, statistic=statistic if statistic in MARGIN_STATISTICS else "median")


state.on_model_added(start_for_model)
