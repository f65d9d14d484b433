"""A calibrated top-k logprob log is a workspace member: it survives a reload and a restart, reaches
Export and Policy, and its config is accepted by `check` (on a log) and by `throttle init`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import streamlit as st
from streamlit.testing.v1 import AppTest

from caliber_core.cli.commands import main
from caliber_core.simulation.llm_like import llm_like_logits, log_softmax
from caliber_dashboard.common import state
from caliber_dashboard.data import log_store
from caliber_dashboard.data.logprob_log import LOG_RESULT, calibrate_log

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
V = 4000


def chat_log(n=60, *, seed=9, part=0, sharpen=1.0, k=10) -> bytes:
    """``n`` positions of one model; ``part`` picks which n of its rows (another part: a new sample)."""
    lp = log_softmax(sharpen * llm_like_logits(n * (part + 1), V, seed=seed)[n * part:])
    content = [{"token": "t", "logprob": float(r.max()),
                "top_logprobs": [{"token": f"t{j}", "logprob": float(r[j])} for j in np.argsort(-r)[:k]]}
               for r in lp]
    return (json.dumps({"model": "m", "choices": [{"logprobs": {"content": content}}]}) + "\n").encode()


def _config_file(tmp_path, log: bytes) -> Path:
    config, error = calibrate_log(log, "log.jsonl", vocab_size=V, targets=[0.9, 0.8])
    assert error is None
    path = tmp_path / "log.caliber.json"
    path.write_text(json.dumps(config))
    return path


def test_check_accepts_the_same_models_log_and_flags_another(tmp_path, capsys):
    config = _config_file(tmp_path, chat_log(seed=9))
    (tmp_path / "again.jsonl").write_bytes(chat_log(seed=9, part=1))  # a new sample of the same model
    assert main(["check", str(config), str(tmp_path / "again.jsonl")]) == 0
    assert "consistent: 2 targets at 95% (simultaneous), 60 positions" in capsys.readouterr().out
    (tmp_path / "sharper.jsonl").write_bytes(chat_log(seed=9, part=1, sharpen=3.0))  # larger gaps: another model
    assert main(["check", str(config), str(tmp_path / "sharper.jsonl")]) == 3
    assert "MOVED" in capsys.readouterr().out
    assert main(["check", str(config), str(tmp_path / "again.jsonl"), "--labels", str(config)]) == 2
    assert "--labels does not apply" in capsys.readouterr().err


def test_throttle_init_serves_the_log_config(tmp_path):
    config = _config_file(tmp_path, chat_log())
    assert main(["throttle", "init", str(config), "--levels", "0", "1", "--escalate-after", "100",
                 "--out", str(tmp_path / "policy.json")]) == 0
    assert json.loads((tmp_path / "policy.json").read_text())["levels"]


def _open(token=None, page="pages/data.py") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if token is not None:
        at.query_params["ws"] = token
    at.switch_page(page)
    at.run()
    assert not at.exception
    return at


def _token(at) -> str:
    value = at.query_params["ws"]
    return value[0] if isinstance(value, list) else value


def _calibrate(at, log: bytes) -> dict:
    at.file_uploader(key="upload_logprob_log").set_value(("answers.jsonl", log, "application/json"))
    at.number_input(key="logprob_log_vocab").set_value(V).run()
    at.button(key="logprob_log_btn").click().run()
    assert not at.exception
    config, error = at.session_state[LOG_RESULT]
    assert error is None
    return config


def test_a_log_survives_a_reload_and_a_restart_and_reaches_export_and_policy(tmp_path):
    at = _open()
    config = _calibrate(at, chat_log())
    token = _token(at)
    assert list(at.session_state[log_store.LOGS][1]) == [config["sha256"]]

    st.cache_resource.clear()  # a server restart: nothing of the process is left, the workspace is
    st.cache_data.clear()
    again = _open(token, "pages/calibrate.py")
    band = [e for e in again.expander if "logprob log" in e.label]
    assert len(band) == 1 and config["model"] in band[0].label

    export = _open(token, "pages/export.py")
    panel = [e for e in export.expander if e.label.startswith("Calibrated top-k logprob logs (1)")]
    assert len(panel) == 1
    commands = [c.value for c in panel[0].code][0].splitlines()
    assert commands[1] == "python -m caliber_core check answers.caliber.json NEW_LOG.jsonl"
    exported = export.session_state[log_store.LOGS][1][config["sha256"]]["config"]
    assert exported == config
    path = tmp_path / "answers.caliber.json"
    path.write_text(json.dumps(exported))
    (tmp_path / "answers.jsonl").write_bytes(chat_log())
    assert main(["check", str(path), str(tmp_path / "answers.jsonl")]) == 0

    policy = _open(token, "pages/policy.py")
    policy.selectbox(key="policy_log").set_value(config["sha256"]).run()
    assert not policy.exception
    assert not policy.error
    policy_json = json.loads([c.value for c in policy.code][-1])
    assert "answers.caliber.json" in json.dumps(policy_json)  # the policy names the log's config
    assert len(policy_json["levels"]) == len(config["targets"]) + 1


def test_removing_a_log_forgets_it(tmp_path):
    at = _open()
    config = _calibrate(at, chat_log(seed=4))
    at.button(key=f"logprob_logs_remove_{config['sha256'][:16]}").click().run()
    assert not at.exception
    assert config["sha256"] not in _open(_token(at)).session_state[log_store.LOGS][1]


def test_the_policy_page_serves_a_log_when_no_model_is_loaded():
    """Without a labelled model the levels come from the log: the page asks for no model."""
    at = _open()
    at.button(key="remove_all_btn").click().run()
    assert not at.session_state[state.MODELS]
    config = _calibrate(at, chat_log(seed=5))
    policy = _open(_token(at), "pages/policy.py")
    assert not policy.exception and not policy.error
    assert not [i.value for i in policy.info if "needs a model" in i.value]
    chooser = policy.selectbox(key="policy_log")
    assert chooser.value == config["sha256"] and len(chooser.options) == 1  # no "(no: the model's targets)"
    policy_json = json.loads([c.value for c in policy.code][-1])
    assert policy_json["config"]["path"] == "answers.caliber.json"
    assert len(policy_json["levels"]) == len(config["targets"]) + 1
