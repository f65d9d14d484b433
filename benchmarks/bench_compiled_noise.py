"""The compiled noise kernel per row against ``torch.randn`` + add, paired in one process, with a bit check.

Run from the repository root (one command; on an H100/H200 it takes a few minutes)::

    python benchmarks/bench_compiled_noise.py --device cuda
    python benchmarks/bench_compiled_noise.py --device cpu --repeats 3     # no GPU: Inductor's C++ build

1. **Compile at start.** ``compiled_noise.prepare`` for three levels (every
   dtype on CUDA, float32 on the CPU) and for one level; the seconds each took.
2. **Bits.** The compiled kernel against numpy's reference
   (``keyed_noise.add_keyed_noise``) on random rows, keys and served counts,
   for every prepared dtype.
3. **Per row.** K = 1,000 and 128,000, batch 1, 8, 64 and 256, three nested
   levels all drawn (float32 logits): the compiled kernel (host side included:
   the packed seeds' copy and the call), ``BatchNoise.serve`` (the whole served
   path: checks, keyed row seeds, levels) and the path it replaces, against
   ``logits + torch.randn(...)``, alternating in each repeat. On CUDA the
   replaced path is torch's op-by-op one; on the CPU it is the fused C kernel
   that serves CPU tensors (the compiled kernel is CUDA's).
   One level at K = 128,000 too.
4. **No compile on a request.** Ten calls at a batch size and K never seen
   before (no recompile: the first is not slower than the tenth), and
   ``BatchNoise.serve`` at level 0, 1 and the top (constant time across levels).

Writes ``docs/figures/compiled-noise.md`` unless ``--no-figure``. Exits 2 on a bad option, 1 if the
kernel cannot be compiled or a bit check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

VOCABS = (1_000, 128_000)
_BITS = {}  # filled in main (torch is imported there)
BATCHES = (1, 8, 64, 256)
INCREMENTS = (0.5, 0.8660254037844386, 1.7320508075688772)  # a three-level policy's sigmas 0.5, 1, 2


def _mean_sd(values) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


class Timer:
    """Wall time with the device synchronized on CUDA; this thread's CPU time on the CPU (blind to the time
    other processes hold the cores, which a loaded machine needs; one torch thread)."""

    def __init__(self, device: str):
        import torch

        self.cuda = device.startswith("cuda")
        self.clock = time.perf_counter if self.cuda else time.thread_time
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)

    def paired(self, fns: dict, repeats: int) -> dict:
        times = {name: [] for name in fns}
        for step in range(repeats + 1):
            for name, fn in fns.items():
                self.sync()
                start = self.clock()
                fn(step)
                self.sync()
                if step:  # the first round warms every path
                    times[name].append(self.clock() - start)
        return times


def _core(folder: Path, vocab: int, device: str):
    from throttle_support import write_policy

    from caliber_core.serving.engine_rows import BatchNoise
    from caliber_core.throttle import load_policy

    (folder / f"k{vocab}").mkdir(parents=True, exist_ok=True)
    policy = write_policy(folder / f"k{vocab}", levels=(0, 1, 2), escalate_after=10**9, n_classes=vocab)
    core = BatchNoise(load_policy(policy), key=bytes(range(32)))
    core.warm_up(device)
    return core


def prepare(device: str) -> dict:
    """Each variant the run needs, compiled and self-checked now; seconds per variant, or why it is not served."""
    import torch

    from caliber_core.serving import compiled_noise

    dtypes = compiled_noise.DTYPES if device.startswith("cuda") else (torch.float32,)
    wanted = [(3, dtype) for dtype in dtypes] + [(1, torch.float32)]
    for n_levels, dtype in wanted:  # one at a time: a dtype that fails its self-check leaves the others served
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", compiled_noise.CompiledNoiseWarning)
            compiled_noise.prepare(device, n_levels=n_levels, dtypes=(dtype,))
        for w in caught:
            print(f"warning: {w.message}", flush=True)
    seconds = {(n, d): s for (_, n, d), s in compiled_noise.compile_seconds().items()}
    return {f"{n_levels} level(s), {str(dtype).split('.')[-1]}":
            (f"{seconds[(n_levels, dtype)]:.1f} ({compiled_noise.kernel_name(device, n_levels, dtype)})"
             if compiled_noise.ready(device, n_levels, dtype) else "not served (see the warning)")
            for n_levels, dtype in wanted}


_INDUCTOR = {}


def inductor_twin(device: str):
    """Inductor's compile of the same function, where the Triton kernel serves: timed beside it (CUDA only)."""
    import torch

    from caliber_core.serving import compiled_noise

    if "fn" not in _INDUCTOR:
        _INDUCTOR["fn"] = torch.compile(compiled_noise.noisy_logits, dynamic=True, fullgraph=True,
                                        options=dict(compiled_noise.COMPILE_OPTIONS))
    return _INDUCTOR["fn"]


