"""One advice rule for every input calibrate reads: the advice line under the table and the
stderr warning past ±2 points come from ``target_intervals.interval_notes`` for matrices,
lm-eval samples, top-k logprob logs and full-vocabulary dumps alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.target_intervals import describe_interval, interval_notes
from caliber_core.cli import main

ROOT = Path(__file__).resolve().parents[1]
ADVICE = re.compile(r"^interval half-width, widest target: (\w+ [0-9.]+): ±([0-9.]+)% at N=([0-9,]+); about ")
WARNING = re.compile(r"^warning: (\d+) of (\d+) target intervals \(95%\) are wider than ±2%, the widest ")


def _samples_file(path: Path, n_docs: int, seed: int = 0) -> Path:
    """An lm-eval ``--log_samples`` file of a four-choice task (the format lm-eval writes)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for i in range(n_docs):
            answer = int(rng.integers(4))
            scores = rng.normal(0, 1.5, 4) + 2.5 * (np.arange(4) == answer)
            ll = scores - np.log(np.exp(scores).sum())
            fh.write(json.dumps({
                "doc_id": i, "doc": {"question": f"q{i}"}, "target": str(answer),
                "arguments": {f"gen_args_{j}": {"arg_0": f"q{i}\nAnswer:", "arg_1": f" {c}"}
                              for j, c in enumerate("ABCD")},
                "resps": [[[str(x), "False"]] for x in ll],
                "filtered_resps": [[str(x), "False"] for x in ll],
                "filter": "none", "metrics": ["acc"]}) + "\n")
    return path


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_lm_eval_samples_with_a_wide_interval_get_the_advice_and_the_warning(tmp_path, capsys):
    samples = _samples_file(tmp_path / "samples_mmlu_demo_2026-01-01T00-00-00.jsonl", 400)
    out = tmp_path / "mmlu.json"
    code, stdout, stderr = _run(["calibrate", samples, "--retention", "0.9", "0.8", "--quiet", "--out", out], capsys)
    assert code == 0
    config = json.loads(out.read_text())
    halves = [0.5 * (t["interval"]["retention"][1] - t["interval"]["retention"][0]) for t in config["targets"]]
    assert max(halves) > 0.02  # the case the issue names: retention 0.8 at ±2.6 points
    (advice,) = [line for line in stdout if ADVICE.match(line)]
    label, half, n = ADVICE.match(advice).groups()
    assert n == "400" and float(half) == pytest.approx(100 * max(halves), abs=0.06)
    (warning,) = [line for line in stderr if WARNING.match(line)]
    assert WARNING.match(warning).groups() == (str(sum(h > 0.02 for h in halves)), "2")
    assert f"the widest {label}: " in warning and "rows for ±2.0%" in warning
    assert (advice, warning.removeprefix("warning: ")) == interval_notes(config)  # the one rule


def test_lm_eval_samples_printed_to_stdout_still_warn(tmp_path, capsys):
    samples = _samples_file(tmp_path / "samples_mmlu_demo_2026-01-01T00-00-00.jsonl", 400)
    code, stdout, stderr = _run(["calibrate", samples, "--retention", "0.8", "--quiet"], capsys)
    assert code == 0 and json.loads("\n".join(stdout))["targets"]
    assert any(WARNING.match(line) for line in stderr)


def test_a_narrow_interval_gets_the_advice_and_no_warning(tmp_path, capsys):
    samples = _samples_file(tmp_path / "samples_big_2026-01-01T00-00-00.jsonl", 4000)
    code, stdout, stderr = _run(["calibrate", samples, "--retention", "0.9", "--quiet", "--out",
                                 tmp_path / "big.json"], capsys)
    assert code == 0
    assert any(ADVICE.match(line) for line in stdout)
    assert not [line for line in stderr if "wider than" in line]


def test_a_matrix_and_a_samples_file_share_the_rule(tmp_path, capsys):
    """The same logits as an .npz and as lm-eval samples: the same advice and warning."""
    samples = _samples_file(tmp_path / "samples_same_2026-01-01T00-00-00.jsonl", 400)
    from caliber_core.calibration.llm_inputs import samples_data

    data = samples_data(samples.read_bytes(), samples.name)
    np.savez(tmp_path / "same.npz", logits=data.logits, labels=data.labels)
    notes = []
    for path in (samples, tmp_path / "same.npz"):
        code, stdout, stderr = _run(["calibrate", path, "--retention", "0.8", "--quiet", "--out",
                                     tmp_path / "c.json"], capsys)
        assert code == 0
        notes.append(([line for line in stdout if ADVICE.match(line)], [line for line in stderr if WARNING.match(line)]))
    assert notes[0] == notes[1] and notes[0][0] and notes[0][1]


def test_a_logprob_log_gets_the_rule_with_its_certified_width(tmp_path, capsys):
    from caliber_core.simulation.llm_like import llm_like_logits, log_softmax

    logprobs = log_softmax(llm_like_logits(160, 32_000, seed=1))
    log = tmp_path / "chat_logs.jsonl"
    with open(log, "w") as fh:
        for start in range(0, 160, 16):
            content = []
            for row in logprobs[start:start + 16]:
                top = [{"token": f"t{j}", "logprob": float(row[j]), "bytes": []} for j in np.argsort(-row)[:20]]
                content.append({**top[0], "top_logprobs": top})
            fh.write(json.dumps({"object": "chat.completion", "model": "demo-llm",
                                 "choices": [{"index": 0, "logprobs": {"content": content}}]}) + "\n")
    out = tmp_path / "logs.json"
    code, stdout, stderr = _run(["calibrate", log, "--agreement", "0.9", "0.8", "--side", "at-least",
                                 "--vocab-size", "32000", "--quiet", "--out", out], capsys)
    assert code == 0
    (advice,) = [line for line in stdout if ADVICE.match(line)]
    assert "N=160" in advice and "certified agreement bounds (k=20, V=32000)" in advice
    # 160 rows cannot pin a mean agreement near 0.8 to ±2 points: the warning says so.
    assert any(WARNING.match(line) for line in stderr)
    # The certified range is named as such, not as a "100%" interval.
    target = json.loads(out.read_text())["targets"][0]
    assert describe_interval(target).startswith("agreement 90.0% (certified: ")
    assert not [line for line in stdout if "(100%" in line]
