"""Tests for caliber_core.serving.runtime (Perturber) and caliber_core.serving.responses.

Statistical tests use fixed keys/seeds, so they are deterministic; each
states the false-alarm rate its threshold would have for a random key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from caliber_core.serving.responses import LogitsProcessorAdapter, noisy_probabilities, noisy_top_logprobs
from caliber_core.config import ConfigError, config_digest, sigma_to_serve
from caliber_core.serving.runtime import Perturber, per_input_noise

torch = pytest.importorskip("torch")

KEY = b"test provider secret"


def zeros(n_rows, n_classes):
    return np.zeros((n_rows, n_classes), dtype=np.float64)


def noise_of(perturber, ids, n_classes):
    """The noise alone: perturbing float64 zeros returns sigma * z exactly."""
    return perturber.perturb(zeros(len(ids), n_classes), ids)


@pytest.fixture(params=["numpy", "torch"])
def backend(request):
    """(to_backend, to_numpy) pair, so each test runs on both array types."""
    if request.param == "numpy":
        return (lambda a: a), (lambda a: np.asarray(a))
    return torch.from_numpy, (lambda t: t.numpy())


# --------------------------------------------------------------------------
# the noise derivation
# --------------------------------------------------------------------------


def test_known_answer_pins_the_noise_stream():
    # Pins the whole derivation (domain caliber.keyed-noise/v2: keyed row seeds,
    # SplitMix64 counters, the tabulated normal transform). A change here changes
    # every served row's noise: bump keyed_noise.DOMAIN, then update these values.
    expected = [
        [2.0753146047465965, -0.7255640625929881, -0.46340912632987563, -1.5781915727593048],
        [0.4463375850301292, 0.35269462402800134, -1.0936531317549198, -0.2600526464291184],
    ]
    got = per_input_noise(["caliber", b"\x00\xff"], 4, key=b"known-answer key")
    assert got.tolist() == expected
    bound = per_input_noise(["caliber"], 3, key=b"known-answer key", binding=b"config", level=2)
    assert bound.tolist() == [[-0.9567949803026288, -1.5177751082834678, -0.5604920590116961]]


def _reference_normal(word: int) -> float:
    """Step 4 of keyed_noise's derivation in plain Python floats, from the committed table."""
    from caliber_core.serving import keyed_noise, normal_table

    a = 2 * (word & ((1 << 52) - 1)) + 1
    exponent = a.bit_length() - 1
    sub_bits = normal_table.SUB_BITS
    fraction = a - (1 << exponent)  # the bits below the leading one, exponent of them
    aligned = fraction << (52 - exponent)  # as a float64 mantissa field
    piece = (exponent << sub_bits) + (aligned >> (52 - sub_bits))
    t = (aligned & ((1 << (52 - sub_bits)) - 1)) * 2.0 ** -(52 - sub_bits)
    coefficients = keyed_noise.table()[:, piece + (word >> 63) * (normal_table.N_EXPONENTS << sub_bits)]
    y = float(coefficients[-1])
    for c in coefficients[-2::-1]:
        y = y * t + float(c)  # Python floats: one rounding per operation, no fused multiply-add
    return y


def test_noise_matches_the_documented_derivation():
    from scipy.special import ndtri

    key, binding, level, one_id, n_classes = b"sixteen byte key", b"cfg", 3, "request-42", 7
    digest = hashlib.sha256(one_id.encode()).digest()
    message = (b"caliber.keyed-noise/v2\x00" + len(binding).to_bytes(8, "big") + binding
               + level.to_bytes(8, "big") + n_classes.to_bytes(8, "big"))
    stream_key = hmac.new(key, message, hashlib.sha256).digest()
    seed = int.from_bytes(hashlib.blake2b(digest, key=stream_key, digest_size=8).digest(), "little")
    mask = (1 << 64) - 1
    reference = []
    for j in range(n_classes):
        z = (seed + j * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        word = z ^ (z >> 31)
        reference.append(_reference_normal(word))
        # ... and the transform is the normal quantile of the word's tail probability.
        q = (2 * (word & ((1 << 52) - 1)) + 1) * 2.0 ** -53
        assert reference[-1] == pytest.approx(-ndtri(q / 2) * (-1) ** (word >> 63), rel=0, abs=2e-13)
    got = per_input_noise([one_id], n_classes, key=key, binding=binding, level=level)[0]
    assert got.tolist() == reference


def test_str_and_bytes_ids_are_the_same_id():
    a = per_input_noise(["héllo"], 16, key=KEY)
    b = per_input_noise(["héllo".encode("utf-8")], 16, key=KEY)
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# determinism and batch invariance
# --------------------------------------------------------------------------


def test_same_id_same_noise_at_any_position_and_batch():
    p = Perturber(1.0, key=KEY)
    ids = [f"id-{i}" for i in range(40)]
    batch = noise_of(p, ids, 32)
    for i in (0, 17, 39):
        alone = p.perturb(np.zeros(32), ids[i])  # single row (K,)
        np.testing.assert_array_equal(alone, batch[i])
        in_other_batch = noise_of(p, ["x", ids[i], "y"], 32)[1]
        np.testing.assert_array_equal(in_other_batch, batch[i])


def test_shuffled_batch_gives_permuted_rows():
    p = Perturber(0.7, key=KEY)
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(64, 100))
    ids = [f"req-{i}" for i in range(64)]
    perm = rng.permutation(64)
    out = p.perturb(logits, ids)
    out_perm = p.perturb(logits[perm], [ids[i] for i in perm])
    np.testing.assert_array_equal(out_perm, out[perm])


