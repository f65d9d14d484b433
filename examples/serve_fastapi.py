"""A classifier endpoint behind the throttle: FastAPI and uvicorn.

Run (after ``keygen`` wrote caliber.key, ``calibrate --seeding consistent --key-file caliber.key`` wrote
the config and ``throttle init`` wrote policy.json)::

    CALIBER_POLICY=policy.json CALIBER_KEY_FILE=caliber.key CALIBER_STORE=sqlite:///ledger.db \\
        python -m uvicorn examples.serve_fastapi:app --host 127.0.0.1 --port 8000

    curl -s -H "Authorization: Bearer acct-7" -d '{"inputs": [[0.1, 0.2, ...]]}' \\
        http://127.0.0.1:8000/v1/classify

``POST /v1/classify`` takes ``{"inputs": [[feature, ...], ...]}`` and returns
``{"logits": [[...], ...]}``. The account is the bearer token, read as the CLI
reads an account (:func:`caliber_core.serving.account_from_authorization`:
any case of the scheme, UTF-8, NFC); the ledger keeps only its fingerprint.

Seeding. The example serves whatever seeding the policy's config was
calibrated for, and its run instructions use consistent seeding: the noise
is a function of the logits, so an input moved by one ulp, a ``-0.0`` for a
``0.0`` or any near-duplicate gets (nearly) the same noise, and no request id
is needed. Under per-input seeding the noise follows the request's id, and
an id taken from raw bytes can be multiplied at will; the example therefore
rounds every input to ``CALIBER_ID_DECIMALS`` places (default 6) before the
model reads it and uses :func:`caliber_core.serving.canonical_ids` of those
features as the ids, so a repeat and its jittered variants share one draw.

Group descriptors. When the policy declares group kinds (``card``, ``org``),
the example reads each request's descriptors from headers that the
provider's own auth layer sets after it has authenticated the request:
``X-Caliber-Group-<Kind>`` by default (``X-Caliber-Group-Card``), or the
names in ``CALIBER_GROUP_HEADERS`` (``card=X-Billing-Card,org=X-Org-Id``).
Only a trusted proxy may set them: it must drop any a client sent, as it
does an ``Authorization`` it did not issue, or a thief can name a stranger's
card (linking the stranger to the campaign) or leave its own out. A missing
header is no descriptor of that kind; a repeated one, or a value the
throttle refuses (over 256 bytes, NUL, not UTF-8), is answered 400 and not
counted. The values are never logged or echoed.

The body and headers are the same at every level: nothing says whether an
account is flagged. A request whose answer cannot be produced is not counted
(a 500 is rolled back with ``Throttle.void``). Flag accounts with
``python -m caliber_core throttle flag``.

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

import os

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, FiniteFloat, ValidationError

from caliber_core.serving import AuthorizationError, account_from_authorization, canonical_features, canonical_ids
from caliber_core.serving.keys import read_key_file
from caliber_core.serving.request_limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, RequestRejected, parse_json
from caliber_core.throttle import StoreUnavailable, Throttle

MAX_ROWS = 1024
#: The precision the stand-in model reads its features at (and the ids are taken at).
DEFAULT_ID_DECIMALS = 6


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


def group_headers(policy, spec: str | None = None) -> dict:
    """Which trusted header carries each declared group kind: ``{kind: header name}``.

    ``spec`` is ``CALIBER_GROUP_HEADERS``' form, ``card=X-Billing-Card,org=X-Org-Id``; a kind it leaves
    out is read from ``X-Caliber-Group-<Kind>``. A kind the policy does not declare is refused (ValueError).
    """
    out = {kind.name: f"X-Caliber-Group-{kind.name.replace('_', '-').title()}" for kind in policy.groups}
    for entry in filter(None, (e.strip() for e in (spec or "").split(","))):
        kind, sep, header = (x.strip() for x in entry.partition("="))
        if not sep or not header or kind not in out:
            raise ValueError(f"CALIBER_GROUP_HEADERS: {entry[:60]!r} is not KIND=HEADER for a kind the policy "
                             f"declares ({', '.join(out) or 'none'})")
        out[kind] = header
    return out


def descriptors(request: Request, headers: dict) -> dict | None:
    """The request's group descriptors from the trusted headers; a 400 (never quoting a value) when malformed."""
    found = {}
    for kind, header in headers.items():
        values = request.headers.getlist(header)
        if len(values) > 1:
            raise HTTPException(status_code=400, detail=f"header {header} is repeated")
        if values:
            try:  # HTTP carries bytes; Starlette reads them as latin-1: take the UTF-8 they were
                found[kind] = values[0].encode("latin-1").decode("utf-8")
            except UnicodeError:
                raise HTTPException(status_code=400, detail=f"header {header} is not UTF-8") from None
    return found or None


def create_app(throttle: Throttle, model, *, decimals: int = DEFAULT_ID_DECIMALS,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, group_header_names: dict | None = None) -> FastAPI:
    """The app: ``model(inputs (N, D) float64) -> logits (N, K)``, served through ``throttle``.

    The model reads the inputs rounded to ``decimals`` places (-0.0 as 0.0);
    under per-input seeding each row's id is the canonical id of what it read.
    A body over ``max_body_bytes`` is answered 413 before it is read.
    ``group_header_names`` (default :func:`group_headers` of the policy) names
    the trusted header of each group kind.
    """
    from caliber_core.throttle.groups import DescriptorError

    app = FastAPI(title="classifier behind the Caliber throttle")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    per_input = throttle.policy.seeding == "per-input"
    headers = group_headers(throttle.policy) if group_header_names is None else dict(group_header_names)

    @app.post("/v1/classify")
    def classify(request: Request, body: ClassifyRequest = Depends(classify_request),
                 authorization: str = Header(default="")):
        try:
            account = account_from_authorization(authorization)
        except AuthorizationError as exc:
            raise HTTPException(status_code=401, detail=str(exc)) from None
        groups = descriptors(request, headers)
        try:
            inputs = canonical_features(body.inputs, decimals=decimals)
            logits = model(inputs)
            ids = canonical_ids(inputs, decimals=decimals) if per_input else None
            served = throttle.respond(account, logits, ids, groups=groups)
        except StoreUnavailable:  # the policy's outage rule refused it: tell the client to come back
            raise HTTPException(status_code=503, detail="try again later") from None
        except DescriptorError as exc:  # the auth layer's headers, not the client's body (before ValueError)
            raise HTTPException(status_code=400, detail=str(exc)) from None
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=" ".join(str(exc).split())) from None
        try:
            return {"logits": np.asarray(served.logits, dtype=np.float64).tolist()}
        except BaseException:
            throttle.void(served)  # no answer went out: not counted
            raise

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
    decimals = int(os.environ.get("CALIBER_ID_DECIMALS", str(DEFAULT_ID_DECIMALS)))
    max_body = int(os.environ.get("CALIBER_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)))
    return create_app(throttle, linear_model(int(os.environ.get("CALIBER_FEATURES", "64")), n_classes),
                      decimals=decimals, max_body_bytes=max_body,
                      group_header_names=group_headers(throttle.policy, os.environ.get("CALIBER_GROUP_HEADERS")))


app = app_from_environment() if os.environ.get("CALIBER_POLICY") else None
