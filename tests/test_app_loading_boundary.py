"""One error boundary for loading: crafted headers of every format give one line, never a traceback.

Each format's header fields are fuzzed (shapes with 70 dimensions, ``[2**62, 0]``,
negative and fractional sizes, unknown dtypes, offsets past the data, a
5,000-digit integer in JSON, flipped bytes in binary footers). Every result is
either a loaded file or a :class:`LogitsFileError` of one bounded line naming
the upload; the dashboard's :func:`upload_boundary.message` turns anything
else into one line too, and Streamlit is told to show no error details.
"""

from __future__ import annotations

import io
import json
import random
import struct
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from caliber_core.loading import LogitsData, LogitsFileError, load_logits_bytes
from caliber_dashboard.common import upload_boundary

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "caliber_dashboard" / "app.py")
BAD_SHAPES = [[1] * 70, [2**62, 0], [0, 2**62], [-1, 3], [1.5, 2], "ab", [2**64, 2], [], [3], [2, 3, 4],
              [10**30, 10**30], None, {"a": 1}, [True, 2]]
BAD_DTYPES = ["X", 5, None, [], "F64" * 50, "BOOL", "C64", "BF16", "F8_E4M3", "U8"]


def _outcome(content: bytes, name: str) -> str:
    """'loaded' or the refusal's line; anything but LogitsFileError fails the test."""
    try:
        data = load_logits_bytes(content, name, max_elements=upload_boundary.max_elements())
    except LogitsFileError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) <= 400 and text.startswith(f"{name}: "), text
        assert "Traceback" not in text and "/tmp" not in text and str(ROOT) not in text, text
        shown = upload_boundary.message(exc, name)
        assert shown.startswith(f"{name}: ") and "\n" not in shown and "--max-elements" not in shown
        return text
    assert isinstance(data, LogitsData)
    return "loaded"


# ----------------------------------------------------------------------------- safetensors


def _safetensors(entries: dict, data: bytes = b"", metadata=None) -> bytes:
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_safetensors_shapes(shape):
    _outcome(_safetensors({"logits": {"dtype": "F64", "shape": shape, "data_offsets": [0, 8]}}, b"\0" * 8),
             "f.safetensors")
    _outcome(_safetensors({"logits": {"dtype": "F64", "shape": shape, "data_offsets": [0, 0]}}), "f.safetensors")


def test_safetensors_issue_cases_name_the_rule():
    assert "70 dimensions" in _outcome(_safetensors(
        {"logits": {"dtype": "F64", "shape": [1] * 70, "data_offsets": [0, 8]}}, b"\0" * 8), "d.safetensors")
    assert "dimension" in _outcome(_safetensors(
        {"logits": {"dtype": "F64", "shape": [2**62, 0], "data_offsets": [0, 0]}}), "z.safetensors")


@pytest.mark.parametrize("dtype", BAD_DTYPES)
@pytest.mark.parametrize("offsets", [[0, 48], [0, 2**70], [-1, 0], [5, 1], "x", [0], [0, 48, 1], [1.0, 48]])
def test_safetensors_dtypes_and_offsets(dtype, offsets):
    _outcome(_safetensors({"logits": {"dtype": dtype, "shape": [3, 2], "data_offsets": offsets}}, b"\1" * 48),
             "f.safetensors")


@pytest.mark.parametrize("metadata", [{"name": 5}, {"name": "<b>x</b>" * 5000}, {"name": {"a": [1] * 10}}, [1],
                                      "x", {"name": "\x00\n\r"}])
def test_safetensors_metadata(metadata):
    z = np.random.default_rng(0).normal(size=(40, 3))
    _outcome(_safetensors({"logits": {"dtype": "F64", "shape": [40, 3], "data_offsets": [0, z.nbytes]}},
                          z.astype("<f8").tobytes(), metadata=metadata), "m.safetensors")


