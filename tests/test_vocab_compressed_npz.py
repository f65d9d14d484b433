"""A np.savez_compressed dump streams like a stored one: inflated block by block, never loaded whole."""

from __future__ import annotations

import hashlib

import numpy as np

from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import load_config
from caliber_core.loading.row_stream import can_map, open_rows


def dump(n, k, seed):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k), dtype=np.float32)
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += 3.0
    return z, y


def test_a_compressed_npz_streams_to_the_same_config_as_a_stored_one(tmp_path, capsys):
    z, y = dump(24, 8192, seed=3)
    np.savez(tmp_path / "stored.npz", logits=z, labels=y)
    np.savez_compressed(tmp_path / "packed.npz", logits=z, labels=y)
    source = open_rows(tmp_path / "packed.npz")
    assert (source.n_rows, source.n_classes, source.member) == (24, 8192, "logits.npy") and not can_map(source)
    configs = {}
    for name in ("stored.npz", "packed.npz"):
        out = tmp_path / f"{name}.json"
        assert main(["calibrate", str(tmp_path / name), "--retention", "0.9", "0.7", "--out", str(out),
                     "--quiet"]) == 0
        configs[name] = load_config(out)
    capsys.readouterr()
    packed = configs["packed.npz"]
    assert packed["inversion"]["accuracy_targets"] == "full-vocabulary-streamed-accuracy"
    assert [t["sigma"] for t in packed["targets"]] == [t["sigma"] for t in configs["stored.npz"]["targets"]]
    assert packed["sha256"] == hashlib.sha256((tmp_path / "packed.npz").read_bytes()).hexdigest()


def test_a_corrupt_compressed_member_is_refused_in_one_line(tmp_path, capsys):
    z, y = dump(24, 8192, seed=4)
    np.savez_compressed(tmp_path / "packed.npz", logits=z, labels=y)
    raw = bytearray((tmp_path / "packed.npz").read_bytes())
    middle = len(raw) // 3
    raw[middle : middle + 64] = bytes(64)  # inside the logits member's deflate stream
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    code = main(["calibrate", str(tmp_path / "bad.npz"), "--retention", "0.9"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR and len(err.strip().splitlines()) == 1, err
    assert "npz" in err and "Traceback" not in err