def _reference_bits(logits, seeds, increments, served):
    """numpy's reference, each row at its count of levels, as raw bits (bfloat16, which numpy lacks: the float64
    reference rounded once, exactly, by the round-to-odd conversion the tests check against exact rounding)."""
    import numpy as np
    import torch

    from caliber_core.serving import compiled_noise, keyed_noise

    wide = logits.to(torch.float64).numpy()
    out = logits.clone()
    for row, k in enumerate(served):
        if not k:
            continue
        row_seeds = [s[row:row + 1] for s in seeds[:k]]
        if logits.dtype == torch.bfloat16:
            noisy = torch.from_numpy(keyed_noise.add_keyed_noise(wide[row:row + 1], row_seeds, increments[:k]))
            out[row] = compiled_noise._round_once(noisy, torch.bfloat16)[0]
        else:
            out[row] = torch.from_numpy(keyed_noise.add_keyed_noise(logits[row:row + 1].numpy(), row_seeds,
                                                                    increments[:k]))[0]
    return out.view(_BITS[logits.dtype]).numpy().astype(np.int64)


def bit_check(device: str, cases: int = 3) -> dict:
    """Prepared variants against numpy's reference on random rows, keyed row seeds and served counts."""
    import numpy as np
    import torch

    from caliber_core.serving import compiled_noise, keyed_noise

    rng = np.random.default_rng(2026)
    out = {}
    for dtype in compiled_noise.DTYPES:
        if not compiled_noise.ready(device, 3, dtype):
            continue
        equal = 0
        for case in range(cases):
            n_rows, n_classes = (1, 7, 64)[case % 3], int(rng.choice([1_000, 32_000, 128_000]))
            logits = torch.from_numpy(rng.standard_normal((n_rows, n_classes)) * 8).to(dtype)
            digests = keyed_noise.row_digests([rng.bytes(12) for _ in range(n_rows)])
            key = rng.bytes(32)
            seeds = [keyed_noise.row_seeds(key, b"bench", level, digests, n_classes) for level in (1, 2, 3)]
            served = [int(k) for k in rng.integers(0, 4, size=n_rows)]
            got = compiled_noise.add_keyed_noise(logits.to(device), seeds, list(INCREMENTS), served)
            got_bits = got.cpu().view(_BITS[dtype]).numpy().astype(np.int64)
            equal += int(np.array_equal(got_bits, _reference_bits(logits, seeds, list(INCREMENTS), served)))
        out[str(dtype).split(".")[-1]] = (equal, cases)
    return out


def per_row(folder: Path, timer: Timer, *, vocab: int, rows: int, n_levels: int, repeats: int, device: str) -> dict:
    import numpy as np
    import torch

    from caliber_core.serving import compiled_noise, keyed_noise_torch
    from caliber_core.serving.engine_rows import position_id

    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).to(device)
    seeds = [np.random.default_rng(level).integers(0, 2**63, size=rows, dtype=np.uint64) for level in range(n_levels)]
    increments = list(INCREMENTS[:n_levels])
    cuda = device.startswith("cuda")
    fns = {
        "compiled": lambda step: compiled_noise.add_keyed_noise(logits, seeds, increments),
        "randn": lambda step: logits + torch.randn(rows, vocab, device=device),
    }
    if n_levels == 3:
        core = _core(folder, vocab, device)
        top = core.policy.top
        fns["served"] = lambda step: core.serve(logits, [top] * rows, [position_id([1, 2, step], [r])
                                                                      for r in range(rows)])
    if cuda:  # what CUDA tensors were served by before
        fns["replaced"] = lambda step: keyed_noise_torch.add_keyed_noise_op_by_op(logits, seeds, increments)
        if compiled_noise.kernel_name(device, n_levels, torch.float32) == "triton":
            from caliber_core.serving import triton_noise

            twin = inductor_twin(device)
            try:  # torch's own compile of it may fail on a torch version; the column then stays empty
                compiled_noise.call(twin, logits, seeds, increments)
                fns["inductor"] = lambda step: compiled_noise.call(twin, logits, seeds, increments)
            except Exception as exc:
                print(f"note: Inductor's compile of the function failed here ({type(exc).__name__})", flush=True)
            packed = torch.from_numpy(np.stack([s.view(np.int64) for s in seeds] + [
                np.full(rows, n_levels, dtype=np.int64)])).to(device)
            incs = torch.tensor(increments, dtype=torch.float64, device=device)
            fns["kernel"] = lambda step: triton_noise.noisy_logits(logits, packed, incs)
    else:  # what serves CPU tensors: the fused C kernel
        fns["replaced"] = lambda step: keyed_noise_torch.add_keyed_noise(logits, seeds, increments)
    if n_levels == 3:
        got = compiled_noise.add_keyed_noise(logits, seeds, increments)
        want = keyed_noise_torch.add_keyed_noise_op_by_op(logits, seeds, increments)
        same = bool(torch.equal(got.view(torch.int32), want.view(torch.int32)))
    else:
        same = None
    times = timer.paired(fns, repeats)
    out = {"vocab": vocab, "rows": rows, "levels": n_levels, "repeats": repeats, "bits_equal": same}
    for name, values in times.items():
        out[f"{name}_us"] = _mean_sd([v / rows * 1e6 for v in values])
        out[f"{name}_ratio"] = _mean_sd([a / b for a, b in zip(values, times["randn"])])
    return out


