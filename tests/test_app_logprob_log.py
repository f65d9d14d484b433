"""The Data page's logprob-log panel: the CLI's call and errors, a band figure, the page still runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_core.simulation.llm_like import llm_like_logits, log_softmax
from caliber_dashboard.data.logprob_log import LOG_RESULT, bounds_figure, calibrate_log

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def chat_log(n=40, vocab=4000, k=10) -> bytes:
    lp = log_softmax(llm_like_logits(n, vocab, seed=9))
    content = [{"token": "t", "logprob": float(r.max()),
                "top_logprobs": [{"token": f"t{j}", "logprob": float(r[j])} for j in np.argsort(-r)[:k]]}
               for r in lp]
    return (json.dumps({"model": "m", "choices": [{"logprobs": {"content": content}}]}) + "\n").encode()


def test_a_log_calibrates_to_a_band_with_the_targets_on_it():
    config, error = calibrate_log(chat_log(), "log.jsonl", vocab_size=4000, targets=[0.9, 0.8])
    assert error is None
    assert [t["requested"] for t in config["targets"]] == [0.9, 0.8]
    fig = bounds_figure(config)
    lower = np.array(fig.data[1].y)
    upper = np.array(fig.data[0].y)
    assert np.all(lower <= upper + 1e-12) and len(fig.data) == 4
    for trace, t in zip(fig.data[2:], config["targets"]):
        assert list(trace.x) == [t["sigma"], t["sigma"]]


def test_errors_are_the_cli_lines():
    _, error = calibrate_log(chat_log()[:-20], "cut.jsonl", vocab_size=4000, targets=[0.9])
    assert error.startswith("cut.jsonl: line 1: not valid JSON")
    _, error = calibrate_log(chat_log(), "log.jsonl", vocab_size=5, targets=[0.9])
    assert "vocab size must be an integer above" in error
    samples = json.dumps({"doc_id": 0, "target": "0", "filtered_resps": [["-0.1", "False"], ["-3", "False"]]})
    _, error = calibrate_log(samples.encode(), "samples_x.jsonl", vocab_size=4000, targets=[0.9])
    assert "lm-eval samples" in error


def test_the_data_page_runs_with_the_panel():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/data.py").run()
    assert not at.exception
    assert any("Top-k logprob log" in s.value for s in at.subheader)


def test_a_calibrated_log_shows_its_band_on_the_calibrate_page():
    config, error = calibrate_log(chat_log(), "log.jsonl", vocab_size=4000, targets=[0.9, 0.8])
    assert error is None
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/calibrate.py").run()
    assert not at.exception
    assert not [e for e in at.expander if "logprob log" in e.label]  # nothing before a log is calibrated
    at.session_state[LOG_RESULT] = (config, None)
    at.run()
    assert not at.exception
    band = [e for e in at.expander if "logprob log" in e.label]
    assert len(band) == 1 and config["model"] in band[0].label
    widths = ", ".join(f"{w:.4f}" for w in config["bounds"]["widths"])
    assert any(widths in c.value for c in band[0].caption)
