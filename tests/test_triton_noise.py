"""The hand-written Triton kernel (triton_noise) against numpy's reference, bit for bit: on the CPU under Triton's
interpreter (where Triton is installed), on CUDA as compiled for the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

# Random shapes (K not a multiple of any block), dtypes, levels, keys and served counts; one JSON line a case.
_CASES = r"""
import json, sys
import numpy as np, torch
from caliber_core.serving import compiled_noise, keyed_noise, triton_noise
from tests.test_compiled_noise import BITS, TORCH_DTYPES, bits_of, random_case, served_reference

device = sys.argv[1]
if device != "cpu":
    triton_noise.time_configs(device, n_rows=8, n_classes=4096, repeats=2)
if len(sys.argv) > 4:
    triton_noise.select_config(device, json.loads(sys.argv[4]))
rng = np.random.default_rng(int(sys.argv[2]))
table = torch.from_numpy(keyed_noise.gather_table()).to(device)
for case in range(int(sys.argv[3])):
    dtype = TORCH_DTYPES[case % 4]
    n_levels = 1 + case % 3
    n_rows, n_classes = int(rng.integers(1, 9)), int(rng.choice([1, 7, 513, 1000, 4099]))
    logits, seeds, increments, served = random_case(rng, dtype, n_rows, n_classes, n_levels)
    got = compiled_noise.call(triton_noise.noisy_logits, logits.to(device), seeds, increments, served)
    same = np.array_equal(bits_of(got), served_reference(logits, seeds, increments, served))
    print(json.dumps({"dtype": str(dtype), "levels": n_levels, "shape": [n_rows, n_classes], "equal": same}))
"""


def run_cases(device: str, seed: int, cases: int, interpret: bool, config=None) -> list:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if interpret:
        env["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated, so in a process of its own
    done = subprocess.run([sys.executable, "-c", _CASES, device, str(seed), str(cases)] + ([json.dumps(config)] if config else []), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_kernel_under_triton_s_interpreter_is_numpys_reference():
    results = run_cases("cpu", 41, 16, interpret=True, config=[512, 4])
    assert len(results) == 16
    assert [r for r in results if not r["equal"]] == []
    assert {r["dtype"] for r in results} == {"torch.float64", "torch.float32", "torch.float16", "torch.bfloat16"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("config", [None, [512, 4], [2048, 8]])
def test_the_kernel_on_cuda_is_numpys_reference(config):
    results = run_cases("cuda", 42, 48, interpret=False, config=config)
    assert len(results) == 48
    assert [r for r in results if not r["equal"]] == []
