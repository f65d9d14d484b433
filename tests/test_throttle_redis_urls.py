"""Redis store URLs of every topology: what each names, and one line for each malformed one."""

from __future__ import annotations

import pytest

from caliber_core.throttle.ledger_store import StoreURLError
from caliber_core.throttle.redis_store import RedisStore
from caliber_core.throttle.redis_urls import parse_redis_url, safe_url
from caliber_core.throttle.stores import open_store


def test_a_sentinel_url_names_its_sentinels_service_database_and_durability():
    t = parse_redis_url("rediss+sentinel://app:s%3Acret@10.0.0.1:26379,[::1]:26380,s3/ledger/2"
                        "?wait=1&wait_timeout_ms=250&sentinel_password=other")
    assert (t.topology, t.service, t.db, t.tls, t.wait, t.wait_timeout_ms) == ("sentinel", "ledger", 2, True, 1, 250)
    assert t.nodes == (("10.0.0.1", 26379), ("::1", 26380), ("s3", 26379))
    assert (t.username, t.password, t.sentinel_password) == ("app", "s:cret", "other")
    assert "cret" not in t.safe_url and "other" not in t.safe_url and "cret" not in repr(t)


def test_a_cluster_url_names_its_startup_nodes():
    t = parse_redis_url("redis+cluster://:pw@n1:7000,n2:7001?wait=1")
    assert (t.topology, t.nodes, t.password, t.username, t.wait, t.wait_timeout_ms) == \
           ("cluster", (("n1", 7000), ("n2", 7001)), "pw", None, 1, 100)


def test_a_single_server_url_keeps_its_own_parameters_and_takes_wait():
    t = parse_redis_url("redis://:pw@127.0.0.1:6380/3?wait=2&socket_keepalive=true")
    assert (t.topology, t.db, t.wait) == ("server", 3, 2)
    assert "wait" not in t.server_url and "socket_keepalive=true" in t.server_url
    store = open_store("redis://127.0.0.1:1/0?wait=1&wait_timeout_ms=5")
    assert isinstance(store, RedisStore) and (store.wait, store.wait_timeout_ms) == (1, 5)
    assert parse_redis_url("redis://h/0").wait == 0  # the default: one server has no replica to wait for


@pytest.mark.parametrize("url, says", [
    ("redis+sentinel://u:hunter2@h1:26379", "names no service"),
    ("redis+sentinel://u:hunter2@h1:26379/", "names no service"),
    ("redis+sentinel://u:hunter2@h1:26379/svc/x", "the database must be a number"),
    ("redis+sentinel://u:hunter2@h1:26379/svc/0/more", "expected /SERVICE[/DB]"),
    ("redis+sentinel://u:hunter2@h1:99999/svc", "bad port"),
    ("redis+sentinel://u:hunter2@/svc", "names no host"),
    ("redis+sentinel://u:hunter2@h1:26379/svc?sentinel_password=hunter3&wait=x", "wait must be an integer"),
    ("redis+cluster://u:hunter2@h1:7000/5", "database 0 only"),
    ("redis+cluster://u:hunter2@h1:7000,h2:x", "bad port"),
    ("redis+cluster://u:hunter2@h1:7000?wait_timeout_ms=0", "wait_timeout_ms must be an integer in [1, 60000]"),
    ("redis+cluster://u:hunter2@h1:7000?wait=1&wait=2", "given twice"),
    ("redis+cluster://u:hunter2@h1:7000?password=hunter3", "unknown parameter 'password'"),
    ("redis://u:hunter2@h1:6379/0?wait=-1", "wait must be an integer"),
    ("redis://u:hunter2@h1:6379/db", "the database must be a number"),
    ("redis+sentinal://u:hunter2@h1/svc", "store URL must start with"),
])
def test_a_malformed_url_is_one_line_without_the_password(url, says):
    with pytest.raises(StoreURLError) as caught:
        open_store(url)
    text = str(caught.value)
    assert says in text and "\n" not in text and "hunter2" not in text and "hunter3" not in text


def test_safe_url_drops_credentials_and_password_parameters():
    assert safe_url("redis+sentinel://u:p@a:1,b:2/svc?sentinel_password=q&wait=1") == \
           "redis+sentinel://a:1,b:2/svc?sentinel_password=***&wait=1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("form", ["redis+cluster://u:hunter2@127.0.0.1:{p}",
                                  "redis+sentinel://u:hunter2@127.0.0.1:{p}/svc"])
def test_a_topology_with_nothing_reachable_refuses_to_start_in_one_line(tmp_path, capsys, form):
    from throttle_support import write_policy

    from caliber_core.cli import main
    from caliber_core.throttle import StoreUnavailable, Throttle

    url = form.format(p=_free_port())
    policy = write_policy(tmp_path)
    with pytest.raises(StoreUnavailable) as caught:
        Throttle.from_files(policy, store=url, metrics=False)
    text = str(caught.value)
    assert "refusing to start" in text and "\n" not in text and "hunter2" not in text
    assert main(["throttle", "status", "--policy", str(policy), "--store", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hunter2" not in err and "Traceback" not in err


def test_a_sentinel_that_names_no_primary_for_the_service_refuses_to_start_in_one_line(tmp_path):
    import subprocess

    from redis_topologies import Missing, redis_executables
    from throttle_support import write_policy

    from caliber_core.throttle import StoreUnavailable, Throttle

    try:
        exe, _ = redis_executables()
    except Missing as exc:
        pytest.skip(str(exc))
    port = _free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n")
    proc = subprocess.Popen([exe, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time

        import redis

        for _ in range(100):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        with pytest.raises(StoreUnavailable) as caught:
            Throttle.from_files(write_policy(tmp_path), store=f"redis+sentinel://:hunter2@127.0.0.1:{port}/nosuch",
                                metrics=False)
        text = str(caught.value)
        assert "MasterNotFoundError" in text and "nosuch" in text and "\n" not in text and "hunter2" not in text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
