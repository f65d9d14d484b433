"""``caliber gateway --upstream URL --policy P --key-file K --store URI --accounts FILE``: the gateway before vLLM.

The gateway serves authenticated accounts only: it does not start without
``--accounts FILE`` (API keys by their SHA-256; re-read on SIGHUP) or
``--account-header NAME --trusted-proxy ADDR[,ADDR...]`` (an authenticating
proxy in front names the account).

Needs the ``gateway`` extra (FastAPI, httpx, uvicorn). vLLM must run with the
same policy and key file (``CALIBER_POLICY``, ``CALIBER_KEY_FILE``),
``--logprobs-mode processed_logprobs`` and
``--logits-processors caliber_core.serving.vllm:CaliberLogitsProcessor``, on an
address only the gateway can reach.
"""

from __future__ import annotations

import argparse
import signal

from .arguments import positive_int

AUTH_REQUIRED = ("caliber gateway serves authenticated accounts only: give --accounts FILE, or --account-header NAME "
                 "with --trusted-proxy ADDR[,ADDR...]")


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
    who = gateway.add_argument_group("accounts (one way is required)")
    who.add_argument("--accounts", metavar="FILE",
                     help="API keys: one line per key, its SHA-256 in hex, a space, the account id ('#' starts a "
                          "comment); clients send 'Authorization: Bearer <key>'; re-read on SIGHUP")
    who.add_argument("--account-header", metavar="NAME",
                     help="the header in which an authenticating proxy in front names the account (needs "
                          "--trusted-proxy)")
    who.add_argument("--trusted-proxy", metavar="ADDR[,ADDR...]",
                     help="the addresses or networks of that proxy: the header is believed from them only")
    who.add_argument("--group-header", metavar="KIND=HEADER", action="append", default=[],
                     help="a campaign descriptor that proxy sets, e.g. card=X-Caliber-Group-Card; KIND must be "
                          "declared in the policy's groups (repeatable; needs --account-header)")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gateway.add_argument("--port", type=positive_int, default=8080, help="port to listen on (default 8080)")
    gateway.add_argument("--default-max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                         help=f"given to, and counted for, requests without max_tokens (default {DEFAULT_MAX_TOKENS})")
    gateway.add_argument("--max-body-bytes", type=positive_int, default=MAX_BODY_BYTES,
                         help=f"larger request bodies get 413 (default {MAX_BODY_BYTES})")
    gateway.add_argument("--refuse-prompt-logprobs", choices=("flagged", "all"), default="flagged",
                         help="refuse prompt_logprobs and echo with logprobs for flagged accounts (default) or for "
                              "all accounts (the refusal then tells nobody they are flagged)")
    gateway.add_argument("--refuse-non-text", choices=("flagged", "all"), default="flagged",
                         help="refuse prompt_embeds and image, audio, video or file content (which cannot get "
                              "consistent noise) for flagged accounts (default) or for all accounts")
    gateway.add_argument("--valid-minutes", type=float, default=DEFAULT_VALID_MINUTES,
                         help=f"how long vLLM honours a grant token (default {DEFAULT_VALID_MINUTES:g})")
    gateway.add_argument("--upstream-api-key-file", metavar="FILE",
                         help="a file holding vLLM's --api-key, sent upstream as its bearer")
    return gateway


def build_authenticator(args):
    """How the gateway names each request's account, from ``--accounts`` or ``--account-header``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``gateway`` options.

    Returns
    -------
    KeyAccounts or HeaderAccounts
        See :mod:`caliber_core.gateway.identity`.

    Raises
    ------
    ValueError
        Neither way given, or both; ``--account-header`` without
        ``--trusted-proxy`` or the reverse; an unreadable or malformed
        accounts file; a bad header name or address.
    """
    from ..gateway.identity import AccountsFile, HeaderAccounts, KeyAccounts, parse_trusted_proxies

    if args.accounts is None and args.account_header is None:
        raise ValueError(AUTH_REQUIRED)
    if args.accounts is not None and args.account_header is not None:
        raise ValueError("give --accounts or --account-header, not both")
    if args.accounts is not None:
        if args.group_header:
            raise ValueError("--group-header goes with --account-header: descriptors come from the "
                             "authenticating proxy only")
        if args.trusted_proxy is not None:
            raise ValueError("--trusted-proxy goes with --account-header (API keys need no proxy)")
        return KeyAccounts(AccountsFile(args.accounts))
    if args.trusted_proxy is None:
        raise ValueError("--account-header needs --trusted-proxy ADDR[,ADDR...]: the header is believed from the "
                         "authenticating proxy only")
    return HeaderAccounts(args.account_header, parse_trusted_proxies(args.trusted_proxy),
                          group_headers=parse_group_headers(args.group_header))


def parse_group_headers(specs) -> dict:
    """``KIND=HEADER`` options as {kind: header name}; one line naming the bad option otherwise.

    Parameters
    ----------
    specs : list of str
        The ``--group-header`` values.

    Returns
    -------
    dict of str to str
        Descriptor kind -> the header the trusted proxy sets it in.

    Raises
    ------
    ValueError
        Not ``KIND=HEADER``, a header name that is not a token, or a kind given twice.
    """
    import re

    out = {}
    for spec in specs:
        kind, sep, header = spec.partition("=")
        kind, header = kind.strip(), header.strip()
        if not sep or not kind or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}", header):
            raise ValueError(f"--group-header must be KIND=HEADER (e.g. card=X-Caliber-Group-Card), got {spec!r}")
        if kind in out:
            raise ValueError(f"--group-header: kind {kind!r} given twice")
        out[kind] = header
    return out


