"""Tests for caliber_core.loading: every format in, every bad file refused safely."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy_format

from caliber_core.loading import safety
from caliber_core.loading import (
    DEFAULT_MAX_ELEMENTS,
    LABELS_EXTENSIONS,
    SUPPORTED_EXTENSIONS,
    LogitsData,
    LogitsFileError,
    describe,
    load_logits,
    load_logits_bytes,
    require_labels,
)

N, K = 300, 5


def make_logits(n: int = N, k: int = K, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, k)), rng.integers(0, k, size=n)


def refuse(path, match: str, **kwargs) -> str:
    """load_logits(path) must raise LogitsFileError matching ``match``, on one line naming the file."""
    with pytest.raises(LogitsFileError, match=match) as info:
        load_logits(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    named = [Path(p).name for p in (path, kwargs.get("labels_path")) if p is not None]
    assert any(name in message for name in named)
    return message


def refuse_bytes(content: bytes, filename: str, match: str, **kwargs) -> str:
    with pytest.raises(LogitsFileError, match=match) as info:
        load_logits_bytes(content, filename, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(filename + ": ")
    return message


# ----------------------------------------------------------------- round trips


def test_npz_round_trip_with_name_and_ignored_extras(tmp_path):
    z, y = make_logits()
    path = tmp_path / "demo.npz"
    np.savez(
        path,
        logits=z,
        labels=y,
        name=np.array("resnet-cifar"),
        inputs=np.zeros((4, 3, 8, 8), np.float32),
        heldout_logits=np.ones((7, 2)),
    )
    data = load_logits(path)
    assert isinstance(data, LogitsData)
    assert data.name == "resnet-cifar"
    np.testing.assert_array_equal(data.logits, z)
    np.testing.assert_array_equal(data.labels, y)
    assert data.logits.dtype == np.float64 and data.logits.flags.c_contiguous
    assert data.logits.flags.writeable and data.labels.flags.writeable
    assert data.labels.dtype == np.int64
    assert (data.n_samples, data.n_classes, data.has_labels) == (N, K, True)
    assert data.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert data.source == str(path)
    assert data.labels_source == str(path)
    assert data.warnings == ()


def test_npz_compressed_and_numeric_name(tmp_path):
    z, y = make_logits(k=3)
    path = tmp_path / "run7.npz"
    np.savez_compressed(path, logits=z.astype(np.float32), labels=y.astype(np.int16), name=np.array(7))
    data = load_logits(path)
    assert data.name == "7"
    np.testing.assert_array_equal(data.logits, z.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(data.labels, y)


def test_npy_without_labels_uses_stem(tmp_path):
    z, _ = make_logits()
    path = tmp_path / "model_a.npy"
    np.save(path, z)
    data = load_logits(path)
    assert data.name == "model_a"
    assert data.logits.flags.writeable  # our own copy, not a view of the file's bytes
    assert data.labels is None and not data.has_labels and data.labels_source is None
    np.testing.assert_array_equal(data.logits, z)


def test_npz_name_must_be_a_scalar(tmp_path):
    z, y = make_logits()
    refuse(_npz(tmp_path, "names.npz", logits=z, labels=y, name=np.array(["a", "b"])),
           r"names\.npz: name must be a 0-d string or number, got shape \(2,\)")


def test_npy_fortran_order_and_big_endian(tmp_path):
    z, _ = make_logits()
    np.save(tmp_path / "f.npy", np.asfortranarray(z))
    np.save(tmp_path / "be.npy", z.astype(">f8"))
    np.testing.assert_array_equal(load_logits(tmp_path / "f.npy").logits, z)
    np.testing.assert_array_equal(load_logits(tmp_path / "be.npy").logits, z)


def test_integer_logits_and_integral_float_labels(tmp_path):
    rng = np.random.default_rng(3)
    z = rng.integers(-50, 50, size=(250, 4)).astype(np.int32)
    z[:, 0] = 100  # a clear top class, positive margins
    y = rng.integers(0, 4, size=250).astype(np.float64)  # 3.0 is fine
    np.savez(tmp_path / "ints.npz", logits=z, labels=y)
    data = load_logits(tmp_path / "ints.npz")
    np.testing.assert_array_equal(data.logits, z.astype(np.float64))
    np.testing.assert_array_equal(data.labels, y.astype(np.int64))
    assert data.labels.dtype == np.int64


@pytest.mark.parametrize("ext", [".pt", ".pth"])
def test_torch_round_trip(tmp_path, ext):
    z, y = make_logits()
    logits = torch.tensor(z, dtype=torch.float32)
    path = tmp_path / f"model{ext}"
    torch.save({"logits": logits, "labels": torch.tensor(y), "name": "vit"}, path)
    data = load_logits(path)
    assert data.name == "vit"
    np.testing.assert_array_equal(data.logits, logits.numpy().astype(np.float64))
    np.testing.assert_array_equal(data.labels, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_half_precision_logits(tmp_path, dtype):
    z, y = make_logits()
    logits = torch.tensor(z).to(dtype)
    torch.save({"logits": logits, "labels": torch.tensor(y, dtype=torch.int32)}, tmp_path / "h.pt")
    data = load_logits(tmp_path / "h.pt")
    np.testing.assert_array_equal(data.logits, logits.to(torch.float64).numpy())
    np.testing.assert_array_equal(data.labels, y)


def test_torch_bare_tensor_is_logits_without_labels(tmp_path):
    z, _ = make_logits()
    torch.save(torch.tensor(z), tmp_path / "bare.pt")
    data = load_logits(tmp_path / "bare.pt")
    np.testing.assert_array_equal(data.logits, z)
    assert data.labels is None


def test_safetensors_numpy_round_trip_agrees_with_library(tmp_path):
    z, y = make_logits()
    path = tmp_path / "st.safetensors"
    safetensors.numpy.save_file(
        {"logits": z, "labels": y, "extra": np.arange(6, dtype=np.int8)}, str(path),
        metadata={"name": "from-metadata"},
    )
    data = load_logits(path)
    reference = safetensors.numpy.load(path.read_bytes())
    np.testing.assert_array_equal(data.logits, reference["logits"])
    np.testing.assert_array_equal(data.labels, reference["labels"])
    np.testing.assert_array_equal(data.logits, z)
    assert data.name == "from-metadata"


def test_safetensors_torch_bfloat16(tmp_path):
    z, y = make_logits()
    logits = torch.tensor(z).to(torch.bfloat16)
    path = tmp_path / "bf.safetensors"
    # the extra bf16 tensor is one safetensors.numpy.load cannot read; it is never read
    safetensors.torch.save_file(
        {"logits": logits, "labels": torch.tensor(y), "hidden": torch.ones(3, dtype=torch.bfloat16)},
        str(path),
    )
    data = load_logits(path)
    np.testing.assert_array_equal(data.logits, logits.to(torch.float64).numpy())
    np.testing.assert_array_equal(data.labels, y)


def test_csv_round_trip(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"class_{i}" for i in range(K)])
    df.insert(2, "label", y)  # the label column may sit anywhere
    df.to_csv(tmp_path / "v.csv", index=False)
    data = load_logits(tmp_path / "v.csv")
    np.testing.assert_array_equal(data.logits, z)
    np.testing.assert_array_equal(data.labels, y)
    assert data.warnings == ()


def test_csv_with_pandas_index_drops_it_with_warning(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)]).assign(label=y)
    df.to_csv(tmp_path / "idx.csv")  # index=True by default: an unnamed 0..N-1 column
    data = load_logits(tmp_path / "idx.csv")
    np.testing.assert_array_equal(data.logits, z)
    assert any("unnamed first column" in w for w in data.warnings)


def test_csv_headerless_savetxt(tmp_path):
    z, _ = make_logits()
    np.savetxt(tmp_path / "raw.csv", z, delimiter=",", fmt="%.17g")
    data = load_logits(tmp_path / "raw.csv")
    np.testing.assert_array_equal(data.logits, z)
    assert data.labels is None
    assert any("no header row" in w for w in data.warnings)


def test_csv_default_integer_header_is_not_data(tmp_path):
    z, _ = make_logits()
    pd.DataFrame(z).to_csv(tmp_path / "ints.csv", index=False)  # header "0,1,2,3,4"
    data = load_logits(tmp_path / "ints.csv")
    np.testing.assert_array_equal(data.logits, z)
    assert data.warnings == ()


def test_parquet_round_trip(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)])
    df["label"] = y
    df.index = df.index + 1000  # a non-default index is stored as __index_level_0__: ignored
    df.to_parquet(tmp_path / "v.parquet")
    data = load_logits(tmp_path / "v.parquet")
    np.testing.assert_array_equal(data.logits, z)
    np.testing.assert_array_equal(data.labels, y)


def test_bytes_and_path_loaders_agree(tmp_path):
    z, y = make_logits()
    path = tmp_path / "same.npz"
    np.savez(path, logits=z, labels=y)
    a = load_logits(path)
    b = load_logits_bytes(path.read_bytes(), "same.npz")
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert (a.sha256, a.name) == (b.sha256, b.name)
    assert b.source == "same.npz"


def test_extension_is_case_insensitive(tmp_path):
    z, _ = make_logits()
    np.save(tmp_path / "x.npy", z)
    data = load_logits_bytes((tmp_path / "x.npy").read_bytes(), "UPPER.NPY")
    assert data.name == "UPPER"


def _write_labels(path: Path, y: np.ndarray) -> None:
    if path.suffix == ".npy":
        np.save(path, y)
    elif path.suffix == ".npz":
        np.savez(path, labels=y, other=np.zeros(3))
    elif path.suffix == ".csv":
        path.write_text("label\n" + "\n".join(map(str, y)) + "\n")
    else:
        path.write_text("\n".join(map(str, y)) + "\n\n")


@pytest.mark.parametrize("labels_name", ["y.npy", "y.npz", "y.csv", "y.txt"])
def test_labels_from_second_file(tmp_path, labels_name):
    z, y = make_logits()
    np.save(tmp_path / "logits.npy", z)
    labels_path = tmp_path / labels_name
    _write_labels(labels_path, y)
    data = load_logits(tmp_path / "logits.npy", labels_path=labels_path)
    np.testing.assert_array_equal(data.labels, y)
    assert data.labels.dtype == np.int64
    assert data.labels_source == str(labels_path)
    # the upload path takes the same bytes
    up = load_logits_bytes(
        (tmp_path / "logits.npy").read_bytes(), "logits.npy",
        labels_content=labels_path.read_bytes(), labels_filename=labels_name,
    )
    np.testing.assert_array_equal(up.labels, y)
    assert up.labels_source == labels_name


def test_labels_file_replaces_embedded_labels_with_warning(tmp_path):
    z, y = make_logits()
    np.savez(tmp_path / "both.npz", logits=z, labels=(y + 1) % K)
    np.save(tmp_path / "true.npy", y)
    data = load_logits(tmp_path / "both.npz", labels_path=tmp_path / "true.npy")
    np.testing.assert_array_equal(data.labels, y)
    assert any("replace the labels" in w for w in data.warnings)


def test_small_n_warns(tmp_path):
    z, y = make_logits(n=57)
    np.savez(tmp_path / "small.npz", logits=z, labels=y)
    data = load_logits(tmp_path / "small.npz")
    assert data.warnings == ("N=57 rows: calibration precision will be poor",)


def test_describe_and_require_labels(tmp_path):
    z, y = make_logits()
    np.save(tmp_path / "nolab.npy", z)
    np.savez(tmp_path / "lab.npz", logits=z, labels=y)
    without, with_ = load_logits(tmp_path / "nolab.npy"), load_logits(tmp_path / "lab.npz")
    assert describe(without) == f"nolab: N={N}, K={K}, labels no"
    assert describe(with_) == f"lab: N={N}, K={K}, labels yes"
    assert require_labels(with_, "an accuracy target") is with_.labels
    with pytest.raises(LogitsFileError) as info:
        require_labels(without, "an accuracy target")
    assert str(info.value) == (
        f"{tmp_path / 'nolab.npy'}: no labels in the file; an accuracy target needs labels "
        "(pass a labels file: --labels FILE on the command line)"
    )
    np.savez(tmp_path / "nolab.npz", logits=z)
    with pytest.raises(LogitsFileError, match=r"needs labels \(add a `labels` array or pass a labels file; "
                       r"or use agreement\)$"):
        require_labels(load_logits(tmp_path / "nolab.npz"), "an accuracy target", instead="use agreement")


def test_public_constants():
    assert safety.MIN_DEFAULT_ELEMENTS <= DEFAULT_MAX_ELEMENTS <= safety.MAX_DEFAULT_ELEMENTS == 200_000_000
    assert set(SUPPORTED_EXTENSIONS) == {".npz", ".npy", ".pt", ".pth", ".safetensors", ".csv", ".parquet",
                                         ".jsonl", ".json"}
    assert set(LABELS_EXTENSIONS) == {".npy", ".npz", ".csv", ".txt"}


# --------------------------------------------------------- validation refusals


def _npz(tmp_path, filename="bad.npz", /, **arrays) -> Path:
    path = tmp_path / filename
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    ("value", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")]
)
def test_non_finite_logits_named_by_row_and_column(tmp_path, value, shown):
    z, y = make_logits()
    z[12, 3] = value
    z[40, 1] = value  # only the first offender is named
    path = _npz(tmp_path, logits=z, labels=y)
    refuse(path, rf"bad\.npz: logits row 12, column 3 is {re.escape(shown)} \(every value must be finite\)$")


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((10,), r"logits must be 2-D \(n_samples, n_classes\), got shape \(10,\)"),
        ((4, 3, 2), r"logits must be 2-D \(n_samples, n_classes\), got shape \(4, 3, 2\)"),
        ((10, 1), r"logits have 1 class column\(s\) \(shape \(10, 1\)\); need at least 2"),
        ((0, 5), r"logits have no rows \(shape \(0, 5\)\)"),
    ],
)
def test_bad_logits_shapes(tmp_path, shape, match):
    path = tmp_path / "bad.npy"
    np.save(path, np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape))
    refuse(path, r"bad\.npy: " + match)


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.array([["a", "b"], ["c", "d"]]), r"logits has dtype <U1 \(string\)"),
        (np.array([[True, False], [False, True]]), r"logits has dtype bool \(bool\)"),
        (np.ones((3, 2), dtype=np.complex128), r"logits has dtype complex128 \(complex\)"),
    ],
)
def test_non_real_dtypes_refused(tmp_path, array, match):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    refuse(path, r"bad\.npy: " + match)


def test_plain_object_array_refused(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([[1.0, 2.0], [3.0, 4.0]], dtype=object), allow_pickle=True)
    refuse(path, r"obj\.npy: logits is an object array \(pickled Python objects are never loaded\)")


@pytest.mark.parametrize(
    ("index", "value", "match"),
    [
        (7, 5, r"labels index 7 is 5, outside \[0, 5\) for K=5 classes"),
        (3, -1, r"labels index 3 is -1, outside \[0, 5\)"),
        (9, 1.5, r"labels index 9 is 1\.5 \(labels must be integers\)"),
        (2, np.nan, r"labels index 2 is nan \(labels must be integers\)"),
    ],
)
def test_bad_labels_name_first_offender(tmp_path, index, value, match):
    z, y = make_logits()
    y = y.astype(np.float64 if isinstance(value, float) else np.int64)
    y[index] = value
    y[index + 50] = value
    path = _npz(tmp_path, logits=z, labels=y)
    refuse(path, r"bad\.npz: " + match)


def test_bool_and_two_d_labels_refused(tmp_path):
    z, y = make_logits(k=2)
    refuse(_npz(tmp_path, "b1.npz", logits=z, labels=y.astype(bool)),
           r"b1\.npz: labels has dtype bool \(bool\); labels must be integers")
    refuse(_npz(tmp_path, "b2.npz", logits=z, labels=y[:, None]),
           r"b2\.npz: labels must be 1-D \(n_samples,\), got shape \(300, 1\)")


def test_length_mismatch_states_both(tmp_path):
    z, y = make_logits()
    refuse(_npz(tmp_path, logits=z, labels=y[:-1]),
           r"bad\.npz: labels have 299 entries but the logits have 300 rows")
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "short.npy", y[:10])
    with pytest.raises(LogitsFileError, match=r"short\.npy: labels have 10 entries but the logits in .*z\.npy have 300 rows"):
        load_logits(tmp_path / "z.npy", labels_path=tmp_path / "short.npy")


def test_all_rows_tied_is_degenerate(tmp_path):
    z = np.zeros((300, 4))
    z[:100, 0] = 1.0  # a third of rows have a winner: median margin is still 0
    refuse(_npz(tmp_path, logits=z),
           r"bad\.npz: logits are degenerate: the median top-two margin is 0 because 67% of rows tie")
    refuse(_npz(tmp_path, "flat.npz", logits=np.ones((300, 4))), r"flat\.npz: .* 100% of rows tie")


@pytest.mark.parametrize(
    ("name", "writer", "match"),
    [
        ("nolog.npz", lambda p: np.savez(p, labels=np.arange(3), inputs=np.ones(2)),
         r"no `logits` array in the npz \(found: inputs, labels\)"),
        ("nolog.pt", lambda p: torch.save({"scores": torch.ones(3, 2)}, p),
         r"no `logits` tensor in the dict \(keys: scores\)"),
        ("nolog.safetensors", lambda p: safetensors.numpy.save_file({"scores": np.ones((3, 2))}, str(p)),
         r"no `logits` tensor in the safetensors file \(found: scores\)"),
    ],
)
def test_missing_logits(tmp_path, name, writer, match):
    writer(tmp_path / name)
    refuse(tmp_path / name, re.escape(name) + ": " + match)


def test_unknown_extension_lists_supported(tmp_path):
    (tmp_path / "logits.h5").write_bytes(b"\x89HDF\r\n")
    message = refuse(tmp_path / "logits.h5", r"logits\.h5: unsupported logits file type \('\.h5'\); supported: \.npz, \.npy")
    assert all(ext in message for ext in SUPPORTED_EXTENSIONS)
    refuse_bytes(b"abc", "noext", r"no extension")
    z, _ = make_logits()
    np.save(tmp_path / "z.npy", z)
    with pytest.raises(LogitsFileError, match=r"y\.json: unsupported labels file type \('\.json'\); supported: \.npy, \.npz, \.csv, \.txt"):
        load_logits_bytes((tmp_path / "z.npy").read_bytes(), "z.npy", labels_content=b"[1]", labels_filename="y.json")


def test_missing_file_and_directory(tmp_path):
    refuse(tmp_path / "absent.npz", r"absent\.npz: no such file")
    (tmp_path / "dir.npz").mkdir()
    refuse(tmp_path / "dir.npz", r"dir\.npz: not a regular file")
    z, _ = make_logits()
    np.save(tmp_path / "z.npy", z)
    refuse(tmp_path / "z.npy", r"nolabels\.npy: no such file", labels_path=tmp_path / "nolabels.npy")


def test_truncated_npz_and_npy(tmp_path):
    z, y = make_logits()
    _npz(tmp_path, "full.npz", logits=z, labels=y)
    content = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(content[: len(content) // 2])
    refuse(tmp_path / "cut.npz", r"cut\.npz: not a valid npz archive \(BadZipFile")
    np.save(tmp_path / "full.npy", z)
    content = (tmp_path / "full.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(content[:-8])
    refuse(tmp_path / "cut.npy", r"cut\.npy: truncated npy: the header declares logits shape \(300, 5\) float64 "
           r"\(12,000 bytes\) but only 11,992 bytes follow")


def test_corrupt_npz_member_fails_crc(tmp_path):
    z, y = make_logits()
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y)
    content = bytearray(buf.getvalue())
    offset = content.index(z.tobytes()[:16])  # stored (uncompressed) member data
    content[offset + 100] ^= 0xFF
    refuse_bytes(bytes(content), "crc.npz", r"crc\.npz: not a valid npz archive \(npz member logits\.npy: BadZipFile: Bad CRC-32")


RANDOM_EXPECTED = {
    ".npz": r"not a valid npz archive",
    ".npy": r"the file is not an npy array \(it does not start with numpy's magic string\)",
    ".pt": r"not a valid torch \(\.pt zip\) archive",
    ".pth": r"not a valid torch \(\.pt zip\) archive",
    ".safetensors": r"not a valid safetensors file",
    ".csv": r"not UTF-8 text",
    ".parquet": r"not a valid parquet file",
    ".jsonl": r"not UTF-8 text",
    ".json": r"not UTF-8 text",
}


@pytest.mark.parametrize("ext", SUPPORTED_EXTENSIONS)
def test_random_bytes_refused_per_format(tmp_path, ext):
    content = np.random.default_rng(42).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    (tmp_path / f"noise{ext}").write_bytes(content)
    refuse(tmp_path / f"noise{ext}", rf"noise{re.escape(ext)}: {RANDOM_EXPECTED[ext]}")


@pytest.mark.parametrize("ext", SUPPORTED_EXTENSIONS)
def test_empty_file_refused_per_format(tmp_path, ext):
    (tmp_path / f"empty{ext}").write_bytes(b"")
    refuse(tmp_path / f"empty{ext}", rf"empty{re.escape(ext)}: the file is empty \(0 bytes\)")


def test_empty_labels_file_refused(tmp_path):
    z, _ = make_logits()
    np.save(tmp_path / "z.npy", z)
    (tmp_path / "y.csv").write_bytes(b"")
    refuse(tmp_path / "z.npy", r"y\.csv: the file is empty", labels_path=tmp_path / "y.csv")


def test_non_integer_line_in_labels_text(tmp_path):
    z, y = make_logits()
    np.save(tmp_path / "z.npy", z)
    lines = ["label"] + [str(v) for v in y]
    lines[3] = "cat"
    (tmp_path / "y.txt").write_text("\n".join(lines))
    refuse(tmp_path / "z.npy", r"y\.txt: line 4 is not an integer label \(text of 3 characters\)", labels_path=tmp_path / "y.txt")
    lines[3] = "1,2"
    (tmp_path / "y.txt").write_text("\n".join(lines))
    refuse(tmp_path / "z.npy", r"y\.txt: line 4 has 2 comma-separated fields", labels_path=tmp_path / "y.txt")


def test_csv_non_numeric_cell_and_empty_header(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)]).assign(label=y)
    df = df.astype({"c2": object})
    df.loc[17, "c2"] = "oops"
    df.to_csv(tmp_path / "bad.csv", index=False)
    message = refuse(tmp_path / "bad.csv", r"bad\.csv: column 'c2' row 17 is not a number \(text of 4 characters\)")
    assert "oops" not in message
    (tmp_path / "hdr.csv").write_text("a,,label\n1,2,0\n3,1,1\n")
    refuse(tmp_path / "hdr.csv", r"hdr\.csv: column 2 has an empty header")


def test_csv_nan_cell_named(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)]).assign(label=y)
    df.loc[5, "c1"] = np.nan  # written as an empty cell
    df.to_csv(tmp_path / "gap.csv", index=False)
    refuse(tmp_path / "gap.csv", r"gap\.csv: logits row 5, column 1 is nan")


def test_parquet_string_column_refused(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)]).assign(label=y, note="x")
    df.to_parquet(tmp_path / "s.parquet")
    refuse(tmp_path / "s.parquet", r"s\.parquet: column 'note' is type (string|large_string); logits must be real numbers")


def test_torch_non_tensor_values_refused(tmp_path):
    torch.save({"logits": [[1.0, 2.0], [2.0, 1.0]]}, tmp_path / "list.pt")
    refuse(tmp_path / "list.pt", r"list\.pt: logits is a list, not a tensor")
    torch.save([torch.ones(2, 2)], tmp_path / "seq.pt")
    refuse(tmp_path / "seq.pt", r"seq\.pt: expected a dict of tensors with a `logits` key, got list")
    torch.save({"logits": torch.ones(3, 2), "labels": torch.tensor([True, False, True])}, tmp_path / "b.pt")
    refuse(tmp_path / "b.pt", r"b\.pt: labels has dtype torch\.bool \(bool\); labels must be integers")


def test_torch_numpy_array_inside_is_refused(tmp_path):
    z, _ = make_logits()
    torch.save({"logits": z}, tmp_path / "np.pt")  # a numpy array, pickled as numpy globals
    refuse(tmp_path / "np.pt", r"np\.pt: refused: the file holds Python objects other than tensors")


def test_safetensors_bad_headers(tmp_path):
    z, _ = make_logits()
    good = safetensors.numpy.save({"logits": z})
    (n,) = np.frombuffer(good[:8], "<u8")
    refuse_bytes((10**12).to_bytes(8, "little") + good[8:], "len.safetensors",
                 r"len\.safetensors: not a valid safetensors file \(its 8-byte header length exceeds")
    refuse_bytes(good[:8] + b"[" + good[9:], "json.safetensors", r"header is not JSON")
    header = good[8 : 8 + int(n)].replace(b'"data_offsets":[0,12000]', b'"data_offsets":[0,11992]')
    assert header != good[8 : 8 + int(n)]
    refuse_bytes(good[:8] + header + good[8 + int(n):], "off.safetensors",
                 r"off\.safetensors: not a valid safetensors file \(entry 'logits': shape \(300, 5\) F64 needs 12,000 bytes")


# -------------------------------------------------- sizes: headers, zip bombs


def _npy_header(shape, descr="<f8") -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def test_absurd_npy_header_refused_instantly(tmp_path):
    path = tmp_path / "huge.npy"
    path.write_bytes(_npy_header((10**7, 10**7)) + b"\0" * 64)
    start = time.perf_counter()
    refuse(path, r"huge\.npy: logits shape \(10000000, 10000000\) has 100,000,000,000,000 elements, "
           rf"more than max_elements={DEFAULT_MAX_ELEMENTS:,} \(about 4,000,000.0 GB to process; "
           r"--max-elements raises the limit\)")
    assert time.perf_counter() - start < 2.0  # generous sanity bound; nothing was allocated


def test_absurd_header_inside_npz_and_safetensors(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("logits.npy", _npy_header((10**7, 10**7)) + b"\0" * 64)
    refuse_bytes(buf.getvalue(), "huge.npz", r"huge\.npz: logits shape \(10000000, 10000000\) has 100,000,000,000,000 elements")
    header = b'{"logits":{"dtype":"F64","shape":[10000000,10000000],"data_offsets":[0,800000000000000]}}'
    refuse_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64, "huge.safetensors",
                 r"huge\.safetensors: not a valid safetensors file \(entry 'logits' has data_offsets")


def test_labels_header_size_checked_too(tmp_path):
    z, _ = make_logits()
    np.save(tmp_path / "z.npy", z)
    (tmp_path / "y.npy").write_bytes(_npy_header((10**12,), "<i8"))
    refuse(tmp_path / "z.npy", r"y\.npy: labels shape \(1000000000000,\) has 1,000,000,000,000 elements",
           labels_path=tmp_path / "y.npy")


def test_torch_zero_stride_tensor_claiming_huge_shape(tmp_path):
    torch.save({"logits": torch.zeros(1).expand(10**7, 10**7)}, tmp_path / "stride.pt")
    refuse(tmp_path / "stride.pt", r"stride\.pt: logits shape \(10000000, 10000000\) has 100,000,000,000,000 elements")


def test_compressed_npz_over_element_limit(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, logits=np.zeros((2000, 1000)))  # 16 MB of zeros in a few KB
    assert path.stat().st_size < 100_000
    # the declared uncompressed size already exceeds the budget: refused before inflating
    refuse(path, r"bomb\.npz: the logits, labels and name arrays unpack to 16,000,128 bytes, more than the "
           r"2,648,576 allowed for max_elements=100,000 \(refusing a possible zip bomb; --max-elements raises the "
           r"limit\)", max_elements=100_000)
    # within the byte budget, the member's npy header is read (a few bytes) and refused
    refuse(path, r"bomb\.npz: logits shape \(2000, 1000\) has 2,000,000 elements, more than max_elements=1,500,000",
           max_elements=1_500_000)


def test_zip_member_larger_than_its_header_is_refused(tmp_path):
    # a valid little header followed by 20 MB of zeros that deflate to ~20 KB
    payload = _npy_header((300, 5)) + make_logits()[0].tobytes() + b"\0" * 20_000_000
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logits.npy", payload)
    assert len(buf.getvalue()) < 200_000
    refuse_bytes(buf.getvalue(), "pad.npz", r"pad\.npz: npz member logits\.npy unpacks to 20,012,128 bytes "
                 r"but its header describes only 12,128 \(refusing a possible zip bomb\)")
    # with a small element budget the declared size alone is enough
    refuse_bytes(buf.getvalue(), "pad.npz", r"pad\.npz: the logits, labels and name arrays unpack to 20,012,128 bytes, "
                 r"more than the 1,064,576 allowed for max_elements=1,000", max_elements=1_000)


def test_ignored_npz_members_are_never_read(tmp_path):
    z, y = make_logits()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logits.npy", _npy_header(z.shape) + z.tobytes())
        zf.writestr("labels.npy", _npy_header(y.shape, "<i8") + y.tobytes())
        zf.writestr("inputs.npy", _npy_header((10**7, 10**7)) + b"\0" * 5_000_000)
        zf.writestr("junk.npy", b"not even npy")
    data = load_logits_bytes(buf.getvalue(), "extras.npz", max_elements=10_000)
    np.testing.assert_array_equal(data.logits, z)


def test_torch_archive_over_budget_refused_before_loading(tmp_path):
    logits = torch.tensor(make_logits(n=30)[0])
    torch.save({"logits": logits, "big": torch.zeros(1_000_000)}, tmp_path / "big.pt")
    refuse(tmp_path / "big.pt", r"big\.pt: the archive's members unpack to [\d,]+ bytes, more than the [\d,]+ allowed "
           r"for max_elements=1,000", max_elements=1_000)


def test_csv_and_parquet_over_limit(tmp_path):
    z, y = make_logits()
    df = pd.DataFrame(z, columns=[f"c{i}" for i in range(K)]).assign(label=y)
    df.to_csv(tmp_path / "big.csv", index=False)
    df.to_parquet(tmp_path / "big.parquet")
    refuse(tmp_path / "big.csv", r"big\.csv: about 30\d rows × 6 columns, more than max_elements=1,000", max_elements=1_000)
    refuse(tmp_path / "big.parquet", r"big\.parquet: 300 rows × 6 columns, more than max_elements=1,000", max_elements=1_000)


def test_file_size_checked_before_reading(tmp_path):
    path = tmp_path / "sparse.npy"
    with open(path, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: no disk used, never read
    refuse(path, r"sparse\.npy: the file is 314,572,800 bytes, more than the 268,435,520 allowed for max_elements=1",
           max_elements=1)


def test_max_elements_argument_checked():
    with pytest.raises(ValueError, match="max_elements must be >= 1"):
        load_logits_bytes(b"x", "a.npy", max_elements=0)
    with pytest.raises(TypeError, match="max_elements must be an int"):
        load_logits_bytes(b"x", "a.npy", max_elements=1.5)
    with pytest.raises(TypeError, match="given together"):
        load_logits_bytes(b"x", "a.npy", labels_content=b"1")


# -------------------------------------------------------- real pickle payloads


class Payload:
    """Unpickling this creates ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker: Path, how: str = "open"):
        self.marker, self.how = str(marker), how

    def __reduce__(self):
        if self.how == "open":
            return (open, (self.marker, "w"))
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _carriers(tmp_path: Path, marker: Path, how: str) -> dict[str, tuple[Path, object]]:
    """Files carrying the payload, each with the unsafe loader that would trigger it."""
    z, y = make_logits()
    payload = Payload(marker, how)
    obj_array = np.array([payload, 1.0], dtype=object)
    files = {}
    p = tmp_path / "evil.npy"
    np.save(p, obj_array, allow_pickle=True)
    files["npy"] = (p, lambda p=p: np.load(p, allow_pickle=True))
    p = tmp_path / "evil.npz"
    np.savez(p, logits=obj_array, labels=y)
    files["npz"] = (p, lambda p=p: np.load(p, allow_pickle=True)["logits"])
    p = tmp_path / "evil_name.npz"
    np.savez(p, logits=z, labels=y, name=np.array(payload, dtype=object))
    files["npz name"] = (p, lambda p=p: np.load(p, allow_pickle=True)["name"])
    p = tmp_path / "evil.pt"
    torch.save({"logits": torch.tensor(z), "labels": torch.tensor(y), "extra": payload}, p)
    files["pt"] = (p, lambda p=p: torch.load(p, weights_only=False))
    for ext in (".pt", ".pth", ".npy"):
        p = tmp_path / f"raw_pickle{ext}"
        p.write_bytes(pickle.dumps({"logits": payload}))
        unsafe = (lambda p=p: np.load(p, allow_pickle=True)) if ext == ".npy" else (lambda p=p: pickle.loads(p.read_bytes()))
        files[f"raw pickle as {ext}"] = (p, unsafe)
    return files


