"""The fused kernel: numpy's reference bit for bit on random shapes, dtypes, levels and keys; exact roundings;
constant work across levels; the fallback when it cannot be built."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core import native_build
from caliber_core.serving import fused_noise, keyed_noise
from tests.test_keyed_noise import edge_words, random_words

torch = pytest.importorskip("torch")
from caliber_core.serving import keyed_noise_torch  # noqa: E402  (after the torch check)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not fused_noise.prepare(), reason="the fused kernel cannot be built here")

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def exact_round(values: np.ndarray, significand_bits: int, min_exponent: int, max_finite: float) -> np.ndarray:
    """float64 values rounded to nearest even at a format's precision, in Python's exact arithmetic.

    frexp and power-of-two scaling are exact, and Python's round() of a float is round-half-even on its
    exact value: an independent reference for the kernel's round-to-odd conversions.
    """
    out = []
    overflow = max_finite + math.ldexp(1.0, math.frexp(max_finite)[1] - significand_bits - 1)  # max + half an ulp
    for x in values.tolist():
        if abs(x) >= overflow:
            out.append(math.copysign(math.inf, x))
            continue
        spacing = max(math.frexp(abs(x))[1] - significand_bits, min_exponent - significand_bits + 1)
        r = round(math.ldexp(abs(x), -spacing))
        out.append(math.copysign(math.ldexp(r, spacing) if r else 0.0, x))
    return np.array(out)


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    as_float32 = np.asarray(values, dtype=np.float32)  # exact: they are bfloat16 values
    return (as_float32.view(np.uint32) >> 16).astype(np.uint16)


def reference(logits: torch.Tensor, seeds, increments) -> np.ndarray:
    """numpy's add_keyed_noise: float64, float32 and float16 directly; bfloat16 as the float64 result
    (bfloat16 widens exactly) rounded once, exactly."""
    if logits.dtype == torch.bfloat16:
        wide = keyed_noise.add_keyed_noise(logits.to(torch.float64).numpy(), seeds, increments)
        return bfloat16_bits(exact_round(wide.ravel(), 8, -126, float(torch.finfo(torch.bfloat16).max))
                             ).reshape(wide.shape)
    out = keyed_noise.add_keyed_noise(logits.numpy(), seeds, increments)
    return out.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[out.itemsize])


def bits(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    out = tensor.numpy()
    return out.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[out.itemsize])


def fused(logits: torch.Tensor, seeds, increments, served=None, n_threads=1) -> torch.Tensor:
    out = torch.empty_like(logits)
    item = logits.element_size()
    fused_noise.add_keyed_noise(logits.data_ptr(), logits.stride(0) * item, out.data_ptr(), out.stride(0) * item,
                                tuple(logits.shape), str(logits.dtype).removeprefix("torch."),
                                np.array(seeds, dtype=np.uint64).reshape(len(increments), -1), increments,
                                served, n_threads=n_threads)
    return out


def test_the_transform_equals_numpy_on_every_seam_and_a_million_words():
    words = np.concatenate([edge_words(), random_words(1_000_000, 4)])
    assert np.array_equal(fused_noise.normals_from_words(words).view(np.uint64),
                          keyed_noise.normals_from_words(words).view(np.uint64))


def test_random_shapes_dtypes_levels_and_keys_equal_numpy_bit_for_bit():
    rng = np.random.default_rng(34)
    cases = 0
    for trial in range(40):
        n_rows = int(rng.choice([1, 2, 7, 8, 33]))
        n_classes = int(rng.choice([1, 2, 3, 255, 256, 257, 1000, 4099]))
        n_levels = int(rng.integers(1, 6))
        dtype = list(TORCH_DTYPES)[trial % 4]
        key = rng.bytes(int(rng.integers(16, 40)))
        digests = keyed_noise.row_digests([rng.bytes(8) for _ in range(n_rows)])
        seeds = [keyed_noise.row_seeds(key, b"cfg", level, digests, n_classes) for level in range(1, n_levels + 1)]
        increments = list(rng.uniform(0.01, 30.0, n_levels) * (10.0 ** rng.integers(-3, 3)))
        scale = float(10.0 ** rng.integers(-2, 4))
        logits = (torch.from_numpy(rng.standard_normal((n_rows, n_classes))) * scale).to(TORCH_DTYPES[dtype])
        got = fused(logits, seeds, increments, n_threads=int(rng.integers(1, 3)))
        assert got.dtype == logits.dtype and np.array_equal(bits(got), reference(logits, seeds, increments)), \
            (trial, dtype, n_rows, n_classes, n_levels)
        cases += 1
    assert cases == 40


def test_the_portable_build_without_vector_instructions_gives_the_same_bits(tmp_path):
    """The kernel compiled without -march=native (what a compiler that lacks it builds, and the scalar loop
    the vector one hands its tails to) serves numpy's bits, as the AVX2 build does."""
    import ctypes

    compiler = native_build.compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    library_path = tmp_path / "portable.so"
    subprocess.run([*compiler.split(), *fused_noise._FLAGS, "-o", str(library_path), str(fused_noise.SOURCE)],
                   check=True, capture_output=True, timeout=300)
    library = fused_noise._bind(ctypes.CDLL(str(library_path)))
    fused_noise._self_check(library)
    rng = np.random.default_rng(35)
    for n_classes in (3, 257, 1001):  # tails of a four-lane loop and of a 256-column block
        logits = rng.standard_normal((3, n_classes)).astype(np.float32) * 7
        seeds = rng.integers(0, 2**64 - 1, size=(2, 3), dtype=np.uint64, endpoint=True)
        got = np.empty_like(logits)
        fused_noise._call(library, logits.ctypes.data, logits.strides[0], got.ctypes.data, got.strides[0],
                          logits.shape, "float32", seeds, [0.75, 1.5], None, 1)
        want = keyed_noise.add_keyed_noise(logits, list(seeds), [0.75, 1.5])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n_classes


