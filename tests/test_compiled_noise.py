"""The served noise as one pure torch function (compiled_noise): numpy's reference bit for bit on random shapes,
dtypes, levels, keys and served counts, eager and compiled; the fallback when it cannot be compiled; on CUDA, the
compiled kernel behind every served path, and no request waiting for a compiler."""

from __future__ import annotations

import importlib.util
import os
import time
import warnings

import numpy as np
import pytest

from caliber_core.serving import keyed_noise
from tests.test_fused_noise import exact_round, reference

torch = pytest.importorskip("torch")
from caliber_core.serving import compiled_noise, keyed_noise_torch  # noqa: E402  (after the torch check)

TORCH_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device here: the compiled kernel's CUDA cases need one "
                                                  "(CPU tensors are served by the fused C kernel)")


def bits_of(tensor: torch.Tensor) -> np.ndarray:
    """Raw bits as numpy's unsigned integers (what the reference helpers return)."""
    signed = tensor.detach().cpu().view(BITS[tensor.dtype]).numpy()
    return signed.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[signed.itemsize])


def served_reference(logits: torch.Tensor, seeds, increments, served) -> np.ndarray:
    """Each row at its count of levels, by numpy's reference (count 0: the row's own bits)."""
    out = bits_of(logits).copy()
    for row, k in enumerate(served):
        if k:
            out[row] = reference(logits[row:row + 1], [s[row:row + 1] for s in seeds[:k]], increments[:k])[0]
    return out


def random_case(rng, dtype, n_rows, n_classes, n_levels):
    """Logits (with +-inf, +-0.0 and large values), real keyed row seeds and increments, served counts."""
    wide = rng.standard_normal((n_rows, n_classes)) * rng.choice([0.5, 8.0, 300.0])
    if n_classes > 4:
        wide[0, :4] = [np.inf, -np.inf, 0.0, -0.0]
    logits = torch.from_numpy(wide).to(dtype)
    key = rng.bytes(32)
    ids = [rng.bytes(int(rng.integers(1, 20))) for _ in range(n_rows)]
    digests = keyed_noise.row_digests(ids)
    seeds = [keyed_noise.row_seeds(key, b"binding", level, digests, n_classes) for level in range(1, n_levels + 1)]
    increments = [float(x) for x in rng.uniform(0.01, 3.0, size=n_levels)]
    served = [int(k) for k in rng.integers(0, n_levels + 1, size=n_rows)]
    return logits, seeds, increments, served


def test_the_eager_function_is_numpys_reference_on_random_cases():
    rng = np.random.default_rng(34)
    for case in range(24):
        dtype = TORCH_DTYPES[case % 4]
        n_rows, n_classes, n_levels = int(rng.integers(1, 9)), int(rng.integers(2, 3000)), int(rng.integers(1, 5))
        logits, seeds, increments, served = random_case(rng, dtype, n_rows, n_classes, n_levels)
        every = compiled_noise.call(compiled_noise.noisy_logits, logits, seeds, increments, None)
        assert np.array_equal(bits_of(every), reference(logits, seeds, increments)), (dtype, n_rows, n_classes)
        some = compiled_noise.call(compiled_noise.noisy_logits, logits, seeds, increments, served)
        assert np.array_equal(bits_of(some), served_reference(logits, seeds, increments, served)), served


def test_the_transform_matches_numpy_at_its_seams():
    # Words at the piece and sign boundaries, through the function's own steps (no SplitMix64 in front).
    from tests.test_keyed_noise import edge_words, random_words

    words = np.concatenate([edge_words(), random_words(4096, seed=5)])
    table = torch.from_numpy(keyed_noise.gather_table())
    got = compiled_noise._normals(torch.from_numpy(words.view(np.int64)), table).numpy()
    assert np.array_equal(got.view(np.uint64), keyed_noise.normals_from_words(words).view(np.uint64))


def test_float16_and_bfloat16_are_rounded_once():
    # Values just off the midpoints of float16 and bfloat16, where a rounding through float32 goes wrong.
    rng = np.random.default_rng(3)
    base = rng.uniform(-60000, 60000, size=4096)
    for dtype, significand, min_exponent, rows in ((torch.float16, 11, -14, None), (torch.bfloat16, 8, -126, None)):
        halves = torch.from_numpy(base).to(dtype).to(torch.float64).numpy()
        ulp = np.spacing(np.abs(halves).astype(np.float32) if dtype == torch.bfloat16 else
                         np.abs(halves).astype(np.float16)).astype(np.float64)
        if dtype == torch.bfloat16:
            ulp = ulp * 2.0 ** 16
        near_midpoints = halves + ulp / 2 + np.where(rng.random(base.size) < 0.5, 1, -1) * np.spacing(halves) * 3
        got = compiled_noise._round_once(torch.from_numpy(near_midpoints), dtype).to(torch.float64).numpy()
        want = exact_round(near_midpoints, significand, min_exponent, float(torch.finfo(dtype).max))
        assert np.array_equal(got, want), dtype
        double = torch.from_numpy(near_midpoints).to(torch.float32).to(dtype).to(torch.float64).numpy()
        assert not np.array_equal(double, want)  # the cases do catch a double rounding


