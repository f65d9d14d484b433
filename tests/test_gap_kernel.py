"""The compiled row reduction gives the numpy path's numbers, on every kind of row, built with or without AVX2."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from caliber_core import native_build
from caliber_core.calibration import gap_kernel
from caliber_core.calibration.gap_histogram import reduce_block
from caliber_core.simulation.llm_like import llm_like_logits

needs_kernel = pytest.mark.skipif(not gap_kernel.available(), reason=f"no gap kernel: "
                                  f"{gap_kernel.unavailable_reason()}")


def awkward_rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    x = llm_like_logits(14, 5_003, seed=5, dtype=np.float32)  # an odd width: the vector loops' tails
    x[0, :-20] = -np.inf  # fewer finite gaps than kept ones
    x[1, ::2] = x[1].max()  # 2,502 ties at the top: more near gaps than the kernel sorts, the numpy path's row
    x[2] = 0.0
    x[2, 17] = -0.0  # a zero top among signed zeros
    x[3, 100:] -= 1e4  # gaps far past the last bin's edge
    x[4, :-5] = -1e30
    x[5, 7] = x[5].max() + np.float32(1e-6)  # a top just above the rest
    x[6] = rng.integers(-3, 3, size=x.shape[1]).astype(np.float32)  # thousands of equal gaps a bin
    x[7, ::3] = x[7, 1]  # a run of equal gaps below the top
    return x


def labels_for(x: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(9)
    y = rng.integers(0, x.shape[1], size=x.shape[0])
    y[::3] = x[::3].argmax(axis=1)  # some rows right
    y[4] = x.shape[1] - 1  # a label among the few finite logits
    return y


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(u.dtype == v.dtype and np.array_equal(u, v) for u, v in zip(a, b))


@needs_kernel
@pytest.mark.parametrize("m", [1, 8, 32])
def test_the_kernel_gives_the_numpy_paths_numbers(m):
    x = awkward_rows()
    y = labels_for(x)
    assert same(gap_kernel.reduce_rows(x, m=m), reduce_block(x, m=m))
    assert same(gap_kernel.reduce_rows(x, m=m, labels=y), reduce_block(x, m=m, labels=y))
    strided = np.zeros((x.shape[0], x.shape[1] + 13), dtype=np.float32)[:, 5 : 5 + x.shape[1]]
    strided[:] = x  # rows that are not adjacent in memory
    assert same(gap_kernel.reduce_rows(strided, m=m, labels=y), reduce_block(x, m=m, labels=y))


@needs_kernel
def test_the_kernel_reads_a_read_only_map_and_names_a_bad_row(tmp_path):
    x = awkward_rows()
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert same(gap_kernel.reduce_rows(mapped), reduce_block(x))
    for bad in (np.nan, np.inf):
        z = x.copy()
        z[9, 4000] = bad
        with pytest.raises(ValueError, match="row 9 holds NaN or \\+inf"):
            gap_kernel.reduce_rows(z)
    z = x.copy()
    z[11, :] = np.nan
    with pytest.raises(ValueError, match="row 11 holds"):
        gap_kernel.reduce_rows(z)


def test_switched_off_the_numpy_path_reduces_with_the_same_numbers(monkeypatch):
    monkeypatch.setattr(gap_kernel, "_state", {})
    monkeypatch.setenv("CALIBER_GAP_KERNEL", "0")
    assert not gap_kernel.available() and "CALIBER_GAP_KERNEL is off" in gap_kernel.unavailable_reason()
    x = awkward_rows()
    assert same(gap_kernel.reduce_rows(x, labels=labels_for(x)), reduce_block(x, labels=labels_for(x)))


def test_the_portable_build_without_vector_instructions_gives_the_same_numbers(tmp_path):
    """Built without -march=native (what a compiler that lacks it builds): the scalar loops, the same numbers."""
    compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        pytest.skip("no C compiler")
    path = tmp_path / "portable.so"
    subprocess.run([compiler, *gap_kernel._FLAGS, "-o", str(path), str(gap_kernel.SOURCE)], check=True,
                   capture_output=True, timeout=300)
    library = gap_kernel._bind(ctypes.CDLL(str(path)))
    gap_kernel._self_check(library)
    x = awkward_rows()
    y = labels_for(x)
    assert same(gap_kernel._reduce(library, x, 32, y), reduce_block(x, labels=y))


@needs_kernel
def test_narrow_rows_and_every_vector_tail_give_the_same_numbers():
    rng = np.random.default_rng(11)
    for v in (2, 3, 7, 8, 9, 31, 32, 33, 40, 65):
        x = (rng.standard_normal((5, v)) * 3).astype(np.float32)
        x[1, : v // 2] = -np.inf
        x[2, :] = x[2, 0]  # every logit tied
        y = rng.integers(0, v, size=5)
        for m in (1, 32):
            assert same(gap_kernel.reduce_rows(x, m=m, labels=y), reduce_block(x, m=m, labels=y)), (v, m)
            assert same(gap_kernel.reduce_rows(x, m=m), reduce_block(x, m=m)), (v, m)


def test_without_a_compiler_the_numpy_path_reduces_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(gap_kernel, "_state", {})
    monkeypatch.setenv("CALIBER_KERNEL_CACHE", str(tmp_path))  # nothing built there yet
    monkeypatch.delenv("CALIBER_GAP_KERNEL", raising=False)
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    assert not gap_kernel.available() and "no C compiler" in gap_kernel.unavailable_reason()
    x = awkward_rows()
    assert same(gap_kernel.reduce_rows(x), reduce_block(x))