def test_the_kernel_takes_no_more_threads_than_the_cores_this_thread_may_run_on(monkeypatch):
    """An engine that pins each thread to one core (vLLM's CPU backend) gets one kernel thread, not torch's count."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert keyed_noise_torch._kernel_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    assert keyed_noise_torch._kernel_threads() == 4


def test_threads_split_a_large_batch_with_the_same_bits():
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.standard_normal((5, 70_001)).astype(np.float32))
    seeds = rng.integers(0, 2**64 - 1, size=(3, 5), dtype=np.uint64, endpoint=True)
    increments = [0.5, 0.8660254037844386, 1.7320508075688772]
    one = fused(logits, seeds, increments, n_threads=1)
    assert np.array_equal(bits(fused(logits, seeds, increments, n_threads=4)), bits(one))
    assert np.array_equal(bits(one), reference(logits, list(seeds), increments))


def test_rows_add_their_own_number_of_levels_and_clean_rows_are_copies():
    rng = np.random.default_rng(6)
    logits = torch.from_numpy(rng.standard_normal((4, 300)) * 5).to(torch.bfloat16)
    seeds = rng.integers(0, 2**64 - 1, size=(3, 4), dtype=np.uint64, endpoint=True)
    increments = [0.4, 0.9, 2.0]
    got = fused(logits, seeds, increments, served=[0, 1, 3, 2])
    assert np.array_equal(bits(got[0:1]), bits(logits[0:1]))
    for row, k in ((1, 1), (2, 3), (3, 2)):
        want = reference(logits[row:row + 1], [s[row:row + 1] for s in seeds[:k]], increments[:k])
        assert np.array_equal(bits(got[row:row + 1]), want)


def test_roundings_to_float16_and_bfloat16_are_exact_at_every_midpoint():
    rng = np.random.default_rng(7)
    halves = np.arange(1 << 16, dtype=np.uint16)
    finite16 = halves.view(np.float16)[np.isfinite(halves.view(np.float16))].astype(np.float64)
    bf = (halves.astype(np.uint32) << 16).view(np.float32)
    finite_bf = bf[np.isfinite(bf)].astype(np.float64)
    for values, name, p, emin, top in ((finite16, "float16", 11, -14, 65504.0),
                                       (finite_bf, "bfloat16", 8, -126, float(torch.finfo(torch.bfloat16).max))):
        ordered = np.unique(values)
        midpoints = (ordered[:-1] + ordered[1:]) / 2  # exact in float64
        tiny = np.abs(midpoints) * 2.0 ** -40 + 2.0 ** -1070
        x = np.concatenate([values, midpoints, midpoints + tiny, midpoints - tiny,
                            rng.standard_normal(20_000) * 10.0 ** rng.uniform(-10, 6, 20_000),
                            [top * 1.0001, -top * 1.01, 1e300, -1e-300, 0.0, -0.0, math.inf, -math.inf]])
        want = exact_round(x, p, emin, top)
        want_bits = want.astype(np.float16).view(np.uint16) if name == "float16" else bfloat16_bits(want)
        assert np.array_equal(fused_noise.round_to(x, name), want_bits), name
    # widening is exact: every value of the format, infinities and NaNs included, comes back as itself
    with np.errstate(invalid="ignore", over="ignore"):
        assert np.array_equal(fused_noise.widen(halves, "float16"), halves.view(np.float16).astype(np.float64),
                              equal_nan=True)
        assert np.array_equal(fused_noise.widen(halves, "bfloat16"), bf.astype(np.float64), equal_nan=True)
    # float16 through numpy: numpy's float64 -> float16 is one correct rounding too
    x = rng.standard_normal(100_000) * 10.0 ** rng.uniform(-9, 5, 100_000)
    with np.errstate(over="ignore"):
        assert np.array_equal(fused_noise.round_to(x, "float16"), x.astype(np.float16).view(np.uint16))


def test_torch_serving_uses_the_kernel_on_the_cpu(monkeypatch):
    rng = np.random.default_rng(8)
    seeds = [rng.integers(0, 2**64 - 1, size=3, dtype=np.uint64, endpoint=True) for _ in range(2)]
    monkeypatch.setattr(keyed_noise, "add_keyed_noise", lambda *a: pytest.fail("numpy's kernel was used"))
    for dtype in TORCH_DTYPES.values():
        logits = torch.from_numpy(rng.standard_normal((3, 500))).to(dtype)
        got = keyed_noise_torch.add_keyed_noise(logits, seeds, [0.5, 1.5])
        assert got.dtype == dtype and torch.equal(got, fused(logits, seeds, [0.5, 1.5]))


def test_the_op_by_op_path_a_gpu_runs_gives_the_same_bits_for_every_dtype():
    # add_keyed_noise_torch is what a CUDA device is served by (and the CPU's fallback for bfloat16):
    # its float16 and bfloat16 roundings go through round_once, so they equal numpy's one rounding.
    rng = np.random.default_rng(9)
    seeds = [rng.integers(0, 2**64 - 1, size=6, dtype=np.uint64, endpoint=True) for _ in range(3)]
    increments = [0.3, 1.1, 2.9]
    for dtype in TORCH_DTYPES.values():
        logits = (torch.from_numpy(rng.standard_normal((6, 4099))) * 30).to(dtype)
        got = keyed_noise_torch.add_keyed_noise_torch(logits, seeds, increments)
        assert np.array_equal(bits(got), reference(logits, seeds, increments)), dtype


def test_the_fallback_serves_per_row_level_counts_with_the_kernels_bits(monkeypatch):
    # What LevelNoise hands a device without the kernel (a GPU, or a CPU that could not build it).
    rng = np.random.default_rng(11)
    seeds = [rng.integers(0, 2**64 - 1, size=5, dtype=np.uint64, endpoint=True) for _ in range(3)]
    served = [0, 1, 1, 3, 2]
    for dtype in TORCH_DTYPES.values():
        logits = (torch.from_numpy(rng.standard_normal((5, 700))) * 9).to(dtype)
        want = fused(logits, seeds, [0.5, 1.0, 2.0], served=served)
        with monkeypatch.context() as patched:
            patched.setattr(fused_noise, "prepare", lambda: False)
            got = keyed_noise_torch.add_keyed_noise(logits, seeds, [0.5, 1.0, 2.0], served=served)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), dtype


def test_out_serves_in_place_or_into_any_tensor_with_the_same_bits(monkeypatch):
    """out=logits (in place, clean rows left as they are, threads splitting rows), a strided out, the fallback."""
    rng = np.random.default_rng(12)
    seeds = rng.integers(0, 2**64 - 1, size=(3, 3), dtype=np.uint64, endpoint=True)
    served = [0, 3, 1]
    for dtype in TORCH_DTYPES.values():
        logits = (torch.from_numpy(rng.standard_normal((3, 40_001))) * 9).to(dtype)
        want = fused(logits, seeds, [0.5, 1.0, 2.0], served=served)
        into = logits.clone()
        monkeypatch.setattr(keyed_noise_torch, "_kernel_threads", lambda: 2)
        assert keyed_noise_torch.add_keyed_noise(into, seeds, [0.5, 1.0, 2.0], served=served, out=into) is into
        assert torch.equal(into.view(torch.uint8), want.view(torch.uint8)), dtype
        strided = torch.empty((40_001, 3), dtype=dtype).t()  # columns not contiguous: served, then copied in
        assert keyed_noise_torch.add_keyed_noise(logits, seeds, [0.5, 1.0, 2.0], served=served, out=strided) is strided
        assert torch.equal(strided.contiguous().view(torch.uint8), want.view(torch.uint8)), dtype
        with monkeypatch.context() as patched:
            patched.setattr(fused_noise, "prepare", lambda: False)
            into = logits.clone()
            assert keyed_noise_torch.add_keyed_noise(into, seeds, [0.5, 1.0, 2.0], served=served, out=into) is into
        assert torch.equal(into.view(torch.uint8), want.view(torch.uint8)), dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_serves_numpys_bits_for_every_dtype():
    rng = np.random.default_rng(10)
    seeds = [rng.integers(0, 2**64 - 1, size=64, dtype=np.uint64, endpoint=True) for _ in range(3)]
    increments = [0.3, 1.1, 2.9]
    for dtype in TORCH_DTYPES.values():
        logits = (torch.from_numpy(rng.standard_normal((64, 32_000))) * 30).to(dtype)
        got = keyed_noise_torch.add_keyed_noise(logits.cuda(), seeds, increments, served=[3, 2, 1, 0] * 16)
        assert got.device.type == "cuda"
        for row, k in enumerate([3, 2, 1, 0] * 16):
            want = (bits(logits[row:row + 1]) if k == 0 else
                    reference(logits[row:row + 1], [s[row:row + 1] for s in seeds[:k]], increments[:k]))
            assert np.array_equal(bits(got[row:row + 1].cpu()), want), (dtype, row)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=300)


FALLBACK = """
import json, warnings, numpy as np, torch
from caliber_core import Perturber
from caliber_core.serving import fused_noise
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    p = Perturber(1.5, key=b"sixteen byte key")
    q = Perturber(0.5, key=b"sixteen byte key")
