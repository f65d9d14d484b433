"""Calibrate a model in the background as soon as it is loaded, so the Calibrate page reads a result.

The calibration is the dashboard's slowest step (about 4 s for a 10,000 x 1,000
file here). It used to start when a visitor first opened the Calibrate page,
who then waited for it. Now :func:`start` is called whenever a model joins a
session (an upload, a file opened from the data root, a restored workspace):
one background worker fills the same process-wide slots the page reads
(:func:`.cache.fill_calibration` with the model's margin statistic, then the
curves, the bootstrap, the default view's figure and the Policy page's default
config), while the visitor is still looking at the Data page. A visitor who reaches the
Calibrate page first sees the job's own progress bar
(:func:`wait_with_progress`) instead of a second computation.

Each job runs with the submitting session's script context attached, so the
workspace's stored copy is read (or the result stored) exactly as when the
page computes it. Only inside a running server (:func:`.background.serving`):
under ``AppTest`` and in scripts nothing starts, and the page computes as before.
"""

from __future__ import annotations

import concurrent.futures
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

from . import background, cache, state

_LOG = logging.getLogger(__name__)
_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caliber-precalibrate")
_lock = threading.Lock()
_MAX_JOBS = 64


@dataclass
class Job:
    """One background calibration: its progress (0..1), whether the Calibrate page's part is ready,
    and whether the whole job (the Policy page's default config too) has ended."""

    name: str
    fraction: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)
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

    def report(fraction: float) -> None:  # the sweep is most of the work: 0..0.85
        job.fraction = min(0.85, max(job.fraction, 0.85 * float(fraction)))

    save_later: list = []  # the workspace's copy: written once the page's first visit has what it reads
    try:
        with cache.quietly():
            cal = cache.fill_calibration(data, statistic=statistic, progress=report, save_later=save_later)
            # What the page's first visit draws next: the curves, the bootstrap, the default view.
            cache.curves(data, cal)
            job.fraction = 0.92
            cache.estimator(data, cal)
            job.fraction = 0.96
            cache.figure(data, cal, calibrate_plots.VIEWS[0])
            job.fraction = 1.0
            job.ready.set()  # a visitor waiting on the Calibrate page goes on from here
            # The first readout (the default kind and target, on the point): its sigma is an exact
            # inversion (about 1 s at 10,000 x 1,000), which a first visit would otherwise compute.
            kind = kinds_for(cal.has_labels)[0]  # the kind the page opens on (ui.target_kind)
            start = slider_range(kind, clean_accuracy=cal.clean_accuracy, n_classes=cal.n_classes).default
            cache.fill_readout(data, cal, kind, percent_to_fraction(start))
            if data.has_labels and statistic == "median":  # the Policy page's default levels
                from caliber_dashboard.common.targets import target_list
                from caliber_dashboard.policy.view import DEFAULT_CHOICES

                cache.config(data, target_list(DEFAULT_CHOICES["retention"], "", ""))
    except Exception:  # noqa: BLE001  (the page computes again and shows the error where it belongs)
        _LOG.info("background calibration of a model failed; the Calibrate page will report it", exc_info=True)
    finally:
        job.fraction = 1.0
        job.ready.set()
        try:
            for save in save_later:  # the workspace's copy (a failure to keep it warns on the page itself)
                save()
        except Exception:  # noqa: BLE001  (not kept: a server restart computes it again)
            _LOG.info("background calibration: keeping it in the workspace failed", exc_info=True)
        job.done.set()


def running(data: LogitsData, *, statistic: str = "median") -> Job | None:
    """The background job for this model and statistic while the Calibrate page's part is not ready."""
    with _lock:
        job = _jobs.get(_key(data, statistic))
    return job if job is not None and not job.ready.is_set() else None


def wait_with_progress(data: LogitsData, *, statistic: str = "median", poll_s: float = 0.2) -> None:
    """If a background job is calibrating this model, show its progress until it ends.

    The page then reads the result from the cache (or, if the job failed,
    computes it itself and shows the error).
    """
    job = running(data, statistic=statistic)
    if job is None:
        return
    text = f"Calibrating {data.name}: noise sweep over {data.n_samples:,} inputs (started when it was loaded)…"
    bar = st.progress(job.fraction, text=text)
    try:
        while not job.ready.wait(poll_s):
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