def test_safetensors_header_length_bytes():
    rng = random.Random(7)
    good = _safetensors({"logits": {"dtype": "F64", "shape": [2, 2], "data_offsets": [0, 32]}}, b"\0" * 32)
    for _ in range(40):
        head = bytearray(good)
        head[rng.randrange(0, 8)] = rng.randrange(256)
        _outcome(bytes(head), "h.safetensors")
    _outcome(b'\x05\x00\x00\x00\x00\x00\x00\x00{"a":' + b"9" * 5000, "h.safetensors")
    _outcome(struct.pack("<Q", 5003) + b'{"a":' + b"9" * 5000 + b"}" + b"\0" * 8, "h.safetensors")
    _outcome(struct.pack("<Q", 4000) + b"[" * 4000, "h.safetensors")


# ----------------------------------------------------------------------------- npy and npz


def _npy_with_header(header: str, data: bytes = b"\0" * 64, version: bytes = b"\x01\x00") -> bytes:
    text = header.encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY" + version + struct.pack("<H", len(text)) + text + data


def _headers():
    for shape in BAD_SHAPES + [(3, 2)]:
        shown = repr(tuple(shape)) if isinstance(shape, list) else repr(shape)
        yield "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }" % shown
    for descr in ["'|O'", "'<U5'", "'<c16'", "'foo'", "5", "[('a', '<f8')]", "'<f8' * 3", "'V8'", "'<M8[s]'"]:
        yield "{'descr': %s, 'fortran_order': False, 'shape': (3, 2), }" % descr
    for order in ["True", "2", "'x'", "None"]:
        yield "{'descr': '<f8', 'fortran_order': %s, 'shape': (3, 2), }" % order
    yield "{'descr': '<f8', 'fortran_order': False, 'shape': (%s, 2), }" % ("9" * 5000)
    yield "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), 'extra': __import__('os'), }"
    yield "{'descr': '<f8', 'fortran_order': False}"
    yield "[" * 500
    yield "not a dict at all"


@pytest.mark.parametrize("header", list(_headers()))
def test_npy_header_fields(header):
    _outcome(_npy_with_header(header), "f.npy")
    _outcome(_npy_with_header(header, version=b"\x03\x00"), "f.npy")


@pytest.mark.parametrize("header", list(_headers()))
def test_npz_member_header_fields(header):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logits.npy", _npy_with_header(header))
    _outcome(buf.getvalue(), "f.npz")
    # The same header as a separate labels file, and as the labels member beside good logits.
    z = np.random.default_rng(1).normal(size=(3, 2))
    good = io.BytesIO()
    np.save(good, z)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("logits.npy", good.getvalue())
        zf.writestr("labels.npy", _npy_with_header(header))
    _outcome(buf.getvalue(), "g.npz")
    try:
        load_logits_bytes(good.getvalue(), "z.npy", labels_content=_npy_with_header(header),
                          labels_filename="y.npy")
    except LogitsFileError as exc:
        assert "\n" not in str(exc)


def test_npz_directory_fields_lie():
    z = np.random.default_rng(2).normal(size=(50, 4))
    buf = io.BytesIO()
    np.savez(buf, logits=z)
    raw = bytearray(buf.getvalue())
    rng = random.Random(3)
    central = raw.rfind(b"PK\x01\x02")
    for _ in range(60):
        mutated = bytearray(raw)
        at = rng.randrange(central, len(raw))
        mutated[at] = rng.randrange(256)
        _outcome(bytes(mutated), "d.npz")


# ----------------------------------------------------------------------------- pt, parquet, csv, json


def test_pt_flipped_bytes():
    import torch

    buf = io.BytesIO()
    torch.save({"logits": torch.randn(50, 4), "labels": torch.arange(50) % 4, "name": "m"}, buf)
    raw = buf.getvalue()
    rng = random.Random(4)
    for _ in range(60):
        mutated = bytearray(raw)
        for _ in range(3):
            mutated[rng.randrange(len(raw))] = rng.randrange(256)
        _outcome(bytes(mutated), "f.pt")


