"""Per-row cost of per-input noise (Perturber.perturb) against plain normals plus the add.

Run:  python benchmarks/bench_runtime.py [--repeats N] [--batch B]

For K = 10, 1,000 and 32,000 (batch B, default 64, float32 logits) it times,
in one process:

* plain   -- ``numpy.random.Generator.standard_normal((B, K))`` plus the add to
             the logits: the floor any noise costs;
* numpy   -- ``Perturber.perturb`` on a numpy array, per-input seeding, the
             whole path (id hashing, keyed draw, scale, add, cast back);
* torch   -- the same on a CPU tensor (torch on one thread, like numpy);
* and, when a CUDA device is present, torch on CUDA at K = 128,000, batch 64,
  against ``torch.randn`` plus the add on the same device.

Each path alternates with a plain call within each of N rounds (after one
warm-up each), so a change in the machine's load hits both alike. Printed per call, in
microseconds per row: the best of N, the median and the interquartile
range; then two ratios to plain: best over best (the least disturbed by other
processes, so the bars are judged on it) and the median over rounds of the
round's ratio. The bars, at K = 1,000: numpy <= 1.5x plain, torch on the CPU
<= 2x.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caliber_core.serving.runtime import Perturber  # noqa: E402

N_CLASSES = (10, 1000, 32_000)
CUDA_CLASSES, CUDA_BATCH = 128_000, 64
KEY = b"benchmark key, not a secret"
BARS = {"numpy": 1.5, "torch": 2.0}


def interleaved_us(calls: dict, n_rows: int, repeats: int, sync=None) -> dict:
    """Per call name: microseconds per row of each of ``repeats`` rounds, the calls alternating in every round.

    Alternating keeps a change in the machine's load from favouring one call:
    each round's ratio compares calls timed moments apart.
    """
    for call in calls.values():
        call()  # warm-up: lazy imports, caches, allocator
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if sync is not None:
                sync()
            times[name].append((time.perf_counter() - start) / n_rows * 1e6)
    return times


def summary(times: list, plain: list) -> str:
    """best of N, median [IQR]; then best / plain's best and the median of the per-round ratios."""
    q1, median, q3 = statistics.quantiles(times, n=4)
    ratio = statistics.median(t / p for t, p in zip(times, plain))
    return (f"{min(times):9.2f} {median:9.2f} [{q1:.2f}-{q3:.2f}]".ljust(40)
            + f"{min(times) / min(plain):7.2f}x {ratio:7.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60, help="timed calls per figure (median reported)")
    parser.add_argument("--batch", type=int, default=64, help="rows per call")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"machine: {platform.machine()}, cpu_count={os.cpu_count()}, usable cores={affinity}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__} (1 thread)")
    print(f"batch={args.batch}, float32 logits, {args.repeats} rounds, microseconds per row\n")

    rng = np.random.default_rng(0)
    plain_gen = np.random.default_rng(1)
    ids = [f"request-{i}" for i in range(args.batch)]
    perturber = Perturber(1.0, key=KEY)
    header = f"{'K':>7}  {'path':<6} {'best':>9} {'median [IQR]':<30}{'best x':>8} {'med x':>8}"
    print(header)
    print("-" * len(header))
    ratios, bests = {}, {}
    for n_classes in N_CLASSES:
        x = rng.normal(size=(args.batch, n_classes)).astype(np.float32)
        xt = torch.from_numpy(x.copy())
        plain = lambda: x + plain_gen.standard_normal(x.shape)  # noqa: E731
        paths = {"numpy": lambda: perturber.perturb(x, ids), "torch": lambda: perturber.perturb(xt, ids)}
        for name, call in paths.items():
            # Each path alternates with its own plain call: nothing else runs between the two.
            times = interleaved_us({"plain": plain, name: call}, args.batch, args.repeats)
            if name == "numpy":
                print(f"{n_classes:>7}  {'plain':<6} {summary(times['plain'], times['plain'])}")
            ratios[(n_classes, name)] = statistics.median(t / p for t, p in zip(times[name], times["plain"]))
            bests[(n_classes, name)] = min(times[name]) / min(times["plain"])
            print(f"{n_classes:>7}  {name:<6} {summary(times[name], times['plain'])}")

    print()
    if torch.cuda.is_available():
        device = torch.device("cuda")
        xc = torch.randn(CUDA_BATCH, CUDA_CLASSES, device=device)
        cuda_ids = [f"request-{i}" for i in range(CUDA_BATCH)]
        times = interleaved_us({
            "randn": lambda: xc + torch.randn(xc.shape, device=device),
            "per-input": lambda: perturber.perturb(xc, cuda_ids),
        }, CUDA_BATCH, args.repeats, sync=torch.cuda.synchronize)
        print(f"CUDA ({torch.cuda.get_device_name(device)}), K={CUDA_CLASSES:,}, batch {CUDA_BATCH}, "
              f"against torch.randn + add on the device:")
        for name, series in times.items():
            print(f"  {name:<9} {summary(series, times['randn'])}")
    else:
        print(f"CUDA, K={CUDA_CLASSES:,}, batch {CUDA_BATCH}: not measured, no CUDA device was available")

    verdicts = []
    for name, bar in BARS.items():
        best, median = bests[(1000, name)], ratios[(1000, name)]
        verdicts.append(f"{name} {best:.2f}x best, {median:.2f}x median "
                        f"({'meets' if best <= bar else 'MISSES'} the {bar}x bar on the best)")
    print("\nK=1000 against plain numpy normals + add: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("runtime-overhead", "--batch"), "Serving overhead per row: Perturber.perturb against plain normals plus the add"):
        raise SystemExit(main())
