"""Server warm-up: the heavy imports and the demo set's results, before anyone asks.

Without it the first visitor after a server start pays for the imports
(scipy.optimize, pandas, plotly: about 2 s here) and for the demo models'
calibrations, curves, intervals, figures and fleet tables, page by page.
:func:`start` runs all of that once per server process in a daemon thread,
from the first script run on. Every result lands in the ``st.cache_resource``
slots of ``cache``, which all sessions share; a visitor who arrives while a
slot is being filled waits on the slot's lock instead of computing it again.

The order follows a person's path: the Calibrate page's first model and view,
then the fleet tables, then the other models and views. The imports of this
module itself stay light: the heavy ones happen in the thread.
"""

from __future__ import annotations

import logging
import threading

_LOG = logging.getLogger(__name__)
_lock = threading.Lock()
_thread: threading.Thread | None = None
#: Set when the warm-up has finished (tests and benchmarks may wait on it).
done = threading.Event()

#: The Calibrate page's first target: the retention slider's default.
DEFAULT_TARGET = ("retention", 0.8)


def start() -> bool:
    """Start the warm-up thread, once per process; False if it runs already or there is no server.

    Under ``AppTest`` (no server runtime) nothing starts: tests compute what they use.
    """
    global _thread
    from streamlit import runtime

    if not runtime.exists():
        return False
    with _lock:
        if _thread is not None:
            return False
        _thread = threading.Thread(target=_run, name="caliber-warmup", daemon=True)
        _thread.start()
    return True


def _run() -> None:
    try:
        from . import cache

        with cache.quietly():
            warm_demo()
    except Exception:  # noqa: BLE001  (a failed warm-up only costs the first visitor time)
        _LOG.exception("dashboard warm-up failed; pages compute on first use instead")
    finally:
        done.set()


def warm_demo() -> None:
    """Fill the caches the demo set's pages read, in the order a visitor needs them."""
    from caliber_core.calibration.calibrate import Calibration

    from . import cache, calibrate_plots, state, tables  # noqa: F401  (tables: pandas)

    demo = [d for d in state.demo_models() if d.has_labels]
    cals: list[Calibration] = []
    for i, data in enumerate(demo):
        cals.append(cache.calibration(data))
        if i == 0:  # the model the Calibrate page opens on
            _warm_model(data, cals[0], views=("normalized",))
    if len(cals) >= 2:
        cache.fleet_report(demo, cals, statistic="median")
        cache.margin_ablation(demo, cals)
    for data, cal in zip(demo, cals):
        _warm_model(data, cal, views=calibrate_plots.VIEWS)


def _warm_model(data, cal, *, views) -> None:
    from . import cache

    kind, value = DEFAULT_TARGET
    cache.served(data, cal, kind, value)
    for view in views:
        cache.figure(data, cal, view)