def first_and_tenth(timer: Timer, device: str) -> list[float]:
    """Ten calls at a batch size and K no warm-up used: a recompile would show as a slow first call."""
    import numpy as np
    import torch

    from caliber_core.serving import compiled_noise

    rows, vocab = 13, 50_021
    logits = torch.randn(rows, vocab, device=device)
    out = []
    for call in range(10):
        seeds = [np.random.default_rng([call, level]).integers(0, 2**63, size=rows, dtype=np.uint64)
                 for level in range(3)]
        timer.sync()
        start = time.perf_counter()
        compiled_noise.add_keyed_noise(logits, seeds, list(INCREMENTS))
        timer.sync()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def across_levels(folder: Path, timer: Timer, *, vocab: int, rows: int, repeats: int, device: str) -> dict:
    import torch

    from caliber_core.serving.engine_rows import position_id

    core = _core(folder, vocab, device)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)).to(device)
    fns = {level: (lambda step, level=level: core.serve(logits, [level] * rows,
                                                         [position_id([7, step], [r]) for r in range(rows)]))
           for level in (0, 1, core.policy.top)}
    times = timer.paired(fns, repeats)
    top = times[core.policy.top]
    return {"vocab": vocab, "rows": rows, "repeats": repeats,
            "levels": {str(level): {"ms": _mean_sd([v * 1e3 for v in values]),
                                    "ratio": _mean_sd([a / b for a, b in zip(values, top)])}
                       for level, values in times.items()}}


def _cell(r, name) -> str:
    if f"{name}_us" not in r:
        return "–"
    mean, sd = r[f"{name}_us"]
    ratio, ratio_sd = r[f"{name}_ratio"]
    return f"{mean:,.2f} ± {sd:,.2f} ({ratio:.2f} ± {ratio_sd:.2f}×)"


