"""The engine-free core of in-engine serving: position ids and a batch with a level per row."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from throttle_support import KEY, write_policy

from caliber_core import Perturber
from caliber_core.serving.engine_rows import POSITION_DOMAIN, BatchNoise, PositionHasher, position_id
from caliber_core.throttle import Throttle, load_policy

torch = pytest.importorskip("torch")

K = 32


@pytest.fixture
def policy(tmp_path):
    return load_policy(write_policy(tmp_path, levels=(0, 1, 2), n_classes=K))


def _reference(tmp_path, target, row, one_id):
    config = json.loads((tmp_path / "cfg.json").read_text())
    return Perturber.from_config(config, target=target, key=KEY).perturb(row[None, :], [one_id])[0]


def test_position_id_is_a_hash_of_the_whole_context():
    expected = hashlib.sha256(POSITION_DOMAIN + struct.pack("<4q", 5, 6, 7, 8)).digest()
    assert position_id([5, 6, 7], [8]) == expected
    assert position_id([5, 6], [7, 8]) == expected  # the split between prompt and output does not count
    assert position_id([5, 6, 7], []) != expected
    assert position_id([], []) == hashlib.sha256(POSITION_DOMAIN).digest()
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 2\^63\), got -1"):
        position_id([1], [-1])


def test_the_incremental_hasher_follows_a_growing_and_a_cut_output():
    output = []
    hasher = PositionHasher([3, 1, 4])
    for token in (1, 5, 9, 2):
        assert hasher.id_after(output) == position_id([3, 1, 4], output)
        output.append(token)
    assert hasher.id_after(output) == position_id([3, 1, 4], output)
    assert hasher.id_after(output[:2]) == position_id([3, 1, 4], output[:2])


def test_each_row_gets_its_levels_perturber_noise_in_any_order(policy, tmp_path):
    core = BatchNoise(policy, key=KEY)
    rng = np.random.default_rng(1)
    logits = torch.tensor(rng.normal(size=(6, K)), dtype=torch.float32)
    levels = [2, 0, 3, 1, 0, 2]
    ids = [position_id([r], [r + 1]) for r in range(6)]
    served = core.serve(logits, levels, ids)
    assert served.dtype == torch.float32 and served.shape == logits.shape
    for r, level in enumerate(levels):
        if level == 0:
            assert torch.equal(served[r], logits[r])
        else:
            expected = _reference(tmp_path, policy.levels[level].target, logits[r].numpy(), ids[r])
            np.testing.assert_array_equal(served[r].numpy(), expected)
    # numpy in, numpy out, the same values
    np.testing.assert_array_equal(core.serve(logits.numpy(), levels, ids), served.numpy())
    # sorted input takes the direct path and agrees
    order = sorted(range(6), key=levels.__getitem__)
    direct = core.serve(logits[order], [levels[r] for r in order], [ids[r] for r in order])
    assert torch.equal(direct, served[order])


def test_serving_in_place_gives_the_same_bits(policy):
    """out=logits (what the vLLM processor passes) writes the served rows into the logits themselves."""
    core = BatchNoise(policy, key=KEY)
    rng = np.random.default_rng(7)
    levels = [3, 0, 1, 1, 2, 0, 3]
    ids = [position_id([r], [r + 2]) for r in range(7)]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        logits = torch.tensor(rng.normal(size=(7, K)) * 4, dtype=dtype)
        want = core.serve(logits, levels, ids)
        into = logits.clone()
        got = core.serve(into, levels, ids, out=into)
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]  # bit for bit, NaN-free
        assert got is into and torch.equal(got.view(bits), want.view(bits)), dtype
        other = torch.empty_like(logits)  # a separate tensor of the logits' shape
        assert core.serve(logits, levels, ids, out=other) is other and torch.equal(other, want)
    array = rng.normal(size=(7, K)).astype(np.float32)  # numpy writes its result into out
    want = core.serve(array, levels, ids)
    assert core.serve(array, levels, ids, out=array) is array
    np.testing.assert_array_equal(array, want)
    bad = torch.zeros(2, K)
    bad[1, 3] = float("nan")
    before = bad.clone()
    with pytest.raises(ValueError, match=r"logits contain NaN"):
        core.serve(bad, [1, 1], [b"a", b"b"], out=bad)
    assert torch.equal(bad.nan_to_num(), before.nan_to_num())  # refused before any row was written


def test_levels_nest_and_repeats_are_identical(policy):
    core = BatchNoise(policy, key=KEY)
    row = torch.randn(1, K, generator=torch.Generator().manual_seed(0))
    one = [position_id([1, 2], [])]
    noise = [core.serve(row, [level], one) - row for level in range(4)]
    assert torch.equal(core.serve(row, [2], one), core.serve(row, [2], one))
    spreads = [float(n.double().pow(2).mean().sqrt()) for n in noise]
    assert spreads[0] == 0.0 and 0 < spreads[1] < spreads[2] < spreads[3]
    # nested: level 2's noise minus level 1's is independent of the row, the same for a shifted row
    shifted = core.serve(row + 1.0, [2], one) - core.serve(row + 1.0, [1], one)
    torch.testing.assert_close(shifted, noise[2] - noise[1], atol=1e-5, rtol=0)


def test_every_row_makes_the_top_levels_draws(policy, monkeypatch):
    from caliber_core.serving import keyed_noise_torch

    calls = []
    real = keyed_noise_torch.add_keyed_noise

    def spy(block, seeds, increments, served=None, **kwargs):  # every row draws every level it is given seeds for
        calls.append((block.shape[0], len(seeds)))
        return real(block, seeds, increments, served=served, **kwargs)

    monkeypatch.setattr(keyed_noise_torch, "add_keyed_noise", spy)
    core = BatchNoise(policy, key=KEY)
    logits = torch.zeros(4, K)
    ids = [bytes([i]) for i in range(4)]
    draws = {}
    for levels in ([0, 0, 0, 0], [3, 3, 3, 3], [1, 0, 2, 3]):
        calls.clear()
        core.serve(logits, levels, ids)
        draws[tuple(levels)] = sum(rows * n for rows, n in calls)
    assert set(draws.values()) == {4 * 3}  # 4 rows x 3 ladder draws, whatever the levels


def test_bad_batches_are_refused(policy):
    core = BatchNoise(policy, key=KEY)
    logits = torch.zeros(2, K)
    with pytest.raises(ValueError, match=r"need one level and one id per row: 1 levels and 2 ids"):
        core.serve(logits, [0], [b"a", b"b"])
    with pytest.raises(ValueError, match=r"row levels must be in 0\.\.3, got \[0, 4\]"):
        core.serve(logits, [0, 4], [b"a", b"b"])
    with pytest.raises(ValueError, match=r"logits have n_classes=31, but the config was calibrated for n_classes=32"):
        core.serve(torch.zeros(2, K - 1), [0, 1], [b"a", b"b"])
    with pytest.raises(ValueError, match=r"logits contain NaN"):
        core.serve(torch.full((2, K), float("nan")), [0, 1], [b"a", b"b"])


def test_the_core_verifies_the_throttles_tokens(policy, tmp_path):
    core = BatchNoise(policy, key=KEY)
    t = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'l.db'}", metrics=False)
    t.flag("acct", level=3)
    assert core.verify(t.grant("acct", rows=2)).level == 3
    other = BatchNoise(policy, key=bytes(range(100, 132)))
    with pytest.raises(ValueError, match=r"signature does not verify"):
        other.verify(t.grant("acct", rows=2))


def test_a_consistent_seeding_policy_is_served_row_by_row(tmp_path):
    """A config from ``calibrate --seeding consistent``: each row gets its level's Perturber noise (no id used)."""
    import subprocess
    import sys
    from pathlib import Path

    from caliber_core.cli import main
    from caliber_core.serving.keys import read_key_file

    root = Path(__file__).resolve().parents[1]
    key_file = tmp_path / "serving.key"
    assert main(["keygen", "--out", str(key_file)]) == 0
    for command in (["calibrate", str(root / "data" / "digits_mlp-wide.npz"), "--retention", "0.9", "0.75",
                     "--seeding", "consistent", "--key-file", str(key_file), "--out", str(tmp_path / "cfg.json"),
                     "--quiet"],
                    ["throttle", "init", str(tmp_path / "cfg.json"), "--levels", "0", "1", "--escalate-after", "30",
                     "--out", str(tmp_path / "policy.json")]):
        proc = subprocess.run([sys.executable, "-m", "caliber_core", *command], cwd=root, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
    key, config = read_key_file(key_file), json.loads((tmp_path / "cfg.json").read_text())
    core = BatchNoise(load_policy(tmp_path / "policy.json"), key=key)
    logits = torch.tensor(np.random.default_rng(5).normal(scale=8.0, size=(5, 10)), dtype=torch.float32)
    levels = [2, 0, 1, 2, 0]
    served = core.serve(logits, levels, [position_id([r], []) for r in range(5)])
    for r, level in enumerate(levels):
        if level == 0:
            assert torch.equal(served[r], logits[r])
        else:
            perturber = Perturber.from_config(config, target=level - 1, seeding="consistent", key=key)
            assert torch.equal(served[r], perturber.perturb(logits[r:r + 1])[0])