@pytest.fixture
def fresh_state(monkeypatch):
    """compiled_noise's per-process state, emptied for one test (and restored after it)."""
    for name in ("_variants", "_device_failure", "_compile_seconds", "_kernel_names", "_triton_configs"):
        monkeypatch.setattr(compiled_noise, name, {})
    monkeypatch.setattr(compiled_noise, "_warned", set())


def test_a_prepared_variant_serves_the_same_bits(fresh_state, monkeypatch):
    # The plain function stands in for the compiled one: the plumbing (one packed copy of seeds and counts, the
    # cached increments and table, the self-check) is what this checks, in a second.
    monkeypatch.setattr(compiled_noise, "_compile", lambda name: compiled_noise._own_function(name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled_noise.prepare("cpu", n_levels=3, dtypes=TORCH_DTYPES)
    assert all(compiled_noise.ready("cpu", 3, dtype) for dtype in TORCH_DTYPES)
    assert not compiled_noise.ready("cpu", 2, torch.float32)
    rng = np.random.default_rng(8)
    for dtype in TORCH_DTYPES:
        logits, seeds, increments, served = random_case(rng, dtype, 6, 777, 3)
        got = compiled_noise.add_keyed_noise(logits, seeds, increments, served)
        assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served)), dtype


def test_when_compiling_fails_one_warning_names_the_cost_and_the_same_bits_are_served(fresh_state, monkeypatch):
    def no_compiler(name):
        raise RuntimeError("Cannot find a working triton installation")

    monkeypatch.setattr(compiled_noise, "_compile", no_compiler)
    with pytest.warns(compiled_noise.CompiledNoiseWarning) as caught:
        assert not compiled_noise.prepare("cpu", n_levels=2, dtypes=(torch.float32, torch.float16))
    assert len(caught) == 1 and "op-by-op" in str(caught[0].message) and "triton" in str(caught[0].message)
    assert "triton" in compiled_noise.unavailable_reason("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: neither a second prepare nor a request warns again
        assert not compiled_noise.prepare("cpu", n_levels=3)
        rng = np.random.default_rng(9)
        logits, seeds, increments, served = random_case(rng, torch.float16, 4, 500, 2)
        got = compiled_noise.add_keyed_noise(logits, seeds, increments, served)
    assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served))


def test_caliber_compiled_kernel_off_selects_the_op_by_op_path(fresh_state, monkeypatch):
    monkeypatch.setenv("CALIBER_COMPILED_KERNEL", "0")
    monkeypatch.setattr(compiled_noise, "_compile", lambda name: pytest.fail("compiled although switched off"))
    with pytest.warns(compiled_noise.CompiledNoiseWarning, match="CALIBER_COMPILED_KERNEL is off"):
        assert not compiled_noise.prepare("cpu")


def test_a_variant_that_fails_its_self_check_is_not_served(fresh_state, monkeypatch):
    def off_by_one_ulp(logits, rows, increments, table):
        out = compiled_noise.noisy_logits(logits, rows, increments, table)
        return (out.view(BITS[out.dtype]) ^ 1).view(out.dtype)

    monkeypatch.setattr(compiled_noise, "_compile", lambda name: off_by_one_ulp)
    with pytest.warns(compiled_noise.CompiledNoiseWarning, match="differs from numpy's reference"):
        assert not compiled_noise.prepare("cpu", n_levels=1)
    assert not compiled_noise.ready("cpu", 1, torch.float32)
    assert compiled_noise.unavailable_reason("cpu") is None  # the device may serve other variants


def test_a_first_kernel_that_fails_its_self_check_gives_way_to_the_next(fresh_state, monkeypatch):
    def off_by_one_ulp(logits, rows, increments, table):
        out = compiled_noise.noisy_logits(logits, rows, increments, table)
        return (out.view(BITS[out.dtype]) ^ 1).view(out.dtype)

    monkeypatch.setattr(compiled_noise, "_candidates", lambda name, device: [
        ("triton", lambda: off_by_one_ulp), ("inductor", lambda: compiled_noise._own_function(name))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second kernel serves: nothing to warn of
        assert compiled_noise.prepare("cpu", n_levels=2, dtypes=(torch.float16,))
    assert compiled_noise.kernel_name("cpu", 2, torch.float16) == "inductor"
    rng = np.random.default_rng(10)
    logits, seeds, increments, served = random_case(rng, torch.float16, 5, 300, 2)
    got = compiled_noise.add_keyed_noise(logits, seeds, increments, served)
    assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served))


def test_the_kernel_choice_follows_caliber_noise_kernel(monkeypatch):
    monkeypatch.setenv("CALIBER_NOISE_KERNEL", "inductor")
    assert [k for k, _ in compiled_noise._candidates("v", "cuda:0")] == ["inductor"]
    monkeypatch.setenv("CALIBER_NOISE_KERNEL", "triton")
    assert [k for k, _ in compiled_noise._candidates("v", "cuda:0")] == ["triton"]
    monkeypatch.delenv("CALIBER_NOISE_KERNEL")
    assert [k for k, _ in compiled_noise._candidates("v", "cuda:0")] == ["triton", "inductor"]
    assert [k for k, _ in compiled_noise._candidates("v", "cpu")] == ["inductor"]  # the CPU has the fused C kernel


