"""Perturber.perturb with the ids' digests in place of the ids: the same bits, the same checks."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.serving.keyed_noise import row_digests
from caliber_core.serving.runtime import Perturber

KEY = b"test provider secret"
IDS = [f"req-{i}" for i in range(37)] + ["héllo", b"raw bytes"]


def _config(*sigmas):
    return {
        "schema": "caliber.config/v1", "model": "m", "n_classes": 6, "n_samples": 10,
        "statistic": "median", "scale": 1.0, "fit": {},
        "targets": [{"kind": "retention", "accuracy": 0.8 - 0.1 * i, "retention": 0.9 - 0.1 * i, "v": 0.5 + i,
                     "sigma": s} for i, s in enumerate(sigmas)],
    }


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("make", [lambda: Perturber(0.7, key=KEY),
                                  lambda: Perturber.from_config(_config(0.3, 0.9, 1.4), target=2, key=KEY)],
                         ids=["bare", "three-levels"])
def test_digests_serve_the_bits_the_ids_serve(make, dtype):
    perturber = make()
    logits = np.random.default_rng(3).normal(size=(len(IDS), 6)).astype(dtype)
    by_ids = perturber.perturb(logits, IDS)
    digests = row_digests(IDS)
    by_digests = perturber.perturb(logits, digests=digests)
    assert by_digests.dtype == dtype
    np.testing.assert_array_equal(by_digests, by_ids)
    # A block of rows reads its slice of the digests, as the attack estimate's passes do.
    np.testing.assert_array_equal(perturber.perturb(logits[5:20], digests=digests[5:20]), by_ids[5:20])


def test_a_single_row_takes_one_digest():
    perturber = Perturber(0.5, key=KEY)
    row = np.linspace(-1.0, 1.0, 8)
    np.testing.assert_array_equal(perturber.perturb(row, digests=row_digests(["x"])), perturber.perturb(row, "x"))


def test_torch_tensors_take_digests_too():
    torch = pytest.importorskip("torch")
    perturber = Perturber(0.8, key=KEY)
    logits = torch.randn(len(IDS), 6, generator=torch.Generator().manual_seed(0))
    got = perturber.perturb(logits, digests=row_digests(IDS))
    assert torch.equal(got, perturber.perturb(logits, IDS))


@pytest.mark.parametrize("ids, digests, match", [
    (["a", "b"], row_digests(["a", "b"]), "ids or their digests, not both"),
    (None, row_digests(["a"]), r"2 rows of 32 bytes .*got shape \(1, 32\)"),
    (None, np.zeros((2, 16), dtype=np.uint8), r"got shape \(2, 16\)"),
    (None, np.zeros((2, 32), dtype=np.int64), "int64"),
    (None, None, "needs ids"),
])
def test_bad_digests_are_refused_before_any_draw(ids, digests, match):
    with pytest.raises(ValueError, match=match):
        Perturber(0.5, key=KEY).perturb(np.zeros((2, 4)), ids, digests=digests)


def test_fresh_seeding_still_checks_the_digests_count():
    perturber = Perturber(0.5, seeding="fresh", generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="2 rows of 32 bytes"):
        perturber.perturb(np.zeros((2, 4)), digests=row_digests(["a", "b", "c"]))
    assert perturber.perturb(np.zeros((2, 4)), digests=row_digests(["a", "b"])).shape == (2, 4)
