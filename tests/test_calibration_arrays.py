"""A calibration stored as .npz bytes: exact round trip, and refusal of anything tampered with."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from caliber_core import __version__
from caliber_core.calibration.calibrate import calibrate_model, sigma_for_target
from caliber_core.calibration.calibration_arrays import (
    FORMAT,
    CalibrationArraysError,
    calibration_from_bytes,
    calibration_to_arrays,
    calibration_to_bytes,
)
from caliber_core.calibration.corridor import model_curves
from caliber_core.loading import load_logits

DATA = Path(__file__).resolve().parent.parent / "data"
TARGETS = (("retention", 0.95), ("retention", 0.8), ("retention", 0.6), ("accuracy", 0.5),
           ("agreement", 0.9), ("agreement", 0.5))


@pytest.fixture(scope="module")
def exact_cal():
    data = load_logits(DATA / "digits_cnn.npz")
    return data, calibrate_model(data.logits, data.labels, name=data.name, seed=3)


@pytest.fixture(scope="module")
def mc_cal():
    # Large enough that "auto" picks the Monte-Carlo curve.
    rng = np.random.default_rng(11)
    n, k = 3000, 200
    y = rng.integers(0, k, n)
    z = rng.standard_normal((n, k))
    z[np.arange(n), y] += 3.0
    return z, y, calibrate_model(z, y, realizations=8, seed=0)


def _same_arrays(a, b):
    ha, aa = calibration_to_arrays(a)
    hb, ab = calibration_to_arrays(b)
    assert ha == hb
    assert aa.keys() == ab.keys()
    for name in aa:
        assert np.array_equal(aa[name], ab[name]), name  # inf == inf, bit for bit on finite values


def test_exact_round_trip_gives_identical_sigma_and_curves(exact_cal):
    data, cal = exact_cal
    assert cal.curve_method == "exact"
    back = calibration_from_bytes(calibration_to_bytes(cal), logits=data.logits, labels=data.labels)
    _same_arrays(cal, back)
    assert back.scales == cal.scales and back.fit == cal.fit and back.seed == 3
    for kind, value in TARGETS:
        a = sigma_for_target(cal, value, kind=kind)
        b = sigma_for_target(back, value, kind=kind)
        assert a == b, (kind, value)  # every field, sigma* bit-identical
        assert sigma_for_target(back, value, kind=kind, inversion="logistic") == \
            sigma_for_target(cal, value, kind=kind, inversion="logistic")
    grid = np.geomspace(*cal.sigma_range(), 20)
    ca = model_curves(cal.logits, cal.labels, grid, draws=cal.intervals, method="monte-carlo")
    cb = model_curves(back.logits, back.labels, grid, draws=back.intervals, method="monte-carlo")
    for field in ("agreement", "accuracy", "lower", "upper"):
        if hasattr(ca, field):
            assert np.array_equal(getattr(ca, field), getattr(cb, field)), field


def test_monte_carlo_round_trip_without_and_with_labels(mc_cal):
    z, y, cal = mc_cal
    assert cal.curve_method == "monte-carlo"
    back = calibration_from_bytes(calibration_to_bytes(cal), logits=z, labels=y)
    _same_arrays(cal, back)
    for value in (0.9, 0.7, 0.5):
        assert sigma_for_target(back, value).sigma == sigma_for_target(cal, value).sigma
    # The pool rows the draws were read from come back, so the block standard errors do too.
    assert back.intervals.pool_rows is not None
    grid = np.geomspace(*cal.sigma_range(), 5)
    assert np.array_equal(back.intervals.accuracy_stderr(grid), cal.intervals.accuracy_stderr(grid))
    unlabelled = calibrate_model(z, None, realizations=8, seed=None, statistic="mean")
    back = calibration_from_bytes(calibration_to_bytes(unlabelled), logits=z)
    _same_arrays(unlabelled, back)
    assert back.labels is None and back.seed is None and back.fit_quantity == "agreement"
    assert sigma_for_target(back, 0.6, kind="agreement") == sigma_for_target(unlabelled, 0.6, kind="agreement")


def test_nan_scale_survives(mc_cal):
    z, y, cal = mc_cal
    header, _ = calibration_to_arrays(cal)
    cal.scales["trimmed"], saved = float("nan"), cal.scales["trimmed"]
    try:
        back = calibration_from_bytes(calibration_to_bytes(cal), logits=z, labels=y)
        assert np.isnan(back.scales["trimmed"]) and back.scales["median"] == cal.scales["median"]
    finally:
        cal.scales["trimmed"] = saved
    assert header["scales"]["trimmed"] == saved


# ------------------------------------------------------------------------------ refusals


def _rewrite(content: bytes, *, header=None, arrays=None, drop=(), raw=None) -> bytes:
    """The stored npz with entries replaced (``raw``: written as given, object arrays included)."""
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        entries = {k: npz[k] for k in npz.files}
    if header is not None:
        h = json.loads(entries["header"].tobytes())
        header(h)
        entries["header"] = np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)
    for name, fn in (arrays or {}).items():
        entries[name] = fn(entries[name].copy())
    for name in drop:
        entries.pop(name)
    entries.update(raw or {})
    buf = io.BytesIO()
    np.savez(buf, **entries)
    return buf.getvalue()


def _set(key, value):
    return lambda h: h.__setitem__(key, value)


def _put(idx, value):
    def fn(a):
        a[idx] = value
        return a
    return fn


@pytest.mark.parametrize("change, match", [
    (dict(raw={"agree_hi": np.array([object()] * 3, dtype=object)}), "agree_hi is an object array"),
    (dict(raw={"header": np.zeros(1 << 17, dtype=np.uint8)}), "header is too large"),
    (dict(arrays={"agree_hi": lambda a: a[:, :-2]}), r"agree_hi must have shape"),
    (dict(arrays={"sigma": lambda a: a[:-1]}), r"sigma must have shape"),
    (dict(arrays={"acc_hi": lambda a: a.astype(np.float32)}), "acc_hi must be float64"),
    (dict(arrays={"agree_hi": _put((0, 0), np.nan)}), "agree_hi holds NaN"),
    (dict(arrays={"accuracy": _put(3, np.nan)}), "accuracy holds NaN"),
    (dict(arrays={"acc_lo": _put((1, 1), np.inf)}), "acc_lo must hold finite"),
    (dict(arrays={"acc_lo": _put((1, 1), 1e9)}), "acc_hi must hold ends >= acc_lo"),
    (dict(arrays={"agree_hi": _put((2, 0), -1.0)}), "agree_hi must hold ends >= 0"),
    (dict(arrays={"sigma": lambda a: a[::-1].copy()}), "sigma must hold finite, > 0 and increasing"),
    (dict(arrays={"agreement": _put(0, 1.5)}), r"agreement must hold in \[0, 1\]"),
    (dict(arrays={"utility": _put(0, np.inf)}), "utility must hold finite"),
    (dict(drop=("acc_lo",)), r"missing \['acc_lo'\]"),
    (dict(raw={"extra": np.zeros(3)}), r"extra \['extra'\]"),
    (dict(drop=("header",)), "no header"),
    (dict(header=_set("version", "0.0.0")), "written by version"),
    (dict(header=_set("format", "other/1")), "format must be"),
    (dict(header=_set("n_samples", 499)), r"acc_hi must have shape \(499"),
    (dict(header=_set("statistic", "max")), "header statistic must be"),
    (dict(header=_set("scale", float("nan"))), "not JSON|header scale"),
    (dict(header=_set("scale", -1.0)), "header scale must be"),
    (dict(header=_set("clean_accuracy", 0.05)), r"clean_accuracy must be a number in \(1/K, 1\]"),
    (dict(header=_set("has_labels", False)), "fit_quantity must be accuracy exactly"),
    (dict(header=_set("realizations", 3)), "header realizations must be even"),
    (dict(header=lambda h: h["fit"].__setitem__("p", 0)), "header fit must be"),
    (dict(header=_set("seed", "0")), "header seed must be"),
])
def test_tampered_bytes_are_refused(exact_cal, change, match):
    data, cal = exact_cal
    bad = _rewrite(calibration_to_bytes(cal), **change)
    with pytest.raises(CalibrationArraysError, match=match):
        calibration_from_bytes(bad, logits=data.logits, labels=data.labels)


def test_object_array_is_never_unpickled(exact_cal, tmp_path):
    data, cal = exact_cal
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):
            return (marker.write_text, ("x",))

    buf = io.BytesIO()
    np.savez(buf, header=np.array([Boom()], dtype=object))
    with pytest.raises(CalibrationArraysError, match="header is an object array"):
        calibration_from_bytes(buf.getvalue(), logits=data.logits, labels=data.labels)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04" + b"\0" * 40])
def test_garbage_is_refused(exact_cal, content):
    data, cal = exact_cal
    with pytest.raises(CalibrationArraysError, match="not a readable .npz"):
        calibration_from_bytes(content, logits=data.logits, labels=data.labels)


def test_flipped_byte_is_refused(exact_cal):
    data, cal = exact_cal
    content = bytearray(calibration_to_bytes(cal))
    content[len(content) // 3] ^= 0xFF  # inside a deflated entry: the zip's CRC catches it
    with pytest.raises(CalibrationArraysError):
        calibration_from_bytes(bytes(content), logits=data.logits, labels=data.labels)


def test_duplicate_and_foreign_entries_are_refused(exact_cal):
    data, cal = exact_cal
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("dir/header.npy", b"x")
    with pytest.raises(CalibrationArraysError, match="unexpected entry 'dir/header.npy'"):
        calibration_from_bytes(buf.getvalue(), logits=data.logits, labels=data.labels)


def test_truncated_bytes_are_refused(exact_cal):
    data, cal = exact_cal
    content = calibration_to_bytes(cal)
    with pytest.raises(CalibrationArraysError):
        calibration_from_bytes(content[: len(content) // 2], logits=data.logits, labels=data.labels)


def test_header_not_json_is_refused(exact_cal):
    data, cal = exact_cal
    bad = _rewrite(calibration_to_bytes(cal), raw={"header": np.frombuffer(b"\xff{", dtype=np.uint8)})
    with pytest.raises(CalibrationArraysError, match="header is not JSON"):
        calibration_from_bytes(bad, logits=data.logits, labels=data.labels)


def test_logits_and_labels_must_fit(exact_cal):
    data, cal = exact_cal
    content = calibration_to_bytes(cal)
    with pytest.raises(CalibrationArraysError, match="stored calibration is of 500 x 10 logits"):
        calibration_from_bytes(content, logits=data.logits[:-1], labels=data.labels[:-1])
    with pytest.raises(CalibrationArraysError, match="made with labels; none given"):
        calibration_from_bytes(content, logits=data.logits)
    with pytest.raises(CalibrationArraysError, match="labels: labels must be integers"):
        calibration_from_bytes(content, logits=data.logits, labels=data.labels + 100)


def test_header_is_plain_json_named_by_format(exact_cal):
    _, cal = exact_cal
    content = calibration_to_bytes(cal)
    with zipfile.ZipFile(io.BytesIO(content)) as zf:
        names = sorted(zf.namelist())
    assert "header.npy" in names and all(n.endswith(".npy") for n in names)
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:  # an ordinary .npz
        assert sorted(npz.files) == sorted(n[:-4] for n in names)
        assert json.loads(npz["header"].tobytes())["format"] == FORMAT
    header, arrays = calibration_to_arrays(cal)
    assert header["format"] == FORMAT and header["version"] == __version__
    assert all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays.values())


def test_an_oversized_npy_header_is_refused_before_it_is_parsed(exact_cal):
    # The loader's limit (numpy's max_header_size) holds here too: one safe .npy reader.
    data, cal = exact_cal
    content = calibration_to_bytes(cal)
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        entries = {k: npz[k] for k in npz.files}
    padding = " " * 20_000
    header = ("{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % entries["header"].size + padding
              + "\n").encode("latin1")
    member = b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + entries["header"].tobytes()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, arr in entries.items():
            if name != "header":
                with zf.open(f"{name}.npy", "w") as f:
                    np.lib.format.write_array(f, arr, allow_pickle=False)
        zf.writestr("header.npy", member)
    with pytest.raises(CalibrationArraysError, match=r"header: the member is not a valid npy array"):
        calibration_from_bytes(buf.getvalue(), logits=data.logits, labels=data.labels)
