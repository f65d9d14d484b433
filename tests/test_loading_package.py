"""Tests for the structure of caliber_core.loading: the shared safety layer and its parsers.

tests/test_loading.py checks every format end to end; this file checks what the
package promises about *how*: sizes are checked before the allocating library
call of each format, the safetensors header rules agree with the safetensors
package, one sanitizer bounds every message, and the package stays light.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import safetensors
import safetensors.numpy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy_format

from caliber_core.loading import LogitsFileError, load_logits_bytes
from caliber_core.loading import npy as npy_reader
from caliber_core.loading.safety import MESSAGE_MAX_CHARS, clean_name, display_name, fail, one_line

PACKAGE = Path(__file__).resolve().parents[1] / "caliber_core" / "loading"
HUGE = (10**7, 10**7)
SHARED_COUNT_MESSAGE = r"logits shape \(10000000, 10000000\) has 100,000,000,000,000 elements, more than max_elements="


class Allocated(BaseException):
    """Raised by a patched allocating call; a BaseException so no wrapper can hide it."""


def _forbid(monkeypatch, owner, name: str) -> None:
    def boom(*args, **kwargs):
        raise Allocated(f"{name} was called")

    monkeypatch.setattr(owner, name, boom)


def _npy_header(shape, descr="<f8") -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _zip(**members: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return buf.getvalue()


def _logits(n=300, k=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, k)), rng.integers(0, k, size=n)


# ------------------------------------------ the size check precedes allocation


def test_npy_huge_header_never_reaches_numpys_array_reader(monkeypatch):
    _forbid(monkeypatch, npy_format, "read_array")
    _forbid(monkeypatch, npy_reader, "view_data")  # a whole .npy is read as a view of its bytes
    with pytest.raises(LogitsFileError, match=r"^huge\.npy: " + SHARED_COUNT_MESSAGE):
        load_logits_bytes(_npy_header(HUGE) + b"\0" * 64, "huge.npy")


def test_npz_huge_member_header_never_reaches_numpys_array_reader(monkeypatch):
    content = _zip(**{"logits.npy": _npy_header(HUGE) + b"\0" * 64})
    _forbid(monkeypatch, npy_format, "read_array")
    with pytest.raises(LogitsFileError, match=r"^huge\.npz: " + SHARED_COUNT_MESSAGE):
        load_logits_bytes(content, "huge.npz")


def test_labels_files_huge_headers_never_reach_numpys_array_reader(monkeypatch):
    z, _ = _logits()
    buf = io.BytesIO()
    np.save(buf, z)
    logits_npy = buf.getvalue()
    labels_npy = _npy_header((10**12,), "<i8")
    labels_npz = _zip(**{"labels.npy": labels_npy})
    calls = []

    def only_for_logits(real):
        def reader(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise Allocated("the labels' data was read")
            return real(*args, **kwargs)
        return reader

    monkeypatch.setattr(npy_format, "read_array", only_for_logits(npy_format.read_array))
    monkeypatch.setattr(npy_reader, "view_data", only_for_logits(npy_reader.view_data))
    for name, content in (("y.npy", labels_npy), ("y.npz", labels_npz)):
        calls.clear()
        with pytest.raises(LogitsFileError, match=rf"^{name[0]}\.{name[2:]}: labels shape \(1000000000000,\) has 1,000,000,000,000 elements"):
            load_logits_bytes(logits_npy, "z.npy", labels_content=content, labels_filename=name)
        assert calls == [1]  # the logits were read by numpy, the labels never


def test_npz_declared_member_sizes_checked_before_any_member_is_opened(monkeypatch):
    z, y = _logits()
    buf = io.BytesIO()
    np.savez_compressed(buf, logits=np.zeros((2000, 1000)), labels=y)
    _forbid(monkeypatch, zipfile.ZipFile, "open")
    with pytest.raises(LogitsFileError, match=r"the logits, labels and name arrays unpack to [\d,]+ bytes"):
        load_logits_bytes(buf.getvalue(), "bomb.npz", max_elements=10_000)


def test_safetensors_count_checked_before_viewing_or_widening(monkeypatch):
    z, _ = _logits()
    content = safetensors.numpy.save({"logits": z})
    _forbid(monkeypatch, np, "frombuffer")
    with pytest.raises(LogitsFileError, match=r"^st\.safetensors: logits shape \(300, 5\) has 1,500 elements, more than max_elements=1,000 \(about 60\.0 kB"):
        load_logits_bytes(content, "st.safetensors", max_elements=1_000)
    # a shape the buffer cannot hold is refused by the header rules, before any view
    header = json.dumps({"logits": {"dtype": "BF16", "shape": list(HUGE), "data_offsets": [0, 2 * 10**14]}}).encode()
    with pytest.raises(LogitsFileError, match=r"entry 'logits' has data_offsets \[0, 200000000000000\] outside the 64-byte buffer"):
        load_logits_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64, "bf.safetensors")


def test_torch_archive_size_checked_before_torch_load(monkeypatch):
    buf = io.BytesIO()
    torch.save({"logits": torch.ones(30, 3), "big": torch.zeros(1_000_000)}, buf)
    _forbid(monkeypatch, torch, "load")
    with pytest.raises(LogitsFileError, match=r"^big\.pt: the archive's members unpack to [\d,]+ bytes, more than"):
        load_logits_bytes(buf.getvalue(), "big.pt", max_elements=1_000)


def test_torch_zero_stride_shape_counted_before_conversion(monkeypatch):
    buf = io.BytesIO()
    torch.save({"logits": torch.zeros(1).expand(*HUGE)}, buf)
    _forbid(monkeypatch, torch.Tensor, "numpy")
    with pytest.raises(LogitsFileError, match=r"^stride\.pt: " + SHARED_COUNT_MESSAGE):
        load_logits_bytes(buf.getvalue(), "stride.pt")


def test_csv_estimate_checked_before_pandas_parses(monkeypatch):
    z, y = _logits()
    content = pd.DataFrame(z).assign(label=y).to_csv(index=False).encode()
    _forbid(monkeypatch, pd, "read_csv")
    with pytest.raises(LogitsFileError, match=r"^big\.csv: about 30\d rows × 6 columns, more than max_elements=1,000 \(--max-elements raises the limit\)$"):
        load_logits_bytes(content, "big.csv", max_elements=1_000)


def test_parquet_footer_checked_before_pyarrow_reads_columns(monkeypatch):
    import pyarrow.parquet as pq

    z, y = _logits()
    buf = io.BytesIO()
    pd.DataFrame(z, columns=list("abcde")).assign(label=y).to_parquet(buf)
    _forbid(monkeypatch, pq.ParquetFile, "read")
    with pytest.raises(LogitsFileError, match=r"^big\.parquet: 300 rows × 6 columns, more than max_elements=1,000 \(--max-elements raises the limit\)$"):
        load_logits_bytes(buf.getvalue(), "big.parquet", max_elements=1_000)


def test_the_patched_calls_are_the_ones_each_format_uses(monkeypatch):
    """Control for the tests above: within budget, each forbidden call is reached."""
    z, y = _logits()
    buf = io.BytesIO()
    np.save(buf, z)
    cases = [
        (npy_reader, "view_data", buf.getvalue(), "ok.npy"),
        (npy_format, "read_array", _zip(**{"logits.npy": buf.getvalue()}), "ok.npz"),
        (np, "frombuffer", safetensors.numpy.save({"logits": z}), "ok.safetensors"),
        (pd, "read_csv", pd.DataFrame(z).to_csv(index=False).encode(), "ok.csv"),
    ]
    for owner, name, content, filename in cases:
        with monkeypatch.context() as patch:
            _forbid(patch, owner, name)
            with pytest.raises(Allocated):
                load_logits_bytes(content, filename)


# ------------------------------------- safetensors rules agree with the package


def _library_accepts(content: bytes) -> bool:
    try:
        safetensors.deserialize(content)
    except Exception:
        return False
    return True


def _our_structure_accepts(content: bytes) -> bool:
    try:
        load_logits_bytes(content, "x.safetensors")
    except LogitsFileError as err:
        return "not a valid safetensors file" not in str(err)
    return True


def _file(entries: dict, data: bytes, *, length_delta: int = 0) -> bytes:
    header = json.dumps(entries, separators=(",", ":")).encode()
    return (len(header) + length_delta).to_bytes(8, "little") + header + data


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SAFETENSORS_CASES = {
    "valid": _file({"logits": _entry("F64", [3, 2], 0, 48), "labels": _entry("I64", [3], 48, 72)}, bytes(72)),
    "gap": _file({"logits": _entry("F64", [3, 2], 0, 48), "labels": _entry("I64", [3], 56, 80)}, bytes(80)),
    "overlap": _file({"logits": _entry("F64", [3, 2], 0, 48), "labels": _entry("I64", [3], 40, 64)}, bytes(64)),
    "span too short": _file({"logits": _entry("F64", [3, 2], 0, 40)}, bytes(40)),
    "past the buffer": _file({"logits": _entry("F64", [3, 2], 0, 48)}, bytes(40)),
    "trailing bytes": _file({"logits": _entry("F64", [3, 2], 0, 48)}, bytes(56)),
    "length past the end": _file({"logits": _entry("F64", [3, 2], 0, 48)}, bytes(48), length_delta=10**6),
    "header not an object": _file([1, 2], bytes(8)),  # type: ignore[arg-type]
    "empty": _file({}, b""),
}


@pytest.mark.parametrize("case", SAFETENSORS_CASES)
def test_safetensors_header_rules_agree_with_the_package(case):
    content = SAFETENSORS_CASES[case]
    assert _our_structure_accepts(content) == _library_accepts(content), case


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 6),
    cols=st.integers(0, 4),
    dtypes=st.tuples(st.sampled_from(["F64", "F32", "F16", "BF16", "I64", "U8"]), st.sampled_from(["I64", "I32", "U8"])),
    shifts=st.tuples(*[st.just(0) | st.integers(-3, 3)] * 4),  # mostly consistent offsets
    extra=st.just(0) | st.integers(-4, 4),
    labels_first=st.booleans(),
)
def test_safetensors_random_headers_get_the_packages_verdict(rows, cols, dtypes, shifts, extra, labels_first):
    size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1}
    spans = [("logits", dtypes[0], [rows, cols], rows * cols * size[dtypes[0]]),
             ("labels", dtypes[1], [rows], rows * size[dtypes[1]])]
    if labels_first:
        spans.reverse()
    entries, position = {}, 0
    for (key, dtype, shape, nbytes), (d_begin, d_end) in zip(spans, (shifts[:2], shifts[2:])):
        begin, end = max(position + d_begin, 0), max(position + nbytes + d_end, 0)
        entries[key] = _entry(dtype, shape, begin, end)
        position += nbytes
    content = _file(entries, bytes(max(position + extra, 0)))
    assert _our_structure_accepts(content) == _library_accepts(content)


# ------------------------------------------------------------- the sanitizer


def test_one_sanitizer_for_messages_file_names_and_model_names():
    assert one_line("a\nb\t\tc\r\n d", max_chars=50) == "a b c d"
    assert one_line("bell\x07 nul\x00 del\x7f csi\x9b", max_chars=50) == "bell? nul? del? csi?"
    assert one_line("x" * 30, max_chars=10) == "x" * 9 + "…"
    assert one_line("/very/long/" + "d" * 200 + "/file.npz", max_chars=20, keep="tail") == "…" + ("d" * 200 + "/file.npz")[-19:]
    assert display_name("a\nb.npz") == "a b.npz"
    assert clean_name("  resnet\x00-50\n") == "resnet?-50"
    message = str(fail("f.npz", "value " + "9" * 1000 + "\nsecond line"))
    assert "\n" not in message and len(message) == MESSAGE_MAX_CHARS and message.endswith("…")


def test_control_characters_in_names_never_reach_messages_or_data():
    z, y = _logits()
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y, name=np.array("evil\nname\x1b[31m"))
    data = load_logits_bytes(buf.getvalue(), "m.npz")
    assert data.name == "evil name?[31m"
    with pytest.raises(LogitsFileError) as info:
        load_logits_bytes(b"", "two\nlines\x00.npy")
    assert str(info.value) == "two lines?.npy: the file is empty (0 bytes)"


# ------------------------------------------------------------------ structure


def _modules():
    return sorted(PACKAGE.glob("*.py"))


def test_every_module_is_short():
    lengths = {p.name: len(p.read_text().splitlines()) for p in _modules()}
    assert max(lengths.values()) <= 450, lengths


def test_no_module_imports_a_private_name():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_") and a.name != "__future__"]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                # module._name across modules of this package
                if node.attr.startswith("_") and not node.attr.startswith("__") and node.value.id in {
                    p.stem for p in _modules()
                }:
                    offenders.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert offenders == []


def test_importing_the_package_loads_no_format_library():
    code = (
        "import sys, caliber_core.loading; "
        "print(sorted(m for m in ('pandas', 'pyarrow', 'torch', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parents[1]).stdout.strip()
    assert out == "[]"


# ------------------------------------- the same rules as caliber_core.validation

BAD_LOGITS = {
    "1-D": np.ones(10),
    "3-D": np.ones((4, 3, 2)),
    "no rows": np.ones((0, 5)),
    "one class": np.ones((10, 1)),
    "strings": np.array([["a", "b"], ["c", "d"]]),
    "bool": np.eye(2, dtype=bool),
    "complex": np.ones((3, 2), dtype=np.complex128),
    "nan": np.array([[1.0, 0.0], [np.nan, 0.0]]),
    "-inf": np.array([[1.0, 0.0], [0.0, -np.inf]]),
}


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@pytest.mark.parametrize("case", BAD_LOGITS)
def test_logits_refused_by_loading_exactly_when_validation_refuses(case):
    from caliber_core import validation

    with pytest.raises(ValueError):
        validation.as_logits(BAD_LOGITS[case], finite=True)
    with pytest.raises(LogitsFileError):
        load_logits_bytes(_npy(BAD_LOGITS[case]), "bad.npy")


@pytest.mark.parametrize(
    "labels",
    [np.array([0, 1, 5]), np.array([0, -1, 1]), np.array([0, 1]), np.array([[0], [1], [1]]), np.array([True, False, True])],
    ids=["above K", "negative", "short", "2-D", "bool"],
)
def test_labels_refused_by_loading_exactly_when_validation_refuses(labels):
    from caliber_core import validation

    z = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])
    with pytest.raises(ValueError):
        validation.as_labels(labels, n_samples=3, n_classes=3)
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=labels)
    with pytest.raises(LogitsFileError):
        load_logits_bytes(buf.getvalue(), "bad.npz")


def test_what_loading_accepts_passes_validation():
    from caliber_core import validation

    z, y = _logits()
    buf = io.BytesIO()
    np.savez(buf, logits=z.astype(np.float32), labels=y.astype(np.float64))  # integral floats: the one wider rule
    data = load_logits_bytes(buf.getvalue(), "ok.npz")
    np.testing.assert_array_equal(validation.as_logits(data.logits, finite=True), data.logits)
    np.testing.assert_array_equal(validation.as_labels(data.labels, n_samples=300, n_classes=5), y)
