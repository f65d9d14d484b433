"""Opening Calibrate after an upload, with and without the calibration started in the background.

Run:  python benchmarks/bench_precalibrate.py [--shape 10000x1000] [--repeats 3] [--no-write]

Drives the dashboard in this process with Streamlit's ``AppTest`` (server-side
script time only, no browser). Each repeat uploads a fresh SYNTHETIC file (a
new seed, so no cache helps) with its labels, in two arms, interleaved:

* **background**: as under ``streamlit run``, the upload queues the model's
  calibration (``caliber_dashboard.common.precalibrate``); the visitor opens
  Calibrate once it has finished (the time it took is printed: a visitor who
  arrives sooner waits for the rest of it, with its progress shown);
* **on the page**: nothing starts in the background (as before): opening
  Calibrate computes the calibration.

Printed per arm: the Calibrate page's run time, median and range over the
repeats, and the time from the upload to the end of the background job's
Calibrate part (what a visitor who opens Calibrate at once waits, at most).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from figure_files import transcript  # noqa: E402

APP = str(ROOT / "caliber_dashboard" / "app.py")


def _files(n: int, k: int, seed: int) -> tuple[bytes, bytes]:
    from caliber_core.simulation.synthetic import make_synthetic_logits

    logits, labels = make_synthetic_logits(n, k, seed=seed)
    out = []
    for array in (logits.astype(np.float32), labels):
        buf = io.BytesIO()
        np.save(buf, array)
        out.append(buf.getvalue())
    return out[0], out[1]


def _one(n: int, k: int, seed: int, *, in_background: bool) -> tuple[float, float | None]:
    """(Calibrate page seconds, background job seconds or None)."""
    from streamlit.testing.v1 import AppTest

    from caliber_dashboard.common import background, precalibrate, state

    logits, labels = _files(n, k, seed)
    real = background.serving
    background.serving = (lambda: True) if in_background else real
    try:
        at = AppTest.from_file(APP, default_timeout=3600)
        at.run()
        at.file_uploader(key="upload_labels").set_value((f"s{seed}_labels.npy", labels, "application/octet-stream"))
        t0 = time.perf_counter()
        at.file_uploader(key="upload_logits").set_value((f"s{seed}.npy", logits, "application/octet-stream")).run()
        assert not at.exception, at.exception
        data = at.session_state[state.MODELS][at.session_state[state.SELECTED]]
        assert data.has_labels
        job_s = None
        if in_background:
            while precalibrate.running(data) is not None:
                time.sleep(0.05)
            job_s = time.perf_counter() - t0
        t = time.perf_counter()
        at.switch_page("pages/calibrate.py").run()
        page_s = time.perf_counter() - t
        assert not at.exception, at.exception
        return page_s, job_s
    finally:
        background.serving = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="10000x1000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write docs/figures/")
    args = parser.parse_args()
    n, k = (int(x) for x in args.shape.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CALIBER_DATA_DIR"] = tmp
        arms: dict[str, list[float]] = {"background": [], "on the page": []}
        jobs: list[float] = []
        _one(1000, 10, 99, in_background=True)  # unmeasured: the first run in a process pays the imports
        for r in range(args.repeats):
            for name, bg in (("background", True), ("on the page", False))[:: 1 if r % 2 == 0 else -1]:
                page_s, job_s = _one(n, k, 100 + 2 * r + bg, in_background=bg)
                arms[name].append(page_s)
                if job_s is not None:
                    jobs.append(job_s)
    note = ("Server-side script time in this process (AppTest), not a browser's; arms interleaved, a fresh "
            "file per run. Other processes shared the CPUs (the load average above).")
    with (transcript("precalibrate", f"Opening Calibrate at {n:,} x {k:,}, with and without the background "
                     "calibration", note=note) if not args.no_write else contextlib.nullcontext()):
        print(f"{args.repeats} repeats, {n:,} x {k:,} float32 .npy with a labels .npy, "
              f"load average {os.getloadavg()[0]:.1f} now")
        for name, values in arms.items():
            print(f"  open Calibrate, calibration {name:<12}: median {statistics.median(values):6.2f} s "
                  f"(range {min(values):.2f}-{max(values):.2f} s)")
        print(f"  upload to the background's Calibrate part   : median {statistics.median(jobs):6.2f} s "
              f"(range {min(jobs):.2f}-{max(jobs):.2f} s): what a visitor who opens Calibrate at once waits, "
              "at most")
        ratio = [b / p for b, p in zip(arms["background"], arms["on the page"])]
        print(f"  paired ratio background / on the page       : median {statistics.median(ratio):.2f} "
              f"(range {min(ratio):.2f}-{max(ratio):.2f})")


if __name__ == "__main__":
    main()
