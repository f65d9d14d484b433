"""The Attack cost page's simulation is computed once the Calibrate page settles; the page then reads it."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from caliber_dashboard import warmup
from caliber_dashboard.common import attack_prefetch, background, precalibrate, readouts
from tests.test_precalibrate import _npz

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _wait_for(condition, timeout=120.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_the_attack_page_reads_the_simulation_made_after_calibrate(monkeypatch):
    monkeypatch.setattr(background, "serving", lambda: True)  # as inside `streamlit run`
    monkeypatch.setattr(warmup, "start", lambda **_: False)
    monkeypatch.setattr(precalibrate, "LATER_WAIT_S", 0.0)
    monkeypatch.setattr(attack_prefetch, "SETTLE_S", 0.05)
    filled = []
    real = attack_prefetch.simulate
    monkeypatch.setattr(attack_prefetch, "simulate", lambda *a: (real(*a), filled.append(a[3])))
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.file_uploader(key="upload_logits").set_value(("settled.npz", _npz(11), "application/octet-stream")).run()
    at.switch_page("pages/calibrate.py").run()
    at.segmented_control(key="calibrate_side").set_value("at-least").run()  # the side Attack cost serves
    assert not at.exception
    _wait_for(lambda: filled and filled[-1] == "at-least", timeout=30)  # at the side the page was left on

    from caliber_core.simulation import attack_estimate

    simulated = []
    monkeypatch.setattr(attack_estimate, "estimate_averaging_attack", lambda *a, **k: simulated.append(1))
    at.switch_page("pages/attack_cost.py").run()
    assert not at.exception and not simulated  # read from the cache, not simulated again
    assert any(m.label.startswith("per-input seeding, M=64") for m in at.metric)
    assert any(m.label == readouts.SIGMA_LABELS["at-least"] for m in at.metric)


def test_a_page_that_arrives_during_the_simulation_waits_for_it():
    from caliber_dashboard.common import cache

    slot = cache._Slot()
    started = threading.Event()

    def background_fill():
        with cache.quietly():
            cache._fill(slot, lambda _: (started.set(), time.sleep(0.3), "simulated")[2])

    t = threading.Thread(target=background_fill)
    t.start()
    assert started.wait(10)
    computed = []
    value = cache._fill(slot, lambda _: computed.append(1), progress_text="Simulating…")
    t.join()
    assert value == "simulated" and not computed  # waited for the run under way, did not start a second


def test_only_the_latest_request_is_simulated_once_it_settles(monkeypatch):
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(attack_prefetch, "SETTLE_S", 0.4)
    done = threading.Event()
    seen = []
    monkeypatch.setattr(attack_prefetch, "simulate", lambda data, cal, percent, side: (seen.append((percent, side)),
                                                                                       done.set()))
    data = types.SimpleNamespace(n_samples=100, n_classes=10)
    cal = types.SimpleNamespace(has_labels=True)
    for percent in (90.0, 89.5, 89.0):  # a slider moved three steps, 0.1 s apart
        attack_prefetch.after_calibrate_run(data, cal, side="point", retention=percent)
        time.sleep(0.1)
    assert not seen  # none has settled yet
    assert done.wait(10)
    time.sleep(0.5)
    assert seen == [(89.0, "point")]


def test_a_run_under_way_holds_the_simulation_back(monkeypatch):
    # A Verify click right after a slider step: the step's simulation waits until the click's run is over.
    monkeypatch.setattr(background, "serving", lambda: True)
    monkeypatch.setattr(attack_prefetch, "SETTLE_S", 0.2)
    done = threading.Event()
    seen = []
    monkeypatch.setattr(attack_prefetch, "simulate", lambda data, cal, percent, side: (seen.append(percent),
                                                                                       done.set()))
    data, cal = types.SimpleNamespace(n_samples=100, n_classes=10), types.SimpleNamespace(has_labels=True)
    attack_prefetch.after_calibrate_run(data, cal, side="point", retention=90.0)
    attack_prefetch.calibrate_run_started()
    time.sleep(0.8)  # four settling times, the run still under way
    assert not seen
    attack_prefetch.after_calibrate_run(data, cal, side="point", retention=90.0)
    assert done.wait(10) and seen == [90.0]


def test_nothing_is_asked_outside_a_server_or_without_labels(monkeypatch):
    seen = []
    monkeypatch.setattr(attack_prefetch, "simulate", lambda *a: seen.append(a))
    monkeypatch.setattr(attack_prefetch, "SETTLE_S", 0.0)
    data = types.SimpleNamespace(n_samples=100, n_classes=10)
    attack_prefetch.after_calibrate_run(data, types.SimpleNamespace(has_labels=True), side="point", retention=90.0)
    monkeypatch.setattr(background, "serving", lambda: True)
    attack_prefetch.after_calibrate_run(data, types.SimpleNamespace(has_labels=False), side="point", retention=90.0)
    big = types.SimpleNamespace(n_samples=200_000, n_classes=1_000)  # over the page's budget: it waits for its button
    attack_prefetch.after_calibrate_run(big, types.SimpleNamespace(has_labels=True), side="point", retention=90.0)
    time.sleep(0.3)
    assert not seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is a Linux feature")
def test_the_lowest_priority_is_the_calling_threads_and_its_childrens_only():
    seen = {}

    def child():
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def lowered():
        background.lowest_priority()
        seen["self"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        t = threading.Thread(target=child)
        t.start()
        t.join()

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=lowered)
    t.start()
    t.join()
    assert seen == {"self": 19, "child": 19}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # this thread unchanged
