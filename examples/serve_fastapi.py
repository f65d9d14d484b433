"""A classifier endpoint behind the throttle: FastAPI and uvicorn.

Run (after ``throttle init`` wrote policy.json and ``keygen`` wrote caliber.key)::

    CALIBER_POLICY=policy.json CALIBER_KEY_FILE=caliber.key CALIBER_STORE=sqlite:///ledger.db \\
        python -m uvicorn examples.serve_fastapi:app --host 127.0.0.1 --port 8000

    curl -s -H "Authorization: Bearer acct-7" -d '{"inputs": [[0.1, 0.2, ...]]}' \\
        http://127.0.0.1:8000/v1/classify

``POST /v1/classify`` takes ``{"inputs": [[feature, ...], ...]}`` and returns
``{"logits": [[...], ...]}``. The account is the bearer token (the ledger
keeps only its fingerprint); each row's per-input id is the sha256 of its
float64 bytes, so a repeated input gets the identical answer. The body and
headers are the same at every level: nothing says whether an account is
flagged. Flag accounts with ``python -m caliber_core throttle flag``.

Every request is bounded before it is read (:mod:`caliber_core.serving.request_limits`):
a body over ``CALIBER_MAX_BODY_BYTES`` (default 8 MiB) is answered 413 without
being held; the body is parsed in a worker thread, never on the event loop;
``NaN``, ``Infinity`` or a number beyond float64 (``1e400``) is answered 422;
a refused request is never counted; and no error body quotes the input.

The model here is a stand-in (a fixed, seeded linear map from
``CALIBER_FEATURES`` features to the config's K classes): pass your own to
:func:`create_app`. Prometheus counters are served on a separate, internal
port when ``CALIBER_METRICS_PORT`` is set, never on the public app.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, FiniteFloat, ValidationError

from caliber_core.serving.keys import read_key_file
from caliber_core.serving.request_limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, RequestRejected, parse_json
from caliber_core.throttle import StoreUnavailable, Throttle

MAX_ROWS = 1024


class ClassifyRequest(BaseModel):
    inputs: list[list[FiniteFloat]] = Field(..., min_length=1, max_length=MAX_ROWS)


def parse_request(raw: bytes) -> ClassifyRequest:
    """The body as a :class:`ClassifyRequest`; a 422 that says where and why, never what was sent."""
    try:
        return ClassifyRequest.model_validate(parse_json(raw))
    except RequestRejected as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise HTTPException(status_code=422, detail=f"{where}: {first['msg']}{more}") from None


async def classify_request(request: Request) -> ClassifyRequest:
    """Read the (bounded) body, then parse and validate it in a worker thread, off the event loop."""
    return await run_in_threadpool(parse_request, await request.body())


def row_ids(inputs: np.ndarray) -> list[bytes]:
    """One per-input id per row: the sha256 of the row's float64 bytes."""
    return [hashlib.sha256(row.tobytes()).digest() for row in np.ascontiguousarray(inputs, dtype=np.float64)]


def create_app(throttle: Throttle, model, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The app: ``model(inputs (N, D) float64) -> logits (N, K)``, served through ``throttle``.

    A body over ``max_body_bytes`` is answered 413 before it is read.
    """
    app = FastAPI(title="classifier behind the Caliber throttle")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.post("/v1/classify")
    def classify(body: ClassifyRequest = Depends(classify_request), authorization: str = Header(default="")):
        account = authorization.removeprefix("Bearer ").strip()
        if not account:
            raise HTTPException(status_code=401, detail="missing bearer token")
        try:
            inputs = np.asarray(body.inputs, dtype=np.float64)
            if inputs.ndim != 2:
                raise ValueError("inputs must be a list of rows of equal length")
            logits = model(inputs)
            served = throttle.respond(account, logits, row_ids(inputs))
        except StoreUnavailable:  # the policy says "refuse": tell the client to come back
            raise HTTPException(status_code=503, detail="try again later") from None
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=" ".join(str(exc).split())) from None
        return {"logits": np.asarray(served.logits, dtype=np.float64).tolist()}

    return app


def linear_model(n_features: int, n_classes: int, *, seed: int = 0):
    """The stand-in model: logits = inputs @ W, W fixed by ``seed``."""
    weights = np.random.default_rng(seed).normal(size=(n_features, n_classes))

    def model(inputs: np.ndarray) -> np.ndarray:
        if inputs.shape[1] != n_features:
            raise ValueError(f"each input needs {n_features} features, got {inputs.shape[1]}")
        return inputs @ weights

    return model


def app_from_environment() -> FastAPI:
    throttle = Throttle.from_files(os.environ["CALIBER_POLICY"], key=read_key_file(os.environ["CALIBER_KEY_FILE"]),
                                   store=os.environ.get("CALIBER_STORE", "sqlite:///caliber-ledger.db"))
    port = os.environ.get("CALIBER_METRICS_PORT")
    if port:
        from prometheus_client import start_http_server

        start_http_server(int(port), addr="127.0.0.1")
    n_classes = throttle.policy.config["n_classes"]
    max_body = int(os.environ.get("CALIBER_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)))
    return create_app(throttle, linear_model(int(os.environ.get("CALIBER_FEATURES", "64")), n_classes),
                      max_body_bytes=max_body)


app = app_from_environment() if os.environ.get("CALIBER_POLICY") else None