def test_duplicate_ids_in_one_batch_get_identical_noise():
    p = Perturber(1.0, key=KEY)
    out = noise_of(p, ["a", "b", "a"], 50)
    np.testing.assert_array_equal(out[0], out[2])
    assert not np.array_equal(out[0], out[1])


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.one_of(st.text(max_size=12), st.binary(max_size=12)), min_size=1, max_size=12),
       n_classes=st.integers(min_value=2, max_value=40), data=st.data())
def test_property_rows_depend_only_on_their_own_id(ids, n_classes, data):
    p = Perturber(1.0, key=KEY)
    perm = data.draw(st.permutations(range(len(ids))))
    batch = noise_of(p, ids, n_classes)
    shuffled = noise_of(p, [ids[i] for i in perm], n_classes)
    np.testing.assert_array_equal(shuffled, batch[list(perm)])
    np.testing.assert_array_equal(batch, per_input_noise(ids, n_classes, key=KEY, binding=p.binding))


def test_noise_depends_on_n_classes():
    # Part of the derivation: K = 10 and K = 11 share no prefix.
    a = per_input_noise(["same"], 10, key=KEY)[0]
    b = per_input_noise(["same"], 11, key=KEY)[0, :10]
    assert not np.any(a == b)


def test_perturb_is_thread_safe():
    p = Perturber(1.0, key=KEY)
    ids = [f"t{i}" for i in range(200)]
    expected = noise_of(p, ids, 64)
    results = [None] * 4

    def work(slot):
        results[slot] = noise_of(p, ids, 64)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, expected)


# --------------------------------------------------------------------------
# independence and distribution
# --------------------------------------------------------------------------

# Under independence the sample correlation of two K-vectors is ~N(0, 1/K);
# |r| < 5 / sqrt(K) would fail for a random key with probability ~6e-7.
K_INDEP = 10_000
R_BOUND = 5 / math.sqrt(K_INDEP)


@pytest.mark.parametrize(
    "left, right",
    [
        ((KEY, "request-0001"), (KEY, "request-0002")),  # one character apart
        ((KEY, "a"), (KEY, "b")),
        ((KEY, "same id"), (KEY + b"!", "same id")),  # keys one byte apart
        ((b"key one, 16 bytes", "same id"), (b"key two, 16 bytes", "same id")),
    ],
)
def test_noise_uncorrelated_across_ids_and_keys(left, right):
    a = per_input_noise([left[1]], K_INDEP, key=left[0])[0]
    b = per_input_noise([right[1]], K_INDEP, key=right[0])[0]
    r = np.corrcoef(a, b)[0, 1]
    assert abs(r) < R_BOUND, f"correlation {r:.4f} exceeds {R_BOUND:.4f}"


def test_rows_of_a_batch_are_uncorrelated():
    noise = per_input_noise([f"row-{i}" for i in range(50)], 2_000, key=KEY)
    r = np.corrcoef(noise)[np.triu_indices(50, k=1)]
    # 1225 pairs, each r ~ N(0, 1/2000): the max of 1225 |N(0,1)| stays below
    # 5.5 sd with probability > 1 - 5e-5.
    assert np.max(np.abs(r)) < 5.5 / math.sqrt(2_000)


