"""Consistent noise: the keyed function g, its per-key exact curve, the keyed config and the CLI path."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.keyed_curve import keyed_accuracy, solve_keyed, step_curve, win_intervals
from caliber_core.serving.consistent_levels import ConsistentLevels, level_noise
from caliber_core.serving.consistent_noise import ConsistentNoise, keyed_normals
from caliber_core.serving.keys import key_fingerprint, read_key_file

ROOT = Path(__file__).resolve().parents[1]
KEY = bytes(range(16))
OTHER = bytes(range(1, 17))


def _demo():
    d = np.load(ROOT / "data" / "digits_mlp-wide.npz")
    return (d["logits"].astype(np.float64), d["labels"], d["heldout_logits"].astype(np.float64),
            d["heldout_labels"])


def _noise(z, key=KEY, **kw):
    opts = dict(binding=b"test", n_classes=z.shape[1], scale=5.0, length_scale=2.0)
    opts.update(kw)
    return ConsistentNoise(key, **opts)


def test_keyed_normals_are_a_pure_function_of_every_input():
    a = keyed_normals(KEY, b"b", 1, "w", (3, 4))
    assert np.array_equal(a, keyed_normals(KEY, b"b", 1, "w", (3, 4)))
    for other in (keyed_normals(OTHER, b"b", 1, "w", (3, 4)), keyed_normals(KEY, b"c", 1, "w", (3, 4)),
                  keyed_normals(KEY, b"b", 2, "w", (3, 4)), keyed_normals(KEY, b"b", 1, "v", (3, 4))):
        assert not np.allclose(a, other)
    with pytest.raises(ValueError, match="16"):
        keyed_normals(b"short", b"b", 1, "w", (2,))
    assert keyed_normals(KEY, b"b", 1, "w", (5,)).shape == (5,)


def test_repeats_get_identical_noise_and_near_duplicates_nearly_the_same():
    z, _, _, _ = _demo()
    g = _noise(z).centred_on(z)
    assert np.array_equal(g(z[:50]), g(z[:50]))
    near = z[:200] + np.random.default_rng(0).normal(0, 0.05 * 5.0, (200, 10))  # 0.05 S per class
    far = z[200:400]
    corr_near = np.corrcoef(g(z[:200]).ravel(), g(near).ravel())[0, 1]
    corr_far = np.corrcoef(g(z[:200]).ravel(), g(far).ravel())[0, 1]
    assert corr_near > 0.98 and abs(corr_far) < 0.3


def test_shift_invariant_in_the_logits():
    # softmax ignores a constant added to a row; so does g (it sees centred logits)
    z, _, _, _ = _demo()
    g = _noise(z)
    assert np.allclose(g(z[:20]), g(z[:20] + 7.5), atol=1e-9)


def test_centring_removes_every_class_mean_and_gives_unit_variance_on_the_rows():
    z, _, zh, _ = _demo()
    raw = _noise(z)
    g = raw.centred_on(z)
    values = g(z)
    assert np.allclose(values.mean(axis=0), 0.0, atol=1e-10)
    assert math.isclose(float(np.sqrt(np.mean(values ** 2))), 1.0, rel_tol=1e-12)
    # on held-out rows of the same distribution the class means stay small (no bias to correct)
    assert np.abs(g(zh).mean(axis=0)).max() < 0.25
    assert np.abs(raw(z).mean(axis=0)).max() > np.abs(values.mean(axis=0)).max()


def test_unit_variance_over_keys_matches_the_kernel_on_average():
    # Averaged over keys, raw g at one point has variance 1 (sum of F cosines, E[2 cos^2] = 1)
    z = np.random.default_rng(1).normal(size=(1, 10)) * 5
    draws = np.array([_noise(z, key=k.to_bytes(16, "big"), features=64)(z)[0] for k in range(1, 201)])
    assert abs(draws.var() - 1.0) < 0.15  # 2000 draws: s.e. of the variance ~0.03


def test_projection_above_32_classes_and_masked_logits():
    z = np.random.default_rng(2).normal(size=(6, 300)) * 3
    g = _noise(z)
    assert g._projection is not None and g(z).shape == (6, 300)
    masked = z.copy()
    masked[:, :5] = -np.inf
    assert np.isfinite(g(masked)).all()


def test_torch_matches_numpy():
    torch = pytest.importorskip("torch")
    z, _, _, _ = _demo()
    g = _noise(z).centred_on(z)
    got = g.torch_noise(torch.from_numpy(z[:40]).float())
    assert got.dtype == torch.float64
    assert np.allclose(got.numpy(), g(z[:40].astype(np.float32)), atol=1e-9)


def test_win_intervals_give_the_exact_curve():
    z, y, _, _ = _demo()
    g = _noise(z).centred_on(z)(z)
    lo, hi = win_intervals(z, g, y)
    knots, values = step_curve(lo, hi)
    for t in (0.0, 0.3, 2.0, 7.1, 19.0, 80.0):
        at = values[np.searchsorted(knots, t, side="right") - 1]
        assert at == pytest.approx(keyed_accuracy(z, y, g, t), abs=1e-12)


def test_solve_keyed_reaches_the_target_and_refuses_an_unreachable_one():
    z, y, zh, yh = _demo()
    noise = _noise(z).centred_on(z)
    a0 = float(np.mean(z.argmax(1) == y))
    solved = solve_keyed(z, y, noise(z), target=0.75 * a0, bootstrap=50)
    assert solved.delivered <= 0.75 * a0 < keyed_accuracy(z, y, noise(z), solved.step * 0.9)
    assert solved.interval[0] <= solved.sigma <= solved.interval[1]
    held = keyed_accuracy(zh, yh, noise(zh), solved.step) / float(np.mean(zh.argmax(1) == yh))
    assert abs(held - 0.75) < 0.06  # 500 held-out rows: s.e. of retention ~0.02
    with pytest.raises(ValueError, match="not reached"):
        solve_keyed(z, y, noise(z), target=0.0, bootstrap=0)


def test_nested_levels_add_up():
    z, _, _, _ = _demo()
    n1, n2 = _noise(z, level=1).centred_on(z), _noise(z, level=2).centred_on(z)
    two = level_noise([n1, n2], [1.0, 3.0], 2, z[:5])
    assert np.allclose(two, 1.0 * n1(z[:5]) + math.sqrt(8.0) * n2(z[:5]))
    assert np.allclose(level_noise([n1, n2], [1.0, 3.0], 1, z[:5]), n1(z[:5]))


def _calibrate(tmp_path, *extra):
    key = tmp_path / "serving.key"
    key.write_text(KEY.hex() * 2 + "\n")
    key.chmod(0o600)  # a key readable by others is refused
    out = tmp_path / "cfg.json"
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--retention", "0.9", "0.75", "--seeding", "consistent", "--key-file", str(key),
                           "--out", str(out), "--quiet", *extra], cwd=ROOT, capture_output=True, text=True)
    return proc, out, read_key_file(key)


def test_cli_calibrates_for_the_key_and_the_config_serves_only_that_key(tmp_path):
    proc, out, key = _calibrate(tmp_path, "--noise-id", "abc")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(out.read_text())
    record = cfg["noise"]
    assert record["seeding"] == "consistent" and record["key_fingerprint"] == key_fingerprint(key)
    assert key.hex() not in out.read_text()
    sigmas = [t["sigma"] for t in cfg["targets"]]
    assert sigmas[0] < sigmas[1] and [lv["sigma"] for lv in record["levels"]] == sigmas
    z, y, zh, yh = _demo()
    served = ConsistentLevels(cfg, target=1, key=key)
    assert served.level == 2 and served.sigma == sigmas[1]
    delivered = float(np.mean(np.argmax(z + served.noise(z), axis=1) == y)) / float(np.mean(z.argmax(1) == y))
    assert delivered == pytest.approx(cfg["targets"][1]["retention"], abs=1e-12)
    held = float(np.mean(np.argmax(zh + served.noise(zh), axis=1) == yh)) / float(np.mean(zh.argmax(1) == yh))
    assert abs(held - 0.75) < 0.06
    with pytest.raises(ValueError, match="fingerprint"):
        ConsistentLevels(cfg, target=0, key=OTHER)
    with pytest.raises(ValueError, match="n_classes=10"):
        served.noise(np.zeros((2, 7)))


def test_cli_refuses_consistent_without_a_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--seeding", "consistent", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--key-file" in proc.stderr
    bad = tmp_path / "bad.key"
    bad.write_text("abcd\n")
    bad.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--seeding", "consistent", "--key-file", str(bad), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "2 byte" in proc.stderr


def test_perturber_serves_a_consistent_config_for_its_key_only(tmp_path):
    from caliber_core.serving.runtime import Perturber

    proc, out, key = _calibrate(tmp_path, "--noise-id", "abc")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(out.read_text())
    z, y, _, _ = _demo()
    p = Perturber.from_config(cfg, target=1, seeding="consistent", key=key)
    assert (p.seeding, p.level, p.levels) == ("consistent", 2, tuple(t["sigma"] for t in cfg["targets"]))
    served = p.perturb(z)  # no ids: the noise is a function of the logits
    assert np.array_equal(served, p.perturb(z, [f"any-{i}" for i in range(len(z))]))
    assert np.allclose(served, z + ConsistentLevels(cfg, target=1, key=key).noise(z), atol=1e-9)
    assert float(np.mean(served.argmax(1) == y)) == pytest.approx(cfg["targets"][1]["accuracy"], abs=1e-12)
    with pytest.raises(ValueError, match="fingerprint"):
        Perturber.from_config(cfg, target=0, seeding="consistent", key=OTHER)
    with pytest.raises(ValueError, match="seeding='consistent'"):
        Perturber.from_config(cfg, target=0, seeding="per-input", key=key)
    with pytest.raises(ValueError, match="from_config"):
        Perturber(1.0, seeding="consistent", key=key)
    with pytest.raises(ValueError, match="n_classes=10"):
        p.perturb(np.zeros((2, 7)))
    torch = pytest.importorskip("torch")
    t = p.perturb(torch.from_numpy(z[:20]).float())
    assert t.dtype == torch.float32 and np.allclose(t.numpy(), served[:20], atol=1e-4)


def test_consistent_noise_on_a_cuda_tensor_stays_there_and_matches_the_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from caliber_core.serving.runtime import Perturber

    proc, out, key = _calibrate(tmp_path, "--noise-id", "abc")
    assert proc.returncode == 0, proc.stderr
    p = Perturber.from_config(json.loads(out.read_text()), target=0, seeding="consistent", key=key)
    z = torch.from_numpy(_demo()[0][:64])
    on_gpu = p.perturb(z.cuda())
    assert on_gpu.device.type == "cuda"
    assert torch.allclose(on_gpu.cpu(), p.perturb(z), atol=1e-9)


@pytest.mark.parametrize("fraction", [0.99, 0.9, 0.75, 0.5, 0.3])
def test_the_solved_step_is_the_first_crossing_of_the_exact_curve(fraction):
    # No overshoot: below the solved sigma this key never reaches the target; at it, it does.
    z, y, _, _ = _demo()
    g = _noise(z).centred_on(z)(z)
    a0 = float(np.mean(z.argmax(1) == y))
    target = fraction * a0
    solved = solve_keyed(z, y, g, target=target, bootstrap=0)
    lo, hi = win_intervals(z, g, y)
    knots, values = step_curve(lo, hi)
    before = knots < solved.step
    assert (values[before][:-1] > target).all() and values[before][-1] <= target
    assert keyed_accuracy(z, y, g, solved.step) == pytest.approx(solved.delivered) and solved.delivered <= target


def test_cli_refuses_options_that_do_not_apply_to_consistent_seeding(tmp_path):
    proc, _, _ = _calibrate(tmp_path, "--side", "at-least")
    assert proc.returncode == 2 and "--side" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                           "--length-scale", "2", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--seeding consistent" in proc.stderr


def test_check_refuses_a_consistent_config_instead_of_judging_per_input_noise(tmp_path):
    proc, out, _ = _calibrate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([sys.executable, "-m", "caliber_core", "check", str(out),
                            str(ROOT / "data" / "digits_mlp-wide.npz")], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 2 and "consistent seeding" in check.stderr
    assert len(check.stderr.strip().splitlines()) == 1
