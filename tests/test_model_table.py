"""The Data page's model table: margins given or computed give the same row, S as margins.all_scales."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.calibration import margins
from caliber_core.loading import LogitsData
from caliber_core.loading.checks import margins_in_chunks
from caliber_dashboard.common import tables


def _data(n=3000, k=12, *, labels=True, seed=0) -> LogitsData:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k))
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += 1.5
    return LogitsData(name=f"m{seed}", logits=z, labels=y if labels else None,
                      sha256=f"{seed:064x}", source=f"dir/m{seed}.npy")


def test_given_margins_give_the_same_table_as_computed_ones():
    datas = [_data(seed=1), _data(seed=2, labels=False)]
    given = tables.model_table(datas, margins=[margins_in_chunks(d.logits) for d in datas])
    computed = tables.model_table(datas)
    assert given.equals(computed)
    for (_, row), d in zip(computed.iterrows(), datas):
        ref = margins.all_scales(d.logits)
        assert row["S median"] == ref["median"]
        assert row["S mean"] == pytest.approx(ref["mean"], rel=1e-12)
        assert row["S trimmed"] == pytest.approx(ref["trimmed"], rel=1e-12)
        assert row["file"] == d.source.rsplit("/", 1)[-1]
    assert computed.iloc[0]["A0"] == margins.clean_accuracy(datas[0].logits, datas[0].labels)
    assert np.isnan(computed.iloc[1]["A0"])


def test_logits_are_not_changed_and_ties_give_nan():
    d = _data(n=50, k=3)
    d.logits[:, 1] = d.logits[:, 0] = d.logits.max(axis=1) + 1  # every row ties: S = 0
    before = d.logits.copy()
    row = tables.model_table([d]).iloc[0]
    assert np.isnan(row["S median"])
    assert np.array_equal(d.logits, before)


def test_margins_must_match_the_models():
    d = _data(n=100)
    with pytest.raises(ValueError, match="one array per model"):
        tables.model_table([d], margins=[])
    with pytest.raises(ValueError, match=r"shape \(100,\)"):
        tables.model_table([d], margins=[np.ones(99)])


def test_histogram_rows_are_evenly_spaced_and_deterministic():
    m = np.arange(45_000, dtype=np.float64)
    x = tables.histogram_rows(m, max_rows=10_000)
    assert x.size == 10_000 and x[0] == 0 and x[-1] == 44_999
    assert np.all(np.diff(x) >= 4) and np.all(np.diff(x) <= 5)  # 44,999 / 9,999 = 4.5
    assert np.array_equal(x, tables.histogram_rows(m, max_rows=10_000))
    small = np.ones(500)
    assert tables.histogram_rows(small) is small
    with pytest.raises(ValueError, match="max_rows must be an integer >= 2"):
        tables.histogram_rows(m, max_rows=1)
    with pytest.raises(ValueError, match="1-D"):
        tables.histogram_rows(np.ones((3, 3)))