def test_bad_arguments_to_prepare_get_one_line(fresh_state):
    with pytest.raises(ValueError, match="n_levels must be a positive integer"):
        compiled_noise.prepare("cpu", n_levels=0)
    with pytest.raises(ValueError, match="dtypes must be among"):
        compiled_noise.prepare("cpu", dtypes=(torch.int32,))


def test_a_perturber_prepares_its_levels_when_built(monkeypatch):
    from caliber_core.serving.runtime import Perturber

    calls = []
    monkeypatch.setattr(compiled_noise, "prepare", lambda device=None, **kw: calls.append((device, kw)) or False)
    Perturber(0.5, key=bytes(range(32)))
    assert calls == [(None, {"n_levels": 1})]


# torch.compile's CPU backend (Inductor's C++), once, on a small case: the same compiler settings and the same
# function as CUDA's, so its bits are checked here in CI. Compiling (batch 1 and 5) took 96 s on a 2-core machine at
# load 4.7 and 203 s at load 16: marked slow.
COMPILE_ON_CPU = os.environ.get("CALIBER_SKIP_COMPILE_TESTS", "") == ""


@pytest.mark.slow
@pytest.mark.skipif(not COMPILE_ON_CPU, reason="CALIBER_SKIP_COMPILE_TESTS is set")
def test_torch_compile_on_the_cpu_gives_numpys_bits(fresh_state):
    started = time.perf_counter()
    if not compiled_noise.prepare("cpu", n_levels=2, dtypes=(torch.float32,)):
        pytest.skip(f"torch.compile cannot build on this machine: {compiled_noise.unavailable_reason('cpu')}")
    seconds = time.perf_counter() - started
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    rng = np.random.default_rng(11)
    for n_rows, n_classes in ((1, 64), (2, 1000), (9, 333), (64, 1000)):
        logits, seeds, increments, served = random_case(rng, torch.float32, n_rows, n_classes, 2)
        got = compiled_noise.add_keyed_noise(logits, seeds, increments, served)
        assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served)), (n_rows, n_classes)
    assert counters["stats"]["unique_graphs"] == graphs  # batch sizes and K never seen at start: no compile
    print(f"compiled for the CPU (batch 1 and 5) in {seconds:.1f} s")


# -- CUDA -------------------------------------------------------------------------------------------------


@needs_cuda
def test_cuda_compiled_kernel_is_numpys_reference_for_every_dtype():
    assert compiled_noise.prepare("cuda", n_levels=3, dtypes=TORCH_DTYPES), compiled_noise.unavailable_reason("cuda")
    if importlib.util.find_spec("triton") is not None:  # the hand-written kernel serves CUDA where Triton is
        assert {compiled_noise.kernel_name("cuda", 3, dtype) for dtype in TORCH_DTYPES} == {"triton"}
    rng = np.random.default_rng(12)
    for dtype in TORCH_DTYPES:
        for n_rows, n_classes in ((1, 1000), (7, 32_000), (64, 1000), (3, 128_000)):
            logits, seeds, increments, served = random_case(rng, dtype, n_rows, n_classes, 3)
            got = keyed_noise_torch.add_keyed_noise(logits.cuda(), seeds, increments, served=served)
            assert got.device.type == "cuda" and got.dtype == dtype
            assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served)), dtype
            every = keyed_noise_torch.add_keyed_noise(logits.cuda(), seeds, increments)
            assert np.array_equal(bits_of(every), reference(logits, seeds, increments)), dtype


@needs_cuda
def test_cuda_first_request_is_not_slower_than_the_tenth():
    from caliber_core.serving.runtime import Perturber

    perturber = Perturber(1.5, key=bytes(range(1, 33)))  # compiles for the current device now
    assert compiled_noise.ready("cuda", 1, torch.float32)
    logits = torch.randn(8, 32_000, device="cuda")
    times = []
    for request in range(10):
        ids = [f"req-{request}-{row}" for row in range(8)]
        torch.cuda.synchronize()
        started = time.perf_counter()
        perturber.perturb(logits, ids)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    # The first request pays no compile (seconds); a margin covers the first use of the host's hash objects.
    assert times[0] <= max(3 * times[9], times[9] + 0.005), times


@needs_cuda
def test_cuda_fallback_warns_once_and_serves_the_same_bits(fresh_state, monkeypatch):
    def unavailable():
        raise RuntimeError("torch.compile is unavailable")

    monkeypatch.setattr(compiled_noise, "_candidates", lambda name, device: [("inductor", unavailable)])
    with pytest.warns(compiled_noise.CompiledNoiseWarning, match="op-by-op"):
        assert not compiled_noise.prepare("cuda", n_levels=2)
    rng = np.random.default_rng(13)
    logits, seeds, increments, served = random_case(rng, torch.float32, 5, 32_000, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = keyed_noise_torch.add_keyed_noise(logits.cuda(), seeds, increments, served=served)
    assert np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served))