logits = torch.from_numpy(np.random.default_rng(1).standard_normal((3, 257)))
out = {}
for name in ("float64", "float32", "float16", "bfloat16"):
    served = p.perturb(logits.to(getattr(torch, name)), ["a", "b", "c"])
    out[name] = served.view(torch.int16 if served.element_size() == 2 else
                            torch.int32 if served.element_size() == 4 else torch.int64).tolist()
print(json.dumps({"warnings": [str(w.message) for w in caught if w.category is fused_noise.FusedKernelWarning],
                  "available": fused_noise.available(), "out": out}))
"""


def test_without_a_compiler_one_warning_names_the_cost_and_the_bits_are_the_same(tmp_path):
    slow = _run(FALLBACK, PATH=str(tmp_path), CC="", CALIBER_KERNEL_CACHE=str(tmp_path / "cache"))
    fast = _run(FALLBACK)
    assert slow.returncode == 0 and fast.returncode == 0, slow.stderr + fast.stderr
    slow, fast = json.loads(slow.stdout), json.loads(fast.stdout)
    assert not slow["available"] and fast["available"] and fast["warnings"] == []
    assert len(slow["warnings"]) == 1  # two Perturbers, one warning
    assert "no C compiler found" in slow["warnings"][0] and "torch.randn + add" in slow["warnings"][0]
    assert slow["out"] == fast["out"]


def test_a_kernel_that_fails_its_self_check_is_not_served(monkeypatch, tmp_path):
    monkeypatch.setattr(fused_noise, "_state", {})
    monkeypatch.setenv("CALIBER_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(fused_noise.keyed_noise, "normals_from_words", lambda w: np.zeros(np.shape(w)))
    with pytest.warns(fused_noise.FusedKernelWarning, match="differs from numpy's reference"):
        assert not fused_noise.prepare()
    assert not fused_noise.available() and "differs" in fused_noise.unavailable_reason()


FIRST_REQUEST = """
import json, os, sys, time
from pathlib import Path
import torch
sys.path.insert(0, "tests")
from throttle_support import write_policy
from caliber_core import Perturber
from caliber_core.serving.engine_rows import BatchNoise
from caliber_core.throttle import load_policy