@pytest.mark.parametrize("seeding", ["per-input", "fresh"])
def test_noise_has_mean_zero_and_std_sigma(seeding):
    sigma = 1.7
    p = Perturber(sigma, seeding=seeding, key=KEY, generator=np.random.default_rng(11))
    noise = noise_of(p, [f"m{i}" for i in range(256)], 1_000).ravel()
    n = noise.size
    # z-tests at 5 sd (two-sided false alarm ~6e-7 for a random key/seed):
    # mean has sd sigma/sqrt(n); sample variance has sd ~ sigma^2 sqrt(2/n).
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(n)
    assert abs(noise.var() / sigma**2 - 1) < 5 * math.sqrt(2 / n)
    # Shape of the law: Kolmogorov-Smirnov against N(0, sigma^2); p > 1e-3
    # fails for a random key with probability 1e-3.
    assert stats.kstest(noise[:20_000] / sigma, "norm").pvalue > 1e-3


def test_noise_is_independent_across_classes_within_a_row():
    noise = per_input_noise(["lag"], 100_000, key=KEY)[0]
    lag1 = np.corrcoef(noise[:-1], noise[1:])[0, 1]
    assert abs(lag1) < 5 / math.sqrt(noise.size)


# --------------------------------------------------------------------------
# types, dtypes, shapes
# --------------------------------------------------------------------------


def test_numpy_and_torch_get_identical_noise():
    p = Perturber(0.9, key=KEY)
    rng = np.random.default_rng(5)
    ids = [f"q{i}" for i in range(20)]
    for dtype in (np.float32, np.float64):
        x = rng.normal(size=(20, 300)).astype(dtype)
        np.testing.assert_array_equal(p.perturb(torch.from_numpy(x), ids).numpy(), p.perturb(x, ids))


NUMPY_DTYPES = [np.float16, np.float32, np.float64]
TORCH_DTYPES = ["float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_dtype_and_values(dtype):
    p = Perturber(0.5, key=KEY)
    x = np.random.default_rng(0).normal(size=(8, 12)).astype(dtype)
    ids = [f"d{i}" for i in range(8)]
    out = p.perturb(x, ids)
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == x.shape
    # Noise drawn in float64, added in float64, cast back once.
    expected = (x.astype(np.float64) + 0.5 * per_input_noise(ids, 12, key=KEY, binding=p.binding)).astype(dtype)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype_name", TORCH_DTYPES)
def test_torch_dtype_device_and_values(dtype_name):
    dtype = getattr(torch, dtype_name)
    p = Perturber(0.5, key=KEY)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(0)).to(dtype)
    ids = [f"d{i}" for i in range(8)]
    out = p.perturb(x, ids)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == dtype and out.shape == x.shape and out.device == x.device
    expected = (x.double() + 0.5 * torch.from_numpy(per_input_noise(ids, 12, key=KEY, binding=p.binding))).to(dtype)
    assert torch.equal(out, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_cuda_device_is_preserved():
    p = Perturber(0.5, key=KEY)
    x = torch.randn(4, 10, device="cuda")
    out = p.perturb(x, list("abcd"))
    assert out.device == x.device and out.dtype == x.dtype
    assert torch.equal(out.cpu(), p.perturb(x.cpu(), list("abcd")))


def test_single_row_in_single_row_out(backend):
    to_b, to_np = backend
    p = Perturber(1.0, key=KEY)
    x = np.linspace(-1, 1, 9)
    out = p.perturb(to_b(x), "only")
    assert tuple(out.shape) == (9,)
    np.testing.assert_array_equal(to_np(out), p.perturb(x[None, :], ["only"])[0])
    np.testing.assert_array_equal(to_np(p.perturb(to_b(x), ["only"])), to_np(out))


def test_masked_logits_stay_masked(backend):
    to_b, to_np = backend
    x = np.array([[0.0, -np.inf, 1.0], [np.inf, 2.0, -np.inf]])
    out = to_np(Perturber(3.0, key=KEY).perturb(to_b(x), ["a", "b"]))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(x))
    np.testing.assert_array_equal(np.sign(out[np.isinf(x)]), np.sign(x[np.isinf(x)]))


def test_torch_gradients_are_not_tracked():
    x = torch.randn(3, 5, requires_grad=True)
    out = Perturber(1.0, key=KEY).perturb(x, ["a", "b", "c"])
    assert not out.requires_grad


