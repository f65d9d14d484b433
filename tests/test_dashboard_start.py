"""The README's ``./scripts/dashboard.sh`` starts on a fresh machine, with no terminal.

Streamlit's non-headless start asks a first-run e-mail question on stdin unless
``~/.streamlit/credentials.toml`` exists, which a fresh ``HOME`` lacks; started with
stdin closed, it never answers its health check. The script must start regardless.
"""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from caliber_core.cli import build_parser
from caliber_core.cli.dashboard import command, local_url, open_browser_when_healthy

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamlit_is_always_started_headless_so_it_never_prompts():
    for argv in (["dashboard"], ["dashboard", "--headless"]):
        cmd = command(build_parser().parse_args(argv))
        assert "--server.headless=true" in cmd and "--server.headless=false" not in cmd


def test_the_upload_limit_is_the_workspace_cap(monkeypatch, capsys):
    from caliber_core.cli import main

    args = build_parser().parse_args(["dashboard"])
    assert "--server.maxUploadSize=953" in command(args, {})  # the default cap, 1000 MB, in MiB
    assert "--server.maxUploadSize=476" in command(args, {"CALIBER_WORKSPACE_MAX_MB": "500"})
    assert "--server.maxUploadSize=1" in command(args, {"CALIBER_WORKSPACE_MAX_MB": "0.1"})
    monkeypatch.setenv("CALIBER_WORKSPACE_MAX_MB", "lots")
    assert main(["dashboard", "--headless"]) == 2  # refused before anything starts
    err = capsys.readouterr().err
    assert "CALIBER_WORKSPACE_MAX_MB must be a number, got 'lots'" in err and err.count("\n") <= 2


def test_the_browser_is_opened_only_once_the_server_answers(tmp_path):
    opened = []
    # Nothing listens on this port: the opener is never called.
    assert not open_browser_when_healthy(f"http://127.0.0.1:{_free_port()}", timeout=1.0, opener=opened.append)
    assert opened == []
    assert local_url(build_parser().parse_args(["dashboard", "--address", "0.0.0.0", "--port", "9"])) \
        == "http://127.0.0.1:9"


@pytest.mark.timeout(120)
def test_dashboard_script_is_healthy_with_a_fresh_home_and_no_terminal(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(HOME=str(home), CALIBER_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.Popen([str(ROOT / "scripts" / "dashboard.sh"), "--port", str(port)], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                    healthy = resp.status == 200
                    break
            except OSError:
                time.sleep(0.5)
        assert healthy, f"no health answer (exit {proc.poll()})"
        assert not (home / ".streamlit" / "credentials.toml").exists()
    finally:
        os.killpg(proc.pid, 15)
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert "Email" not in out
