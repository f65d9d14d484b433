"""The request check's one pass over CPU rows (fused_noise.min_max) against numpy's min and max, and the refusals
it leads to, for every dtype, numpy and torch, contiguous and strided rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from caliber_core.serving import fused_noise, rows

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not fused_noise.prepare(), reason="no C compiler: the fused kernel is not built")


def one_pass(values):
    return rows._min_max_in_one_pass(values, isinstance(values, torch.Tensor))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_the_one_pass_is_numpys_min_and_max_on_random_rows(dtype):
    rng = np.random.default_rng(7)
    for case in range(20):
        n_rows, n_classes = int(rng.integers(1, 9)), int(rng.integers(1, 3000))
        wide = rng.standard_normal((n_rows, n_classes)) * rng.choice([1.0, 100.0, 6e4])
        if case % 3 == 0:
            wide[rng.integers(n_rows), rng.integers(n_classes)] = rng.choice([np.inf, -np.inf])
        tensor = torch.from_numpy(wide).to(dtype)
        exact = tensor.to(torch.float64).numpy()
        assert one_pass(tensor) == (exact.min(), exact.max())
        if dtype != torch.bfloat16:  # numpy has no bfloat16
            array = tensor.numpy()
            assert one_pass(array) == (exact.min(), exact.max())
            assert one_pass(array[:, ::1][::-1]) == (exact.min(), exact.max())  # rows in reverse: a negative stride


def test_a_nan_anywhere_is_found_and_refused_with_its_place():
    for dtype in (np.float64, np.float32, np.float16):
        values = np.zeros((5, 777), dtype=dtype)
        values[3, 500] = np.nan
        smallest, largest = one_pass(values)
        assert math.isnan(smallest)
        with pytest.raises(ValueError, match=r"NaN \(first at row 3, class 500\)"):
            rows.check_values(values, limit=1e3)
        tensor = torch.from_numpy(values)
        with pytest.raises(ValueError, match=r"NaN \(first at row 3, class 500\)"):
            rows.check_values(tensor, limit=1e3)


def test_a_masked_class_passes_and_a_value_beyond_the_limit_is_refused():
    values = torch.randn(4, 1000)
    values[1, 10] = -math.inf  # a masked class
    rows.check_values(values, limit=100.0)
    values[2, 20] = 250.0
    with pytest.raises(ValueError, match=r"250.0 at row 2, class 20: beyond 100"):
        rows.check_values(values, limit=100.0)


def test_what_the_pass_does_not_take_is_left_to_the_general_check():
    wide = np.random.default_rng(1).standard_normal((3, 64))
    assert one_pass(wide[:, ::2]) is None  # columns not contiguous
    assert one_pass(wide.astype(">f8")) is None  # byte-swapped
    assert one_pass(np.zeros((0, 5))) is None
    assert one_pass(torch.zeros(3, 4, dtype=torch.float64).t()) is None
    assert one_pass(np.arange(6, dtype=np.int64).reshape(2, 3)) is None
    rows.check_values(wide[:, ::2], limit=1e3)  # the general check still serves them
