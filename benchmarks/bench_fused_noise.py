"""The served noise's cost per row on torch tensors, against ``torch.randn`` + add, paired in one process.

Run from the repository root::

    python benchmarks/bench_fused_noise.py

1. **Per row.** ``BatchNoise.serve`` (what the vLLM processors and the throttle
   call) on float32 rows of K = 1,000 and 128,000 at batch 1, 8, 64 and 256,
   every row at the top level of a three-level policy (three nested draws per
   element, all drawn), against ``logits + torch.randn(...)`` of the same shape;
   the two alternate in each repeat, so a change of load hits both. The fused
   kernel alone (``keyed_noise_torch.add_keyed_noise``, three levels) and, at
   batch 8, the op-by-op path it replaced (numpy's kernel on the tensor's memory)
   are timed in the same rounds.
2. **Constant time across levels.** ``BatchNoise.serve`` of the same batch with
   every row at level 0, 1 and the top, alternating; the ratio of each to the top.
3. **Where the time goes.** The fused kernel alone (``fused_noise.add_keyed_noise``
   on preallocated output) at K = 128,000, batch 8, drawing 0, 1, 2 and 3 levels,
   beside ``torch.randn`` into a preallocated tensor, the add alone, and
   ``torch.randn`` + add, at the same thread count: the slope over levels is one
   draw's cost, the 0-level call the read and write of the rows.

Writes ``docs/figures/fused-noise.md`` unless ``--no-figure``. ``--device cuda``
times a CUDA device instead (where there is one; the fused kernel is the CPU's,
a GPU is served by torch's op-by-op path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _core(folder: Path, vocab: int):
    from throttle_support import write_policy

    from caliber_core.serving.engine_rows import BatchNoise
    from caliber_core.throttle import load_policy

    (folder / f"k{vocab}").mkdir(parents=True, exist_ok=True)
    policy = write_policy(folder / f"k{vocab}", levels=(0, 1, 2), escalate_after=10**9, n_classes=vocab)
    return BatchNoise(load_policy(policy), key=bytes(range(32)))


#: What is timed: "cpu" (this thread's CPU time, blind to the time other processes hold the cores: the
#: figure to read on a loaded machine, with one thread) or "wall" (perf_counter; a device's kernels).
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _timed(fns: dict, repeats: int, sync) -> dict:
    times = {name: [] for name in fns}
    for step in range(repeats + 1):
        for name, fn in fns.items():
            sync()
            start = _clock()
            fn(step)
            sync()
            if step:  # the first round warms every path
                times[name].append(_clock() - start)
    return times


def _mean_sd(values) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def per_row(folder: Path, *, vocab: int, rows: int, repeats: int, device: str) -> dict:
    import numpy as np
    import torch

    from caliber_core.serving import keyed_noise, keyed_noise_torch
    from caliber_core.serving.engine_rows import position_id

    core = _core(folder, vocab)
    top = core.policy.top
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).to(device)
    seeds = [np.random.default_rng(level).integers(0, 2**63, size=rows, dtype=np.uint64) for level in range(3)]
    increments = [0.5, 0.8660254037844386, 1.7320508075688772]
    fns = {
        "served": lambda step: core.serve(logits, [top] * rows, [position_id([1, 2, step], [r]) for r in range(rows)]),
        "kernel": lambda step: keyed_noise_torch.add_keyed_noise(logits, seeds, increments),
        "randn": lambda step: logits + torch.randn(rows, vocab, device=device),
    }
    if rows == 8 and device == "cpu":
        fns["previous"] = lambda step: torch.from_numpy(keyed_noise.add_keyed_noise(logits.numpy(), seeds, increments))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = _timed(fns, repeats, sync)
    out = {"vocab": vocab, "rows": rows, "repeats": repeats, "draws": len(core.levels.increments)}
    for name, values in times.items():
        out[f"{name}_us"] = _mean_sd([v / rows * 1e6 for v in values])
        out[f"{name}_ratio"] = _mean_sd([a / b for a, b in zip(values, times["randn"])])
    return out


def levels(folder: Path, *, vocab: int, rows: int, repeats: int, device: str) -> dict:
    import torch

    from caliber_core.serving.engine_rows import position_id

    core = _core(folder, vocab)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fns = {level: (lambda step, level=level: core.serve(logits, [level] * rows,
                                                         [position_id([7, step], [r]) for r in range(rows)]))
           for level in (0, 1, core.policy.top)}
    times = _timed(fns, repeats, sync)
    top = times[core.policy.top]
    return {"vocab": vocab, "rows": rows, "repeats": repeats,
            "levels": {str(level): {"ms": _mean_sd([v * 1e3 for v in values]),
                                    "ratio": _mean_sd([a / b for a, b in zip(values, top)])}
                       for level, values in times.items()}}


def breakdown(*, vocab: int, rows: int, repeats: int) -> dict:
    """The kernel alone by number of levels drawn, against torch.randn's parts, ns per element (CPU)."""
    import numpy as np
    import torch

    from caliber_core.serving import fused_noise

    if not fused_noise.prepare():
        return {}
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2))
    out, noise = torch.empty_like(logits), torch.empty_like(logits)
    seeds = np.random.default_rng(3).integers(0, 2**63, size=(3, rows), dtype=np.uint64)
    increments = np.array([0.5, 0.8660254037844386, 1.7320508075688772])
    stride = vocab * logits.element_size()

    def kernel(levels):
        return lambda step: fused_noise.add_keyed_noise(logits.data_ptr(), stride, out.data_ptr(), stride,
                                                        (rows, vocab), "float32", seeds[:levels],
                                                        increments[:levels], n_threads=torch.get_num_threads())

    fns = {f"kernel, {levels} level(s)": kernel(levels) for levels in range(4)}
    fns.update({"`torch.randn` (into a tensor)": lambda step: torch.randn(rows, vocab, out=noise),
                "the add alone": lambda step: torch.add(logits, noise, out=out),
                "`torch.randn` + add": lambda step: logits + torch.randn(rows, vocab)})
    times = _timed(fns, repeats, lambda: None)
    elements = rows * vocab
    return {"vocab": vocab, "rows": rows, "repeats": repeats,
            "ns": {name: _mean_sd([v / elements * 1e9 for v in values]) for name, values in times.items()},
            "ratio": {name: _mean_sd([a / b for a, b in zip(values, times["`torch.randn` + add"])])
                      for name, values in times.items()}}


