"""A short-lived process keeps what it frees for its next arrays, instead of handing it back to the kernel.

Each evaluation of the streamed bounds (:func:`.gap_histogram.row_bounds`)
makes arrays of a few to 16 MB in its worker threads. glibc's malloc serves
sizes like these from fresh ``mmap`` or trims its heaps once they are freed,
so every evaluation faulted its pages in (and zeroed them) again: some 90,000
minor faults and half a CPU-second of a 4,000 x 128,000 dump's solve. Raising
the mmap and trim thresholds (``mallopt``) makes the freed pages serve the
next arrays. For a command that exits when done (``caliber calibrate``), not
for a long-lived server: a process that does this keeps its high-water heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): arrays up to it come from the heap.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


def keep_freed_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for the rest of this process (nothing elsewhere).

    Returns
    -------
    bool
        Whether both were set (False off glibc: the process runs as before, only slower).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