@pytest.mark.parametrize("how", ["open", "exec"])
def test_pickle_payloads_are_refused_and_never_run(tmp_path, how):
    marker = tmp_path / "PWNED"
    files = _carriers(tmp_path, marker, how)
    for label, (path, _) in files.items():
        with pytest.raises(LogitsFileError) as info:
            load_logits(path)
        assert path.name in str(info.value), label
        assert not marker.exists(), f"{label}: the payload ran"
    # the same files do run the payload under the unsafe loaders: the test can fail
    for label, (_, unsafe_load) in files.items():
        try:
            unsafe_load()
        except Exception:
            pass
        assert marker.exists(), f"{label}: control payload did not run"
        marker.unlink()


def test_pickle_payload_messages(tmp_path):
    marker = tmp_path / "PWNED"
    files = _carriers(tmp_path, marker, "open")
    refuse(files["npy"][0], r"evil\.npy: logits is an object array \(pickled Python objects are never loaded\)")
    refuse(files["npz"][0], r"evil\.npz: logits is an object array")
    refuse(files["npz name"][0], r"evil_name\.npz: name is an object array")
    refuse(files["pt"][0], r"evil\.pt: refused: the file holds Python objects other than tensors "
           r"\(it references (io|builtins)\.open\)")
    refuse(files["raw pickle as .pt"][0], r"raw_pickle\.pt: not a valid torch \(\.pt zip\) archive")
    refuse(files["raw pickle as .npy"][0], r"raw_pickle\.npy: the file is not an npy array")
    assert not marker.exists()


