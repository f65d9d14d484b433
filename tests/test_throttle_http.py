"""The FastAPI example served by uvicorn on 127.0.0.1, driven with real HTTP requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from throttle_support import KEY, free_port, serve_example, write_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from caliber_core import Perturber  # noqa: E402
from caliber_core.throttle import Throttle  # noqa: E402
from caliber_core.serving import canonical_features, canonical_ids  # noqa: E402
from examples.serve_fastapi import linear_model  # noqa: E402



@pytest.fixture
def served(tmp_path):
    policy = write_policy(tmp_path, escalate_after=1000)
    metrics_port = free_port()
    env = {"CALIBER_POLICY": str(policy), "CALIBER_STORE": f"sqlite:///{tmp_path / 'ledger.db'}",
           "CALIBER_FEATURES": "8", "CALIBER_METRICS_PORT": str(metrics_port)}
    with serve_example(tmp_path, env=env) as (base, _):
        yield base, policy, tmp_path, metrics_port


def test_flagged_and_clean_accounts_over_http(served):
    base, policy, folder, metrics_port = served
    inputs = canonical_features(np.random.default_rng(1).normal(size=(3, 8)), decimals=6)
    clean_logits = linear_model(8, 10)(inputs)
    with Throttle.from_files(policy, store=f"sqlite:///{folder / 'ledger.db'}", metrics=False) as admin:
        admin.flag("acct-7", level=2, reason="detector 0.93")

    def classify(account):
        return httpx.post(base + "/v1/classify", json={"inputs": inputs.tolist()},
                          headers={"Authorization": f"Bearer {account}"}, timeout=30)

    clean, flagged, again = classify("acct-1"), classify("acct-7"), classify("acct-7")
    assert clean.status_code == flagged.status_code == 200
    np.testing.assert_allclose(clean.json()["logits"], clean_logits, rtol=0, atol=1e-12)
    config = json.loads((folder / "cfg.json").read_text())
    expected = Perturber.from_config(config, target=1, key=KEY).perturb(clean_logits, canonical_ids(inputs, decimals=6))
    np.testing.assert_allclose(flagged.json()["logits"], expected, rtol=0, atol=1e-12)
    assert flagged.json() == again.json()  # per-input seeding: a repeat gets the identical answer
    # Nothing but the numbers differs: same keys, same header names.
    assert clean.json().keys() == flagged.json().keys() == {"logits"}
    assert sorted(h for h in clean.headers if h != "content-length") == \
           sorted(h for h in flagged.headers if h != "content-length")

    assert httpx.post(base + "/v1/classify", json={"inputs": [[1.0] * 3]},
                      headers={"Authorization": "Bearer acct-1"}, timeout=30).status_code == 422
    assert httpx.post(base + "/v1/classify", json={"inputs": inputs.tolist()}, timeout=30).status_code == 401
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert 'caliber_throttle_requests_total{level="2"} 2.0' in metrics
    assert 'caliber_throttle_requests_total{level="0"} 1.0' in metrics
    with Throttle.from_files(policy, store=f"sqlite:///{folder / 'ledger.db'}", metrics=False) as admin:
        assert admin.state("acct-7").queries == {2: 6}


SPELLINGS = [b"bearer acct-7", b"BEARER acct-7", b"Bearer\tacct-7", b"bEaReR   acct-7",
             "Bearer compte-e\u0301".encode("utf-8")]  # NFD over the wire; the CLI flags the NFC spelling
MALFORMED = [b"Basic acct-7", b"Bearer", b"Bearer \xff\xfe", b"Beareracct-7"]


def test_every_spelling_of_the_scheme_and_a_utf8_token_reach_the_flag_set_by_the_cli(served):
    from caliber_core.cli import main

    base, policy, folder, _ = served
    store = f"sqlite:///{folder / 'ledger.db'}"
    for account in ("acct-7", "compte-\u00e9"):
        assert main(["throttle", "flag", account, "--policy", str(policy), "--store", store, "--level", "1"]) == 0
    inputs = canonical_features(np.random.default_rng(2).normal(size=(2, 8)), decimals=6)
    clean = linear_model(8, 10)(inputs)
    config = json.loads((folder / "cfg.json").read_text())
    expected = Perturber.from_config(config, target=0, key=KEY).perturb(clean, canonical_ids(inputs, decimals=6))
    for header in SPELLINGS:
        r = httpx.post(base + "/v1/classify", json={"inputs": inputs.tolist()}, headers={"Authorization": header},
                       timeout=30)
        assert r.status_code == 200, header
        np.testing.assert_allclose(r.json()["logits"], expected, rtol=0, atol=1e-12, err_msg=repr(header))
    for header in MALFORMED:
        r = httpx.post(base + "/v1/classify", json={"inputs": inputs.tolist()}, headers={"Authorization": header},
                       timeout=30)
        assert r.status_code == 401 and "acct-7" not in r.text, header
    with Throttle.from_files(policy, store=store, metrics=False) as admin:
        assert admin.state("acct-7").queries == {1: 8} and admin.state("compte-e\u0301").queries == {1: 2}
