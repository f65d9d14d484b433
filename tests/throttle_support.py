"""Shared pieces of the throttle tests: a small config, a policy for it, a real redis-server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from caliber_core.throttle.policy import build_policy, save_policy

KEY = bytes(range(32))
SIGMAS = (0.5, 1.0, 2.0)


def write_config(folder: Path, *, n_classes: int = 10, name: str = "cfg.json") -> Path:
    """A valid caliber.config/v2 with three retention targets (sigma 0.5, 1, 2) and their intervals."""
    targets = []
    for sigma, acc, ret in zip(SIGMAS, (0.85, 0.7, 0.5), (0.9, 0.75, 0.55)):
        targets.append({"kind": "retention", "requested": ret, "accuracy": acc, "retention": ret,
                        "agreement": None, "v": sigma ** 2 / 4, "sigma": sigma, "sigma_logistic": sigma,
                        "method": "exact-curve", "saturated": False, "side": "point",
                        "interval": {"level": 0.95, "method": "bootstrap", "accuracy": [acc - 0.02, acc + 0.01],
                                     "retention": [ret - 0.02, ret + 0.01], "agreement": None},
                        "attacker": None, "reference": None})
    config = {"schema": "caliber.config/v2", "model": "toy", "n_classes": n_classes, "n_samples": 500,
              "statistic": "median", "scale": 2.0, "clean_accuracy": 0.95, "chance": 1 / n_classes,
              "fit": {}, "targets": targets}
    path = folder / name
    path.write_text(json.dumps(config, indent=1))
    return path


def write_policy(folder: Path, *, levels=(0, 1, 2), escalate_after: int = 10, expire_after=None,
                 shadow: bool = False, on_store_error: str = "last-known", n_classes: int = 10,
                 name: str = "policy.json", unseen_level=None, start_degraded: bool = False) -> Path:
    config = folder / "cfg.json"
    if not config.exists():
        write_config(folder, n_classes=n_classes)
    out = folder / name
    doc = build_policy(config, targets=list(levels), escalate_after=escalate_after, expire_after=expire_after,
                       shadow=shadow, on_store_error=on_store_error, unseen_level=unseen_level,
                       start_degraded=start_degraded, out_path=out)
    save_policy(doc, out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on 127.0.0.1 with AOF (appendfsync always) in ``folder``; restartable on its port."""

    def __init__(self, folder: Path, *, extra: tuple = (), password: str | None = None):
        exe = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                               else None)
        if exe is None:
            import pytest  # here: vLLM's virtualenv imports this module for write_config, without pytest

            pytest.skip("redis-server is not installed (./scripts/test.sh installs Debian's redis-server "
                        "when it runs as root)")
        self.exe, self.folder, self.port, self.proc = exe, folder, free_port(), None
        self.extra, self.password = tuple(extra), password

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes",
             "--logfile", str(self.folder / "redis.log"), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2, password=self.password)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {(self.folder / 'redis.log').read_text()[-500:]}")
                time.sleep(0.05)
        client.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def redis_server(folder: Path):
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def serve_example(folder: Path, *, env: dict, start_timeout: float = 60.0):
    """``uvicorn examples.serve_fastapi:app`` on a free 127.0.0.1 port; yields (base URL, process).

    ``folder`` receives the key file (mode 0600: a key readable by others is
    refused); ``env`` adds the example's settings (``CALIBER_POLICY``,
    ``CALIBER_STORE``, ...) to this process's environment, and
    ``CALIBER_KEY_FILE`` points at that key unless ``env`` names one. The
    server is up when its ``/docs`` answers; it is stopped on exit.
    """
    import sys

    import httpx

    key = folder / "caliber.key"
    key.write_text(KEY.hex() + "\n")
    key.chmod(0o600)
    port = free_port()
    environ = os.environ | {"CALIBER_KEY_FILE": str(key)} | env
    if "CALIBER_METRICS_PORT" not in env:
        environ.pop("CALIBER_METRICS_PORT", None)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "examples.serve_fastapi:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=root, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            try:
                httpx.get(base + "/docs", timeout=1.0)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"uvicorn did not start: {proc.stdout.read().decode()[-2000:]}") from None
                time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