def test_pickle_payload_in_labels_file_and_ignored_member(tmp_path):
    marker = tmp_path / "PWNED"
    z, y = make_logits()
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    refuse(tmp_path / "z.npy", r"y\.npy: labels is an object array", labels_path=tmp_path / "y.npy")
    # a pickle in a member we do not need is simply never opened
    np.savez(tmp_path / "extra.npz", logits=z, labels=y, inputs=np.array([Payload(marker)], dtype=object))
    data = load_logits(tmp_path / "extra.npz")
    np.testing.assert_array_equal(data.logits, z)
    assert not marker.exists()


# ------------------------------------------------------------------- properties


def _valid_files() -> dict[str, bytes]:
    z, y = make_logits(n=20, k=3, seed=5)
    df = pd.DataFrame(z, columns=["a", "b", "c"]).assign(label=y)
    files = {}
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=y, name=np.array("n"))
    files[".npz"] = buf.getvalue()
    buf = io.BytesIO()
    np.save(buf, z)
    files[".npy"] = buf.getvalue()
    buf = io.BytesIO()
    torch.save({"logits": torch.tensor(z), "labels": torch.tensor(y)}, buf)
    files[".pt"] = files[".pth"] = buf.getvalue()
    files[".safetensors"] = safetensors.numpy.save({"logits": z, "labels": y})
    files[".csv"] = df.to_csv(index=False).encode()
    buf = io.BytesIO()
    df.to_parquet(buf)
    files[".parquet"] = buf.getvalue()
    # lm-eval samples as 0.4.4+ writes them (strings), and the 0.4.0-0.4.2 array form.
    lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    samples = [{"doc_id": i, "doc": {}, "target": str(int(y[i])),
                "arguments": {f"gen_args_{j}": {"arg_0": "Q", "arg_1": f" {'ABC'[j]}"} for j in range(3)},
                "filtered_resps": [[repr(float(v)), "False"] for v in lp[i]], "filter": "none"}
               for i in range(len(z))]
    files[".jsonl"] = "".join(json.dumps(s) + "\n" for s in samples).encode()
    files[".json"] = json.dumps(samples).encode()
    return files


