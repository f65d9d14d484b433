"""One BLAS thread while a reduction's bounds are solved: OpenBLAS's idle threads spin between calls.

Each evaluation of the streamed bounds (:func:`.gap_histogram.row_bounds`,
:func:`.accuracy_bounds.accuracy_row_bounds`) multiplies the tail counts by
the edges' log-CDFs: some ten milliseconds of float32 products, a few dozen
times per solve. Between two such calls OpenBLAS's worker threads keep
spinning, and on a 2-core machine that took 1.0 to 1.3 CPU-seconds of the
4,000 x 128,000 solve from the threads doing the work (the products
themselves run as fast on one thread). ``threadpoolctl`` sets the count where
it is installed; without it the count stays as it was.
"""

from __future__ import annotations

from contextlib import nullcontext


def one_blas_thread():
    """A context manager that holds BLAS to one thread (a no-op without ``threadpoolctl``).

    Returns
    -------
    contextlib.AbstractContextManager
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional speed-up: the results are the same either way
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
