"""A large labelled dump opened from the data root (or uploaded): open, calibrate, export, check; peak memory.

Run:  python benchmarks/bench_data_root.py [--rows 2000] [--vocab 32000] [--server | --upload] [--no-write]

Writes a ``--rows`` x ``--vocab`` float32 ``.npy`` of LLM-like next-token logits
and its labels ``.npy`` into a temporary data root (never committed), then
drives the dashboard in this process with Streamlit's ``AppTest`` (the same
script runs as under ``streamlit run``; this process plays the server): the
Calibrate page is visited once first (the demo set's calibration, which a
server's warm-up makes at start), then the Data page opens the file from the
root (a vocabulary this large is streamed once and reduced, and its default
targets solved), the Calibrate page shows it, a new target is solved there,
and the Export page shows the config; ``caliber check`` (a separate process)
is run on the exported config and the file. Printed: each step's wall time, the
process's resident memory after start-up and its peak (``VmHWM``), against the
file's size. With ``--server`` the same steps run in a real ``streamlit run`` server,
driven in Chromium (the config is the Export page's download), and the memory is
that server process's, after its warm-up and at its peak. With ``--upload`` the two files are uploaded on the Data page
instead (logits and labels boxes at once): the upload's bytes are read into this
process as Streamlit's uploader holds them, so the peak counts them, and the
file goes through the same streamed engine before it is stored in the workspace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from figure_files import figure_name, transcript  # noqa: E402

APP = str(ROOT / "caliber_dashboard" / "app.py")


def _status_mb(field: str, pid: int | str = "self") -> float:
    """A memory field of /proc/<pid>/status, in MB (10^6 bytes, as the file's size is counted)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


@contextlib.contextmanager
def _timed(times: dict, step: str):
    """Keep the wall time of the block under ``step`` in ``times``."""
    start = time.perf_counter()
    yield
    times[step] = time.perf_counter() - start


def _write_dump(root: Path, rows: int, vocab: int) -> tuple[Path, Path]:
    from caliber_core.simulation.llm_like import llm_like_logits

    (root / "evals").mkdir(parents=True)
    z = llm_like_logits(rows, vocab, seed=1, dtype=np.float32)
    rng = np.random.default_rng(2)
    top = np.argpartition(-z, 4, axis=1)[:, :5]
    # The next token is the model's top one about 60% of the time, else one of its next four.
    pick = np.where(rng.random(rows) < 0.6, 0, rng.integers(1, 5, rows))
    order = np.take_along_axis(top, np.argsort(-np.take_along_axis(z, top, axis=1), axis=1), axis=1)
    labels = order[np.arange(rows), pick].astype(np.int64)
    logits_path, labels_path = root / "evals" / "next_token.npy", root / "evals" / "next_token_labels.npy"
    np.save(logits_path, z)
    np.save(labels_path, labels)
    return logits_path, labels_path


# `caliber check` with its own peak resident set (VmHWM, KiB; ru_maxrss would carry this process's
# peak across the fork) as the last line on stderr.
_CHECK = ("import re, sys\nfrom pathlib import Path\nfrom caliber_core.cli import main\ncode = main(sys.argv[1:])\n"
          "print('peak resident KiB', re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text())[1], "
          "file=sys.stderr)\nsys.exit(code)")


def _served(tmp: Path, vocab: int) -> tuple[dict, float, float, Path]:
    """Open the dump from the root, calibrate and export it in a real server driven in Chromium.

    Returns the steps' wall times, the server's resident memory once its warm-up
    is over, its peak, and the config downloaded from the Export page.
    """
    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    import dashboard_harness as harness
    from app_state import settle_run, watch_socket
    from playwright.sync_api import sync_playwright

    def goto(page, title: str) -> None:
        link = page.locator("[data-testid='stSidebarNavLink']", has_text=title).first
        settle_run(page, lambda: link.click(), ready=f"h1:has-text('{title}')")

    times: dict = {}
    with sync_playwright() as pw, harness.serve("caliber_dashboard/app.py", tmp / "server.log") as (url, _):
        browser = pw.chromium.launch(executable_path=harness.CHROMIUM, args=harness.CHROMIUM_ARGS)
        try:
            pid = harness.PIDS[url]
            context = browser.new_context(accept_downloads=True, viewport=harness.VIEWPORT)
            context.set_default_timeout(3_600_000)
            page = context.new_page()
            watch_socket(page)
            page.goto(url)
            settle_run(page, ready="text=models loaded")
            harness.wait_idle(url, windows=4)  # the warm-up (the demo set's results) is over
            goto(page, "Data")
            started_mb = _status_mb("VmRSS", pid)
            page.get_by_role("combobox", name="Labels file (optional)").first.click()
            settle_run(page, lambda: page.get_by_role("option", name="evals/next_token_labels.npy", exact=True).click())
            box = page.get_by_role("textbox", name="Or a path relative to the data root")
            settle_run(page, lambda: (box.fill("evals/next_token.npy"), box.press("Enter")))
            button = page.locator("[data-testid='stButton'] button", has_text=re.compile(r"Open$"))
            with _timed(times, "open from the root (stream, reduce, solve)"):
                settle_run(page, lambda: button.click(), ready="text=Streamed evals/next_token.npy")
            with _timed(times, "Calibrate (first visit)"):
                goto(page, "Calibrate")
                page.wait_for_selector("text=retention 0.9 (point)")
            targets = page.get_by_role("textbox", name="Targets (%)")
            with _timed(times, "Calibrate: a new target (retention 80%)"):
                settle_run(page, lambda: (targets.fill("80"), targets.press("Enter")),
                           ready="text=retention 0.8 (point)")
            with _timed(times, "Export (config)"):
                goto(page, "Export")
                page.wait_for_selector("text=--retention 0.8 --out next_token.caliber.json")
            part = page.locator("[data-testid='stExpander']", has_text="Large-vocabulary files, streamed (1)")
            with page.expect_download() as download:
                part.get_by_role("button", name="Download config JSON").click()
            config_path = tmp / "cfg.json"
            download.value.save_as(config_path)
            if page.locator("[data-testid='stException']").count():
                raise RuntimeError("the app raised an exception: " + page.locator(
                    "[data-testid='stException']").first.inner_text())
            config = json.loads(config_path.read_text())
            assert config["n_classes"] == vocab and [t["requested"] for t in config["targets"]] == [0.8]
            peak_mb = _status_mb("VmHWM", pid)
        finally:
            browser.close()
    return times, started_mb, peak_mb, config_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--upload", action="store_true",
                        help="upload the files on the Data page instead of opening them from the root")
    parser.add_argument("--server", action="store_true",
                        help="open, calibrate and export in a real server driven in Chromium; its memory")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write docs/figures/")
    parser.add_argument("--write-dump", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_dump:
        _write_dump(Path(args.write_dump), args.rows, args.vocab)
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = tmp / "root"
        # Written by a child process: this one (the server) never holds the matrix itself.
        subprocess.run([sys.executable, __file__, "--write-dump", str(root), "--rows", str(args.rows),
                        "--vocab", str(args.vocab)], check=True, cwd=ROOT)
        logits_path, labels_path = root / "evals" / "next_token.npy", root / "evals" / "next_token_labels.npy"
        os.environ["CALIBER_DATA_ROOT"] = str(root)
        os.environ["CALIBER_DATA_DIR"] = str(tmp / "workspaces")
        size_mb = logits_path.stat().st_size / 1e6

        handling: dict = {}
        if args.server and args.upload:
            parser.error("--server opens the file from the root; --upload is measured in this process")
        if args.server:
            times, started_mb, peak_mb, config_path = _served(tmp, args.vocab)
        else:
            from streamlit.testing.v1 import AppTest

            from caliber_core.config import config_to_json
            from caliber_dashboard.common import state
            from caliber_dashboard.data import server_panel, vocab_files

            at = AppTest.from_file(APP, default_timeout=3600)
            at.switch_page("pages/calibrate.py")
            at.run()  # the demo set's calibration: a server's warm-up makes it at start
            assert not at.exception, at.exception
            at.switch_page("pages/data.py").run()
            started_mb = _status_mb("VmRSS")
            models_before = set(at.session_state[state.MODELS])
            times = {}
            if args.upload:  # the server holds the upload's bytes, as Streamlit's uploader does
                from caliber_dashboard.data import vocab_uploads

                opened = vocab_uploads.open_upload

                def measured(*a, **k):
                    # Resident memory with the upload held, and the peak while the page reduces and stores it:
                    # AppTest keeps copies of the bytes of its own after the run, which a server does not make.
                    handling["held"], handling["peak_before"] = _status_mb("VmRSS"), _status_mb("VmHWM")
                    out = opened(*a, **k)
                    handling["peak"] = _status_mb("VmHWM")
                    return out

                vocab_uploads.open_upload = measured
                with _timed(times, "upload (stream, reduce, solve, store)"):
                    for key, path in (("upload_labels", labels_path), ("upload_logits", logits_path)):
                        at.file_uploader(key=key).set_value((path.name, path.read_bytes(),
                                                             "application/octet-stream"))
                    at.run()
            else:
                with _timed(times, "open from the root (stream, reduce, solve)"):
                    at.selectbox(key=server_panel.FILE_KEY).set_value("evals/next_token.npy")
                    at.selectbox(key=server_panel.LABELS_KEY).set_value("evals/next_token_labels.npy")
                    at.button(key="server_open_btn").click().run()
            assert not at.exception, at.exception
            assert set(at.session_state[state.MODELS]) == models_before, "the file was read into a dense model"
            (entry,) = at.session_state[vocab_files.MEMBERS][1].values()
            assert entry["n_classes"] == args.vocab and entry["has_labels"]
            with _timed(times, "Calibrate (first visit)"):
                at.switch_page("pages/calibrate.py").run()
            assert not at.exception, at.exception
            with _timed(times, "Calibrate: a new target (retention 80%)"):
                at.text_input(key=f"vocab_targets_{entry['sha256'][:12]}_retention").set_value("80").run()
            assert not at.exception, at.exception
            with _timed(times, "Export (config)"):
                at.switch_page("pages/export.py").run()
            assert not at.exception, at.exception
            (entry,) = at.session_state[vocab_files.MEMBERS][1].values()
            config_path = tmp / "cfg.json"
            config_path.write_text(config_to_json(entry["config"]))  # the download button's bytes
            peak_mb = _status_mb("VmHWM")
        with _timed(times, "caliber check (separate process)"):
            check = subprocess.run([sys.executable, "-c", _CHECK, "check", str(config_path), str(logits_path),
                                    "--labels", str(labels_path)], capture_output=True, text=True, cwd=ROOT,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
        check_mb = int(check.stderr.strip().splitlines()[-1].split()[-1]) * 1024 / 1e6  # KiB -> MB, as the file
        targets = json.loads(config_path.read_text())["targets"]

    base = "data-root-upload" if args.upload else "data-root-server" if args.server else "data-root"
    with transcript(figure_name(base, "--rows", "--vocab"),
                    "A large labelled dump " + ("uploaded" if args.upload else "opened from the data root"
                                                + (" of a running server, in Chromium" if args.server else "")),
                    note="One run (each step is timed once, under the load stated above: no spread). The file "
                         "is streamed through the large-vocabulary engine (K >= 8,192), the one `caliber "
                         "calibrate` uses: no Monte-Carlo sweep, so the sigmas carry certified bounds, not "
                         "sampling bands. Memory is " + ("the server process's, from /proc/<pid>/status; MB = 10^6 bytes."
                                                        if args.server else "this process's (it plays the server), "
                                                        "from /proc/self/status; MB = 10^6 bytes.")) if not args.no_write \
            else contextlib.nullcontext():
        print(f"file: {args.rows:,} x {args.vocab:,} float32 .npy, {size_mb:,.1f} MB, with a labels .npy")
        for what, seconds in times.items():
            print(f"  {what:<42} {seconds:8.1f} s")
        print(f"  caliber check exit status {check.returncode} "
              f"({(check.stdout or check.stderr).strip().splitlines()[-1] if (check.stdout or check.stderr).strip() else ''})")
        print("  targets: " + ", ".join(f"{t['kind']} {t['requested']:g}: sigma {t['sigma']:.4g}, certified "
                                        f"[{t['interval']['retention'][0]:.5f}, {t['interval']['retention'][1]:.5f}]"
                                        for t in targets))
        print(f"memory: resident after start-up {started_mb:,.0f} MB; peak {peak_mb:,.0f} MB; "
              f"peak above start-up {peak_mb - started_mb:,.0f} MB = {(peak_mb - started_mb) / size_mb:.2f} x the file "
              f"(peak {peak_mb / size_mb:.2f} x the file); caliber check's peak {check_mb:,.0f} MB "
              f"({check_mb / size_mb:.2f} x the file)")
        if handling:
            added = handling["peak"] - handling["held"]
            bound = "" if handling["peak"] > handling["peak_before"] else "at most "
            print(f"  the upload: resident {handling['held']:,.0f} MB with its bytes held; reducing, solving and "
                  f"storing it added {bound}{added:,.0f} MB = {bound}{added / size_mb:.2f} x the file (the overall "
                  "peak above includes AppTest's own copies of the bytes after the run)")
    if check.returncode != 0:
        print(check.stdout, check.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
