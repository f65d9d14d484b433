"""A model is calibrated in the background as soon as it is loaded; Calibrate then reads the result."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_dashboard import warmup
from caliber_dashboard.common import background, cache, calibration_store, precalibrate, state
from caliber_dashboard.workspace import SQLiteStore, from_environment

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _npz(seed: int, n: int = 600, k: int = 12) -> bytes:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += 2.5
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y)
    return buf.getvalue()


def _uploaded(name: str, seed: int):
    """The app with ``name``.npz (``_npz(seed)``) uploaded on the Data page, and the model it added."""
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.file_uploader(key="upload_logits").set_value((f"{name}.npz", _npz(seed), "application/octet-stream")).run()
    assert not at.exception
    return at, at.session_state[state.MODELS][at.session_state[state.SELECTED]]


def _wait(data, timeout=240.0) -> None:
    end = time.monotonic() + timeout
    while precalibrate.running(data) is not None:
        assert time.monotonic() < end, "the background calibration did not end"
        time.sleep(0.1)


def test_an_upload_starts_its_calibration_and_the_page_reads_it(monkeypatch):
    monkeypatch.setattr(background, "serving", lambda: True)  # as inside `streamlit run`
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)  # the last stage waits for no visit here
    # ... but not the server's warm-up: its thread is once per process and would outlive this test.
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    at, data = _uploaded("bg", 1)
    _wait(data)
    assert cache.has_calibration(data)  # filled before anyone opened Calibrate
    end = time.monotonic() + 240  # the job goes on past the page's part: the first readout, then storing
    while not all(job.done.is_set() for job in precalibrate._jobs.values()):
        assert time.monotonic() < end, "the background job did not end"
        time.sleep(0.1)
    # ... in the workspace too, under the key the page looks for (a restart reads it back).
    kind, key = calibration_store.store_key(data, statistic="median", seed=0, realizations=None)
    cfg = from_environment()
    token = at.query_params["ws"]
    token = token[0] if isinstance(token, list) else token
    assert SQLiteStore(cfg.data_dir, limits=cfg.limits).load_result(token, kind, key) is not None
    computed, inverted = [], []
    monkeypatch.setattr(cache.pipeline, "calibrate_data", lambda *a, **k: computed.append(1))
    monkeypatch.setattr(cache, "sigma_for_target", lambda *a, **k: inverted.append(1))
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception and not computed  # read, not computed again
    assert not inverted  # the default target's sigma too: the job inverted it before the visit
    assert any(m.label == "inputs N" and m.value == "600" for m in at.metric)


def test_a_visitor_who_arrives_first_waits_for_the_same_job(monkeypatch):
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    release = __import__("threading").Event()
    real = cache.pipeline.calibrate_data
    calls = []

    def slow(*args, **kwargs):  # hold the job until the page is waiting for it
        calls.append(1)
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache.pipeline, "calibrate_data", slow)
    shown = []
    original = precalibrate.wait_with_progress

    def watching(data, **kwargs):
        shown.append(precalibrate.running(data, **kwargs) is not None)
        release.set()
        return original(data, **kwargs)

    monkeypatch.setattr(precalibrate, "wait_with_progress", watching)
    at, _ = _uploaded("first", 2)
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert shown == [True] and calls == [1]  # the page found the job running and did not start another


def test_nothing_starts_outside_a_server():
    _, data = _uploaded("plain", 3)
    assert precalibrate.running(data) is None and not cache.has_calibration(data)


def test_the_page_part_is_ready_before_the_workspace_copy_is_written(monkeypatch):
    # Storing the result (encoding, a disk sync) waits until the first visit has what it reads.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    hold = __import__("threading").Event()
    real = calibration_store.save
    ready_when_saved = []

    def slow_save(data, cal, **options):
        job = precalibrate._jobs[precalibrate._key(data, options["statistic"])]  # this upload's job
        ready_when_saved.append(job.ready.is_set())
        hold.wait(60)
        return real(data, cal, **options)

    monkeypatch.setattr(calibration_store, "save", slow_save)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)
    _, data = _uploaded("later", 4)
    _wait(data)  # the page's part is ready while the copy is held back
    assert cache.has_calibration(data) and ready_when_saved in ([], [True])
    hold.set()
    end = time.monotonic() + 240
    while not all(job.done.is_set() for job in precalibrate._jobs.values()):
        assert time.monotonic() < end, "the background job did not end"
        time.sleep(0.1)
    assert ready_when_saved == [True]


def test_the_page_draws_its_readout_while_the_curves_are_computed(monkeypatch):
    # The job's first stage ends with the first readout: the page draws its header and readout
    # from there while the job computes the curves its plot reads.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)
    release = threading.Event()
    real = cache.model_curves

    def slow_curves(*args, **kwargs):
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "model_curves", slow_curves)
    seen = []
    original = precalibrate.wait_with_progress

    def watching(data, **kwargs):
        original(data, **kwargs)
        job = precalibrate._jobs[precalibrate._key(data, kwargs.get("statistic", "median"))]
        seen.append((job.readout.is_set(), job.ready.is_set()))
        release.set()  # the curves go on; the plot waits for them

    monkeypatch.setattr(precalibrate, "wait_with_progress", watching)
    at, _ = _uploaded("overlap", 5)
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert seen == [(True, False)]  # past the wait with the readout, the curves still computing
    assert any(m.label == "σ* (logit units)" for m in at.metric)
    assert any("Curves and corridor" in c.value for c in at.caption)  # the plot's note, once they came


def test_the_plot_part_runs_beside_the_readout_part(monkeypatch):
    # Once calibrated, the curves start on a second thread while the job takes the bootstrap: a
    # bootstrap that waits for the curves to begin would wait forever if they came after it.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)
    curves_started = threading.Event()
    real_curves, real_estimator = cache.curves, cache.estimator
    overlapped = []

    def ours(args) -> bool:  # this upload's, not a job another test left running
        return any(getattr(a, "name", None) == "beside" for a in args)

    def curves(*args, **kwargs):
        if ours(args):
            curves_started.set()
        return real_curves(*args, **kwargs)

    def estimator(*args, **kwargs):
        if ours(args) and threading.current_thread().name.startswith("caliber-precalibrate_"):  # the job's call
            overlapped.append(curves_started.wait(30))
        return real_estimator(*args, **kwargs)

    monkeypatch.setattr(cache, "curves", curves)
    monkeypatch.setattr(cache, "estimator", estimator)
    _, data = _uploaded("beside", 7)
    job = precalibrate._jobs[precalibrate._key(data, "median")]
    assert job.ready.wait(240)
    assert overlapped and overlapped[0]  # its first call (the readout's own calls come after)
    assert cache.has_calibration(data)
    assert job.done.wait(240)  # its last stage ends under this test's settings


def test_the_policy_config_waits_for_the_first_calibrate_visit(monkeypatch):
    # Computed at once it would share the CPUs with that visit's run and the browser's drawing.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 120.0)
    monkeypatch.setattr(precalibrate, "BROWSER_DRAW_S", 0.0)
    configs = []
    real = cache.config

    def counting(data, *args, **kwargs):
        configs.append(data.name)  # an earlier test's job may still end here: counted by name
        return real(data, *args, **kwargs)

    monkeypatch.setattr(cache, "config", counting)
    at, data = _uploaded("visit", 6)
    job = precalibrate._jobs[precalibrate._key(data, "median")]
    assert job.ready.wait(240)
    time.sleep(1.0)  # a config of 600 x 12 takes milliseconds: started now, it would be done
    assert "visit" not in configs and not job.done.is_set()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert job.done.wait(240) and configs.count("visit") == 1


def test_the_policy_page_reads_the_replay_the_job_made(monkeypatch):
    # The job builds the page's default policy with the page's own call: the texts, hence the keys, agree.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)
    at, data = _uploaded("replayed", 8)
    job = precalibrate._jobs[precalibrate._key(data, "median")]
    assert job.done.wait(240)
    from caliber_core.throttle import simulate as simulate_module

    replays = []
    monkeypatch.setattr(simulate_module, "simulate", lambda *a, **k: replays.append(1))
    at.switch_page("pages/policy.py").run()
    assert not at.exception and not replays  # read from the cache, not replayed again
    assert any("benign" in str(v) for df in at.dataframe for v in df.value.to_numpy().ravel())
