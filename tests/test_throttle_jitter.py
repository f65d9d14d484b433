"""Ids that cannot be multiplied: jittered variants of one input get one draw (per-input) or one noise (consistent).

The FastAPI example is driven in process (FastAPI's TestClient) with its own
``create_app`` and ``linear_model``; 64 variants of one input (one ulp up or
down in random features, -0.0 for 0.0) are averaged and compared with one answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from throttle_support import KEY, write_policy

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from caliber_core.cli import main  # noqa: E402
from caliber_core.serving import canonical_features, canonical_id, canonical_ids  # noqa: E402
from caliber_core.serving.keys import read_key_file  # noqa: E402
from caliber_core.throttle import Throttle  # noqa: E402
from examples.serve_fastapi import create_app, linear_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def jittered(x: np.ndarray, n: int, *, seed: int = 0) -> np.ndarray:
    """``n`` variants of row ``x``: each feature moved one ulp up, down or kept; zeros sent as +-0.0."""
    rng = np.random.default_rng(seed)
    out = np.repeat(x[None, :], n, axis=0)
    step = rng.integers(-1, 2, size=out.shape)
    out = np.where(step > 0, np.nextafter(out, np.inf), np.where(step < 0, np.nextafter(out, -np.inf), out))
    zeros = x == 0
    signs = rng.random(size=out.shape) < 0.5
    out[:, zeros] = np.where(signs[:, zeros], -0.0, 0.0)
    return out


def test_canonical_ids_cover_ulps_signed_zero_field_order_and_ints():
    x = np.array([0.1, -2.5e-3, 0.0, 3.0, 123.456789])
    ids = {canonical_id(v, decimals=6) for v in jittered(x, 64)}
    assert len(ids) == 1
    assert canonical_id({"b": 3, "a": -0.0}, decimals=2) == canonical_id({"a": 0.0, "b": 3.0}, decimals=2)
    assert canonical_id({"a": 1.0, "b": 2.0}, decimals=2) != canonical_id({"a": 1.0, "c": 2.0}, decimals=2)
    assert canonical_id(x, decimals=6) != canonical_id(x + 1e-5, decimals=6)  # above the precision: another input
    assert canonical_id(x, decimals=6) != canonical_id(x, decimals=6, namespace=b"other-model")
    assert canonical_ids(np.stack([x, x]), decimals=6) == [canonical_id(x, decimals=6)] * 2
    np.testing.assert_array_equal(canonical_features([[-0.0, 0.12345649]], decimals=6), [[0.0, 0.123456]])
    assert not np.signbit(canonical_features([[-1e-9]], decimals=6)).any()


@pytest.mark.parametrize("bad, message", [
    ([1.0, float("nan")], r"nan at row 0, feature 1: only finite numbers"),
    ([float("-inf"), 1.0], r"-inf at row 0, feature 0"),
    ([1e300], r"beyond what 6 decimals hold exactly"),
    ([[1.0], [1.0, 2.0]], r"features must be numbers"),
    ([{"a": 1}, {"b": 1}], r"row 1 has fields \['b'\], row 0 has \['a'\]"),
])
def test_canonical_ids_refuse_what_has_no_id(bad, message):
    with pytest.raises(ValueError, match=message):
        canonical_ids(bad, decimals=6)
    with pytest.raises(ValueError, match=r"decimals must be an integer in \[0, 15\], got 16"):
        canonical_id([1.0], decimals=16)
    with pytest.raises(ValueError, match="canonical_id takes one input, got 2 rows"):
        canonical_id([[1.0], [2.0]], decimals=6)


def _average_ratio(client, model, x, n=64):
    """|mean of n jittered answers - clean| / |one answer - clean|, over the logits (RMS)."""
    variants = jittered(x, n)
    answers = [np.array(client.post("/v1/classify", json={"inputs": [v.tolist()]},
                                    headers={"Authorization": "Bearer thief"}).json()["logits"][0])
               for v in variants]
    clean = model(canonical_features(x, decimals=6))[0]
    one = np.sqrt(np.mean((answers[0] - clean) ** 2))
    averaged = np.sqrt(np.mean((np.mean(answers, axis=0) - clean) ** 2))
    return averaged / one


def test_per_input_policy_jittered_variants_average_to_nothing(tmp_path):
    policy = write_policy(tmp_path, escalate_after=10**6)
    throttle = Throttle.from_files(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.flag("thief", level=1)
    model = linear_model(8, 10)
    client = TestClient(create_app(throttle, model))
    x = np.random.default_rng(4).normal(size=8)
    x[2] = 0.0
    assert _average_ratio(client, model, x) >= 0.999  # one draw for all 64


def test_consistent_policy_jittered_variants_average_to_nothing(tmp_path):
    key_file = tmp_path / "caliber.key"
    assert main(["keygen", "--out", str(key_file)]) == 0
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--retention", "0.9", "--seeding", "consistent", "--key-file", str(key_file),
                           "--out", str(tmp_path / "cfg.json"), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert main(["throttle", "init", str(tmp_path / "cfg.json"), "--levels", "0", "--escalate-after", "1000000",
                 "--out", str(tmp_path / "policy.json"), "--key-file", str(key_file)]) == 0
    assert json.loads((tmp_path / "policy.json").read_text())["seeding"] == "consistent"
    throttle = Throttle.from_files(tmp_path / "policy.json", key=read_key_file(key_file),
                                   store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    throttle.flag("thief", level=1)
    model = linear_model(8, 10)
    client = TestClient(create_app(throttle, model))
    x = np.random.default_rng(5).normal(scale=4.0, size=8)
    x[0] = 0.0
    assert _average_ratio(client, model, x) >= 0.95
