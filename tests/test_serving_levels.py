"""Nested levels, config binding, keys and hostile configs of the serving runtime."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from caliber_core.config import ConfigError, config_digest, load_config
from caliber_core.serving import keys
from caliber_core.serving.runtime import Perturber, level_increments, per_input_noise
from caliber_core.validation import check_key

ROOT = Path(__file__).resolve().parents[1]
KEY = b"levels test key, not a secret"


def make_config(*sigmas, n_classes=6, scale=1.0, v_max=16.0):
    """A v2 config as calibrate writes it (sweep included), with one retention target per sigma."""
    return {
        "schema": "caliber.config/v2", "model": "m", "n_classes": n_classes, "n_samples": 100,
        "statistic": "median", "scale": scale, "fit": {},
        "sweep": {"realizations": 8, "seed": 0, "n_points": 10, "v_min": 0.01, "v_max": v_max},
        "targets": [
            {"kind": "retention", "requested": 0.9 - 0.1 * i, "accuracy": 0.8 - 0.1 * i, "retention": 0.9 - 0.1 * i,
             "v": (s / scale) ** 2, "sigma": s, "side": "point", "interval": None}
            for i, s in enumerate(sigmas)
        ],
    }


def served(perturber, z, ids):
    return perturber.perturb(z, ids)


# --------------------------------------------------------------------------
# levels
# --------------------------------------------------------------------------


def test_levels_are_the_configs_distinct_sigmas_sorted():
    config = make_config(1.5, 0.5, 1.5, 3.0)
    for target, (sigma, level) in enumerate([(1.5, 2), (0.5, 1), (1.5, 2), (3.0, 3)]):
        p = Perturber.from_config(config, target=target, key=KEY)
        assert p.levels == (0.5, 1.5, 3.0) and p.sigma == sigma and p.level == level
    bare = Perturber(0.7, key=KEY)
    assert bare.levels == (0.7,) and bare.level == 1 and bare.n_classes is None and bare.config_digest is None


def test_level_increments_square_sum_to_the_sigma():
    inc = level_increments((0.5, 1.5, 3.0), 3)
    assert inc[0] == 0.5 and math.fsum(i * i for i in inc) == pytest.approx(9.0, rel=1e-15)
    assert level_increments((0.5, 1.5, 3.0), 1) == (0.5,)


def test_lower_levels_are_nested_in_higher_ones():
    # eps_j = eps_{j-1} + sqrt(s_j^2 - s_{j-1}^2) xi_j: the lower level's draw is shared exactly.
    config = make_config(0.5, 1.5, 3.0)
    ids = [f"r{i}" for i in range(50)]
    z = np.zeros((50, 6))
    eps = [served(Perturber.from_config(config, target=t, key=KEY), z, ids) for t in range(3)]
    inc = level_increments((0.5, 1.5, 3.0), 3)
    binding = bytes.fromhex(config_digest(config))
    xi = [per_input_noise(ids, 6, key=KEY, binding=binding, level=i) for i in (1, 2, 3)]
    np.testing.assert_array_equal(eps[0], inc[0] * xi[0])
    np.testing.assert_array_equal(eps[1], inc[0] * xi[0] + inc[1] * xi[1])
    np.testing.assert_array_equal(eps[2], inc[0] * xi[0] + inc[1] * xi[1] + inc[2] * xi[2])
    # The increments are uncorrelated with the lower level (r ~ N(0, 1/n); bound 5/sqrt(n)).
    d = (eps[2] - eps[1]).ravel()
    assert abs(np.corrcoef(d, eps[1].ravel())[0, 1]) < 5 / math.sqrt(d.size)


def test_best_linear_combination_of_all_levels_is_no_better_than_the_least_noisy():
    # A thief sees every level's answer for the same inputs and fits the best
    # linear predictor of the clean logits (least squares with an intercept) on
    # half the rows; on the other half its error is compared with the same fit
    # using the least-noisy answer only. Nested noise: the other answers are the
    # least-noisy one plus noise independent of z, so they cannot help.
    sigmas = (0.5, 0.8, 2.0)
    config = make_config(*sigmas, n_classes=500)
    rng = np.random.default_rng(0)
    n_rows = 400
    z = rng.normal(scale=2.0, size=(n_rows, 500))
    ids = [f"input-{i}" for i in range(n_rows)]
    answers = [served(Perturber.from_config(config, target=t, key=KEY), z, ids).ravel() for t in range(3)]
    target = z.ravel()
    half = target.size // 2

    def held_out_mse(columns):
        design = np.column_stack([np.ones(target.size)] + columns)
        w, *_ = np.linalg.lstsq(design[:half], target[:half], rcond=None)
        return float(np.mean((design[half:] @ w - target[half:]) ** 2))

    all_levels, least_noisy = held_out_mse(answers), held_out_mse(answers[:1])
    # Standard error of an MSE over 100,000 values is ~0.5%; the margin is 2%.
    assert all_levels >= 0.98 * least_noisy
    # The old derivation's exact leak: (s2 a - s1 b) / (s2 - s1) would return z; now it does not.
    leak = (sigmas[1] * answers[0] - sigmas[0] * answers[1]) / (sigmas[1] - sigmas[0])
    assert np.mean((leak - target) ** 2) > sigmas[0] ** 2


def test_two_configs_share_no_draw():
    # A recalibration (one number changed) gives a new config digest: unrelated noise.
    first, second = make_config(1.0), make_config(1.0)
    second["targets"][0]["accuracy"] = 0.8000001
    assert config_digest(first) != config_digest(second)
    ids = [f"q{i}" for i in range(20)]
    z = np.zeros((20, 6))
    a = served(Perturber.from_config(first, key=KEY), z, ids).ravel()
    b = served(Perturber.from_config(second, key=KEY), z, ids).ravel()
    assert not np.any(a == b) and abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)
    # Two bare sigmas are two one-level configs: no shared draw either.
    c = served(Perturber(1.0, key=KEY), z, ids).ravel()
    d = served(Perturber(2.0, key=KEY), z, ids).ravel() / 2.0
    assert not np.any(c == d)


def test_config_digest_is_the_same_for_every_form_of_one_config(tmp_path):
    config = make_config(0.5, 1.0)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config, indent=3))
    digests = {config_digest(config), config_digest(path), config_digest(json.dumps(config)),
               config_digest(load_config(path))}
    assert len(digests) == 1 and len(next(iter(digests))) == 64


def test_an_old_v1_config_still_loads_and_serves():
    v1 = {"schema": "caliber.config/v1", "model": "m", "n_classes": 3, "n_samples": 10, "statistic": "median",
          "scale": 1.0, "fit": {}, "targets": [{"kind": "retention", "accuracy": 0.8, "retention": 0.9, "v": 0.25,
                                                 "sigma": 0.5}]}
    p = Perturber.from_config(v1, key=KEY)
    assert p.sigma == 0.5 and p.config_digest == config_digest(v1)
    assert np.isfinite(p.perturb(np.zeros((2, 3)), ["a", "b"])).all()


def test_a_config_refuses_logits_of_another_k():
    p = Perturber.from_config(make_config(1.0, n_classes=4), key=KEY)
    with pytest.raises(ValueError, match="logits have n_classes=1000, but the config was calibrated for n_classes=4"):
        p.perturb(np.zeros((2, 1000)), ["a", "b"])


# --------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------


def test_new_keys_are_32_random_bytes():
    a, b = keys.new_key(), keys.new_key()
    assert len(a) == 32 and a != b and check_key(a) == a


def test_key_file_round_trip_and_mode(tmp_path):
    path = tmp_path / "caliber.key"
    key = keys.write_key_file(path)
    assert keys.read_key_file(path) == key
    assert path.read_text() == key.hex() + "\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        keys.write_key_file(path)
    assert keys.read_key_file(path) == key  # untouched


SECRET_HEX = bytes(range(7, 39)).hex()


@pytest.mark.parametrize("content, match", [
    ("not hex\n", "one line of hex digits"),
    ("", "the key file is empty"),
    ("\n\n", "the key file is empty"),
    ("00ff\n", "key is 2 bytes; need at least 16"),
    ("00" * 32 + "\n", "32 copies of one byte, not a secret"),
    ("ab" * 32 + "\n", "32 copies of one byte, not a secret"),
    (SECRET_HEX + "\n" + SECRET_HEX + "\n", "one line of hex digits, this one has 2 lines"),
    (SECRET_HEX + "\r\n" + "ff" * 20, "this one has 2 lines"),
    ("0123456789abcdef" * 9 + "\n", "the key is 72 bytes, more than the 64 allowed"),
    ("0123456789abcdef" * 375 + "\n", r"longer than 256 bytes; a key is at most 64 bytes .* never cut short"),
])
def test_bad_key_files_are_refused(tmp_path, content, match):
    path = tmp_path / "k"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(ValueError, match=match) as err:
        keys.read_key_file(path)
    assert SECRET_HEX[:8] not in str(err.value) and "0123456789" not in str(err.value)  # never the contents
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o666, 0o620])
def test_key_file_readable_or_writable_by_others_is_warned_about(tmp_path, mode):
    path = tmp_path / "caliber.key"
    path.write_text(SECRET_HEX + "\n")
    path.chmod(mode)
    with pytest.warns(keys.KeyFileExposedWarning, match=rf"group or others \(mode {mode:04o}\).*chmod 600 .*caliber.key") as seen:
        assert keys.read_key_file(path) == bytes.fromhex(SECRET_HEX)
    assert all(SECRET_HEX[:8] not in str(w.message) for w in seen)  # never the key itself
    with warnings.catch_warnings():
        warnings.simplefilter("error", keys.KeyFileExposedWarning)  # the strict mode the docstring offers
        with pytest.raises(keys.KeyFileExposedWarning):
            keys.read_key_file(path)
    path.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an owner-only file is read silently
        assert keys.read_key_file(path) == bytes.fromhex(SECRET_HEX)
    path.chmod(0o400)  # read-only for its owner is fine too
    assert keys.read_key_file(path) == bytes.fromhex(SECRET_HEX)


def test_key_file_must_be_a_regular_file(tmp_path):
    with pytest.raises(ValueError, match="must be a regular file"):
        keys.read_key_file("/dev/null")


def test_constant_keys_are_refused_in_memory_too():
    with pytest.raises(ValueError, match="32 copies of one byte"):
        check_key(bytes(32))
    with pytest.raises(ValueError, match="16 copies of one byte"):
        keys.key_fingerprint(b"k" * 16)


def test_fingerprint_names_the_key_without_revealing_it():
    key = bytes(range(32))
    fp = keys.key_fingerprint(key)
    assert len(fp) == 16 and int(fp, 16) >= 0 and key.hex()[:16] not in fp
    assert fp == keys.key_fingerprint(key) and fp != keys.key_fingerprint(bytes(range(1, 33)))


def test_keygen_command(tmp_path):
    path = tmp_path / "new.key"
    run = [sys.executable, "-m", "caliber_core", "keygen", "--out", str(path)]
    first = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert len(keys.read_key_file(path)) == 32 and keys.key_fingerprint(keys.read_key_file(path)) in first.stdout
    again = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr


# --------------------------------------------------------------------------
# hostile configs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("edit, match", [
    (lambda c: c["targets"][0].update(sigma=1e308), r"targets\[0\].sigma=1e\+308 exceeds the largest sigma"),
    (lambda c: c.update(n_classes=0), "config n_classes must be an integer >= 2, got 0"),
    (lambda c: c.update(n_classes=2.5), "config n_classes must be an integer >= 2, got 2.5"),
    (lambda c: c["sweep"].update(v_max=float("inf")), "sweep.v_max must be a finite number > 0, got inf"),
])
def test_hostile_configs_are_refused_before_any_draw(edit, match):
    config = make_config(1.0)
    edit(config)
    with pytest.raises(ConfigError, match=match):
        Perturber.from_config(config, key=KEY)


def test_a_saturated_target_at_the_sweeps_end_is_served():
    config = make_config(4.0, v_max=16.0)  # sigma = scale * sqrt(v_max) exactly
    config["targets"][0].update(saturated=True, method="saturated-exact-curve")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Perturber.from_config(config, key=KEY).sigma == 4.0
    assert len(caught) == 1


def test_deeply_nested_json_is_refused_in_one_line(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ConfigError, match="nested 100001 levels deep; a config nests at most 32"):
        load_config('{"schema": "caliber.config/v2", "x": ' + deep + "}")
    with pytest.raises(ConfigError, match="nested 100000 levels deep"):
        load_config(deep.encode())
    nested: dict = {}
    for _ in range(5000):
        nested = {"x": nested}
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        load_config({**make_config(1.0), "extra": nested})
    path = tmp_path / "deep.json"
    path.write_text('{"schema": "caliber.config/v2", "x": ' + deep + "}")
    np.save(tmp_path / "logits.npy", np.zeros((4, 3)))
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "check", str(path), str(tmp_path / "logits.npy")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nested 100001 levels deep" in proc.stderr


def test_an_oversized_config_is_refused_before_parsing_in_one_line(tmp_path):
    from caliber_core.config import MAX_CONFIG_BYTES

    big = '{"schema": "caliber.config/v2", "pad": "' + "x" * MAX_CONFIG_BYTES + '"}'
    with pytest.raises(ConfigError, match=r"^config is larger than 4,194,304 bytes \(4 MiB\)"):
        load_config(big)
    with pytest.raises(ConfigError, match="config is larger than 4,194,304 bytes"):
        load_config(big.encode())
    # A 30 MB file: refused from its first 4 MiB, in one line, without the process growing by it.
    path = tmp_path / "huge.json"
    with open(path, "w") as fh:
        fh.write('{"schema": "caliber.config/v2", "pad": [')
        fh.write("1.0, " * 6_000_000)
        fh.write("1.0]}")
    assert path.stat().st_size > 30_000_000
    np.save(tmp_path / "logits.npy", np.zeros((4, 3)))
    argv = [sys.executable, "-m", "caliber_core", "check", str(path), str(tmp_path / "logits.npy")]
    # A child's ru_maxrss starts at its parent's RSS when forked: fork from a small interpreter,
    # not from this test process, and let it report the command's exit status and peak.
    launcher = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
                "_, s, u = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(s), u.ru_maxrss * 1024)")
    proc = subprocess.run([sys.executable, "-c", launcher, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    status, peak = map(int, proc.stdout.split())
    err = proc.stderr
    assert status == 2 and err.count("\n") == 1, err
    assert f"{path}: config is larger than 4,194,304 bytes" in err and "1.0" not in err
    assert peak < 400e6


def test_served_logits_stay_finite_at_the_edges():
    p = Perturber(3.0, key=KEY)  # noise at most 3 * 8.29 = 24.9
    with pytest.raises(ValueError, match=r"logits hold 65504.0 at row 0, class 1: beyond 6.548e\+04"):
        p.perturb(np.array([[0.0, 65500.0, -np.inf]], np.float16), ["a"])
    edge = np.array([[65470.0, -65470.0, np.inf, -np.inf]], np.float16)
    out = p.perturb(edge, ["a"])
    assert np.isfinite(out[0, :2]).all() and np.array_equal(out[0, 2:], edge[0, 2:])
    with pytest.raises(ValueError, match="can add noise up to .* beyond half the largest float16 value"):
        Perturber(5000.0, key=KEY).perturb(np.zeros((1, 3), np.float16), ["a"])
    with pytest.raises(ValueError, match=r"sigma=1e\+308 is too large"):
        Perturber(1e308, key=KEY)
    top = np.finfo(np.float64).max
    assert np.isfinite(p.perturb(np.array([[top, -top, 0.0]]), ["a"])).all()


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["targets"][0].update(sigma=1e308), "targets[0].sigma=1e+308 exceeds the largest sigma"),
    (lambda c: c.update(n_classes=0), "config n_classes must be an integer >= 2, got 0"),
])
def test_the_check_command_refuses_hostile_configs_with_exit_2(tmp_path, edit, message):
    config = make_config(1.0, n_classes=3)
    edit(config)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(config))
    np.save(tmp_path / "logits.npy", np.zeros((4, 3)))
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "check", str(path), str(tmp_path / "logits.npy")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr


def test_the_fused_path_equals_the_level_by_level_sum():
    # perturb draws, scales, sums and adds block by block; level_noise is the plain
    # whole-array path any keyed seeding can use: the two agree bit for bit, on numpy and torch.
    import torch

    from caliber_core.serving import keyed_noise

    p = Perturber.from_config(make_config(0.3, 0.9, 2.5, n_classes=70_000), target=2, key=KEY)
    ids = [f"f{i}" for i in range(3)]
    z = np.random.default_rng(2).normal(size=(3, 70_000)).astype(np.float32)
    digests = keyed_noise.row_digests(ids)
    expected = (p.level_noise(digests, z, 70_000) + z).astype(np.float32)
    np.testing.assert_array_equal(p.perturb(z, ids), expected)
    on_torch = p.level_noise(digests, torch.from_numpy(z), 70_000, device="cpu")
    assert np.array_equal((on_torch + torch.from_numpy(z)).float().numpy(), expected)
    assert np.array_equal(p.perturb(torch.from_numpy(z), ids).numpy(), expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble])
def test_the_fused_path_rounds_like_the_level_path_in_every_numpy_dtype(dtype):
    # The fused add rounds float64 noise + logits once into the logits' dtype; logits wider
    # than float64 (longdouble) are summed and rounded to float64 first, as level_noise's path does.
    from caliber_core.serving import keyed_noise

    p = Perturber.from_config(make_config(0.3, 0.9, n_classes=257), target=1, key=KEY)
    ids = [f"d{i}" for i in range(5)]
    z = (np.random.default_rng(3).normal(size=(5, 257)) * 7).astype(dtype)
    noise = p.level_noise(keyed_noise.row_digests(ids), z, 257)
    noise += z
    expected = noise.astype(dtype)
    got = p.perturb(z, ids)
    assert got.dtype == dtype and np.array_equal(got, expected)
    assert np.array_equal(np.signbit(got), np.signbit(expected))


def test_nesting_up_to_the_limit_loads_and_one_more_level_is_refused():
    def nested(depth):  # a config (depth 1) whose "extra" field nests to ``depth`` in all
        return '{"extra": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    with pytest.raises(ConfigError, match="schema"):  # 32 levels: parsed, then judged on its fields
        load_config(nested(32))
    with pytest.raises(ConfigError, match="nested 33 levels deep; a config nests at most 32"):
        load_config(nested(33))
    with pytest.raises(ConfigError, match="config must be a JSON object, got NoneType"):
        load_config(b"null")


def test_the_level_by_level_path_serves_what_the_fused_path_serves(monkeypatch):
    # A seeding other than per-input goes through unit_draw and level_noise; with
    # per-input's own draws plugged in, it must serve the identical answers.
    import torch

    p = Perturber.from_config(make_config(0.3, 0.9, n_classes=40), target=1, key=KEY)
    ids = [f"s{i}" for i in range(5)]
    z = np.random.default_rng(3).normal(size=(5, 40)).astype(np.float32)
    fused_np, fused_torch = p.perturb(z, ids), p.perturb(torch.from_numpy(z), ids)
    monkeypatch.setattr(p, "_seeding", "another keyed seeding")
    np.testing.assert_array_equal(p.perturb(z, ids), fused_np)
    assert torch.equal(p.perturb(torch.from_numpy(z), ids), fused_torch)