def write_figure(result: dict, name: str) -> Path:
    from figure_files import FigureFile

    device, cuda = result["device"], result["device"].startswith("cuda")
    fig = FigureFile(name, "The compiled noise kernel per row against torch.randn + add, with a bit check")
    where = result["device_name"]
    clock = "elapsed time, the device synchronized around each call" if cuda else (
        "this thread's CPU time (`time.thread_time`, one torch thread: the time other processes hold the cores "
        "is not counted, which a loaded machine needs)")
    if not cuda:
        fig.note("**No GPU was available to this run**: these are the CPU figures of the same compiled function "
                 "(Inductor's C++ build), which CPU tensors are not served by (the fused C kernel serves them, the "
                 "`replaced` column). The CUDA figures come from `python benchmarks/bench_compiled_noise.py "
                 "--device cuda` on a GPU machine.")
    fig.note(f"Device: {where}; torch {result['torch']}. Timed by {clock}. Mean ± sd over repeats; ratios are "
             "paired (each repeat's time over the same repeat's `torch.randn` + add).")
    fig.table(["variant", "seconds to compile and self-check"],
              [[k, v] for k, v in result["compile_seconds"].items()],
              caption="Compile at start (`compiled_noise.prepare`: batch 1 and 5, then a bit check against numpy's "
                      "reference); this process's first compile includes the compiler's own start.")
    if result.get("triton_configs"):
        fig.table(["Triton launch configuration", "µs a call (batch 64, K = 131,072, three levels)"],
                  [[k, f"{v:,.1f}"] for k, v in result["triton_configs"].items()],
                  caption="Timed once at prepare; the fastest serves.")
    fig.table(["dtype", "cases bit-equal to numpy's reference"],
              [[k, f"{a} of {b}"] for k, (a, b) in result["bits"].items()],
              caption="Bits: random rows (batch 1, 7, 64; K of 1,000, 32,000 or 128,000), keys and served counts, "
                      "three levels.")
    replaced = "torch's op-by-op path (what CUDA served before)" if cuda else "the fused C kernel (what serves CPU)"
    rows = [[f"{r['vocab']:,}", r["rows"], r["levels"], _cell(r, "compiled"), _cell(r, "served"), _cell(r, "replaced"),
             f"{r['randn_us'][0]:,.2f} ± {r['randn_us'][1]:,.2f}",
             {True: "equal", False: "DIFFER", None: "–"}[r["bits_equal"]]] + (
                [_cell(r, "kernel"), _cell(r, "inductor")] if cuda else [])
            for r in result["per_row"]]
    fig.table(["K", "batch", "levels", "served kernel µs/row (× randn + add)", "`BatchNoise.serve` µs/row (×)",
               f"replaced: {replaced} µs/row (×)", "`torch.randn` + add µs/row", "bits"] + (
                   ["Triton kernel alone (seeds already on the device) µs/row (×)",
                    "Inductor's compile of the same function µs/row (×)"] if cuda else []), rows,
              caption="Per row, float32 logits, every level drawn. The compiled kernel's time includes its host "
                      "side (seeds packed and copied to the device in one transfer, the call); `BatchNoise.serve` "
                      "adds the checks, the keyed row seeds (one hash per row and level) and the levels' bookkeeping.")
    first = result["first_calls_ms"]
    fig.note(f"No compile on a request: ten calls at batch 13 and K = 50,021 (shapes no warm-up used) took "
             f"{', '.join(f'{t:.2f}' for t in first)} ms; first over tenth {first[0] / first[-1]:.2f}×.")
    c = result["levels"]
    fig.table(["level of every row", "ms per batch", "× the top level"],
              [[level, f"{v['ms'][0]:.3f} ± {v['ms'][1]:.3f}", f"{v['ratio'][0]:.3f} ± {v['ratio'][1]:.3f}"]
               for level, v in c["levels"].items()],
              caption=f"Constant time across levels: `BatchNoise.serve` of {c['rows']} rows of K = {c['vocab']:,}, "
                      f"every row at level 0 (served clean), 1, and the top, alternating ({c['repeats']} repeats).")
    return fig.write()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where the logits live (default cuda)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per size (default 7)")
    parser.add_argument("--figure", default="compiled-noise", help="docs/figures/NAME.md (default compiled-noise)")
    parser.add_argument("--no-figure", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2 (a spread needs two), got {args.repeats}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch here (use --device cpu)")
    if args.device == "cpu":
        torch.set_num_threads(1)  # thread_time counts this thread only
    _BITS.update({torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                  torch.bfloat16: torch.int16})
    device = "cuda" if args.device == "cuda" else "cpu"
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "the CPU, 1 thread"
    print(f"torch {torch.__version__}, device {device_name}", flush=True)
    timer = Timer(device)
    result = {"device": device, "device_name": device_name, "torch": torch.__version__, "per_row": []}
    from caliber_core.serving import compiled_noise

    result["compile_seconds"] = prepare(device)
    result["triton_configs"] = {f"block {b}, {w} warps": round(t * 1e6, 1)
                                for (b, w), t in compiled_noise.triton_configs(device).items()}
    print(json.dumps({"compile_seconds": result["compile_seconds"], "triton_configs_us": result["triton_configs"]}),
          flush=True)
    if not (compiled_noise.ready(device, 3, torch.float32) and compiled_noise.ready(device, 1, torch.float32)):
        print(f"error: the compiled kernel is unavailable on {device} for float32 logits: "
              f"{compiled_noise.unavailable_reason(device) or 'it failed its self-check'}", file=sys.stderr)
        return 1
    result["bits"] = bit_check(device)
    print(json.dumps({"bits": result["bits"]}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in VOCABS:
            for rows in BATCHES:
                big = vocab * rows > 8 * 128_000
                repeats = args.repeats if not big else max(2, args.repeats // 2)
                one = per_row(Path(tmp), timer, vocab=vocab, rows=rows, n_levels=3, repeats=repeats, device=device)
                print(json.dumps(one), flush=True)
                result["per_row"].append(one)
        for rows in (8, 64, 256):
            one = per_row(Path(tmp), timer, vocab=128_000, rows=rows, n_levels=1, repeats=args.repeats, device=device)
            print(json.dumps(one), flush=True)
            result["per_row"].append(one)
        result["first_calls_ms"] = first_and_tenth(timer, device)
        print(json.dumps({"first_calls_ms": result["first_calls_ms"]}), flush=True)
        result["levels"] = across_levels(Path(tmp), timer, vocab=128_000, rows=8 if device == "cpu" else 64,
                                         repeats=3 * args.repeats, device=device)
        print(json.dumps(result["levels"]), flush=True)
    failed = [k for k, (a, b) in result["bits"].items() if a != b] + [
        f"K={r['vocab']} batch {r['rows']}" for r in result["per_row"] if r["bits_equal"] is False]
    if not args.no_figure:
        # Printed too, so that the run's output holds every figure.
        print(write_figure(result, args.figure).read_text(encoding="utf-8"), flush=True)
    if failed:
        print(f"error: bits differ from numpy's reference: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
