"""Consistent noise version 2: the balanced keyed class cycle, its config record, and old configs still served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration import pipeline
from caliber_core.calibration.keyed_config import consistent_config
from caliber_core.loading import load_logits
from caliber_core.serving.class_cycle_noise import ClassCycleNoise, CycleFit, keyed_cycle
from caliber_core.serving.consistent_levels import ConsistentLevels, level_noise, noise_binding
from caliber_core.serving.consistent_noise import CYCLE_VERSION, Centring, ConsistentNoise
from caliber_core.serving.runtime import Perturber

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "digits_mlp-wide.npz"
KEY = bytes(range(1, 33))
OTHER = bytes(range(2, 34))


def _demo():
    with np.load(DEMO, allow_pickle=False) as f:
        return f["logits"].astype(np.float64), f["labels"]


def _config(*, design="class-cycle"):
    data = load_logits(DEMO)
    _, _, base = pipeline.config_for(data, targets=[("retention", 0.9), ("retention", 0.75)])
    return consistent_config(base, data.logits, data.labels, KEY, design=design, bootstrap=20, noise_id="t")


def test_the_keyed_cycle_visits_every_class_once_and_depends_on_key_binding_and_level():
    nxt = keyed_cycle(KEY, b"b", 1, 10)
    c, seen = 0, []
    for _ in range(10):
        seen.append(c)
        c = int(nxt[c])
    assert sorted(seen) == list(range(10)) and c == 0 and all(nxt[i] != i for i in range(10))
    others = [keyed_cycle(OTHER, b"b", 1, 10), keyed_cycle(KEY, b"c", 1, 10), keyed_cycle(KEY, b"b", 2, 10)]
    assert all(not np.array_equal(nxt, o) for o in others)
    assert np.array_equal(nxt, keyed_cycle(KEY, b"b", 1, 10))


def test_class_pi_c_gains_in_proportion_to_how_far_c_stands_above_the_row_mean():
    g = ClassCycleNoise(KEY, binding=b"b", n_classes=4)
    z = np.array([[3.0, 1.0, -1.0, -3.0]])
    out = g(z)
    expected = np.zeros(4)
    expected[g.next[0]] += 3.0
    expected[g.next[1]] += 1.0
    np.testing.assert_array_equal(out[0], expected)


def test_balancing_keeps_class_frequencies_where_the_target_share_of_rows_flips():
    z, _ = _demo()
    plain = ClassCycleNoise(KEY, binding=b"b", n_classes=10)
    balanced = plain.balanced_on(z, share=0.25)
    clean = np.bincount(z.argmax(1), minlength=10)

    def imbalance(noise):
        g = noise(z)
        lo, hi = 0.0, 1e3
        for _ in range(60):  # the step where a quarter of the rows change their prediction
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.mean((z + mid * g).argmax(1) != z.argmax(1)) < 0.25 else (lo, mid)
        return int(np.abs(np.bincount((z + hi * g).argmax(1), minlength=10) - clean).sum())

    assert imbalance(balanced) <= 20 < imbalance(plain)  # 500 rows, 125 of them flipped
    assert float(np.sqrt(np.mean(balanced(z) ** 2))) == pytest.approx(1.0, rel=1e-9)
    assert balanced.fit.amplitudes.mean() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="share must be in \\(0, 1\\), got 1.5"):
        plain.balanced_on(z, share=1.5)
    with pytest.raises(ValueError, match="logits have 7 classes; this noise has n_classes=10"):
        plain.balanced_on(z[:, :7], share=0.25)


def test_torch_serves_the_same_noise_as_numpy_masked_classes_included():
    torch = pytest.importorskip("torch")
    z, _ = _demo()
    g = ClassCycleNoise(KEY, binding=b"b", n_classes=10).balanced_on(z, share=0.25)
    rows = z[:50].copy()
    rows[3, 2] = -np.inf
    np.testing.assert_allclose(g.torch_noise(torch.from_numpy(rows)).numpy(), g(rows), rtol=0, atol=1e-12)
    assert np.isfinite(g(rows)).all()


def test_calibrate_writes_a_version_2_record_and_the_perturber_serves_its_nested_levels():
    cfg = _config()
    record = cfg["noise"]
    assert record["version"] == CYCLE_VERSION and record["design"] == "class-cycle"
    assert "length_scale" not in record and all("fit" in lv for lv in record["levels"])
    z, y = _demo()
    p = Perturber.from_config(cfg, target=1, seeding="consistent", key=KEY)
    served = p.perturb(z)
    a0 = float(np.mean(z.argmax(1) == y))
    assert float(np.mean(served.argmax(1) == y)) / a0 == pytest.approx(cfg["targets"][1]["retention"], abs=1e-12)
    levels = ConsistentLevels(cfg, target=1, key=KEY)
    np.testing.assert_allclose(served, z + levels.noise(z), atol=1e-9)
    one, two = levels.noises
    s1, s2 = levels.levels
    np.testing.assert_allclose(level_noise(levels.noises, levels.levels, 2, z),
                               s1 * one(z) + np.sqrt(s2 ** 2 - s1 ** 2) * two(z), atol=1e-9)
    with pytest.raises(ValueError, match="fingerprint"):
        Perturber.from_config(cfg, target=0, seeding="consistent", key=OTHER)


def test_the_default_is_the_version_3_field_and_a_config_written_before_versions_serves_its_own_noise():
    cfg = _config(design="field")
    assert cfg["noise"]["version"] == "caliber.consistent-noise/v3" and cfg["noise"]["length_scale"] == 4.0
    z, y = _demo()
    p = Perturber.from_config(cfg, target=1, seeding="consistent", key=KEY)
    a0 = float(np.mean(z.argmax(1) == y))
    assert float(np.mean(p.perturb(z).argmax(1) == y)) / a0 == pytest.approx(cfg["targets"][1]["retention"],
                                                                           abs=1e-12)
    # A config as calibrate wrote it before noise versions: the version-1 labels and binding.
    old = json.loads(json.dumps(cfg))
    del old["noise"]["version"], old["noise"]["design"]
    record = old["noise"]
    binding = noise_binding(record)
    first = ConsistentNoise(KEY, binding=binding, n_classes=10, scale=record["scale"], level=1,
                            centring=Centring.from_dict(record["levels"][0]["centring"], features=128))
    second = ConsistentNoise(KEY, binding=binding, n_classes=10, scale=record["scale"], level=2,
                             centring=Centring.from_dict(record["levels"][1]["centring"], features=128))
    s1, s2 = (lv["sigma"] for lv in record["levels"])
    served_old = Perturber.from_config(old, target=1, seeding="consistent", key=KEY).perturb(z)
    np.testing.assert_allclose(served_old, z + s1 * first(z) + np.sqrt(s2 ** 2 - s1 ** 2) * second(z), atol=1e-9)
    assert not np.allclose(served_old, p.perturb(z))  # v3 labels draw another function


def test_an_unknown_noise_version_or_a_damaged_fit_is_refused_in_one_line():
    cfg = _config()
    cfg["noise"]["version"] = "caliber.consistent-noise/v9"
    with pytest.raises(ValueError, match="consistent noise version 'caliber.consistent-noise/v9' is not one this "
                                         "Caliber serves"):
        Perturber.from_config(cfg, target=0, seeding="consistent", key=KEY)
    with pytest.raises(ValueError, match="amplitudes must be 10 positive finite numbers"):
        CycleFit.from_dict({"amplitudes": [1.0] * 9, "gain": 1.0}, n_classes=10)
    with pytest.raises(ValueError, match="gain must be a positive number"):
        CycleFit.from_dict({"amplitudes": [1.0] * 10, "gain": 0.0}, n_classes=10)
    with pytest.raises(ValueError, match="consistent design must be one of"):
        _config(design="spiral")
