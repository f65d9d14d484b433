"""The thief's module, imported only when a visitor trains surrogates.

torch comes with it (about 180 MB resident, some 140,000 objects), which no
other part of the dashboard needs; see :mod:`caliber_dashboard.warmup` for why
its objects are then moved out of the garbage collector's view.
"""

from __future__ import annotations

import gc
import importlib
import sys


def import_trainer():
    """The thief's module (:mod:`caliber_core.extraction.attacker`, with torch), imported for a training run.

    On its first import the objects that exist then are moved out of the
    garbage collector's view, as the warm-up does at its end
    (:mod:`caliber_dashboard.warmup`): otherwise every later script run would scan torch's.
    """
    name = "caliber_core.extraction.attacker"
    first = name not in sys.modules
    module = importlib.import_module(name)
    if first:
        gc.freeze()
    return module
