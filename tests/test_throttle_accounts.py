"""Accounts: the Authorization header read as the CLI reads an account id; Redis URLs read as redis-py reads them."""

from __future__ import annotations

import unicodedata

import pytest
from throttle_support import RedisServer

from caliber_core.serving import AuthorizationError, account_from_authorization
from caliber_core.throttle import StoreUnavailable, StoreURLError, account_fingerprint, open_store


@pytest.mark.parametrize("header", ["Bearer acct-7", "bearer acct-7", "BEARER acct-7", "Bearer\tacct-7",
                                    "Bearer \t acct-7 \t", b"bEaReR acct-7"])
def test_the_scheme_is_case_insensitive_and_any_whitespace_follows_it(header):
    assert account_from_authorization(header) == "acct-7"


def test_a_utf8_token_is_decoded_and_normalized_like_the_cli():
    nfd = "compte-e\u0301"
    as_received = ("Bearer " + nfd).encode("utf-8")
    as_server_decoded = as_received.decode("latin-1")  # what Starlette hands over
    for header in (as_received, as_server_decoded):
        token = account_from_authorization(header)
        assert token == unicodedata.normalize("NFC", nfd) == "compte-\u00e9"
    assert account_fingerprint(nfd) == account_fingerprint("compte-\u00e9")  # the CLI's side
    assert account_from_authorization("Bearer Bearer x") == "Bearer x"  # the scheme is stripped once


@pytest.mark.parametrize("header, message", [
    ("", "missing bearer token"), ("Bearer", "missing bearer token"), ("Bearer  \t", "missing bearer token"),
    ("Basic YWxhZGRpbjpvcGVu", "scheme must be Bearer"), ("Beareracct-7", "missing bearer token"),
    (b"Bearer \xff\xfe", "not UTF-8"), ("Bearer a\x01b", "control character"),
])
def test_malformed_headers_are_refused_without_echoing_the_token(header, message):
    with pytest.raises(AuthorizationError, match=message) as info:
        account_from_authorization(header)
    assert "YWxh" not in str(info.value)


def test_redis_urls_with_an_acl_user_and_percent_encoded_passwords(tmp_path):
    password, user_password = "s3cr:t@x/y", "p@ss:w/rd%"
    server = RedisServer(tmp_path, extra=("--requirepass", password, "--user", "alice", "on", ">" + user_password,
                                          "~*", "&*", "+@all"), password=password)
    server.start()
    try:
        from urllib.parse import quote

        for url in (f"redis://:{quote(password, safe='')}@127.0.0.1:{server.port}/2",
                    f"redis://alice:{quote(user_password, safe='')}@127.0.0.1:{server.port}/2"):
            store = open_store(url)
            store.set_flag("acct", flagged=True, level=1, reason="", now=0.0)
            assert store.get("acct").level == 1 and store.ping()
            assert password not in repr(store) and "alice" not in repr(store)
            store.close()
        wrong = open_store(f"redis://alice:nope@127.0.0.1:{server.port}/2")
        with pytest.raises(StoreUnavailable) as info:
            wrong.ping()
        assert "nope" not in str(info.value) and "alice" not in str(info.value)
    finally:
        server.stop()
    with pytest.raises(StoreURLError, match="the database must be a number"):
        open_store("redis://127.0.0.1:6379/x")
    with pytest.raises(StoreURLError, match="NUL"):
        open_store("sqlite:///a\x00b")