def _loaded() -> bool:
    """Whether other processes held the cores: a load average above half the CPU count."""
    import os

    return os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1) if hasattr(os, "getloadavg") else False


def write_figure(result: dict, device: str, name: str = "fused-noise") -> None:
    from figure_files import FigureFile

    fig = FigureFile(name, "The served noise per row against torch.randn + add, and across levels")
    where = f"on {device}" if device != "cpu" else f"on the CPU, {result['threads']} thread(s)"
    clock = ("this thread's CPU time (`time.thread_time`: the time other processes hold the cores is not "
             "counted, which a loaded machine needs)" if result["clock"] == "cpu" else "elapsed time")
    if result.get("loaded"):
        paired = ("of CPU time paired within a repeat" if result["clock"] == "cpu" else
                  "of elapsed time paired within a repeat, which a wait for a core still stretches unevenly")
        fig.note("**Loaded machine.** Other processes held the cores while this ran (the load average is in the "
                 f"header): read the ratios, which are {paired}, not the absolute times, and neither as a quiet "
                 "machine's.")
    fig.note(f"Float32 logits {where}, timed by {clock}; every row at the top level of a three-level policy "
             "(three nested keyed draws per element, all drawn). Mean ± sd over repeats; ratios are paired "
             "(each repeat's time over the same repeat's `torch.randn` + add). GPU figures were not measured "
             "here: no GPU was available to this run (a CUDA device is served by torch's op-by-op path, and the "
             "fused kernel is the CPU's).")
    rows = []
    for r in result["per_row"]:
        def cell(name, r=r):
            mean, sd = r[f"{name}_us"]
            return f"{mean:,.1f} ± {sd:,.1f}"

        def ratio(name, r=r):
            mean, sd = r[f"{name}_ratio"]
            return f"{mean:.2f} ± {sd:.2f}"

        previous = f"{cell('previous')} ({ratio('previous')}×)" if "previous_us" in r else "–"
        rows.append([f"{r['vocab']:,}", r["rows"], cell("served"), ratio("served"), cell("kernel"), ratio("kernel"),
                     cell("randn"), previous])
    fig.table(["K", "batch", "`BatchNoise.serve` µs/row", "× randn + add", "kernel alone µs/row", "× randn + add",
               "`torch.randn` + add µs/row", "previous path µs/row (×)"], rows,
              caption="Per row. `BatchNoise.serve` includes the checks, the row seeds (one keyed hash per row and "
                      "level) and the grant-free level bookkeeping; the kernel alone is "
                      "`keyed_noise_torch.add_keyed_noise` with three levels; the previous path is numpy's kernel "
                      "on the tensor's memory, what CPU float32 tensors were served by before.")
    c = result["levels"]
    fig.table(["level of every row", "ms per batch", "× the top level"],
              [[level, f"{v['ms'][0]:.2f} ± {v['ms'][1]:.2f}", f"{v['ratio'][0]:.3f} ± {v['ratio'][1]:.3f}"]
               for level, v in c["levels"].items()],
              caption=f"Constant time across levels: `BatchNoise.serve` of {c['rows']} rows of K = {c['vocab']:,}, "
                      f"every row at level 0 (served clean), 1, and the top, alternating ({c['repeats']} repeats).")
    b = result.get("breakdown")
    if b:
        fig.table(["call", "ns per element", "× `torch.randn` + add"],
                  [[name, f"{b['ns'][name][0]:.2f} ± {b['ns'][name][1]:.2f}",
                    f"{b['ratio'][name][0]:.2f} ± {b['ratio'][name][1]:.2f}"] for name in b["ns"]],
                  caption=f"Where the time goes: the fused kernel alone on preallocated rows ({b['rows']} rows of "
                          f"K = {b['vocab']:,}, float32) by the number of levels it draws, and `torch.randn`'s parts, "
                          f"at the same thread count ({b['repeats']} repeats). The step from one level to the next is "
                          f"one draw per element (SplitMix64 words, the piecewise polynomial, the scale and the sum); "
                          f"0 levels is the read and write of the rows alone.")
    fig.write()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per size (default 7)")
    parser.add_argument("--device", default="cpu", help="where the logits live (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads, and the kernel's (default 1)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this thread's CPU time (default; needs --threads 1); wall: elapsed time")
    parser.add_argument("--figure", default="fused-noise", help="docs/figures/NAME.md (default fused-noise)")
    parser.add_argument("--no-figure", action="store_true", help="print only")
    args = parser.parse_args(argv)
    import figure_files  # noqa: F401  (imported now, it records the load at the start of the run)
    import torch

    global _clock
    _clock = CLOCKS[args.clock]
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        parser.error("--clock cpu counts this thread only: use it with --threads 1 on the CPU")
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}", flush=True)
    result = {"per_row": [], "clock": args.clock, "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in (1_000, 128_000):
            for rows in (1, 8, 64, 256):
                repeats = args.repeats if vocab * rows <= 8 * 128_000 else max(3, args.repeats // 2)
                one = per_row(Path(tmp), vocab=vocab, rows=rows, repeats=repeats, device=args.device)
                print(json.dumps(one), flush=True)
                result["per_row"].append(one)
        result["levels"] = levels(Path(tmp), vocab=128_000, rows=8, repeats=3 * args.repeats, device=args.device)
        print(json.dumps(result["levels"]), flush=True)
    if args.device == "cpu":
        result["breakdown"] = breakdown(vocab=128_000, rows=8, repeats=3 * args.repeats)
        print(json.dumps(result["breakdown"]), flush=True)
    result["loaded"] = _loaded()
    if not args.no_figure:
        write_figure(result, args.device, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