def test_empty_batch():
    out = Perturber(1.0, key=KEY).perturb(np.zeros((0, 5), np.float32), [])
    assert out.shape == (0, 5) and out.dtype == np.float32


def test_input_is_not_modified(backend):
    to_b, to_np = backend
    x = np.random.default_rng(1).normal(size=(4, 6))
    original = x.copy()
    xb = to_b(x)
    Perturber(1.0, key=KEY).perturb(xb, list("abcd"))
    np.testing.assert_array_equal(to_np(xb), original)


# --------------------------------------------------------------------------
# sigma = 0 and fresh seeding
# --------------------------------------------------------------------------


@pytest.mark.parametrize("seeding", ["per-input", "fresh"])
def test_sigma_zero_returns_an_equal_copy(backend, seeding):
    to_b, to_np = backend
    x = to_b(np.random.default_rng(2).normal(size=(3, 7)).astype(np.float32))
    out = Perturber(0.0, seeding=seeding, key=KEY).perturb(x, ["a", "b", "c"])
    assert out is not x and type(out) is type(x) and out.dtype == x.dtype
    np.testing.assert_array_equal(to_np(out), to_np(x))


def test_sigma_zero_still_validates_ids():
    with pytest.raises(ValueError, match="needs ids"):
        Perturber(0.0, key=KEY).perturb(np.zeros((2, 3)))


def test_fresh_noise_differs_between_calls(backend):
    to_b, to_np = backend
    p = Perturber(1.0, seeding="fresh")
    x = to_b(zeros(4, 50))
    a, b = to_np(p.perturb(x)), to_np(p.perturb(x))
    assert not np.any(a == b)
    # Two independent perturbers (OS-seeded) differ too.
    c = to_np(Perturber(1.0, seeding="fresh").perturb(x))
    assert not np.any(a == c)


def test_fresh_with_seeded_generator_is_reproducible():
    a = Perturber(1.0, seeding="fresh", generator=np.random.default_rng(7)).perturb(zeros(2, 5))
    b = Perturber(1.0, seeding="fresh", generator=np.random.default_rng(7)).perturb(zeros(2, 5))
    np.testing.assert_array_equal(a, b)


def test_fresh_checks_ids_when_given():
    with pytest.raises(ValueError, match="got 1 ids for 2 rows"):
        Perturber(1.0, seeding="fresh").perturb(zeros(2, 5), ["a"])


# --------------------------------------------------------------------------
# pickling and repr
# --------------------------------------------------------------------------


def test_pickled_per_input_perturber_serves_the_same_noise():
    p = Perturber(1.0, key=KEY)
    q = pickle.loads(pickle.dumps(p))
    np.testing.assert_array_equal(noise_of(p, ["a", "b"], 20), noise_of(q, ["a", "b"], 20))


def test_pickled_fresh_perturber_gets_its_own_generator():
    p = Perturber(1.0, seeding="fresh", generator=np.random.default_rng(0))
    q1, q2 = pickle.loads(pickle.dumps(p)), pickle.loads(pickle.dumps(p))
    assert not np.array_equal(q1.perturb(zeros(1, 20)), q2.perturb(zeros(1, 20)))


def test_repr_hides_the_key():
    text = repr(Perturber(0.25, key=b"top-secret-value"))
    assert "0.25" in text and "per-input" in text and "top-secret" not in text


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma, exc, match",
    [
        (-0.1, ValueError, r"sigma must be finite and >= 0, got -0\.1"),
        (float("nan"), ValueError, "sigma must be finite and >= 0, got nan"),
        (float("inf"), ValueError, "sigma must be finite and >= 0, got inf"),
        ("1.0", TypeError, r"sigma must be a real number, got '1\.0'"),
        (True, TypeError, "sigma must be a real number, got True"),
        (None, TypeError, "sigma must be a real number, got None"),
    ],
)
def test_invalid_sigma(sigma, exc, match):
    with pytest.raises(exc, match=match):
        Perturber(sigma, key=KEY)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"key": None}, ValueError, "per-input seeding needs key"),
        ({"key": b""}, ValueError, "key is 0 bytes; need at least 16"),
        ({"key": b"x"}, ValueError, "key is 1 byte; need at least 16"),
        ({"key": b"15 bytes secret"}, ValueError, "key is 15 bytes; need at least 16"),
        ({"key": "text key"}, TypeError, "key must be bytes.*got str"),
        ({"seeding": "per-call", "key": KEY}, ValueError, "seeding must be one of .*got 'per-call'"),
        ({"seeding": "fresh", "generator": 42}, TypeError, "generator must be a numpy.random.Generator, got int"),
    ],
)
def test_invalid_constructor_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Perturber(1.0, **kwargs)


