"""A uvicorn server in a thread of the test process, on a free port of 127.0.0.1."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from throttle_support import free_port


@contextmanager
def serve(app, *, port: int | None = None):
    """Serve ``app`` over real HTTP until the block ends; yields the base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
