"""``caliber gateway --upstream URL --policy P --key-file K --store URI``: the OpenAI-compatible gateway before vLLM.

Needs the ``gateway`` extra (FastAPI, httpx, uvicorn). vLLM must run with the
same policy and key file (``CALIBER_POLICY``, ``CALIBER_KEY_FILE``),
``--logprobs-mode processed_logprobs`` and
``--logits-processors caliber_core.serving.vllm:CaliberLogitsProcessor``, on an
address only the gateway can reach.
"""

from __future__ import annotations

import argparse

from .arguments import positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``gateway`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``gateway`` parser.
    """
    from ..gateway.request_rules import DEFAULT_MAX_TOKENS, MAX_BODY_BYTES
    from ..throttle.grants import DEFAULT_VALID_MINUTES

    gateway = sub.add_parser("gateway", help="serve an OpenAI-compatible gateway that grants each account its level "
                                             "and forwards to vLLM")
    gateway.add_argument("--upstream", required=True, metavar="URL",
                         help="vLLM's base URL, e.g. http://127.0.0.1:8000 (reachable by the gateway only)")
    gateway.add_argument("--policy", required=True, metavar="POLICY", help="the throttle policy (the file vLLM reads)")
    gateway.add_argument("--key-file", required=True, metavar="KEYFILE", help="the serving key (the file vLLM reads)")
    gateway.add_argument("--store", required=True, metavar="URI",
                         help="sqlite:///PATH, redis://HOST:PORT/DB, redis+sentinel://... or redis+cluster://...")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gateway.add_argument("--port", type=positive_int, default=8080, help="port to listen on (default 8080)")
    gateway.add_argument("--default-max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                         help=f"given to, and counted for, requests without max_tokens (default {DEFAULT_MAX_TOKENS})")
    gateway.add_argument("--max-body-bytes", type=positive_int, default=MAX_BODY_BYTES,
                         help=f"larger request bodies get 413 (default {MAX_BODY_BYTES})")
    gateway.add_argument("--refuse-prompt-logprobs", choices=("flagged", "all"), default="flagged",
                         help="refuse prompt_logprobs and echo with logprobs for flagged accounts (default) or for "
                              "all accounts (the refusal then tells nobody they are flagged)")
    gateway.add_argument("--valid-minutes", type=float, default=DEFAULT_VALID_MINUTES,
                         help=f"how long vLLM honours a grant token (default {DEFAULT_VALID_MINUTES:g})")
    gateway.add_argument("--upstream-api-key-file", metavar="FILE",
                         help="a file holding vLLM's --api-key, sent upstream as its bearer")
    return gateway


def build_app(args):
    """The gateway app for parsed arguments (the server is started by :func:`run`).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``gateway`` options.

    Returns
    -------
    fastapi.FastAPI
        The app of :func:`caliber_core.gateway.app.create_app` over a
        :class:`~caliber_core.throttle.Throttle` built from the policy and store.

    Raises
    ------
    ValueError
        An unreadable key or upstream key file, an upstream that is not an
        http(s) URL, bad ``--valid-minutes``, a policy the throttle refuses
        (``PolicyError``) or a bad store URL (``StoreURLError``).
    """
    from ..gateway.app import create_app
    from ..serving.keys import read_key_file
    from ..throttle import Throttle
    from ..throttle.grants import check_valid_minutes

    try:
        key = read_key_file(args.key_file)
    except OSError as exc:
        raise ValueError(f"{args.key_file}: cannot read the key ({exc.strerror})") from None
    upstream_key = None
    if args.upstream_api_key_file:
        try:
            with open(args.upstream_api_key_file, encoding="utf-8") as fh:
                upstream_key = fh.read(4096).strip()
        except OSError as exc:
            raise ValueError(f"{args.upstream_api_key_file}: cannot read the upstream API key ({exc.strerror})") from None
    if not args.upstream.startswith(("http://", "https://")):
        raise ValueError(f"--upstream must be an http:// or https:// URL, got {args.upstream!r}")
    minutes = check_valid_minutes(args.valid_minutes)
    throttle = Throttle.from_files(args.policy, key=key, store=args.store)
    return create_app(throttle, key=key, upstream=args.upstream, default_max_tokens=args.default_max_tokens,
                      max_body_bytes=args.max_body_bytes, refuse_prompt_logprobs=args.refuse_prompt_logprobs,
                      upstream_api_key=upstream_key, valid_minutes=minutes)


def run(args) -> int:
    """Serve until interrupted.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``gateway`` options.

    Returns
    -------
    int
        0 once uvicorn stops.

    Raises
    ------
    ValueError
        The gateway extra is missing, or an unreadable key, a bad policy or
        store, a bad upstream URL (one line, exit 2).
    """
    try:
        import uvicorn
    except ImportError:
        raise ValueError("caliber gateway needs the gateway extra: pip install 'caliber[gateway]' "
                         "(fastapi, httpx, uvicorn)") from None
    app = build_app(args)
    print(f"caliber gateway on http://{args.host}:{args.port} -> {args.upstream}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