VALID_FILES = _valid_files()


def _outcome(content: bytes, filename: str):
    try:
        return load_logits_bytes(content, filename, max_elements=100_000)
    except LogitsFileError as err:
        assert "\n" not in str(err) and str(err).startswith(filename + ": ")
        return err


def test_valid_fuzz_seeds_load():
    for ext, content in VALID_FILES.items():
        assert isinstance(_outcome(content, f"seed{ext}"), LogitsData), ext


# corrupt inputs may make numpy/torch emit a UserWarning on the way to an error
@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ext=st.sampled_from(SUPPORTED_EXTENSIONS), content=st.binary(max_size=4096))
def test_random_bytes_give_data_or_logits_file_error(ext, content):
    _outcome(content, f"fuzz{ext}")


# corrupt inputs may make numpy/torch emit a UserWarning on the way to an error
@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ext=st.sampled_from(SUPPORTED_EXTENSIONS),
    cut=st.none() | st.integers(min_value=0, max_value=10**6),
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(0, 255)), max_size=6),
)
def test_mutated_valid_files_give_data_or_logits_file_error(ext, cut, edits):
    content = bytearray(VALID_FILES[ext])
    for position, value in edits:
        content[position % len(content)] = value
    if cut is not None:
        content = content[: cut % (len(content) + 1)]
    _outcome(bytes(content), f"mutant{ext}")


