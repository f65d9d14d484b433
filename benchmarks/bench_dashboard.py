"""What a person waits for in the dashboard, measured in a real Chromium.

Starts its own Streamlit servers on free ports of 127.0.0.1 and drives Debian's
Chromium (``/usr/bin/chromium``) through Playwright. It prints:

* **slider steps**: the target slider of the Calibrate page (demo model) next to
  ``benchmarks/minimal_slider_page.py`` (one plotly figure of the same size),
  one step on each in turn, in the same run: median, quartiles and extremes;
* **first visits**: Data, Calibrate and Fleet for the first visitor after a
  server start (cold, once the server had ``--settle`` seconds for its
  warm-up) and for a second visitor (warm), deep links to ``/calibrate`` and
  ``/fleet`` as a fresh server's first request (after ``--settle`` s and right
  away), and the minimal page opened in a new tab for scale;
* **the corridor on a large file**: a 2,000 x 1,000 SYNTHETIC upload
  (``caliber_core.simulation.synthetic``, written to a temporary folder), the
  time from opening Calibrate with it selected to the corridor being drawn,
  and whether its legend calls it exact or estimated.

How "done" is decided: ``dashboard_harness``. Other processes share the CPUs:
compare the two pages only within one run, and look at the spreads.

* **each action at scale** (``--actions 10000x1000``): a SYNTHETIC upload with
  a separate labels file, then every page and action a provider uses, each
  timed from the click to the end of its script run; written to
  ``docs/figures/dashboard.md``.

Usage: python benchmarks/bench_dashboard.py [--steps 30] [--skip-cold] [--skip-large] [--actions 10000x1000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dashboard_harness import (  # noqa: E402
    CHROMIUM, CHROMIUM_ARGS, CORRIDOR_JS, LONG_TASKS, MINIMAL_PAGE, ROOT, VISIT_DONE_JS, Visitor, cpu_seconds,
    serve, wait_browser_idle, wait_idle)

# ----------------------------------------------------------------------------- parts


def _summary(x) -> dict:
    a = np.asarray(x, dtype=float)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"n": int(a.size), "median": float(med), "q1": float(q1), "q3": float(q3),
            "min": float(a.min()), "max": float(a.max())}


def _fmt(s: dict, unit: str = "s") -> str:
    return (f"median {s['median']:.3f} {unit} (quartiles {s['q1']:.3f}–{s['q3']:.3f}, "
            f"range {s['min']:.3f}–{s['max']:.3f}, n={s['n']})")


def slider_steps(browser, app_url: str, minimal_url: str, *, steps: int, warmup: int,
                 quiet: float) -> dict:
    """Interleaved steps: project, minimal, minimal, project, ... (the order alternates)."""
    project = Visitor(browser, quiet_ms=quiet)
    minimal = Visitor(browser, quiet_ms=quiet)
    try:
        project.open(app_url, "Data")
        project.click_page("Calibrate")
        minimal.open(minimal_url, "Minimal slider page")
        settled = wait_idle(app_url)  # a person reads the page before moving the slider
        times = {"project": [], "minimal": []}
        sizes = {"project": [], "minimal": []}
        urls = {"project": app_url, "minimal": minimal_url}
        cpu = {}
        for i in range(warmup + steps):
            if i == warmup:
                cpu = {name: cpu_seconds(u) for name, u in urls.items()}
            order = (("project", project), ("minimal", minimal))
            for name, visitor in order if i % 2 == 0 else order[::-1]:
                visitor.page.bring_to_front()
                seconds, received = visitor.step()
                if i >= warmup:
                    times[name].append(seconds)
                    sizes[name].append(received)
                time.sleep(0.2)
        out = {name: {**_summary(t), "bytes_median": float(np.median(sizes[name])),
                      "server_cpu_per_step": (cpu_seconds(urls[name]) - cpu[name]) / steps}
               for name, t in times.items()}
        out["ratio_of_medians"] = out["project"]["median"] / out["minimal"]["median"]
        paired = np.array(times["project"]) / np.array(times["minimal"])
        out["paired_ratio"] = _summary(paired)
        out["exceptions"] = project.exceptions() + minimal.exceptions()
        out["settled_s"] = settled
        return out
    finally:
        project.close()
        minimal.close()


def first_visits(browser, log_dir: Path, *, quiet: float, root: Path, settle: float) -> dict:
    """Fresh servers, each given ``settle`` s after start (its warm-up) before anyone visits.

    Visitor 1 (the first after start) then visitor 2 open Data and click Calibrate,
    then Fleet; then a fresh server per deep link (/calibrate, /fleet) as the very
    first request, after ``settle`` s and right away.
    """
    out: dict = {"settle_s": settle}
    with serve("caliber_dashboard/app.py", log_dir / "visits.log", root=root) as (url, healthy):
        out["server_healthy_s"] = healthy
        time.sleep(settle)
        for who in ("cold", "warm"):
            v = Visitor(browser, quiet_ms=quiet)
            try:
                out[who] = {"Data": v.open(url, "Data"), "Calibrate": v.click_page("Calibrate"),
                            "Fleet": v.click_page("Fleet")}
                out[who]["exceptions"] = v.exceptions()
            finally:
                v.close()
    for wait in (settle, 0.0):
        for path, title in (("calibrate", "Calibrate"), ("fleet", "Fleet")):
            with serve("caliber_dashboard/app.py", log_dir / f"deep_{path}.log", root=root) as (url, _):
                time.sleep(wait)
                v = Visitor(browser, quiet_ms=quiet)
                try:
                    out[f"deep /{path} after {wait:g} s"] = v.open(f"{url}/{path}", title)
                finally:
                    v.close()
    return out


def new_tab_floor(browser, minimal_url: str, *, quiet: float, n: int = 3) -> float:
    """Median seconds to open the minimal page in a new browser context: any page's floor."""
    times = []
    for _ in range(n):
        v = Visitor(browser, quiet_ms=quiet)
        try:
            times.append(v.open(minimal_url, "Minimal slider page"))
        finally:
            v.close()
    return float(np.median(times))