def build_app(args, authenticate=None):
    """The gateway app for parsed arguments (the server is started by :func:`run`).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``gateway`` options.
    authenticate : KeyAccounts or HeaderAccounts, optional
        Built by :func:`build_authenticator` from ``args`` when not given.

    Returns
    -------
    fastapi.FastAPI
        The app of :func:`caliber_core.gateway.app.create_app` over a
        :class:`~caliber_core.throttle.Throttle` built from the policy and store.

    Raises
    ------
    ValueError
        No way to authenticate accounts (checked first), an unreadable key,
        accounts or upstream key file, an upstream that is not an http(s) URL,
        bad ``--valid-minutes``, a policy the throttle refuses
        (``PolicyError``) or a bad store URL (``StoreURLError``).
    """
    from ..gateway.app import create_app
    from ..serving.keys import read_key_file
    from ..throttle import Throttle
    from ..throttle.grants import check_valid_minutes

    if authenticate is None:
        authenticate = build_authenticator(args)
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
    undeclared = [kind for kind in getattr(authenticate, "group_headers", {})
                  if throttle.policy.group_kind(kind) is None]
    if undeclared:
        raise ValueError(f"--group-header: kind {undeclared[0]!r} is not declared in the policy's groups")
    return create_app(throttle, key=key, upstream=args.upstream, authenticate=authenticate,
                      default_max_tokens=args.default_max_tokens, max_body_bytes=args.max_body_bytes,
                      refuse_prompt_logprobs=args.refuse_prompt_logprobs, refuse_non_text=args.refuse_non_text,
                      upstream_api_key=upstream_key, valid_minutes=minutes)


def run(args) -> int:
    """Serve until interrupted; SIGHUP re-reads the accounts file.

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
        No way to authenticate accounts, the gateway extra is missing, or an
        unreadable key or accounts file, a bad policy or store, a bad upstream
        URL (one line, exit 2).
    """
    authenticate = build_authenticator(args)
    try:
        import uvicorn
    except ImportError:
        raise ValueError("caliber gateway needs the gateway extra: pip install 'caliber[gateway]' "
                         "(fastapi, httpx, uvicorn)") from None
    app = build_app(args, authenticate)
    accounts = getattr(authenticate, "accounts", None)
    if accounts is not None and hasattr(signal, "SIGHUP"):
        def reload(_signum, _frame):
            if accounts.reload():  # a bad file is logged, and the table in force stays
                print(f"caliber gateway: accounts file reloaded ({len(accounts)} keys)", flush=True)

        signal.signal(signal.SIGHUP, reload)
    print(f"caliber gateway on http://{args.host}:{args.port} -> {args.upstream}", flush=True)
    # proxy_headers=False: the peer is the socket's address, never an X-Forwarded-For a client wrote
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", proxy_headers=False, server_header=False)
    return 0