# ---------------------------------------------------------------- no echo, short and wide files


def test_no_error_echoes_the_file_contents(tmp_path):
    secret = b"rooty:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n"
    for ext in (".npy", ".npz", ".pt", ".safetensors", ".parquet", ".csv", ".jsonl", ".json"):
        path = tmp_path / f"shadow{ext}"
        path.write_bytes(secret * 3)
        with pytest.raises(LogitsFileError) as info:
            load_logits(path)
        message = str(info.value).split(": ", 1)[1]  # after the file name
        assert "rooty" not in message and "$6$" not in message and "salt" not in message, message
    with pytest.raises(LogitsFileError) as info:  # the same lines as a labels file
        load_logits(_fine(tmp_path), labels_path=tmp_path / "shadow.csv")
    assert "rooty" not in str(info.value).split(": ", 1)[1] and "salt" not in str(info.value)
    # through a symlink, numpy's own magic-number message would have quoted the first bytes
    (tmp_path / "link.npy").symlink_to(tmp_path / "shadow.csv")
    refuse(tmp_path / "link.npy", r"link\.npy: the file is not an npy array \(it does not start with numpy's magic")


def _fine(folder):
    np.save(folder / "fine.npy", make_logits()[0])
    return folder / "fine.npy"


def test_library_messages_lose_their_quoted_literals():
    from caliber_core.loading.safety import describe_exception

    text = describe_exception(ValueError("expected b'\\x93NUMPY', got b'root:$' near \"secret\" and 'it\\'s'"))
    assert text == "ValueError: expected <...>, got <...> near <...> and <...>"


