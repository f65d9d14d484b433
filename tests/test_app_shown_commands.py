"""Every command the dashboard shows, run by a shell with a hostile file name, runs nothing else.

The names hold ``$()``, backticks, quotes, spaces, newlines and a leading dash.
Each shown command goes through ``bash -c`` in an empty folder, with ``python``
on PATH replaced by a stub that prints its arguments and does nothing else:
the stub must receive the file name as one word, verbatim (``./`` before a
leading dash), and the folder must stay empty.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from caliber_dashboard.common.commands import cli_command, file_argument, shell_command
from caliber_dashboard.export.config import calibrate_command, extract_command

BASH = shutil.which("bash")
HOSTILE = [
    "run$(touch pwned_dollar).npy",
    "run`touch pwned_tick`.npy",
    "it's \"quoted\" $(touch pwned_q).npy",
    "two words; touch pwned_semicolon.npy",
    "line\ntouch pwned_newline\n.npy",
    "-rf --out pwned_dash.npy",
    "--out=pwned_option.npy",
    "$HOME|touch pwned_pipe&.npy",
]

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


@pytest.fixture
def stub_shell(tmp_path):
    """Run a command through ``bash -c`` in an empty folder with a stub ``python``; its argv back."""
    stubs, work = tmp_path / "bin", tmp_path / "work"
    stubs.mkdir()
    work.mkdir()
    stub = stubs / "python"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    stub.chmod(0o755)

    def run(command: str) -> list[str]:
        env = {"PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(work)}
        proc = subprocess.run([BASH, "-c", command], cwd=work, env=env, capture_output=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(work)) == [], f"the command created {os.listdir(work)}"
        assert sorted(os.listdir(tmp_path)) == ["bin", "work"]
        return proc.stdout.decode().split("\0")[:-1]

    return run


@pytest.mark.parametrize("name", HOSTILE)
def test_calibrate_command_keeps_a_hostile_name_one_word(stub_shell, name):
    data = SimpleNamespace(source=name, labels_source="labels " + name)
    command = calibrate_command(data, [("retention", 0.8)], side="at-least")
    argv = stub_shell(command)
    assert argv[:4] == ["-m", "caliber_core", "calibrate", file_argument(name)]
    assert argv[4:6] == ["--labels", "labels " + name]
    assert argv[-2:] == ["--out", "cfg.json"]


@pytest.mark.parametrize("name", HOSTILE)
def test_extract_command_keeps_a_hostile_name_one_word(stub_shell, name):
    settings = SimpleNamespace(retention=(0.9, 0.8), seeds=3, attack="tuned", seed=0, architecture="mlp")
    command = extract_command(name, SimpleNamespace(settings=settings), 0.9)
    argv = stub_shell(command)
    assert argv[:4] == ["-m", "caliber_core", "extract", file_argument(name)]
    assert argv[4:] == ["--retention", "0.9", "0.8", "--surrogate-retention", "0.9", "--seeds", "3",
                        "--attack", "tuned", "--seed", "0", "--out", "CONFIG"]


def test_one_function_quotes_every_word(stub_shell):
    words = ["python", *HOSTILE]
    assert stub_shell(shell_command(words)) == HOSTILE
    assert stub_shell(cli_command("check", "-x")) == ["-m", "caliber_core", "check", "-x"]
    assert file_argument("-rf") == "./-rf" and file_argument("a-b") == "a-b"


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_the_export_page_shows_a_command_that_runs_nothing_else(stub_shell):
    from streamlit.testing.v1 import AppTest

    app = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 300)
    z = rng.normal(size=(300, 4))
    z[np.arange(300), y] += 2.5
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y)
    name = "-m$(touch pwned)`touch pwned2` 'q\".npz"
    at = AppTest.from_file(app, default_timeout=120)
    at.run()
    at.file_uploader(key="upload_logits").set_value((name, buf.getvalue(), "application/octet-stream")).run()
    assert not at.exception
    at.switch_page("pages/export.py").run()
    assert not at.exception
    shown = [c.value for c in at.code if c.value.startswith("python -m caliber_core ")]
    assert shown
    for command in shown:
        argv = stub_shell(command)
        assert argv[3] == "./" + name
