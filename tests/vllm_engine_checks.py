"""Checks of CaliberLogitsProcessor in a real vLLM engine (CPU), run in vLLM's virtualenv by test_vllm_engine.py.

``python tests/vllm_engine_checks.py FOLDER`` prints one JSON object:
``{"checks": {name: [passed, detail]}, "seconds": {...}}``. Three engines are
loaded, one at a time: one with the processor that must refuse to start
(raw_logprobs), one without it (raw_logits: the clean logits), one with it
(processed_logprobs).
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path


def engine(setup, **options):
    from vllm import LLM

    return LLM(model=setup["model"], tokenizer=setup["model"], dtype="float32", max_model_len=128,
               gpu_memory_utilization=0.15, enforce_eager=True, max_num_seqs=8, max_logprobs=-1, seed=0,
               **options)


def close(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort; the process ends soon anyway
        pass
    del llm
    gc.collect()


def main(folder: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm_support import VOCAB, write_setup

    setup = write_setup(Path(folder))
    os.environ["CALIBER_POLICY"], os.environ["CALIBER_KEY_FILE"] = setup["policy"], setup["key"]

    import numpy as np
    import torch
    from vllm import SamplingParams

    from caliber_core import Perturber
    from caliber_core.serving.keys import read_key_file
    from caliber_core.serving.vllm import CaliberLogitsProcessor, position_id
    from caliber_core.throttle import Throttle, load_policy

    checks, seconds = {}, {}

    def check(name, passed, detail=""):
        checks[name] = [bool(passed), str(detail)[:500]]

    key = read_key_file(setup["key"])
    policy = load_policy(setup["policy"])
    config = json.loads(Path(setup["config"]).read_text())
    throttle = Throttle(policy, key=key, store=f"sqlite:///{Path(folder) / 'ledger.db'}", metrics=False)
    for level in (1, 2, 3):
        throttle.flag(f"acct-{level}", level=level)
    # Valid for an hour: three engine loads on a busy 2-core machine take minutes.
    token = {level: throttle.grant(f"acct-{level}" if level else "clean", rows=50, valid_minutes=60)
             for level in range(4)}

    # 1. raw_logprobs: the processor refuses to start, naming the flag.
    start = time.time()
    try:
        close(engine(setup, logits_processors=[CaliberLogitsProcessor], logprobs_mode="raw_logprobs"))
        check("raw_logprobs_refused", False, "the engine started")
    except Exception as exc:  # noqa: BLE001 - vLLM wraps the worker's error
        # The processor raises in the engine's worker; the front end sees the engine fail to start, and the
        # worker's message goes to stderr (the pytest side reads it there).
        text = "".join(traceback.format_exception(exc))
        check("raw_logprobs_refused", "initialization failed" in text or "processed_logprobs" in text, text[-400:])
    seconds["refusal"] = time.time() - start

    prompts = [[1, 7, 9, 11], [1, 20, 21], [1, 33, 34, 35, 36, 37], [1, 40], [1, 50, 51, 52], [1, 60, 61, 62, 63]]
    plan = [  # (prompt, level, max_tokens): different lengths, so requests leave the batch and rows move
        (0, 0, 6), (1, 1, 3), (2, 2, 8), (3, 3, 5), (4, 1, 2), (5, 0, 7), (0, 3, 6), (2, 2, 4)]

    def params(level, max_tokens, n_logprobs=-1, **extra):
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=n_logprobs, ignore_eos=True,
                              extra_args={"caliber": token[level]} if level is not None else None, **extra)

    # 2. The processed engine: mixed levels in one batch, repeats, refusals.
    start = time.time()
    llm = engine(setup, logits_processors=[CaliberLogitsProcessor], logprobs_mode="processed_logprobs")
    seconds["load_processed"] = time.time() - start
    start = time.time()
    batch = llm.generate([{"prompt_token_ids": prompts[p]} for p, _, _ in plan],
                         [params(level, m) for _, level, m in plan], use_tqdm=False)
    again = llm.generate([{"prompt_token_ids": prompts[p]} for p, _, _ in plan],
                         [params(level, m) for _, level, m in plan], use_tqdm=False)
    alone = llm.generate([{"prompt_token_ids": prompts[2]}], [params(2, 8)], use_tqdm=False)
    seconds["generate"] = time.time() - start

    def rows(output):
        """(tokens, [full logprob row as float64 array per position])."""
        completion = output.outputs[0]
        table = []
        for position in completion.logprobs:
            row = np.full(VOCAB, -np.inf)
            for token_id, lp in position.items():
                row[token_id] = lp.logprob
            table.append(row)
        return list(completion.token_ids), table

    served = [rows(o) for o in batch]
    repeat = [rows(o) for o in again]
    check("repeats_identical", all(a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
                                   for a, b in zip(served, repeat)))
    check("batch_equals_alone", served[2][0] == rows(alone[0])[0]
          and all(np.array_equal(x, y) for x, y in zip(served[2][1], rows(alone[0])[1])))

    refusals = {}
    forged = token[0][:-6] + ("AAAAAA" if not token[0].endswith("AAAAAA") else "BBBBBB")
    expired = Throttle(policy, key=key, store=f"sqlite:///{Path(folder) / 'l2.db'}", metrics=False,
                       clock=lambda: time.time() - 3600).grant("clean", rows=1, valid_minutes=1)
    for name, extra in (("missing", None), ("forged", {"caliber": forged}), ("expired", {"caliber": expired}),
                        ("other_key", {"caliber": Throttle(policy, key=bytes(range(1, 33)), store=f"sqlite:///{Path(folder) / 'l3.db'}",
                                                           metrics=False).grant("x", rows=1)})):
        try:
            llm.generate([{"prompt_token_ids": prompts[0]}],
                         [SamplingParams(max_tokens=2, extra_args=extra)], use_tqdm=False)
            refusals[name] = "served"
        except Exception as exc:  # noqa: BLE001 - vLLM's validation error type varies by version
            refusals[name] = f"{type(exc).__name__}: {exc}"
    expected_words = {"missing": "no caliber grant token", "forged": "does not verify",
                      "expired": "expired", "other_key": "does not verify"}
    for name, words in expected_words.items():
        check(f"refused_{name}", words in refusals[name] and isinstance(refusals[name], str), refusals[name])
    after = llm.generate([{"prompt_token_ids": prompts[1]}], [params(1, 3)], use_tqdm=False)
    check("engine_alive_after_refusals", rows(after[0])[0] == served[1][0])
    close(llm)

    # 3. The clean engine (no processor, raw logits): the reference for every served position.
    start = time.time()
    clean_llm = engine(setup, logprobs_mode="raw_logits")
    seconds["load_clean"] = time.time() - start
    contexts = []
    for (p, level, _), (tokens, _) in zip(plan, served):
        for t in range(len(tokens)):
            contexts.append((prompts[p], tokens[:t], level))
    clean_out = clean_llm.generate([{"prompt_token_ids": prompt + list(prefix)} for prompt, prefix, _ in contexts],
                                   [SamplingParams(temperature=0.0, max_tokens=1, logprobs=-1)] * len(contexts),
                                   use_tqdm=False)
    plain = clean_llm.generate([{"prompt_token_ids": prompts[p]} for p, _, _ in plan],
                               [params(None, m) for _, _, m in plan], use_tqdm=False)
    close(clean_llm)

    clean_rows = []
    for out in clean_out:
        row = np.full(VOCAB, np.nan, dtype=np.float32)
        for token_id, lp in out.outputs[0].logprobs[0].items():
            row[token_id] = lp.logprob
        clean_rows.append(row)
    check("clean_rows_complete", all(np.isfinite(r).all() for r in clean_rows))

    worst, worst_level0, count, flagged_differs = 0.0, 0.0, 0, False
    index = 0
    for (p, level, _), (tokens, table) in zip(plan, served):
        for t in range(len(tokens)):
            clean = clean_rows[index]
            index += 1
            if level == 0:
                expected = torch.log_softmax(torch.from_numpy(clean), -1).double().numpy()
                worst_level0 = max(worst_level0, float(np.max(np.abs(table[t] - expected))))
                continue
            one_id = position_id(prompts[p], tokens[:t])
            noisy = Perturber.from_config(config, target=policy.levels[level].target, key=key).perturb(
                torch.from_numpy(clean)[None, :], [one_id])
            expected = torch.log_softmax(noisy[0], -1).double().numpy()
            top5 = np.argsort(-table[t])[:5]
            worst = max(worst, float(np.max(np.abs(table[t][top5] - expected[top5]))))
            flagged_differs |= bool(np.max(np.abs(expected - torch.log_softmax(torch.from_numpy(clean), -1).numpy()))
                                    > 0.05)
            count += 1
    check("flagged_equal_perturber", worst < 1e-4 and count > 0, f"largest |difference| {worst:.2e} over {count} rows")
    check("flagged_not_clean", flagged_differs)
    check("level0_equal_clean", worst_level0 < 1e-5, f"largest |difference| {worst_level0:.2e}")
    level0_tokens = all(served[i][0] == list(plain[i].outputs[0].token_ids) for i, (_, lv, _) in enumerate(plan)
                        if lv == 0)
    check("level0_tokens_equal_run_without_processor", level0_tokens)

    # Levels nest: at one context, the noise of level j+1 spreads wider than level j's (as the Perturber's do).
    spreads = []
    clean0 = clean_rows[0]
    for level in (1, 2, 3):
        noise = Perturber.from_config(config, target=policy.levels[level].target, key=key).perturb(
            clean0.astype(np.float64)[None, :], [position_id(prompts[0], [])])[0] - clean0
        spreads.append(float(np.std(noise)))
    check("levels_nested", spreads[0] < spreads[1] < spreads[2] and math.isfinite(spreads[2]), spreads)
    print(json.dumps({"checks": checks, "seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv[1])
