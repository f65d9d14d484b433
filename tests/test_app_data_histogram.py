"""AppTest: a file with more rows than the margin histogram draws says so under the histogram."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_dashboard.common import tables

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")


def _npz(n: int, k: int = 4) -> bytes:
    rng = np.random.default_rng(n)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += 2.0
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y)
    return buf.getvalue()


def _captions(at) -> str:
    return " ".join(str(c.value) for c in at.main.caption)


def test_large_file_histogram_is_drawn_from_stated_rows():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert "evenly spaced rows" not in _captions(at)  # the demo files are small
    n = tables.HIST_MAX_ROWS + 2_000
    content = _npz(n)
    at.file_uploader(key="upload_logits").set_value(("wide.npz", content, "application/octet-stream")).run()
    assert not at.exception
    at.multiselect(key="hist_models").select(hashlib.sha256(content).hexdigest()).run()
    assert not at.exception
    # file names pass through ui.plain, which escapes Markdown characters
    shown = _captions(at).replace("\\", "")
    assert "evenly spaced rows of the larger files" in shown
    assert f"wide ({tables.HIST_MAX_ROWS:,} of {n:,} rows)" in shown


def test_the_histogram_figure_is_built_once_per_models_and_axis():
    # Every Data page run draws it: the same models and axis reuse one figure, anything else builds its own.
    from caliber_core.calibration.margins import scale_from_margins
    from caliber_core.loading import LogitsData
    from caliber_dashboard.common import cache, figures

    rng = np.random.default_rng(3)
    models = [LogitsData(logits=rng.normal(size=(300, 5)) * s, labels=None, name=f"m{i}", sha256=f"{i}" * 64,
                         source="test") for i, s in enumerate((1.0, 2.0))]
    shown = [("first", models[0]), ("second", models[1])]
    fig = cache.margin_histogram(shown, normalized=False)
    assert cache.margin_histogram(shown, normalized=False) is fig
    scaled = cache.margin_histogram(shown, normalized=True)
    assert scaled is not fig and cache.margin_histogram(shown[:1], normalized=False) is not fig
    m = cache.margins(models[1])
    expected = figures.margin_histogram({"first": cache.margins(models[0]), "second": m})
    assert fig.to_json() == expected.to_json()
    assert np.allclose(scaled.data[1].x, m / scale_from_margins(m))