@pytest.mark.parametrize(
    "logits, ids, exc, match",
    [
        (np.zeros((2, 3)), None, ValueError, r"needs ids \(one str/bytes per row\), got ids=None"),
        (np.zeros((2, 3)), ["a"], ValueError, "need one id per row: got 1 ids for 2 rows"),
        (np.zeros((2, 3)), "ab", TypeError, "batch of 2 rows must be a sequence of str/bytes, got a single str 'ab'"),
        (np.zeros((2, 3)), ["a", 7], TypeError, "ids must be str or bytes, got int 7 at position 1"),
        (np.zeros((2, 3)), 5, TypeError, "ids must be a sequence of str/bytes, got int"),
        (np.zeros((2, 3)), np.array([["a", "b"]]), ValueError, r"one-dimensional, got an array of shape \(1, 2\)"),
        (np.float64(1.0), "a", ValueError, r"single row \(n_classes,\), got shape \(\)"),
        (np.zeros((2, 3, 4)), ["a", "b"], ValueError, r"got shape \(2, 3, 4\)"),
        (np.zeros((2, 1)), ["a", "b"], ValueError, "at least 2 classes, got n_classes=1"),
        (np.array([[0.0, np.nan]]), ["a"], ValueError, r"logits contain NaN \(first at row 0, class 1\)"),
        (np.zeros((2, 3), dtype=np.int64), ["a", "b"], TypeError, "floating dtype, got int64"),
        ([[1, 2]], ["a"], TypeError, "floating dtype, got int64"),
    ],
)
def test_invalid_perturb_arguments(logits, ids, exc, match):
    with pytest.raises(exc, match=match):
        Perturber(1.0, key=KEY).perturb(logits, ids)


def test_invalid_torch_logits():
    p = Perturber(1.0, key=KEY)
    with pytest.raises(TypeError, match="floating dtype, got torch.int64"):
        p.perturb(torch.zeros(2, 3, dtype=torch.int64), ["a", "b"])
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 3\)"):
        p.perturb(torch.zeros(1, 2, 3), ["a"])
    with pytest.raises(ValueError, match="NaN"):
        p.perturb(torch.tensor([[0.0, float("nan")]]), ["a"])


def test_per_input_noise_argument_errors():
    with pytest.raises(ValueError, match="n_classes must be a positive integer, got 0"):
        per_input_noise(["a"], 0, key=KEY)
    with pytest.raises(TypeError, match="ids must be a sequence of str/bytes, got str"):
        per_input_noise("abc", 3, key=KEY)


# --------------------------------------------------------------------------
# from_config
# --------------------------------------------------------------------------


def make_config(*sigmas):
    """A minimal v1 config (as older releases wrote them): it is upgraded on load."""
    return {
        "schema": "caliber.config/v1", "model": "m", "n_classes": 5, "n_samples": 10,
        "statistic": "median", "scale": 1.0, "fit": {},
        "targets": [
            {"kind": "retention", "accuracy": 0.8 - 0.1 * i, "retention": 0.9 - 0.1 * i, "v": 0.5 + i,
             "sigma": s}
            for i, s in enumerate(sigmas)
        ],
    }


def test_from_config_dict_and_path(tmp_path):
    config = make_config(0.4, 1.3)
    path = tmp_path / "caliber.json"
    path.write_text(json.dumps(config))
    served = []
    for source in (config, path, str(path)):
        p = Perturber.from_config(source, target=1, key=KEY)
        assert p.sigma == 1.3 and p.seeding == "per-input"
        assert p.levels == (0.4, 1.3) and p.level == 2 and p.n_classes == 5
        assert p.config_digest == config_digest(config)
        served.append(noise_of(p, ["a"], 5))
    assert Perturber.from_config(config, seeding="fresh").sigma == 0.4
    # Every form of the config serves the same noise: level 2 = sigma_1 xi_1 + sqrt(sigma_2^2 - sigma_1^2) xi_2.
    np.testing.assert_array_equal(served[0], served[1])
    np.testing.assert_array_equal(served[0], served[2])
    xi = [per_input_noise(["a"], 5, key=KEY, binding=bytes.fromhex(config_digest(config)), level=i) for i in (1, 2)]
    expected = 0.4 * xi[0]
    expected += math.sqrt((1.3 - 0.4) * (1.3 + 0.4)) * xi[1]
    np.testing.assert_array_equal(served[0], expected)


