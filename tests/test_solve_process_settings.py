"""The streamed solve's process settings: one BLAS thread inside its scope, and glibc keeping freed heap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from caliber_core.calibration.blas_threads import one_blas_thread


def test_blas_runs_on_one_thread_inside_the_scope_and_as_before_after():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # BLAS loaded

    def counts():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    before = counts()
    with one_blas_thread():
        assert counts() and set(counts()) == {1}
    assert counts() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_heap_setting_takes_in_a_process_of_its_own():
    """Process-wide, so in a child: a command that exits when done, as calibrate."""
    code = ("from caliber_core.calibration.heap_reuse import keep_freed_heap\n"
            "import numpy as np\n"
            "ok = keep_freed_heap()\n"
            "x = [np.ones(2_000_000) for _ in range(3)]\n"
            "print(ok, sum(float(a.sum()) for a in x))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    libc = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout + \
        subprocess.run(["ldd", "--version"], capture_output=True, text=True).stderr
    want = "True" if "GNU" in libc or "glibc" in libc.lower() else "False"
    assert out.stdout.split() == [want, "6000000.0"]
