"""The gateway's test harness: upstreams, uvicorn in a thread, ``caliber gateway`` as a process, an accounts file.

Imported after ``pytest.importorskip("fastapi")``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from throttle_support import free_port

ROOT = Path(__file__).resolve().parents[1]


def api_key(account: str) -> str:
    """The test API key of ``account`` (any string works; this one is easy to read in a test)."""
    return f"sk-test-{account}"


def write_accounts(path: Path, keys: dict) -> Path:
    """An accounts file: ``{api key: account id}`` written as 'sha256-hex account' lines, with a comment."""
    lines = ["# caliber gateway accounts: sha256(key) account"]
    lines += [f"{hashlib.sha256(key.encode()).hexdigest()} {account}  # issued for the tests" for key, account
              in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def recording_upstream(seen: list):
    """Answers as vLLM would in shape: JSON, SSE when streaming; records each request.

    Prompt ``"bad"`` gets its own 400; prompt ``"echo"`` a 400 that quotes the request, grant included.
    """
    app = FastAPI()

    async def answer(request: Request):
        body = await request.json()
        seen.append({"path": request.url.path, "body": body, "auth": request.headers.get("authorization")})
        if body.get("prompt") == "bad":
            return JSONResponse(status_code=400, content={"error": {"message": "upstream says no"}})
        if body.get("prompt") == "echo":  # as a model-level validator's error can: the whole request quoted
            return JSONResponse(status_code=400, content={"object": "error", "message": json.dumps(body),
                                                          "type": "BadRequestError", "code": 400})
        if body.get("stream"):
            async def events():
                for i in range(3):
                    yield f"data: {json.dumps({'i': i})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return {"ok": True}

    app.post("/v1/completions")(answer)
    app.post("/v1/chat/completions")(answer)
    return app


def echoing_upstream() -> FastAPI:
    """Answers as a model-level validator can: its error quotes the whole request, grant included."""
    app = FastAPI()

    async def answer(request: Request):
        body = await request.json()
        quoted = json.dumps(body)
        if body.get("prompt") == "in-stream":  # a 200 stream whose error event quotes the request
            async def events():
                yield f"data: {json.dumps({'i': 0})}\n\n".encode()
                yield f"data: {json.dumps({'error': {'message': quoted, 'code': 400}})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        if body.get("prompt") == "leak-200":  # a 200 body holding the request
            return {"choices": [{"text": quoted}]}
        return JSONResponse(status_code=400, content={"object": "error", "message": f"1 validation error: {quoted}",
                                                      "type": "BadRequestError", "param": None, "code": 400})

    app.post("/v1/completions")(answer)
    app.post("/v1/chat/completions")(answer)
    return app


@contextmanager
def serve(app, *, port: int | None = None):
    """Serve ``app`` over real HTTP until the block ends; yields the base URL.

    ``proxy_headers=False`` as ``caliber gateway`` runs it: the peer address is the socket's.
    """
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           proxy_headers=False))
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


@contextmanager
def gateway_process(arguments: list, *, folder: Path, timeout: float = 120.0):
    """``python -m caliber_core gateway ARGUMENTS --port P`` as a process; yields (base URL, Popen, log path).

    Waits until the port answers; on exit stops the process (SIGTERM, then SIGKILL).
    """
    import httpx

    port = free_port()
    log_path = folder / f"gateway-{port}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "caliber_core", "gateway", *arguments, "--port", str(port)],
                                cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"caliber gateway exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                httpx.get(base + "/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"caliber gateway did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield base, proc, log_path
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