@pytest.mark.parametrize(
    "config, target, exc, match",
    [
        (make_config(0.4), 1, ConfigError, r"target index 1 is out of range: it must be in \[0, 1\)"),
        (make_config(0.4), -1, ConfigError, r"target index -1 is out of range: it must be in \[0, 1\)"),
        (make_config(0.4), "0", TypeError, "target must be an integer index, got '0'"),
        ({"schema": "other/v1", "targets": []}, 0, ConfigError,
         "config schema must be 'caliber.config/v2', got 'other/v1'"),
        ({"targets": [{"sigma": 1.0}]}, 0, ConfigError, "config schema must be 'caliber.config/v2', got None"),
        ({**make_config(0.4), "targets": []}, 0, ConfigError, "'targets' is empty: there is no sigma to serve"),
        ({**make_config(0.4), "targets": [{"kind": "retention", "accuracy": 0.8, "retention": 0.9, "v": 1.0}]},
         0, ConfigError, r"targets\[0\] is missing field\(s\): sigma"),
        (make_config(-2.0), 0, ConfigError, r"targets\[0\].sigma must be a finite number >= 0, got -2\.0"),
        ([1, 2], 0, ConfigError, "config must be a path, JSON text or a dict, got list"),
    ],
)
def test_from_config_errors(config, target, exc, match):
    with pytest.raises(exc, match=match):
        Perturber.from_config(config, target=target, key=KEY)


def test_from_config_bad_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        sigma_to_serve(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        sigma_to_serve(tmp_path / "missing.json")


# --------------------------------------------------------------------------
# response helpers
# --------------------------------------------------------------------------


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    return z - z.max(axis=-1, keepdims=True) - np.log(np.exp(z - z.max(axis=-1, keepdims=True)).sum(-1, keepdims=True))


def test_top_logprobs_agree_with_log_softmax_of_noisy_logits():
    p = Perturber(1.2, key=KEY)
    logits = np.random.default_rng(4).normal(size=(6, 30))
    ids = [f"c{i}" for i in range(6)]
    top = noisy_top_logprobs(p, logits, ids, k=5)
    reference = log_softmax(p.perturb(logits, ids))
    assert len(top) == 6
    for row, entries in zip(reference, top):
        assert len(entries) == 5
        indices = [i for i, _ in entries]
        assert indices == list(np.argsort(-row, kind="stable")[:5])
        for index, logprob in entries:
            assert isinstance(index, int) and isinstance(logprob, float)
            assert logprob == pytest.approx(row[index], rel=0, abs=1e-12)
        logprobs = [lp for _, lp in entries]
        assert logprobs == sorted(logprobs, reverse=True)


def test_top_logprobs_single_row_torch_and_all_k():
    p = Perturber(1.0, key=KEY)
    x = torch.randn(8, generator=torch.Generator().manual_seed(1))
    top = noisy_top_logprobs(p, x, "one", k=8)
    assert len(top) == 8 and all(isinstance(e, tuple) for e in top)
    assert math.fsum(math.exp(lp) for _, lp in top) == pytest.approx(1.0, abs=1e-6)  # float32 rounding
    for bad_k in (0, 9, 2.0, True):
        with pytest.raises(ValueError, match=r"k must be an integer in \[1, n_classes=8\]"):
            noisy_top_logprobs(p, x, "one", k=bad_k)


def test_top_logprobs_ties_go_to_lower_index():
    top = noisy_top_logprobs(Perturber(0.0, key=KEY), np.array([1.0, 3.0, 3.0, 0.0]), "t", k=3)
    assert [i for i, _ in top] == [1, 2, 0]


def test_noisy_probabilities(backend):
    to_b, to_np = backend
    p = Perturber(0.8, key=KEY)
    logits = np.random.default_rng(6).normal(size=(5, 12))
    ids = [f"p{i}" for i in range(5)]
    for temperature in (1.0, 0.5, 3.0):
        probs = noisy_probabilities(p, to_b(logits), ids, temperature=temperature)
        assert type(probs) is type(to_b(logits)) and tuple(probs.shape) == (5, 12)
        reference = np.exp(log_softmax(p.perturb(logits, ids) / temperature))
        np.testing.assert_allclose(to_np(probs), reference, rtol=1e-12, atol=0)
        np.testing.assert_allclose(to_np(probs).sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), "1", True])
