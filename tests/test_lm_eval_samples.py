"""lm-eval samples files written by lm-eval itself (a custom LM on local tasks), calibrated by the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import load_config
from caliber_core.loading import LogitsFileError
from caliber_core.calibration.llm_inputs import samples_data as read_lm_eval_samples
from caliber_core.loading import load_logits
from caliber_core.loading.lm_eval_samples import task_name

N_DOCS, K = 400, 4
LETTERS = "ABCD"
CHOICES = ["alpha", "beta", "gamma", "delta"]
SENTENCES = ["the first answer is long", "the second answer is long", "the third answer is long",
             "the fourth answer is long"]


def doc_scores(n_docs=N_DOCS, seed=0):
    """Per-document answer logits: a model right on ~70% of documents, margins of a few nats."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 1.5, (n_docs, K))
    answers = rng.integers(0, K, n_docs)
    right = rng.random(n_docs) < 0.6
    logits[right, answers[right]] += rng.uniform(0.5, 4.0, right.sum())
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)), answers


def task_yaml(name, data, *, output_type="multiple_choice", choice="[\"A\", \"B\", \"C\", \"D\"]",
              target="answer"):
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
             f"    test: {data}", "test_split: test", f"output_type: {output_type}",
             "doc_to_text: \"Question {{qid}}\\nAnswer:\""]
    if output_type == "multiple_choice":
        lines += [f"doc_to_choice: {choice}", f"doc_to_target: {target!r}", "metric_list:", "  - metric: acc"]
    else:
        lines += ["doc_to_target: \"{{choices[answer]}}\"", "generation_kwargs:", "  until: [\"\\n\"]",
                  "metric_list:", "  - metric: exact_match"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Run lm-eval's simple_evaluate with a deterministic LM and save samples with its EvaluationTracker."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    root = tmp_path_factory.mktemp("lm_eval")
    scores, answers = doc_scores()
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps({"qid": i, "choices": CHOICES, "sentences": SENTENCES,
                                        "answer": int(a)}) + "\n" for i, a in enumerate(answers)))
    tasks = {
        "cal_letters": task_yaml("cal_letters", data),
        "cal_words": task_yaml("cal_words", data, choice="\"{{choices}}\"", target="{{choices[answer]}}"),
        "cal_sentences": task_yaml("cal_sentences", data, choice="\"{{sentences}}\""),
        "cal_generate": task_yaml("cal_generate", data, output_type="generate_until"),
    }
    for name, text in tasks.items():
        (root / f"{name}.yaml").write_text(text)

    class TableLM(LM):
        """Loglikelihood of choice j on document i is scores[i, j], whatever the task's wording."""

        def loglikelihood(self, requests):
            out = []
            for req in requests:
                context, continuation = req.args
                i = int(context.split("Question ")[1].split("\n")[0])
                word = continuation.strip()
                j = next(idx for idx, names in enumerate(zip(LETTERS, CHOICES, SENTENCES)) if word in names)
                out.append((float(scores[i, j]), False))
            return out

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

        def generate_until(self, requests):
            return ["alpha" for _ in requests]

    tracker = EvaluationTracker(output_path=str(root / "out"))
    results = simple_evaluate(model=TableLM(), tasks=list(tasks), task_manager=TaskManager(include_path=str(root), include_defaults=False),
                              log_samples=True, bootstrap_iters=0, evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in tasks:
        tracker.save_results_samples(task_name=name, samples=samples[name])
    files = {name: next((root / "out").rglob(f"samples_{name}_*.jsonl")) for name in tasks}
    return files, scores, answers


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def retention_by_monte_carlo(scores, answers, sigma, draws=4000, seed=123):
    """Mean accuracy under N(0, sigma^2) noise on each row's K scores, over the clean accuracy."""
    rng = np.random.default_rng(seed)
    hits = 0.0
    for start in range(0, draws, 500):
        noisy = scores[None] + sigma * rng.standard_normal((min(500, draws - start), *scores.shape))
        hits += (noisy.argmax(axis=2) == answers[None]).sum()
    return hits / (draws * len(answers)) / np.mean(scores.argmax(axis=1) == answers)


def test_the_file_lm_eval_writes_reads_as_its_scores(written):
    files, scores, answers = written
    data = read_lm_eval_samples(files["cal_letters"].read_bytes(), files["cal_letters"].name)
    assert data.name == "cal_letters" == task_name(files["cal_letters"].name)
    np.testing.assert_allclose(data.logits, scores)  # strings parsed, doc_id order
    np.testing.assert_array_equal(data.labels, answers)
    words = read_lm_eval_samples(files["cal_words"].read_bytes(), files["cal_words"].name)
    np.testing.assert_array_equal(words.labels, answers)
    assert any("mapped to their choice's index" in w for w in words.warnings)


def test_the_old_json_array_form_reads_the_same(written):
    files, scores, _ = written
    records = [json.loads(line) for line in files["cal_letters"].read_text().splitlines()]
    for r in records:  # 0.4.0-0.4.2: native numbers and booleans, one JSON array
        r["filtered_resps"] = [[float(a), b == "True"] for a, b in r["filtered_resps"]]
        r["target"] = int(r["target"])
    data = read_lm_eval_samples(json.dumps(records, indent=1).encode(), "samples_cal_letters_old.json")
    np.testing.assert_allclose(data.logits, scores)


def test_cli_retention_of_the_served_sigma_is_on_target(written, tmp_path, capsys):
    files, scores, answers = written
    out = tmp_path / "cfg.json"
    code, stdout, err = run(["calibrate", files["cal_letters"], "--retention", "0.9", "0.8", "--out", out], capsys)
    assert code == 0, err
    config = load_config(out)
    assert config["model"] == "cal_letters" and config["n_classes"] == K and config["n_samples"] == N_DOCS
    errors = [abs(retention_by_monte_carlo(scores, answers, t["sigma"]) - t["requested"]) / t["requested"]
              for t in config["targets"]]
    assert np.mean(errors) <= 0.005, errors


def test_generation_and_multi_token_tasks(written, tmp_path, capsys):
    files, _, _ = written
    code, _, err = run(["calibrate", files["cal_generate"], "--retention", "0.9"], capsys)
    assert code == EXIT_USER_ERROR and "line 1: a generation or perplexity task" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(["calibrate", files["cal_sentences"], "--retention", "0.9"], capsys)
    assert code == EXIT_USER_ERROR and "choices of several tokens" in err and "--multi-token" in err
    code, _, err = run(["calibrate", files["cal_sentences"], "--retention", "0.9", "--multi-token",
                        "--out", tmp_path / "c.json"], capsys)
    assert code == 0 and "warning: multi-token choices" in err


def edited(path: Path, line_index: int, edit) -> bytes:
    lines = path.read_text().splitlines()
    rec = json.loads(lines[line_index])
    lines[line_index] = edit(rec) if callable(edit) else edit
    if isinstance(lines[line_index], dict):
        lines[line_index] = json.dumps(lines[line_index])
    return ("\n".join(lines) + "\n").encode()


def _set(rec, **fields):
    rec.update(fields)
    return rec


@pytest.mark.parametrize("edit,match", [
    (lambda r: _set(r, filtered_resps=r["filtered_resps"][:3]), "line 3: 3 choices where earlier documents have 4"),
    (lambda r: _set(r, target="7"), "line 3: target '7' is outside the 4 choices"),
    (lambda r: _set(r, target="omega"), "line 3: target text is not one of the document's 4 choices"),
    (lambda r: json.dumps(r)[:-30], "line 3: not valid JSON"),
    (lambda r: _set(r, filtered_resps=[["nan", "False"]] + r["filtered_resps"][1:]),
     "line 3: choice 0 loglikelihood is NaN"),
    (lambda r: json.dumps(_set(r, filtered_resps=[[float("nan"), False]] + r["filtered_resps"][1:])),
     "line 3: choice 0 loglikelihood is NaN"),
    (lambda r: _set(r, filtered_resps=[["-1.0", "False"]] * 10_000), "line 3: 10,000 choices, more than"),
])
def test_bad_lines_are_refused_naming_the_line(written, edit, match):
    files, _, _ = written
    with pytest.raises(LogitsFileError, match=match):
        read_lm_eval_samples(edited(files["cal_letters"], 2, edit), "samples_x_2026-01-01T00-00-00.jsonl")


def test_the_ordinary_loader_reads_samples_and_points_logs_to_the_cli(written, tmp_path):
    files, scores, answers = written
    data = load_logits(files["cal_letters"])  # the Data page's reader (load_logits_bytes) too
    assert data.name == "cal_letters"
    np.testing.assert_allclose(data.logits, scores)
    np.testing.assert_array_equal(data.labels, answers)
    with pytest.raises(LogitsFileError, match="line 1: choices of several tokens"):
        load_logits(files["cal_sentences"])
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"choices": [{"logprobs": {"content": [
        {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}]}]}}]}) + "\n")
    with pytest.raises(LogitsFileError, match="a top-k logprob log gives agreement only"):
        load_logits(log)
