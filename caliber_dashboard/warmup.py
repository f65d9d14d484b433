"""Server warm-up: the heavy imports and the demo set's results, before anyone asks.

Without it the first visitor after a server start pays for the imports
(scipy.optimize, pandas, plotly: about 2 s here) and for the demo models'
calibrations, curves, intervals, figures and fleet tables, page by page.
:func:`start` runs all of that once per server process in a daemon thread,
from the first script run on. Every result lands in the ``st.cache_resource``
slots of ``cache``, which all sessions share; a visitor who arrives while a
slot is being filled waits on the slot's lock instead of computing it again.

The order follows a person's path: the Calibrate page's first model and view,
then the fleet tables, then every module a page imports (:func:`import_modules`).
The imports of this module itself stay light: the heavy ones happen in the thread.

Why every module before the end: Streamlit collects garbage over the whole heap
after every script run, a slider step included, and the warm-up ends by moving
what exists then out of the collector's view (``gc.freeze``). A module first
imported later stays in view.

torch is the exception: no page needs it until a visitor trains surrogates (the
Extraction page's runs) or opens a ``.pt`` file, and imported it holds about
180 MB of the server's memory, as much as everything else at start, and about
140,000 objects. The pages import only the extraction code's torch-free modules.
The run that first imports torch ends with :func:`freeze_late_imports`, which
moves torch's objects out of the collector's view in turn (each slider step's
collection took 0.1-0.15 s instead of a few ms here while they were in view).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading

_LOG = logging.getLogger(__name__)
_lock = threading.Lock()
_thread: threading.Thread | None = None
#: Set when the warm-up has finished (tests and benchmarks may wait on it).
done = threading.Event()
_torch_frozen = False

#: The Calibrate page's first target: the retention slider's default.
DEFAULT_TARGET = ("retention", 0.8)


def start(*, server: bool = False) -> bool:
    """Start the warm-up thread, once per process; False if it runs already or there is no server.

    ``server=True`` says the caller is the server itself (``app.py``'s lifespan,
    at start-up, before Streamlit's runtime exists). Otherwise it starts only
    inside a ``streamlit run`` server: under ``AppTest`` nothing starts, tests
    compute what they use.
    """
    global _thread
    from caliber_dashboard.common.background import serving

    if not (server or serving()):
        return False
    with _lock:
        if _thread is not None:
            return False
        # The caches are Streamlit's, used here outside any session: say so once, not per call.
        logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
            _OwnThreads())
        _thread = threading.Thread(target=_run, name="caliber-warmup", daemon=True)
        _thread.start()
    return True


class _OwnThreads(logging.Filter):
    """Drops the "missing ScriptRunContext" warning for this package's own background threads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.threadName.startswith("caliber-")


def _run() -> None:
    try:
        from caliber_dashboard.common import cache

        with cache.quietly():
            warm_demo()
        import_modules()
        _prime_streamlit()
    except Exception:  # noqa: BLE001  (a failed warm-up only costs the first visitor time)
        _LOG.exception("dashboard warm-up failed; pages compute on first use instead")
    finally:
        # Streamlit runs a full garbage collection after every script run (every
        # slider step). The modules and caches loaded so far live as long as the
        # server: moved out of the collector's view, a step's collection scans only
        # what was made since (about 110 ms -> a few ms per step here).
        gc.freeze()
        done.set()


def freeze_late_imports() -> bool:
    """At the end of a script run: if torch has been imported since the last freeze, collect and freeze again.

    Called by every run of ``app.py`` (a few microseconds when there is nothing to do); the warm-up's
    own freeze covers what is imported before it ends. Returns whether it froze.
    """
    global _torch_frozen
    if _torch_frozen or "torch" not in sys.modules or not done.is_set():
        return False
    with _lock:
        if _torch_frozen:
            return False
        _torch_frozen = True
        gc.collect()  # the garbage of the moment is not kept for good
        gc.freeze()
    return True


def warm_demo() -> None:
    """Fill what a first visit to Calibrate and Fleet reads, and nothing more.

    Kept short (about 3 s of CPU here): it runs while the first visitors use
    the app, on the same CPUs. The fleet ablation runs on request, and other
    models and views fill on first use (a fraction of a second each).
    """
    from caliber_dashboard.common import cache, state, tables  # noqa: F401  (tables: pandas, for the pages' tables)

    demo = [d for d in state.demo_models() if d.has_labels]
    cals = [cache.calibration(d) for d in demo]
    if not cals:
        return
    kind, value = DEFAULT_TARGET
    cache.served(demo[0], cals[0], kind, value)  # the model and target the Calibrate page opens on
    cache.figure(demo[0], cals[0], "normalized")
    # The readout's thief line looks each model up among the demo archives (seven files, 0.2-0.4 s to read).
    from caliber_dashboard.extraction import view as extraction_view

    extraction_view.demo_archives()
    if len(cals) >= 2:
        cache.fleet_report(demo, cals, statistic="median")


def import_modules() -> list[str]:
    """Import every module a page may import; the names of those imported.

    Every module of the dashboard package (but the page scripts and the entry
    point, which are run, not imported), and every module a page script
    imports by name itself (read from the scripts' import statements).
    """
    import ast
    import importlib
    import pkgutil
    from pathlib import Path

    import caliber_dashboard

    names = [m.name for m in pkgutil.walk_packages(caliber_dashboard.__path__, "caliber_dashboard.")
             if not (m.name.startswith("caliber_dashboard.pages") or m.name == "caliber_dashboard.app")]
    for page in sorted((Path(caliber_dashboard.__file__).parent / "pages").glob("*.py")):
        for node in ast.walk(ast.parse(page.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
            elif isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
    imported = []
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra not installed: the page that needs it says so itself
            _LOG.info("warm-up: %s not importable", name)
            continue
        imported.append(name)
    return imported


def _prime_streamlit(wait_s: float = 10.0) -> None:
    """Pay Streamlit's one-time check on the first element of the process (an ``inspect.stack()``,
    0.1-0.3 s) here rather than in the first visitor's page: once the runtime is up, an
    element made outside any session does nothing but that check."""
    import time

    import streamlit as st
    from streamlit import runtime

    deadline = time.monotonic() + wait_s
    while not runtime.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if runtime.exists():
        st.empty()
