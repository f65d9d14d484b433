"""The keyed generator: its normal transform against mpmath, numpy and torch bit for bit, its statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from caliber_core.serving import keyed_noise, normal_table

torch = pytest.importorskip("torch")
from caliber_core.serving import keyed_noise_torch  # noqa: E402  (after the torch check)
mpmath = pytest.importorskip("mpmath")

KEY = b"keyed noise test key"
MASK52 = (1 << 52) - 1


def words_as_int64(words: np.ndarray) -> "torch.Tensor":
    return torch.from_numpy(np.ascontiguousarray(words, dtype=np.uint64).view(np.int64))


def edge_words() -> np.ndarray:
    """Words at the transform's seams: extreme tails, q near 1, every piece boundary, both signs."""
    words = [0, MASK52, 1, MASK52 - 1, 1 << 51, (1 << 51) - 1]
    for exponent in range(53):  # a = 2v + 1 just at and just below each power of two
        for v in ((1 << exponent) >> 1, ((1 << exponent) >> 1) - 1, (1 << exponent) - 1):
            if 0 <= v <= MASK52:
                words.append(v)
    for exponent in range(normal_table.SUB_BITS, 53):  # every piece's first value
        for sub in range(1 << normal_table.SUB_BITS):
            a = (1 << exponent) + (sub << (exponent - normal_table.SUB_BITS)) + 1
            words.append((a - 1) // 2)
    words = np.array(words, dtype=np.uint64)
    return np.concatenate([words, words | np.uint64(1 << 63), words | np.uint64(0x7FF << 52)])


def random_words(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)


def tail_quantile(word: int) -> float:
    """The exact target of the transform, in mpmath: sign * Phi^-1(1 - q/2), q = (2v + 1) 2^-53."""
    q = mpmath.mpf(2 * (word & MASK52) + 1) / mpmath.mpf(2) ** 53
    x = -mpmath.sqrt(2) * mpmath.erfinv(q - 1)  # Phi^-1(1 - q/2) = sqrt(2) erfinv(1 - q)
    return float(x) * (-1 if word >> 63 else 1)


def test_the_transform_matches_mpmath_within_2e_13():
    # 53 * 64 pieces, degree-4 interpolation at Chebyshev nodes: the error is
    # stated, not zero. The fit's worst case, 1.45e-13, is on the first piece
    # below q = 1/2 (|x| = 0.67); the bound is 2e-13 * max(1, |x|).
    with mpmath.workdps(30):
        words = np.concatenate([edge_words(), random_words(600, 1)])
        got = keyed_noise.normals_from_words(words)
        exact = np.array([tail_quantile(int(w)) for w in words.tolist()])
    assert np.all(np.abs(got - exact) <= 2e-13 * np.maximum(1.0, np.abs(exact)))
    assert keyed_noise.MAX_ABS_NORMAL == pytest.approx(abs(tail_quantile(0)), rel=2e-13)


def test_the_transform_is_monotone_in_the_tail_probability():
    # Within one sign, a larger v means a larger tail probability, hence a smaller |x|.
    v = np.sort(np.concatenate([edge_words() & np.uint64(MASK52), random_words(20_000, 2) & np.uint64(MASK52)]))
    x = keyed_noise.normals_from_words(np.unique(v))
    assert np.all(np.diff(x) <= 0) and np.all(x > 0)


def test_the_committed_table_is_what_the_generator_fits():
    from tests.make_normal_table import fit_table

    committed = keyed_noise.table()[:, : normal_table.N_EXPONENTS << normal_table.SUB_BITS].T
    np.testing.assert_allclose(fit_table(), committed, rtol=1e-12, atol=1e-13)


def test_numpy_and_torch_transforms_agree_bit_for_bit():
    words = np.concatenate([edge_words(), random_words(1_000_000, 3)])
    from_numpy = keyed_noise.normals_from_words(words)
    from_torch = keyed_noise_torch.normals_from_words(words_as_int64(words)).numpy()
    assert from_numpy.view(np.uint64).tolist() == from_torch.view(np.uint64).tolist()


def test_numpy_and_torch_draws_agree_bit_for_bit_and_float32_to_the_ulp():
    digests = keyed_noise.row_digests([f"row-{i}" for i in range(300)] + ["", b"\x00" * 40])
    for n_classes in (1, 2, 7, 1000, 70_001):
        rows = digests[:3] if n_classes > 1000 else digests
        a = keyed_noise.unit_normals(KEY, b"binding", 2, rows, n_classes)
        b = keyed_noise_torch.unit_normals_torch(KEY, b"binding", 2, rows, n_classes, "cpu")
        assert b.dtype == torch.float64 and np.array_equal(a.view(np.uint64), b.numpy().view(np.uint64))
        single = keyed_noise_torch.unit_normals_torch(KEY, b"binding", 2, rows, n_classes, "cpu", dtype=torch.float32)
        ulp = np.spacing(np.abs(a).astype(np.float32))
        assert np.all(np.abs(single.numpy().astype(np.float64) - a) <= ulp)


def test_adding_noise_to_a_tensor_takes_either_kernel_with_the_same_bits(monkeypatch):
    # CPU float32/float64 tensors go through numpy's kernel on their memory; torch's own kernel
    # (what a GPU runs) must give the same bits on the CPU, on whole rows and on split ones.
    digests = keyed_noise.row_digests([f"row-{i}" for i in range(5)])
    seeds = [keyed_noise.row_seeds(KEY, b"binding", level, digests, 70_001) for level in (1, 2, 3)]
    increments = [0.5, 0.8660254037844386, 1.7320508075688772]
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(5, 70_001, generator=torch.Generator().manual_seed(3), dtype=dtype) * 20
        want = keyed_noise.add_keyed_noise(logits.numpy(), seeds, increments)
        routed = keyed_noise_torch.add_keyed_noise(logits, seeds, increments)
        own = keyed_noise_torch.add_keyed_noise_torch(logits, seeds, increments)
        assert routed.dtype == own.dtype == dtype
        assert np.array_equal(routed.numpy(), want) and np.array_equal(own.numpy(), want)
    # a dtype numpy lacks takes torch's kernel: no numpy array is made
    monkeypatch.setattr(keyed_noise, "add_keyed_noise", lambda *a: pytest.fail("numpy's kernel on bfloat16"))
    half = torch.zeros(2, 64, dtype=torch.bfloat16)
    out = keyed_noise_torch.add_keyed_noise(half, [s[:2] for s in seeds], increments)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 64) and torch.count_nonzero(out) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draws_equal_numpy():
    digests = keyed_noise.row_digests([f"row-{i}" for i in range(64)])
    a = keyed_noise.unit_normals(KEY, b"b", 1, digests, 32_000)
    b = keyed_noise_torch.unit_normals_torch(KEY, b"b", 1, digests, 32_000, "cuda")
    assert b.device.type == "cuda" and np.array_equal(a, b.cpu().numpy())