def large_corridor(browser, app_url: str, path: Path, *, quiet: float, limit_s: float) -> dict:
    """Upload, then open Calibrate on the new model: seconds until a corridor is drawn."""
    v = Visitor(browser, quiet_ms=quiet, timeout_s=max(limit_s, 120.0) + 60.0)
    try:
        v.open(app_url, "Data")
        file_input(v.page).set_input_files(str(path))
        v.page.wait_for_selector("text=Loaded", timeout=120_000)
        v.wait_visit("Data")
        v.page.locator("[data-testid='stSidebarNavLink']", has_text="Calibrate").first.click()
        start = time.monotonic()
        shown = None
        try:
            v.page.wait_for_function(CORRIDOR_JS, timeout=limit_s * 1000, polling=50)
            shown = v.page.evaluate("performance.now() - window.__bench.t0") / 1000.0
        except Exception:  # noqa: BLE001  (playwright's TimeoutError: not shown in time)
            pass
        remaining = max(1.0, limit_s + 60.0 - (time.monotonic() - start))
        v.page.wait_for_function(VISIT_DONE_JS, arg=["Calibrate", quiet], timeout=remaining * 1000,
                                 polling=50)
        done = v.page.evaluate("window.__bench.painted - window.__bench.t0") / 1000.0
        corridor = [t for t in v.legends() if "corridor" in t.lower()]
        checkbox = v.page.get_by_text("accuracy corridor (quadrature", exact=False).count() > 0
        return {"corridor_shown_s": shown, "page_done_s": done, "legend": sorted(set(corridor)),
                "behind_checkbox": checkbox, "exceptions": v.exceptions()}
    finally:
        v.close()


# The app's own run state, as the browser tests wait on it (never a timer).
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from app_state import IDLE, file_input, settle_run, watch_socket  # noqa: E402


def _timed(page, action, *, ready: str, timeout_s: float = 600.0) -> float:
    """Seconds from the action to its script run ended and ``ready`` on the page."""
    start = time.monotonic()
    settle_run(page, action, ready=ready, timeout=timeout_s * 1000)
    return time.monotonic() - start


