"""No small file becomes a large array: uploads are counted as they will be materialized.

Each hostile file below is a few kilobytes that claims (or decompresses to)
30,000,000 values, three times the dashboard's element limit and 240 MB as
float64: a ``.pt`` holding one stored row expanded to 30,000 (and a zero-stride
view), a 1,000:1 compressed ``.npz``, a compressed ``.parquet``, and a CSV just
over the limit. Each is refused through the dashboard's loader in a fresh
process, whose peak resident memory must grow by less than 200 MB.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from caliber_dashboard.common import upload_boundary

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
ROWS, COLS = 30_000, 1_000  # 3e7 values: 240 MB as float64
GROWTH_LIMIT_MB = 200

# Runs in a fresh interpreter: libraries imported first, then the peak RSS before and after the load.
_MEASURE = r"""
import json, resource, sys
import numpy, pandas, pyarrow.parquet, torch
from caliber_dashboard.common import upload_boundary
path, name = sys.argv[1], sys.argv[2]
content = open(path, "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    upload_boundary.load_logits(content, name)
    message = None
except Exception as exc:
    message = upload_boundary.message(exc, name)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"message": message, "growth_mb": (after - before) / 1024}))
"""


def _measure(tmp_path, name: str, content: bytes) -> dict:
    path = tmp_path / "upload.bin"
    path.write_bytes(content)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(upload_boundary.MAX_ELEMENTS_ENV, None)
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(path), name], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expanded_pt(*, strided: bool = False) -> bytes:
    import torch

    row = torch.randn(COLS, dtype=torch.float32)
    big = (torch.as_strided(row, (ROWS, COLS), (0, 1)) if strided else row.expand(ROWS, COLS))
    buf = io.BytesIO()
    torch.save({"logits": big, "labels": torch.zeros(1, dtype=torch.int64).expand(ROWS)}, buf)
    return buf.getvalue()


def _compressed_npz() -> bytes:
    """A float64 (ROWS, COLS) member of zeros, deflated, written a block at a time (never held whole)."""
    buf = io.BytesIO()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (ROWS, COLS)})
    block = bytes(8 * COLS * 100)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("logits.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            for _ in range(ROWS // 100):
                member.write(block)
    return buf.getvalue()


def _compressed_parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = 100
    batch_rows = 20_000
    schema = pa.schema([(f"c{i}", pa.float64()) for i in range(cols)])
    zeros = pa.array(np.zeros(batch_rows))
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema, compression="zstd") as writer:
        for _ in range(ROWS * COLS // (cols * batch_rows)):
            writer.write_table(pa.table([zeros] * cols, schema=schema))
    return buf.getvalue()


def test_the_hostile_files_are_small():
    pt, npz = _expanded_pt(), _compressed_npz()
    assert len(pt) < 20_000  # the stored row and the archive's bookkeeping
    assert len(npz) * 1000 < ROWS * COLS * 8 * 1.2  # about 1,000:1
    assert upload_boundary.max_elements() < ROWS * COLS


@pytest.mark.parametrize("name, make", [
    ("expanded.pt", _expanded_pt),
    ("strided.pt", lambda: _expanded_pt(strided=True)),
    ("bomb.npz", _compressed_npz),
    ("bomb.parquet", _compressed_parquet),
])
def test_a_small_file_claiming_a_large_array_is_refused_before_it_is_built(tmp_path, name, make):
    found = _measure(tmp_path, name, make())
    message = found["message"]
    assert message is not None, f"{name} was loaded"
    assert message.startswith(f"{name}: ") and "\n" not in message and len(message) <= 400
    assert "max_elements=10,000,000" in message or "more than" in message, message
    assert "--max-elements" not in message  # the dashboard names its own setting
    assert found["growth_mb"] < GROWTH_LIMIT_MB, found


def test_a_csv_over_the_limit_is_refused_from_its_text(tmp_path):
    limit = upload_boundary.max_elements()
    cols = 100
    rows = limit // cols + 10
    text = ",".join(f"c{i}" for i in range(cols)) + "\n" + ("0," * (cols - 1) + "0\n") * rows
    found = _measure(tmp_path, "wide.csv", text.encode())
    assert found["message"] and "rows" in found["message"] and "more than" in found["message"]
    assert found["growth_mb"] < GROWTH_LIMIT_MB, found


def test_the_limit_is_a_setting_never_above_the_core_default(monkeypatch):
    from caliber_core.loading import DEFAULT_MAX_ELEMENTS

    assert upload_boundary.max_elements({}) == min(10_000_000, DEFAULT_MAX_ELEMENTS)
    assert upload_boundary.max_elements({upload_boundary.MAX_ELEMENTS_ENV: "2_000"}) == 2000
    assert upload_boundary.max_elements({upload_boundary.MAX_ELEMENTS_ENV: str(10**15)}) == DEFAULT_MAX_ELEMENTS
    with pytest.raises(ValueError, match=upload_boundary.MAX_ELEMENTS_ENV):
        upload_boundary.max_elements({upload_boundary.MAX_ELEMENTS_ENV: "-5"})


def test_the_data_page_refuses_the_expanded_pt_in_one_line_and_keeps_nothing():
    from streamlit.testing.v1 import AppTest

    from caliber_dashboard.common import state

    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    before = dict(at.session_state[state.MODELS])
    at.file_uploader(key="upload_logits").set_value(("expanded.pt", _expanded_pt(),
                                                     "application/octet-stream")).run()
    assert not at.exception
    errors = [e.value.replace("\\", "") for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("expanded.pt: logits shape (30000, 1000)"), errors
    assert dict(at.session_state[state.MODELS]) == before


def test_a_visitor_holds_at_most_the_session_budget(monkeypatch):
    """Many small uploads cannot add up past CALIBER_VISITOR_MAX_ELEMENTS: the next is refused, nothing stored."""
    from streamlit.testing.v1 import AppTest

    from caliber_dashboard.common import state

    def npz(seed):
        rng = np.random.default_rng(seed)
        buf = io.BytesIO()
        np.savez(buf, logits=rng.normal(size=(300, 5)), labels=rng.integers(0, 5, 300))
        return buf.getvalue()

    demo = sum(d.logits.size for d in state.demo_models())
    monkeypatch.setenv(upload_boundary.MAX_ELEMENTS_ENV, "2000")
    monkeypatch.setenv(upload_boundary.VISITOR_MAX_ELEMENTS_ENV, str(demo + 2 * 1500 + 100))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    for seed in (1, 2):
        at.file_uploader(key="upload_logits").set_value((f"m{seed}.npz", npz(seed), "application/octet-stream")).run()
    assert not at.exception and len(at.session_state[state.MODELS]) == len(state.demo_models()) + 2
    at.file_uploader(key="upload_logits").set_value(("m3.npz", npz(3), "application/octet-stream")).run()
    errors = [e.value.replace("\\", "") for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("m3.npz: 1,500 values would bring") and "\n" not in errors[0]
    assert len(at.session_state[state.MODELS]) == len(state.demo_models()) + 2
    assert upload_boundary.visitor_max_elements({}) == 40_000_000