def test_every_input_separates_the_streams():
    digests = keyed_noise.row_digests(["x", "y"])
    base = keyed_noise.unit_normals(KEY, b"cfg", 1, digests, 64)
    variants = [
        keyed_noise.unit_normals(KEY + b"!", b"cfg", 1, digests, 64),
        keyed_noise.unit_normals(KEY, b"cfh", 1, digests, 64),
        keyed_noise.unit_normals(KEY, b"cfg", 2, digests, 64),
        keyed_noise.unit_normals(KEY, b"cfg", 1, digests, 65)[:, :64],
        keyed_noise.unit_normals(KEY, b"cfg", 1, keyed_noise.row_digests(["x ", "Y"]), 64),
    ]
    for other in variants:
        assert not np.any(other == base)
    # Length-prefixed binding: (b"ab", level) and (b"a", ...) cannot collide by concatenation.
    assert not np.any(keyed_noise.unit_normals(KEY, b"", 1, digests, 8)
                      == keyed_noise.unit_normals(KEY, b"\x00", 1, digests, 8))


def test_draws_are_standard_normal():
    # 2 million values from 200 rows: Kolmogorov-Smirnov and the first four
    # moments, each bound 5 standard errors (a false alarm ~1e-6 per check).
    digests = keyed_noise.row_digests([f"stat-{i}" for i in range(200)])
    x = keyed_noise.unit_normals(KEY, b"stats", 1, digests, 10_000).ravel()
    n = x.size
    assert stats.kstest(x, "norm").pvalue > 1e-6
    assert abs(x.mean()) < 5 / math.sqrt(n)
    assert abs(x.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(stats.skew(x)) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(x)) < 5 * math.sqrt(24 / n)
    # The tails: P(|Z| > 4) = 6.33e-5, so about 127 of 2 million; Poisson bound of 5 sd.
    expected = 2 * stats.norm.sf(4) * n
    assert abs(np.sum(np.abs(x) > 4) - expected) < 5 * math.sqrt(expected)


def test_argument_errors():
    digests = keyed_noise.row_digests(["a"])
    with pytest.raises(ValueError, match="key is 3 bytes; need at least 16"):
        keyed_noise.unit_normals(b"abc", b"", 1, digests, 3)
    with pytest.raises(TypeError, match="binding must be bytes, got str"):
        keyed_noise.unit_normals(KEY, "cfg", 1, digests, 3)
    with pytest.raises(ValueError, match="level must be an integer >= 0, got -1"):
        keyed_noise.unit_normals(KEY, b"", -1, digests, 3)
    with pytest.raises(ValueError, match="n_classes must be a positive integer, got 0"):
        keyed_noise.unit_normals(KEY, b"", 1, digests, 0)
    with pytest.raises(ValueError, match=r"row_digests must have shape \(n_rows, 32\), got \(1, 16\)"):
        keyed_noise.unit_normals(KEY, b"", 1, digests[:, :16], 3)
    with pytest.raises(TypeError, match="ids must be str or bytes, got int 3 at position 1"):
        keyed_noise.row_digests(["a", 3])


def test_row_seeder_gives_row_seeds_of_every_level_at_once():
    rng = np.random.default_rng(36)
    key, ids = rng.bytes(32), [rng.bytes(int(rng.integers(1, 40))) for _ in range(5)]
    seeder = keyed_noise.RowSeeder(key, b"cfg", [1, 2, 4])
    for n_classes in (2, 1000, 128_000):
        got = seeder.seeds(keyed_noise.joined_digests(ids), n_classes)
        want = [keyed_noise.row_seeds(key, b"cfg", level, keyed_noise.row_digests(ids), n_classes)
                for level in (1, 2, 4)]
        assert got.dtype == np.uint64 and got.shape == (3, 5) and np.array_equal(got, np.stack(want))
        assert np.array_equal(seeder.seeds(keyed_noise.row_digests(ids), n_classes), got)
    with pytest.raises(ValueError, match="32 bytes each"):
        seeder.seeds(b"\x00" * 33, 1000)
    with pytest.raises(ValueError, match="n_classes"):
        seeder.seeds(keyed_noise.joined_digests(ids), 0)