def actions_at_scale(browser, app_url: str, folder: Path, *, n: int, k: int) -> list[tuple[str, float]]:
    """Each action a provider takes on an N x K upload with separate labels, timed in Chromium.

    Once the server's warm-up is over and the page drawn, upload labels (.npy), then the logits (.npy); open Calibrate (its calibration:
    the first visit computes it), a slider step, Verify, side "at least"; open
    Fleet, Attack cost (largest M 64, its simulation included), Export, Policy,
    Extraction and Data again. The time of an action runs from the click to the
    end of the script run it starts, with its result on the page.
    """
    from caliber_core.simulation.synthetic import make_synthetic_logits

    logits, labels = make_synthetic_logits(n, k, seed=2024)
    logits_path, labels_path = folder / f"bench_{n}x{k}.npy", folder / f"bench_{n}x{k}_labels.npy"
    np.save(logits_path, logits)
    np.save(labels_path, labels)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(600_000)
    context.add_init_script(LONG_TASKS)
    page = context.new_page()
    watch_socket(page)
    out = []

    def goto(title: str, ready: str | None = None) -> None:
        link = page.locator("[data-testid='stSidebarNavLink']", has_text=title).first
        out.append((f"open {title}", _timed(page, lambda: link.click(), ready=ready or f"h1:has-text('{title}')")))

    try:
        page.goto(app_url)
        settle_run(page, ready="h1:has-text('Data')", timeout=600_000)
        wait_idle(app_url, windows=4)  # the server's warm-up (first visits time it) is over before the first upload
        wait_browser_idle(page)  # and the page drawn: its first plotly drawing is no part of the upload
        out.append(("upload the labels file (.npy)", _timed(
            page, lambda: file_input(page, "Labels file").set_input_files(str(labels_path)), ready="text=labels")))
        out.append((f"upload the logits file ({n:,} x {k:,} .npy), labels attached", _timed(
            page, lambda: file_input(page).set_input_files(str(logits_path)),
            ready=f"text=Loaded bench_{n}x{k}")))
        goto("Calibrate", "[data-testid='stMetricLabel']:has-text('σ* (logit units)')")
        thumb = page.locator("[data-testid='stSlider'] input[type=range]").first
        thumb.focus()
        out.append(("Calibrate: slider step", _timed(page, lambda: thumb.press("ArrowLeft"), ready=IDLE)))
        verify = page.get_by_role("button", name="Verify")
        out.append(("Calibrate: Verify", _timed(
            page, lambda: verify.click(), ready="[data-testid='stMetricLabel']:has-text('measured')")))
        side = page.locator("[data-testid='stButtonGroup'] button", has_text="at least")
        out.append(("Calibrate: side at least", _timed(
            page, lambda: side.click(), ready="[data-testid='stMetricLabel']:has-text('σ served, at least')")))
        goto("Fleet")
        goto("Attack cost", "[data-testid='stMetricLabel']:has-text('per-input seeding, M=64')")
        goto("Export", "text=Equivalent command")
        goto("Policy")
        goto("Extraction")
        goto("Data")
        if page.locator("[data-testid='stException']").count():
            raise RuntimeError("the app raised an exception during the tour")
        return out
    finally:
        context.close()


def _write_large(folder: Path, n: int, k: int) -> Path:
    from caliber_core.simulation.synthetic import make_synthetic_logits

    logits, labels = make_synthetic_logits(n, k, seed=2024)
    path = folder / f"synthetic_{n}x{k}.npz"
    np.savez(path, logits=logits, labels=labels, name=np.array(f"synthetic-{n}x{k}"))
    return path


