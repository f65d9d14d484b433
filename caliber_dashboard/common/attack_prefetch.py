"""The Attack cost page's simulation, computed in the background once the Calibrate page settles.

Opening Attack cost runs the averaging attack at the σ served (0.6-0.8 s at
10,000 x 1,000 here, most of that page's time). That σ is the one the Calibrate
page shows for the retention target and the side the visitor left there, and the
simulation's options start at :data:`DEFAULT_M_MAX`, :data:`DEFAULT_REPEATS` and
:data:`DEFAULT_SEED` on every visit. So each Calibrate run says when it starts
(:func:`calibrate_run_started`), names that σ when its target panel ends
(:func:`after_calibrate_run`: the end of a slider step's run) and says when a full
run ends (:func:`calibrate_run_ended`). Once no run is under way and none has ended
for :data:`SETTLE_S` (a slider being dragged asks once, at the end; a Verify click
right after a step keeps its cores), one thread fills the same cache slot the page
reads (:func:`.cache.attack`). A page that arrives while it runs waits for it
instead of computing it a second time.

The thread runs at the lowest CPU priority where the system allows one thread its
own (Linux): it takes the cores only while the visitor's own runs and the browser's
drawing leave them idle. Nothing starts outside a server (:func:`.background.serving`).
"""

from __future__ import annotations

import logging
import threading
import time

from caliber_core.calibration.calibrate import Calibration
from caliber_core.loading import LogitsData
from caliber_core.simulation.attack_estimate import DEFAULT_MAX_DRAWS

from caliber_dashboard.common.curves import powers_of_two
from caliber_dashboard.common.targets import percent_to_fraction

from . import background, cache, ui

_LOG = logging.getLogger(__name__)

#: The page's choices for the largest M, and where it starts.
M_MAX_CHOICES = (16, 64, 256, 1024)
DEFAULT_M_MAX = 64
DEFAULT_REPEATS = 4
DEFAULT_SEED = 0
#: Simulations up to this many noise values run on opening the page; larger ones wait for its button.
AUTO_SIMULATION_BUDGET = 2e8
#: Seconds without a newer Calibrate run before the simulation starts.
SETTLE_S = 0.75
#: A run said to have started this long ago without ending (a closed tab) no longer holds the simulation back.
RUN_LIMIT_S = 30.0

_condition = threading.Condition()
_latest: tuple | None = None  # (time asked, data, calibration, retention percent, side)
_running_since: float | None = None  # a Calibrate run under way: nothing starts before it ends
_thread: threading.Thread | None = None


def runs_at_once(data: LogitsData, repeats: int) -> bool:
    """Whether the page runs the simulation on opening (else it waits for a button press)."""
    return float(data.n_samples) * data.n_classes * repeats + 2 * DEFAULT_MAX_DRAWS <= AUTO_SIMULATION_BUDGET


def calibrate_run_started() -> None:
    """A Calibrate run begins (or goes on past its target panel): a simulation not yet started waits
    until :func:`after_calibrate_run` or :func:`calibrate_run_ended`, then settles."""
    global _running_since
    if background.serving():
        with _condition:
            _running_since = time.monotonic()


def calibrate_run_ended() -> None:
    """A Calibrate page's full run has ended: the last σ named settles from now."""
    global _latest, _running_since
    if background.serving():
        with _condition:
            _running_since = None
            if _latest is not None:
                _latest = (time.monotonic(), *_latest[1:])
            _condition.notify()


def after_calibrate_run(data: LogitsData, cal: Calibration, *, side: str,
                        retention: float | None = None) -> None:
    """Name the σ the Attack cost page would simulate now; its simulation follows once the page settles.

    ``retention``: the Calibrate page's retention target (percent) when that is its
    kind, else the remembered one is read here, in the script's thread.
    """
    global _latest, _thread, _running_since
    if not background.serving():
        return
    if not cal.has_labels or not runs_at_once(data, DEFAULT_REPEATS):
        with _condition:
            _running_since = None
        return
    # The retention target the Attack cost page opens on.
    percent = ui.slider_start(cal, "retention")[1] if retention is None else float(retention)
    with _condition:
        _running_since = None
        _latest = (time.monotonic(), data, cal, percent, side)
        if _thread is None:
            _thread = threading.Thread(target=_loop, name="caliber-attack-prefetch", daemon=True)
            _thread.start()
        _condition.notify()


def _loop() -> None:
    global _latest
    background.lowest_priority()
    while True:
        with _condition:
            while _latest is None:
                _condition.wait()
            asked, data, cal, percent, side = _latest
            now = time.monotonic()
            if _running_since is not None and now - _running_since < RUN_LIMIT_S:
                _condition.wait(SETTLE_S)  # until that run ends (it notifies)
                continue
            wait = asked + SETTLE_S - now
            if wait > 0:  # a newer run restarts the wait
                _condition.wait(wait)
                continue
            _latest = None
        try:
            simulate(data, cal, percent, side)
        except Exception:  # noqa: BLE001  (the page computes it and shows the error where it belongs)
            _LOG.info("attack cost prefetch failed; the page will compute it", exc_info=True)


def simulate(data: LogitsData, cal: Calibration, percent: float, side: str) -> None:
    """Fill the cache with what the Attack cost page reads on opening at this target and side."""
    with cache.quietly():
        try:
            record, _ = cache.served(data, cal, "retention", percent_to_fraction(percent), side=side)
        except ValueError:
            return  # out of reach: the page says so
        if record.sigma > 0:
            cache.attack(data, sigma=record.sigma, m_values=powers_of_two(DEFAULT_M_MAX),
                         repeats=DEFAULT_REPEATS, seed=DEFAULT_SEED)