def test_a_short_wide_csv_is_refused_before_parsing(tmp_path):
    import time

    rng = np.random.default_rng(0)
    path = tmp_path / "wide.csv"
    z = rng.normal(size=(100, 20_000))
    np.savetxt(path, np.column_stack([z, rng.integers(0, 20_000, 100)]), delimiter=",", fmt="%.3f",
               header=",".join([f"c{j}" for j in range(20_000)] + ["label"]), comments="")
    start = time.perf_counter()
    refuse(path, r"wide\.csv: 100 rows and 20,000 class columns: more classes than rows in a file of fewer than "
           r"200 rows \(.*is it transposed\?\); nothing was computed")
    assert time.perf_counter() - start < 10  # generous: refusing parses no number
    np.savetxt(path, z, delimiter=",", fmt="%.3f")  # headerless: every line is a row
    refuse(path, r"wide\.csv: 100 rows and 20,000 class columns")
    # the same rule on any format, from the declared shape
    np.save(tmp_path / "wide.npy", np.zeros((150, 151), np.float32))
    refuse(tmp_path / "wide.npy", r"wide\.npy: 150 rows and 151 class columns")
    np.save(tmp_path / "fine.npy", rng.normal(size=(150, 150)))
    assert load_logits(tmp_path / "fine.npy").n_classes == 150  # as many classes as rows: accepted
    np.save(tmp_path / "tall.npy", rng.normal(size=(200, 3000)))
    assert load_logits(tmp_path / "tall.npy").n_classes == 3000  # 200 rows are enough for any K