cache = Path(os.environ["CALIBER_KERNEL_CACHE"])
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
start = time.perf_counter()
core = BatchNoise(load_policy(write_policy(Path(sys.argv[1]), levels=(0, 1, 2), n_classes=32_000)),
                  key=bytes(range(32)))
built = time.perf_counter() - start
compiled = sorted(p.name for p in cache.glob("*.so"))  # before any request
logits = torch.randn(8, 32_000)
times = []
for step in range(10):
    ids = [bytes([step, row]) for row in range(8)]
    start = time.perf_counter()
    core.serve(logits, [2, 1, 0, 2, 2, 1, 0, 2], ids)
    times.append(time.perf_counter() - start)
print(json.dumps({"built": built, "compiled": compiled, "times": times}))
"""


def test_servers_build_the_kernel_at_start_and_the_first_request_is_as_fast_as_the_tenth(tmp_path):
    # A compile on the first request would cost a second or more in every fresh process; the margin and the
    # three tries absorb a timer that another process's burst can stretch on a loaded machine.
    seen = []
    for attempt in range(3):
        cache = tmp_path / f"cache{attempt}"
        proc = subprocess.run([sys.executable, "-c", FIRST_REQUEST, str(tmp_path / f"p{attempt}")], cwd=ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "CALIBER_KERNEL_CACHE": str(cache)})
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert len(result["compiled"]) == 1  # built (compiled into an empty cache) by the constructor
        first, tenth = result["times"][0], result["times"][9]
        steady = max(tenth, sorted(result["times"][1:])[4])  # the tenth, or the median of the rest if it was lucky
        seen.append(result["times"])
        if first <= 1.5 * steady + 0.01:
            return
    pytest.fail(f"the first request was slower than the tenth in three fresh processes: {seen}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_numpy_arrays_take_the_kernel_with_the_op_by_op_bits(dtype):
    # Perturber serves a numpy array through add_to_array: the kernel's bits are numpy's, masked classes
    # included; a layout the kernel does not take (a strided view, longdouble) goes the op-by-op way.
    rng = np.random.default_rng(7)
    logits = (rng.normal(size=(37, 300)) * 4).astype(dtype)
    logits[2, 9], logits[5, 0] = np.inf, -np.inf
    seeds = [rng.integers(0, 2**63, size=37, dtype=np.uint64) for _ in range(3)]
    increments = (0.7, 0.2, 0.05)
    want = keyed_noise.add_keyed_noise(logits, seeds, increments)
    got = fused_noise.add_to_array(logits, seeds, increments)
    assert got.dtype == logits.dtype and got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()
    strided = logits[:, ::2]
    assert np.array_equal(fused_noise.add_to_array(strided, seeds, increments),
                          keyed_noise.add_keyed_noise(strided, seeds, increments))


def test_perturber_serves_numpy_arrays_through_the_kernel(monkeypatch):
    from caliber_core.serving.runtime import Perturber

    rng = np.random.default_rng(8)
    logits = rng.normal(size=(20, 500)).astype(np.float32)
    ids = [f"row-{i}" for i in range(20)]
    perturber = Perturber(0.9, key=bytes(range(1, 33)))
    calls, real = [], fused_noise._call
    monkeypatch.setattr(fused_noise, "_call", lambda *args: calls.append(args[6]) or real(*args))
    served = perturber.perturb(logits, ids)
    assert calls == ["float32"]  # the dtype the kernel was asked for
    monkeypatch.setitem(fused_noise._state, "library", None)  # as if it were not loaded: numpy's ops
    assert np.array_equal(perturber.perturb(logits, ids), served) and calls == ["float32"]