def test_noisy_probabilities_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        noisy_probabilities(Perturber(1.0, key=KEY), np.zeros((1, 3)), ["a"], temperature=temperature)


def test_helpers_reject_non_perturbers():
    with pytest.raises(TypeError, match="perturber must be a caliber_core.serving.runtime.Perturber, got float"):
        noisy_top_logprobs(0.5, np.zeros((1, 3)), ["a"])
    with pytest.raises(TypeError, match="got dict"):
        LogitsProcessorAdapter({})


# --------------------------------------------------------------------------
# LogitsProcessor adapter
# --------------------------------------------------------------------------


def test_logits_processor_is_deterministic_per_input_ids_row():
    adapter = LogitsProcessorAdapter(Perturber(1.0, key=KEY))
    input_ids = torch.tensor([[5, 6, 7], [5, 6, 8], [1, 2, 3]])
    scores = torch.zeros(3, 50)
    first = adapter(input_ids, scores)
    assert first.shape == scores.shape and first.dtype == scores.dtype
    # Same rows in another batch, another order: the same noise per row.
    again = adapter(input_ids[[2, 0]], scores[[2, 0]])
    assert torch.equal(again, first[[2, 0]])
    # Prefixes one token apart get unrelated noise.
    r = np.corrcoef(first[0].numpy(), first[1].numpy())[0, 1]
    assert abs(r) < 5 / math.sqrt(50)
    # The default id is the row's int64 little-endian token bytes, whatever the integer dtype.
    assert torch.equal(adapter(input_ids.to(torch.int32), scores), first)
    expected = Perturber(1.0, key=KEY).perturb(scores, [np.array(r, "<i8").tobytes() for r in input_ids.tolist()])
    assert torch.equal(first, expected)


def test_logits_processor_custom_id_fn():
    seen = []

    def id_fn(row):
        seen.append(tuple(row.tolist()))
        return "constant"

    adapter = LogitsProcessorAdapter(Perturber(1.0, key=KEY), id_fn=id_fn)
    out = adapter(torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, 10))
    assert seen == [(1, 2), (3, 4)]
    assert torch.equal(out[0], out[1])


def test_logits_processor_errors():
    adapter = LogitsProcessorAdapter(Perturber(1.0, key=KEY))
    with pytest.raises(ValueError, match=r"same batch, got \(2, 3\) and \(3, 10\)"):
        adapter(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 10))
    with pytest.raises(TypeError, match="must be torch tensors, got ndarray and Tensor"):
        adapter(np.zeros((1, 3)), torch.zeros(1, 10))
    with pytest.raises(TypeError, match="id_fn must be callable, got str"):
        LogitsProcessorAdapter(Perturber(1.0, key=KEY), id_fn="tokens")


def test_ids_may_be_any_sized_iterable_of_str():
    import pandas as pd

    p = Perturber(1.0, key=KEY)
    ids = ["a", "b", "c"]
    expected = noise_of(p, ids, 4)
    for container in (tuple(ids), np.array(ids), pd.Series(ids)):
        np.testing.assert_array_equal(noise_of(p, container, 4), expected)


def test_top_logprobs_checks_k_before_any_draw(monkeypatch):
    p = Perturber(1.0, key=KEY)

    def no_draw(*args, **kwargs):
        raise AssertionError("noise was drawn before k was checked")

    monkeypatch.setattr(p, "perturb", no_draw)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, n_classes=4\], got 5"):
        noisy_top_logprobs(p, np.zeros((2, 4)), ["a", "b"], k=5)


def test_fresh_torch_noise_is_drawn_on_the_device_and_reproducible_with_a_seeded_generator():
    x = torch.zeros(3, 4000)
    a = Perturber(2.0, seeding="fresh", generator=np.random.default_rng(7)).perturb(x)
    b = Perturber(2.0, seeding="fresh", generator=np.random.default_rng(7)).perturb(x)
    assert torch.equal(a, b) and a.device == x.device and a.dtype == x.dtype
    # sd of 12,000 N(0, 4) draws: 2 within 5 standard errors (se = 2 / sqrt(2 * 12,000)).
    assert abs(float(a.double().std()) - 2.0) < 5 * 2.0 / math.sqrt(2 * a.numel())
