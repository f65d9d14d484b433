"""The compiled agreement bounds keep the numpy path's bounds: within the table's stated error, and without scipy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtr

from caliber_core.calibration import bound_kernel
from caliber_core.calibration.full_vocab import config_for_vocab_file
from caliber_core.calibration.gap_histogram import ReducedRows, reduce_block, row_bounds
from caliber_core.simulation.llm_like import exact_agreement, llm_like_logits

needs_kernel = pytest.mark.skipif(not bound_kernel.available(), reason=f"no bound kernel: "
                                  f"{bound_kernel.unavailable_reason()}")
V = 16_384
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def logits():
    x = llm_like_logits(40, V, seed=23, dtype=np.float32)
    x[0, :-20] = -np.inf  # fewer finite gaps than kept ones
    x[1, :40] = x[1].max()  # ties at the top
    x[2, 100:] -= 1e4  # a tail far past every factor's 1.0
    return x


def reduced_of(x) -> ReducedRows:
    return ReducedRows(*reduce_block(x), x.shape[1])


@pytest.fixture
def numpy_path(monkeypatch):
    """Run the bounds through the numpy path (the kernel taken as not built) for the test's duration."""
    monkeypatch.setattr(bound_kernel, "_state", {"library": None, "reason": "switched off by the test"})


@needs_kernel
def test_phi_read_from_the_table_is_within_its_stated_error():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-8.5, 8.5, 1_000_000), np.linspace(-8.5, 8.5, 17 * 256 + 1),
                        [-20.0, -8.6, 8.5, 8.3, 9.0]])  # past the table the C library's erfc serves
    error = np.abs(bound_kernel.phi_read(x) - ndtr(x))
    assert bound_kernel.phi_table_error() == 4e-13
    assert error.max() <= bound_kernel.phi_table_error()
    assert error.max() > 1e-14  # a table, not the exact function: the bound is what keeps the rows' bounds


@needs_kernel
@pytest.mark.parametrize("sigma", [0.05, 0.3, 0.9, 2.0, 6.0, 40.0])
def test_the_kernel_bounds_contain_the_numpy_paths_and_are_at_most_the_stated_width_wider(logits, sigma,
                                                                                          monkeypatch):
    red = reduced_of(logits)
    got = row_bounds(red, sigma, step=0.3)
    with monkeypatch.context() as patch:
        patch.setattr(bound_kernel, "_state", {"library": None, "reason": "test"})
        want = row_bounds(red, sigma, step=0.3)
    slack = 32 * bound_kernel.phi_table_error()
    f32 = 1e-6  # the tails are float32 sums, taken over other bins in another order
    assert np.all(got.agree_lo <= want.agree_lo * (1 + f32) + 1e-300)
    assert np.all(got.agree_hi >= want.agree_hi * (1 - f32))
    assert np.all(got.agree_lo >= want.agree_lo * (1 - f32) - slack)
    assert np.all(got.agree_hi <= want.agree_hi * (1 + f32) + slack)
    truth = exact_agreement(logits.astype(np.float64), sigma, step=0.3)
    assert np.all(got.agree_lo <= truth + 1e-9) and np.all(truth <= got.agree_hi + 1e-9)


@needs_kernel
def test_a_config_from_the_kernel_serves_the_numpy_paths_sigmas(logits, tmp_path, monkeypatch):
    path = tmp_path / "dump.npy"
    np.save(path, logits)
    targets = [("agreement", 0.9), ("agreement", 0.8)]
    _, compiled = config_for_vocab_file(path, targets)
    monkeypatch.setattr(bound_kernel, "_state", {"library": None, "reason": "test"})
    _, plain = config_for_vocab_file(path, targets)
    for a, b in zip(compiled["targets"], plain["targets"]):
        assert abs(a["sigma"] - b["sigma"]) <= 1e-9 * b["sigma"]
    assert compiled["sha256"] == plain["sha256"]


def test_the_numpy_path_serves_where_the_kernel_is_switched_off(logits, numpy_path):
    assert not bound_kernel.available()
    red = reduced_of(logits[:8])
    b = row_bounds(red, 0.7, step=0.3)
    assert np.all(b.agree_lo <= b.agree_hi) and np.all((0 <= b.agree_lo) & (b.agree_hi <= 1))
    with pytest.raises(RuntimeError, match="not available: test|switched off"):
        bound_kernel.phi_read(np.zeros(1))


@needs_kernel
def test_an_unlabelled_dump_is_calibrated_without_importing_scipy_special(logits, tmp_path):
    path = tmp_path / "dump.npy"
    np.save(path, logits)
    out = tmp_path / "cfg.json"
    code = ("import sys; from caliber_core.cli import main; "
            f"rc = main(['calibrate', {str(path)!r}, '--agreement', '0.9', '0.8', '--out', {str(out)!r}, '--quiet']); "
            "print(rc, 'scipy.special' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout
    assert len(json.loads(out.read_text())["targets"]) == 2