def _legend_kind(legend: list[str]) -> str:
    text = " ".join(legend).lower()
    if not text:
        return "no corridor in the legend"
    kinds = [w for w in ("exact", "estimated", "monte carlo") if w in text]
    return ", ".join(kinds) if kinds else "not stated"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="measured steps per page (default 30)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="unmeasured steps first (default 2)")
    ap.add_argument("--quiet", type=float, default=300.0,
                    help="ms without DOM mutation that ends an action (default 300)")
    ap.add_argument("--settle", type=float, default=10.0,
                    help="seconds a fresh server gets for its warm-up before the first visitor "
                         "(default 10; deep links are also timed at 0)")
    ap.add_argument("--large", default="2000x1000", help="N x K of the synthetic upload")
    ap.add_argument("--corridor-limit", type=float, default=60.0,
                    help="seconds to wait for the corridor on the large file (default 60)")
    ap.add_argument("--skip-slider", action="store_true")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--actions", default=None, metavar="NxK",
                    help="time every action on an N x K upload with a separate labels file "
                         "(e.g. 10000x1000) and write docs/figures/dashboard.md")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the dashboard to serve (a checkout; default: this one)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--figure", default="dashboard",
                    help="the docs/figures/ file --actions writes (default dashboard; another name keeps a "
                         "loaded or comparison run apart from the quiet one)")
    args = ap.parse_args(argv)
    n, k = (int(x) for x in args.large.lower().split("x"))
    args.root = args.root.resolve()
    sys.path.insert(0, str(args.root))  # the synthetic generator of the tree being served

    from playwright.sync_api import sync_playwright

    results: dict = {"load_average_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    print(f"CPUs {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at start "
          "(other processes share the CPUs: read the spreads)")
    with tempfile.TemporaryDirectory(prefix="caliber_bench_") as tmp, sync_playwright() as pw:
        tmp_dir = Path(tmp)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            if not args.skip_cold:
                v = first_visits(browser, tmp_dir, quiet=args.quiet, root=args.root,
                                 settle=args.settle)
                results["first_visits"] = v
                print(f"\nFirst visits (server healthy {v['server_healthy_s']:.1f} s after start, then "
                      f"{args.settle:g} s for its warm-up; navigation start or click to the last paint):")
                for who in ("cold", "warm"):
                    label = "first visitor after start" if who == "cold" else "second visitor"
                    print(f"  {who:<5} ({label}): " + ", ".join(
                        f"{p} {v[who][p]:.2f} s" for p in ("Data", "Calibrate", "Fleet"))
                        + f"; exceptions {v[who]['exceptions']}")
                for wait in (args.settle, 0.0):
                    print(f"  deep link as a fresh server's first request, {wait:g} s after start: "
                          f"/calibrate {v[f'deep /calibrate after {wait:g} s']:.2f} s, "
                          f"/fleet {v[f'deep /fleet after {wait:g} s']:.2f} s")
            with serve("caliber_dashboard/app.py", tmp_dir / "app.log", root=args.root) as (app_url, _), \
                    serve(MINIMAL_PAGE, tmp_dir / "minimal.log") as (minimal_url, _):
                if not args.skip_cold:
                    floor = new_tab_floor(browser, minimal_url, quiet=args.quiet)
                    results["new_tab_floor_s"] = floor
                    print(f"  (for scale: the minimal page opened in a new browser tab: {floor:.2f} s)")
                if not args.skip_slider:
                    s = slider_steps(browser, app_url, minimal_url, steps=args.steps,
                                     warmup=args.warmup_steps, quiet=args.quiet)
                    results["slider"] = s
                    print("\nSlider steps, interleaved in one run (key press to the last paint; "
                          f"first {s['settled_s']:.1f} s for the server to go idle):")
                    for name, label in (("project", "Calibrate page:"), ("minimal", "minimal page:  ")):
                        print(f"  {label} {_fmt(s[name])}, {s[name]['bytes_median'] / 1024:.1f} KiB "
                              f"and {1000 * s[name]['server_cpu_per_step']:.0f} ms of server CPU per step")
                    print(f"  ratio of medians {s['ratio_of_medians']:.2f}; "
                          f"paired ratios (the bar: median <= 1.3): {_fmt(s['paired_ratio'], unit='x')}; "
                          f"exceptions {s['exceptions']}")
                if args.actions:
                    an, ak = (int(x) for x in args.actions.lower().split("x"))
                    timed = actions_at_scale(browser, app_url, tmp_dir, n=an, k=ak)
                    results["actions"] = timed
                    print(f"\nEach action on a {an:,} x {ak:,} SYNTHETIC upload with a separate labels file "
                          "(click to the end of its script run, result on the page):")
                    for what, seconds in timed:
                        print(f"  {what:<58} {seconds:6.2f} s")
                    from figure_files import FigureFile

                    fig = FigureFile(args.figure, f"Each dashboard action at {an:,} x {ak:,}, in Chromium")
                    fig.table(["action", "seconds"], [[w, f"{t:.2f}"] for w, t in timed])
                    background = (args.root / "caliber_dashboard" / "common" / "precalibrate.py").exists()
                    prepared = (args.root / "caliber_dashboard" / "common" / "attack_prefetch.py").exists()
                    fig.note("One visitor, one run, served from " + (
                        "this checkout" if args.root == ROOT else f"the tree at {args.root}") + ": " + (
                        "the model's calibration starts in the background when its file is loaded, so opening "
                        "Calibrate right after the upload waits only for what is left of it"
                        if background else "the first visit to Calibrate computes the model's calibration")
                        + "; every later page reuses it." + (
                            " Attack cost's simulation and the Policy page's replay are prepared in the "
                            "background too (the first once the Calibrate page has been left alone for a "
                            "moment), so those two pages read them when they are ready in time."
                            if prepared else "")
                        + " Other processes shared the CPUs (see the load average above).")
                    fig.write()
                if not args.skip_large:
                    path = _write_large(tmp_dir, n, k)
                    c = large_corridor(browser, app_url, path, quiet=args.quiet,
                                       limit_s=args.corridor_limit)
                    results["large"] = c
                    shown = (f"{c['corridor_shown_s']:.2f} s" if c["corridor_shown_s"] is not None
                             else f"not shown within {args.corridor_limit:.0f} s")
                    print(f"\nCorridor on a {n:,} x {k:,} SYNTHETIC upload (click on Calibrate to "
                          f"the corridor drawn): {shown}; page done {c['page_done_s']:.2f} s; "
                          f"legend: {_legend_kind(c['legend'])} {c['legend']}; "
                          f"behind a checkbox: {'yes' if c['behind_checkbox'] else 'no'}; "
                          f"exceptions {c['exceptions']}")
        finally:
            browser.close()
    results["load_average_end"] = os.getloadavg()[0]
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("dashboard-timings", "--skip-slider", "--skip-cold", "--skip-large", "--large"), "Dashboard timings in Chromium"):
        main()