# ------------------------------------------------------ the default limit, sized to the machine


def test_the_default_limit_is_half_the_available_memory_at_40_bytes_per_element():
    assert safety.BYTES_PER_ELEMENT == 40 and safety.MEMORY_SHARE == 0.5
    assert safety.default_max_elements(available=8 * 10**9) == 100_000_000  # 4 GB / 40 B
    assert safety.default_max_elements(available=10**12) == 200_000_000  # capped
    assert safety.default_max_elements(available=10**6) == 1_000_000  # floored
    available = safety.available_memory()
    assert available is None or available > 0


def _claims_bytes(content: bytes, member: str, claimed: int) -> bytes:
    """The zip ``content`` with ``member``'s uncompressed size rewritten to ``claimed`` (headers only)."""
    import struct

    out = bytearray(content)
    name = member.encode()
    for sig, size_at, name_len_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        pos = out.find(sig)
        while pos >= 0:
            (length,) = struct.unpack_from("<H", out, pos + name_len_at)
            if out[pos + name_at:pos + name_at + length] == name:
                struct.pack_into("<I", out, pos + size_at, claimed)
            pos = out.find(sig, pos + 4)
    return bytes(out)


def test_a_small_file_claiming_a_large_size_is_refused_from_its_headers_without_allocating(tmp_path):
    import tracemalloc

    # 1. the npy header inside a 1 kB npz declares 4,000,000,000 float64 elements (32 GB)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logits.npy", _npy_header((2_000_000, 2_000)) + b"\0" * 256)
    small = tmp_path / "claims-shape.npz"
    small.write_bytes(buf.getvalue())
    assert small.stat().st_size < 2_000
    # 2. the zip's own headers claim the member inflates to 4 GB
    sized = tmp_path / "claims-size.npz"
    sized.write_bytes(_claims_bytes(buf.getvalue(), "logits.npy", 4_000_000_000))
    with zipfile.ZipFile(sized) as zf:
        assert zf.getinfo("logits.npy").file_size == 4_000_000_000
    tracemalloc.start()
    try:
        refuse(small, r"claims-shape\.npz: logits shape \(2000000, 2000\) has 4,000,000,000 elements, more than "
               r"max_elements=10,000,000 \(about 160\.0 GB to process; --max-elements raises the limit\)",
               max_elements=10_000_000)
        refuse(sized, r"claims-size\.npz: the logits, labels and name arrays unpack to 4,000,000,000 bytes, more "
               r"than the 161,048,576 allowed for max_elements=10,000,000 \(refusing a possible zip bomb; "
               r"--max-elements raises the limit\)", max_elements=10_000_000)
        refuse(small, r"claims-shape\.npz: logits shape \(2000000, 2000\) has 4,000,000,000 elements")  # the default
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000  # nothing of the claimed size was ever allocated
