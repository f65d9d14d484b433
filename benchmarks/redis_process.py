"""A redis-server process for the throttle benchmarks: started on a free 127.0.0.1 port, stopped or killed."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


class Redis:
    """Debian's ``redis-server`` with an append-only file in ``folder``.

    Parameters
    ----------
    folder : Path
        Its working directory (the append-only file; ``redis.log`` when ``log``).
    fsync : {"always", "everysec", "no"}, default "always"
        ``--appendfsync``: "always" loses no acknowledged write on a kill.
    log : bool, default False
        Keep the server's log in ``folder / "redis.log"`` (else it is discarded).
    """

    def __init__(self, folder: Path, *, fsync: str = "always", log: bool = False):
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.exe, self.folder, self.fsync, self.log, self.proc = exe, folder, fsync, log, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING (10 s at most)."""
        import redis

        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                "--save", "", "--appendonly", "yes", "--appendfsync", self.fsync]
        quiet = {}
        if self.log:
            argv += ["--logfile", str(self.folder / "redis.log")]
        else:
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.proc = subprocess.Popen(argv, **quiet)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(200):
            try:
                if client.ping():
                    return
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (a clean shutdown) or, with ``kill``, SIGKILL; then wait for the process."""
        if self.proc is not None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(timeout=10)
            self.proc = None
