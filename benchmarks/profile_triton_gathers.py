"""Where the CUDA noise kernel's time goes: the table's gathers against the rest, on the device at hand.

Run from the repository root on a machine with a CUDA device and Triton::

    python benchmarks/profile_triton_gathers.py

At K = 128,000, batch 64, three levels, float32 logits, per row and paired
with ``torch.randn`` + add (median of 30 calls each, the device synchronized
around each call), it times:

1. the served kernel (``triton_noise.noisy_logits``, the seeds already on the
   device), in each launch configuration;
2. probes: the same kernel with every gather kept in one exponent's 64 pieces
   (the likeliest, four cache lines a power), with no gathers at all
   (constant coefficients), and with the SplitMix64 words alone (no
   polynomial).

The probes' outputs are not the served noise: they only bound what a better
table layout could win. Each probe reads the logits, draws every level and
writes the result, as the kernel does. Writes ``docs/figures/triton-gathers.md``
unless ``--no-figure``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ROWS, VOCAB = 64, 128_000
PROBES = {0: "every piece in one exponent's 64 (four cache lines a power)", 1: "no gathers (constant coefficients)",
          2: "SplitMix64 words only (no polynomial)"}


try:  # the probe is a Triton kernel: defined where Triton is installed
    import triton
    import triton.language as tl

    # The served kernel's own word function and index arithmetic, so the probes differ only in the gathers.
    from caliber_core.serving.triton_noise import (_FIRST_PIECE, _MASK_T_HIGH, _N_PIECES, _T_HIGH, _piece_and_t,
                                                    _word)
except ImportError:  # main() says why nothing is measured
    triton = None
else:
    @triton.jit
    def _probe(logits, out, rows, table, n_rows, n_classes, n_blocks, BLOCK: tl.constexpr, MODE: tl.constexpr,
               N: tl.constexpr, T_HIGH: tl.constexpr, FIRST: tl.constexpr, MASK_T_HIGH: tl.constexpr):
        program = tl.program_id(0)
        row = program // n_blocks
        cols = (program % n_blocks) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < n_classes
        at = row.to(tl.int64) * n_classes + cols
        wide = tl.load(logits + at, mask=inside, other=0.0).to(tl.float64)
        counters = cols.to(tl.uint64) * 0x9E3779B97F4A7C15
        noise = tl.zeros((BLOCK,), dtype=tl.float64)
        for level in tl.static_range(3):
            seed = tl.load(rows + level * n_rows + row).to(tl.uint64, bitcast=True)
            z = _word(seed + counters)
            piece, t = _piece_and_t(z, T_HIGH, FIRST, MASK_T_HIGH)
            if MODE == 0:  # the top exponent's 64 pieces, the likeliest
                p = table + (piece & 63) + (N - 64)
                c4, c3, c2 = tl.load(p + 4 * N), tl.load(p + 3 * N), tl.load(p + 2 * N)
                c1, c0 = tl.load(p + N), tl.load(p)
            elif MODE == 1:
                c4, c3, c2, c1, c0 = 0.1, 0.2, 0.3, 0.4, 0.5
            else:
                c4, c3, c2, c1, c0 = 0.0, 0.0, 0.0, 0.0, piece.to(tl.float64)
            value = c4 * t + c3
            value = value * t + c2
            value = value * t + c1
            value = value * t + c0
            noise = noise + value * 0.5
        tl.store(out + at, (noise + wide).to(tl.float32), mask=inside)


def measure(repeats: int) -> dict:
    import torch

    from caliber_core.serving import triton_noise

    device = "cuda"
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=generator).to(device)
    rows = torch.randint(-2**62, 2**62, (4, ROWS), generator=generator).to(device)
    rows[3] = 3
    increments = torch.tensor([0.5, 0.8, 1.7], dtype=torch.float64, device=device)
    table = torch.from_numpy(triton_noise.positive_table()).to(device)
    out = torch.empty_like(logits)

    def median_us(fn) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times) / ROWS * 1e6

    def probe_call(mode, block, warps):
        n_blocks = triton.cdiv(VOCAB, block)
        return lambda: _probe[(ROWS * n_blocks,)](logits, out, rows, table, ROWS, VOCAB, n_blocks, BLOCK=block,
                                                  MODE=mode, N=_N_PIECES, T_HIGH=_T_HIGH, FIRST=_FIRST_PIECE,
                                                  MASK_T_HIGH=_MASK_T_HIGH, num_warps=warps, enable_fp_fusion=False)

    result = {"randn": median_us(lambda: logits + torch.randn(ROWS, VOCAB, device=device)), "kernel": {},
              "probes": {}}
    for config in triton_noise.CONFIGS:
        triton_noise.select_config(device, config)
        result["kernel"][config] = median_us(lambda: triton_noise.noisy_logits(logits, rows, increments))
    for mode in PROBES:
        for config in ((1024, 4), (2048, 8)):
            result["probes"][(mode, config)] = median_us(probe_call(mode, *config))
    result["device"] = torch.cuda.get_device_name()
    result["versions"] = f"torch {torch.__version__}, Triton {triton.__version__}"
    return result


def write_figure(result: dict, repeats: int) -> None:
    from figure_files import FigureFile

    randn = result["randn"]
    fig = FigureFile("triton-gathers", "Where the CUDA noise kernel's time goes")
    fig.note(f"Device: {result['device']}; {result['versions']}. K = {VOCAB:,}, batch {ROWS}, three levels, float32 "
             f"logits; the median of {repeats} calls each, the device synchronized around each call. "
             f"`torch.randn` + add: {randn:.2f} µs a row.")
    rows = [[f"served kernel, block {b}, {w} warps", f"{t:.2f}", f"{t / randn:.2f}"]
            for (b, w), t in result["kernel"].items()]
    rows += [[f"probe: {PROBES[mode]}, block {b}, {w} warps", f"{t:.2f}", f"{t / randn:.2f}"]
             for (mode, (b, w)), t in result["probes"].items()]
    fig.table(["what runs", "µs a row", "× `torch.randn` + add"], rows)
    fig.note("The probes are not the served noise: they keep the kernel's reads, words, levels and writes and change "
             "only where the coefficients come from. The gap between the served kernel and the probe without gathers "
             "is what the table's gathers cost; the probe with every piece in one exponent bounds what any layout of "
             "the same table could win.")
    fig.write()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-figure", action="store_true")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    import torch

    if triton is None or not torch.cuda.is_available():
        print("no CUDA device or no Triton here: nothing to measure", file=sys.stderr)
        return 1
    import figure_files  # noqa: F401  (imported now, it records the load at the start of the run)

    result = measure(args.repeats)
    for (b, w), t in result["kernel"].items():
        print(f"served kernel {b}/{w}: {t:.2f} us a row ({t / result['randn']:.2f}x randn + add)")
    for (mode, (b, w)), t in result["probes"].items():
        print(f"probe {PROBES[mode]} {b}/{w}: {t:.2f} us a row ({t / result['randn']:.2f}x)")
    if not args.no_figure:
        write_figure(result, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
