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

The model here is a stand-in (a fixed, seeded linear map from
``CALIBER_FEATURES`` features to the config's K classes): pass your own to
:func:`create_app`. Prometheus counters are served on a separate, internal
port when ``CALIBER_METRICS_PORT`` is set, never on the public app.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from caliber_core.serving.keys import read_key_file
from caliber_core.throttle import StoreUnavailable, Throttle

MAX_ROWS = 1024


class ClassifyRequest(BaseModel):
    inputs: list[list[float]] = Field(..., min_length=1, max_length=MAX_ROWS)


def row_ids(inputs: np.ndarray) -> list[bytes]:
    """One per-input id per row: the sha256 of the row's float64 bytes."""
    return [hashlib.sha256(row.tobytes()).digest() for row in np.ascontiguousarray(inputs, dtype=np.float64)]


def create_app(throttle: Throttle, model) -> FastAPI:
    """The app: ``model(inputs (N, D) float64) -> logits (N, K)``, served through ``throttle``."""
    app = FastAPI(title="classifier behind the Caliber throttle")

    @app.post("/v1/classify")
    def classify(body: ClassifyRequest, authorization: str = Header(default="")):
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
    return create_app(throttle, linear_model(int(os.environ.get("CALIBER_FEATURES", "64")), n_classes))


app = app_from_environment() if os.environ.get("CALIBER_POLICY") else None
