"""An upload is bytes, never a path: config and policy uploads whose content names a server file.

The content of an uploaded ``.json`` may be anything, a path on the server
included. Every uploader parses only the bytes it received: a path is text
that is not JSON, refused by one line that is the same whether the path exists
or not, and the file it names is never opened or even looked at.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pathlib
from pathlib import Path

import pytest

from caliber_core.config import ConfigError, config_from_bytes, config_from_text, load_config
from caliber_core.throttle.policy import PolicyError, parse_policy, policy_for_config_text

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _config() -> dict:
    return {
        "schema": "caliber.config/v2", "model": "server_only_model", "n_classes": 10, "n_samples": 500,
        "statistic": "median", "scale": 2.0, "fit": {},
        "targets": [{"kind": "retention", "requested": 0.9, "accuracy": 0.8, "retention": 0.9, "v": 0.25,
                     "sigma": 1.0, "side": "point", "interval": None}],
    }


@pytest.fixture
def server_files(tmp_path):
    """A config that exists only on the server, and a path beside it that does not exist."""
    existing = tmp_path / "server" / "secret.caliber.json"
    existing.parent.mkdir()
    existing.write_text(json.dumps(_config()))
    load_config(existing)  # a valid config: loading it by path works
    return existing, tmp_path / "server" / "missing.caliber.json"


@pytest.fixture
def touched(monkeypatch, server_files):
    """Every path the process opens, stats or reads while the test runs, as strings."""
    seen: list[str] = []
    watched = {str(p) for p in server_files}

    def note(target):
        try:
            text = os.fsdecode(os.fspath(target))
        except TypeError:
            return
        if text in watched:
            seen.append(text)

    def wrap(fn, *, method=False):
        def wrapper(*args, **kwargs):
            note(args[0] if args else kwargs.get("file", kwargs.get("path")))
            return fn(*args, **kwargs)
        return wrapper

    for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "stat"), (os, "lstat"),
                         (os.path, "exists"), (os.path, "isfile")):
        monkeypatch.setattr(module, name, wrap(getattr(module, name)))
    for name in ("open", "read_bytes", "read_text", "stat", "exists"):
        monkeypatch.setattr(pathlib.Path, name, wrap(getattr(pathlib.Path, name)))
    return seen


def _refusal(fn, raw: bytes) -> str:
    with pytest.raises(ValueError) as info:
        fn(raw)
    return str(info.value)


@pytest.mark.parametrize("prefix", ["", "   ", "\n"])
def test_config_bytes_naming_a_server_path_are_refused_alike_and_never_opened(server_files, touched, prefix):
    existing, missing = server_files
    one, two = (_refusal(config_from_bytes, (prefix + str(p)).encode()) for p in (existing, missing))
    assert one == two and one.startswith("config is not valid JSON (line ")
    assert "\n" not in one and str(existing) not in one and "No such file" not in one
    assert touched == []


def test_config_text_is_never_a_path(server_files, touched):
    existing, missing = server_files
    messages = {_refusal(config_from_text, str(p)) for p in (existing, missing)}
    assert len(messages) == 1 and touched == []
    # load_config keeps its documented path form for the command line; the text entry point does not.
    assert load_config(str(existing))["model"] == "server_only_model"


def test_the_policy_view_and_the_policy_builder_take_text_only(server_files, touched):
    from caliber_dashboard.policy import view

    existing, missing = server_files
    shown = set()
    for path in (existing, missing):
        with pytest.raises(ValueError) as info:
            view.config_from_upload(str(path).encode(), name="upload.json")
        shown.add(str(info.value))
        with pytest.raises(PolicyError) as info:
            policy_for_config_text(str(path), config_name="c.json", targets=[0], escalate_after=10)
        shown.add(str(info.value).replace("upload.json: ", ""))
    assert shown == {"upload.json: config is not valid JSON (line 1: Expecting value)",
                     "config is not valid JSON (line 1: Expecting value)"}
    assert touched == []


def test_a_policy_checked_against_text_never_reads_the_text_as_a_path(server_files, touched):
    existing, _ = server_files
    text = str(existing)
    import hashlib

    doc = {"schema": "caliber.policy/v1",
           "config": {"path": "c.json", "sha256": hashlib.sha256(text.encode()).hexdigest(), "n_classes": 10},
           "levels": [{"level": 0, "target": None, "sigma": 0.0}], "escalation": {"after_queries": 10},
           "expiry": {"after_seconds": None}, "shadow": False, "seeding": "per-input"}
    with pytest.raises(PolicyError, match="not valid JSON"):
        parse_policy(doc, config_text=text)
    assert touched == []


def test_a_real_config_upload_still_loads():
    raw = json.dumps(_config()).encode()
    assert config_from_bytes(raw)["model"] == "server_only_model"
    assert config_from_bytes(b"\xef\xbb\xbf" + raw)["n_classes"] == 10  # a BOM is not an error
    with pytest.raises(ConfigError, match="not UTF-8"):
        config_from_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match="not valid JSON"):
        config_from_bytes(b'{"n": ' + b"9" * 5000 + b"}")  # more digits than int() converts: one line


@pytest.mark.parametrize("page, key", [("pages/policy.py", "policy_config_upload"),
                                       ("pages/export.py", "import_config")])
def test_pages_refuse_a_path_upload_with_one_line_and_read_nothing(server_files, touched, page, key):
    from streamlit.testing.v1 import AppTest

    existing, missing = server_files
    shown = []
    for path in (existing, missing):
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        at.switch_page(page).run()
        assert not at.exception
        at.file_uploader(key=key).set_value(("cfg.json", str(path).encode(), "application/json")).run()
        assert not at.exception
        errors = [e.value.replace("\\", "") for e in at.error]
        assert len(errors) == 1 and "\n" not in errors[0], errors
        shown.append(errors[0])
    assert shown[0] == shown[1] == "cfg.json: config is not valid JSON (line 1: Expecting value)"
    assert touched == []
