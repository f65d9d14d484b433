"""Top-k logprob logs: both OpenAI-compatible shapes, one-line refusals, and the CLI's certified sigma."""

from __future__ import annotations

import json

import numpy as np
import pytest

from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import load_config
from caliber_core.loading import LogitsFileError
from caliber_core.loading.logprob_logs import read_logprob_log
from caliber_core.simulation.llm_like import exact_agreement, llm_like_logits, log_softmax

V = 32_000


def chat_line(rows, *, model="m", k=20):
    content = []
    for lp in rows:
        top = np.argsort(-lp)[:k]
        entries = [{"token": f"t{j}", "logprob": float(lp[j]), "bytes": [116]} for j in top]
        content.append({"token": entries[0]["token"], "logprob": entries[0]["logprob"], "bytes": [116],
                        "top_logprobs": entries})
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                         "logprobs": {"content": content}, "finish_reason": "length"}]}


def legacy_line(rows, *, k=5):
    tops = [{f"t{j}": float(lp[j]) for j in np.argsort(-lp)[:k]} for lp in rows]
    return {"id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "x", "logprobs": {
                "tokens": [f"t{int(np.argmax(lp))}" for lp in rows],
                "token_logprobs": [float(lp.max()) for lp in rows], "top_logprobs": tops}}]}


@pytest.fixture(scope="module")
def full():
    return llm_like_logits(80, V, seed=5)


def write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def test_chat_legacy_and_bare_shapes_give_the_same_rows(tmp_path, full):
    lp = log_softmax(full[:6])
    chat = read_logprob_log(json.dumps(chat_line(lp[:3], k=5)).encode() + b"\n"
                            + json.dumps(chat_line(lp[3:], k=5)).encode(), "chat.jsonl")
    legacy = read_logprob_log(json.dumps(legacy_line(lp)).encode(), "legacy.jsonl")
    bare = read_logprob_log(json.dumps(chat_line(lp, k=5)["choices"][0]["logprobs"]["content"]).encode(),
                            "bare.json")
    batch = read_logprob_log(json.dumps({"custom_id": "a", "response": {"status_code": 200,
                                                                         "body": chat_line(lp, k=5)}}).encode(),
                             "batch.jsonl")
    expected = -np.sort(-lp, axis=1)[:, :5]
    for log in (chat, legacy, bare, batch):
        assert log.n_positions == 6 and log.k == 5
        np.testing.assert_allclose(log.logprobs, expected)
    assert chat.name == "m" and chat.n_responses == 2


@pytest.mark.parametrize("text,match", [
    ('{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [',
     "line 1: not valid JSON"),
    ('{"model": "m", "choices": [{"logprobs": {"content": [{"token": "a", "logprob": -0.1, '
     '"top_logprobs": []}]}}]}', "line 1: position 0 has no top_logprobs"),
    ('{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": '
     '[{"token": "a", "logprob": NaN}, {"token": "b", "logprob": -3}]}]}}]}', "line 1: position 0: logprob is NaN"),
    ('{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": '
     '[{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}]}]}}]}', "sum above 1"),
    ('{"choices": [{"text": "x"}]}', r"line 1: choices\[0\] has no logprobs"),
    ('[1, 2]', "line 1: a response must be a JSON object"),
])
def test_bad_lines_are_refused_naming_the_line(text, match):
    with pytest.raises(LogitsFileError, match=match):
        read_logprob_log(text.encode(), "bad.jsonl")


def test_later_bad_lines_mixed_models_and_huge_rows_name_their_line(full):
    lp = log_softmax(full[:4])
    good = json.dumps(chat_line(lp[:2], k=3))
    other = json.dumps(chat_line(lp[2:], k=3, model="another-model"))
    with pytest.raises(LogitsFileError, match="line 3: model 'another-model' differs"):
        read_logprob_log(f"{good}\n\n{other}\n".encode(), "mixed.jsonl")
    with pytest.raises(LogitsFileError, match="line 2: not valid JSON"):
        read_logprob_log(f"{good}\n{good[:-40]}\n".encode(), "cut.jsonl")
    huge = {"choices": [{"logprobs": {"top_logprobs": [{f"t{i}": -20.0 for i in range(10_000)}]}}]}
    with pytest.raises(LogitsFileError, match="line 2: position 0 shows 10,000 logprobs"):
        read_logprob_log(f"{good}\n{json.dumps(huge)}\n".encode(), "huge.jsonl")


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_serves_a_certified_sigma_for_chat_logs(tmp_path, full, capsys):
    lp = log_softmax(full)
    log = write_lines(tmp_path / "chat.jsonl", [chat_line(lp[i:i + 8]) for i in range(0, len(lp), 8)])
    out = tmp_path / "cfg.json"
    code, stdout, err = run(["calibrate", log, "--agreement", "0.9", "0.8", "--side", "at-least",
                             "--vocab-size", V, "--out", out], capsys)
    assert code == 0, err
    assert "certified agreement bounds (k=20, V=32000)" in stdout
    config = load_config(out)
    assert config["bounds"]["k"] == 20 and config["bounds"]["vocab_size"] == V
    assert config["clean_accuracy"] is None and config["n_samples"] == len(lp)
    for target in config["targets"]:
        truth = exact_agreement(full, target["sigma"]).mean()
        assert target["requested"] <= truth <= target["requested"] + 0.01
        lo, hi = target["interval"]["agreement"]
        assert lo == pytest.approx(target["requested"], abs=1e-4) and lo <= truth <= hi
        assert target["method"] == "topk-certified-agreement" and target["side"] == "at-least"


def test_cli_refuses_what_a_log_cannot_give(tmp_path, full, capsys):
    log = write_lines(tmp_path / "chat.jsonl", [chat_line(log_softmax(full[:4]))])
    code, _, err = run(["calibrate", log, "--agreement", "0.9"], capsys)
    assert code == EXIT_USER_ERROR and "--vocab-size" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(["calibrate", log, "--retention", "0.9", "--vocab-size", V], capsys)
    assert code == EXIT_USER_ERROR and "only --agreement targets apply" in err
    code, _, err = run(["calibrate", log, "--agreement", "0.9", "--vocab-size", 10], capsys)
    assert code == EXIT_USER_ERROR and "vocab size must be an integer above" in err
    code, _, err = run(["calibrate", log, "--agreement", "0.9", "--vocab-size", 25], capsys)
    assert code == EXIT_USER_ERROR and len(err.strip().splitlines()) == 1
    assert "row 0's leftover mass" in err and "vocabulary size 25 is too small" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(log.read_text() + '{"choices": [{"logprobs": {"content": [{"token": "a", "top_logprobs": []}]}}]}\n')
    code, _, err = run(["calibrate", bad, "--agreement", "0.9", "--vocab-size", V], capsys)
    assert code == EXIT_USER_ERROR and "bad.jsonl: line 2: position 0 has no top_logprobs" in err
