"""The loader's margin check, computed a block of rows at a time: same values, same verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.calibration.margins import top_two_margins
from caliber_core.loading import LogitsFileError, checks


@pytest.mark.parametrize("n, k, chunk", [(1, 2, 4), (1000, 7, 70), (1001, 7, 70), (999, 7, 7), (50, 3, 1 << 20)])
def test_chunked_margins_equal_one_pass(monkeypatch, n, k, chunk):
    monkeypatch.setattr(checks, "_MARGIN_CHUNK_ELEMENTS", chunk)
    z = np.random.default_rng(n * k).normal(size=(n, k))
    z[::5, 1] = z[::5, 0]  # ties: margin 0
    got = checks.margins_in_chunks(z)
    assert got.dtype == np.float64 and got.shape == (n,)
    assert np.array_equal(got, top_two_margins(z))


def test_degenerate_verdict_across_chunks(monkeypatch):
    monkeypatch.setattr(checks, "_MARGIN_CHUNK_ELEMENTS", 40)  # 10 rows per block of K=4
    z = np.zeros((300, 4))
    z[:100, 0] = 1.0  # the rows with a winner all sit in the first blocks
    with pytest.raises(LogitsFileError, match=r"f\.npy: logits are degenerate: .* 67% of rows tie"):
        checks.check_margin_scale(z, "f.npy")
    z[:, 0] = np.arange(300) + 1.0
    checks.check_margin_scale(z, "f.npy")  # every row has a winner: no error