def test_parquet_flipped_footer_bytes():
    import pandas as pd

    df = pd.DataFrame(np.random.default_rng(5).normal(size=(60, 3)), columns=["a", "b", "c"])
    df["label"] = np.arange(60) % 3
    buf = io.BytesIO()
    df.to_parquet(buf)
    raw = buf.getvalue()
    rng = random.Random(6)
    for _ in range(60):
        mutated = bytearray(raw)
        mutated[rng.randrange(max(0, len(raw) - 400), len(raw) - 8)] = rng.randrange(256)
        _outcome(bytes(mutated), "f.parquet")


@pytest.mark.parametrize("text", [
    "a,b,label\n" + "9" * 5000 + ",1,0\n",
    "a,b,label\n1e999999,1,0\n",
    "a,b,label\nnan,1,0\n",
    "a,b,label\n1,2,0,4,5\n",
    '"a\n,b",label\n1,0\n',
    "a" * 100_000 + "\n1\n",
    "a,b,label\n1,2," + "9" * 5000 + "\n",
    "\ufeff,,\n,,\n",
])
def test_csv_fields(text):
    _outcome(text.encode(), "f.csv")


@pytest.mark.parametrize("line", [
    '{"doc_id": 0, "target": ' + "9" * 5000 + "}",
    "[" * 100_000,
    '{"doc_id": 0, "resps": [[["-1.5", true]]], "target": 0, "doc": {}}',
    '{"doc_id": 0, "filtered_resps": [[' + "9" * 5000 + ', true]], "target": 0}',
    "[]",
    '"text"',
    "1e400",
])
def test_json_records(line):
    for name in ("samples_task.jsonl", "samples_task.json"):
        _outcome((line + "\n").encode(), name)


# ----------------------------------------------------------------------------- the dashboard's side


def test_unexpected_errors_become_one_line_with_the_type_only():
    assert upload_boundary.message(RuntimeError("/srv/secret/path\nTraceback (most recent call last)"),
                                   "x.npz") == "x.npz: could not be read (RuntimeError)"
    assert upload_boundary.message(ValueError("a\nb"), "x.npz") == "x.npz: a b"
    assert len(upload_boundary.message(ValueError("v" * 5000), "x.npz")) <= upload_boundary.MESSAGE_MAX_CHARS


def test_streamlit_shows_no_error_details():
    from streamlit.config import ShowErrorDetailsConfigOptions

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["client"]["showErrorDetails"] == ShowErrorDetailsConfigOptions.NONE


@pytest.mark.parametrize("name, content", [
    ("d.safetensors", _safetensors({"logits": {"dtype": "F64", "shape": [1] * 70, "data_offsets": [0, 8]}},
                                   b"\0" * 8)),
    ("z.safetensors", _safetensors({"logits": {"dtype": "F64", "shape": [2**62, 0], "data_offsets": [0, 0]}})),
    ("samples_t.json", b'{"doc_id": 0, "target": ' + b"9" * 5000 + b"}\n"),
])
def test_every_upload_page_shows_one_line(name, content):
    """The Data page's logits and labels boxes, Extraction's archive box, Policy's and Export's config boxes."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    boxes = [(None, "upload_logits", name), (None, "upload_labels", "labels.npy"),
             ("pages/extraction.py", "extraction_upload", "archive.npz"),
             ("pages/policy.py", "policy_config_upload", "cfg.json"),
             ("pages/export.py", "import_config", "cfg.json")]
    for page, key, shown in boxes:
        if page is not None:
            at.switch_page(page).run()
        at.file_uploader(key=key).set_value((shown, content, "application/octet-stream")).run()
        assert not at.exception, (key, at.exception)
        errors = [e.value.replace("\\", "") for e in at.error]
        assert errors, key
        for text in errors:
            assert "\n" not in text and "Traceback" not in text and str(ROOT) not in text, text
