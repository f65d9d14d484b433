"""A finished calibration as bytes and back, without pickle: an ``.npz`` of plain arrays.

The sweep is what takes time (minutes on a 50,000 x 1,000 file); its result
is a few arrays: the survival intervals of every (input, draw) pair, the
sweep's curves on its grid, and a handful of scalars (scales, clean accuracy,
the logistic fit). A two-class calibration has no draws (``realizations`` 0,
:mod:`.two_class`): its exact curves are rebuilt from the logits, and only the
grid's curves and the scalars are stored. :func:`calibration_to_bytes` writes them as an ``.npz``
(plain float64 arrays only, deflated) whose ``header`` entry is UTF-8 JSON;
:func:`calibration_from_bytes` reads it back without pickle (each entry's
``.npy`` header is checked, object dtypes and unexpected shapes refused,
before its data is read) and checks every value before building the
:class:`~caliber_core.calibration.calibrate.Calibration`: the format and code
version, the set of entries, dtypes, shapes against the header and the
logits, and the values each array may hold (no NaN anywhere; interval ends
>= 0, ``lo <= hi``; curves in [0, 1]; a grid that increases).

The logits and labels are not stored: the caller passes the ones the
calibration was run on (read again from the file they came from), and their
shape must match the stored one. Nothing is recomputed on the way back, so a
restored calibration gives bit-identical sigma* and curves.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib

import numpy as np

from ..loading.npy import read_header
from ..loading.safety import LogitsFileError
from ..version import __version__
from .calibrate import CURVE_METHODS, Calibration
from .fit import LogisticFit
from .margins import MARGIN_STATISTICS
from .sample import LogitSample
from .sweep import NoiseSweep, SurvivalIntervals
from .two_class import TwoClassCurves

FORMAT = "caliber.calibration-arrays/1"
#: Entries of a stored calibration with labels; without labels the ``acc_*`` and
#: accuracy curves are absent.
INTERVAL_ARRAYS = ("agree_hi", "acc_lo", "acc_hi")
SWEEP_ARRAYS = ("sigma", "v", "accuracy", "accuracy_se", "agreement", "agreement_se", "utility")
_LABELLED_ONLY = ("acc_lo", "acc_hi", "accuracy", "accuracy_se", "utility")
_FIT_QUANTITIES = ("accuracy", "agreement")
_MIN_GRID = 3
_MAX_HEADER = 1 << 16  # bytes of header JSON


class CalibrationArraysError(ValueError):
    """Stored calibration bytes that cannot be read back (damaged, or written by other code).

    A ``ValueError`` subclass; its message names what is wrong, never the bytes.
    """


# ------------------------------------------------------------------------------ write


def calibration_to_arrays(cal: Calibration) -> tuple[dict, dict[str, np.ndarray]]:
    """The calibration as a JSON-able header and named float64 arrays (no logits, no labels).

    Parameters
    ----------
    cal : Calibration

    Returns
    -------
    header : dict
        Format, code version, shapes and every scalar (NaN as ``None``).
    arrays : dict of str to ndarray
        ``agree_hi``, ``acc_lo``, ``acc_hi`` of shape (n_samples, realizations) (none
        at K = 2, where there are no draws) and the sweep's curves of shape
        (n_points,); the label-only ones are absent without labels.
    """
    iv, sw, fit = cal.intervals, cal.sweep, cal.fit
    header = {
        "format": FORMAT,
        "version": __version__,
        "name": cal.name,
        "n_samples": int(cal.n_samples),
        "n_classes": int(cal.n_classes),
        "has_labels": iv.has_labels,
        "pooled": iv.pool_rows is not None,
        "realizations": int(iv.realizations),
        "n_points": int(sw.sigma.size),
        "statistic": cal.statistic,
        "scale": float(cal.scale),
        "scales": {s: _nan_to_none(cal.scales[s]) for s in MARGIN_STATISTICS},
        "clean_accuracy": None if cal.clean_accuracy is None else float(cal.clean_accuracy),
        "fit": {"v50": fit.v50, "p": fit.p, "c": fit.c, "r2": _nan_to_none(fit.r2),
                "rmse": _nan_to_none(fit.rmse), "n_points": int(fit.n_points)},
        "fit_quantity": cal.fit_quantity,
        "curve_method": cal.curve_method,
        "seed": cal.seed,
        "sweep_scale": float(sw.scale),
    }
    draws = ({"agree_hi": iv.agree_hi, "acc_lo": iv.acc_lo, "acc_hi": iv.acc_hi}
             if isinstance(iv, SurvivalIntervals) else {})
    arrays = {**draws, "pool_rows": iv.pool_rows, "sigma": sw.sigma, "v": sw.v, "accuracy": sw.accuracy, "accuracy_se": sw.accuracy_se,
              "agreement": sw.agreement, "agreement_se": sw.agreement_se, "utility": sw.utility}
    arrays = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in arrays.items() if v is not None}
    return header, arrays


def calibration_to_bytes(cal: Calibration) -> bytes:
    """The calibration as ``.npz`` bytes (deflated, no object arrays); see the module docstring.

    Compressed at level 1: about half the bytes of a plain ``numpy.savez``
    (most ``acc_lo`` ends are 0) for ~0.3 s per 10 MB of arrays.

    Parameters
    ----------
    cal : Calibration

    Returns
    -------
    bytes

    Raises
    ------
    ValueError
        A scalar of the calibration that is infinite (NaN is stored as null).
    """
    header, arrays = calibration_to_arrays(cal)
    text = json.dumps(header, allow_nan=False, sort_keys=True, separators=(",", ":"))
    entries = {"header": np.frombuffer(text.encode("utf-8"), dtype=np.uint8), **arrays}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, arr in entries.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    return buf.getvalue()


def _nan_to_none(x) -> float | None:
    x = float(x)
    if math.isnan(x):
        return None
    if not math.isfinite(x):
        raise ValueError(f"a calibration scalar must be finite or NaN, got {x}")
    return x


# ------------------------------------------------------------------------------ read


def calibration_from_bytes(content: bytes, *, logits, labels=None) -> Calibration:
    """Read :func:`calibration_to_bytes` output back, checked, on the logits it was run on.

    Parameters
    ----------
    content : bytes
    logits : array_like of shape (n_samples, n_classes)
        The logits the calibration was made from (not stored with it).
    labels : array_like of int, shape (n_samples,), optional
        Required when the calibration had labels, refused when it had none.

    Returns
    -------
    Calibration

    Raises
    ------
    CalibrationArraysError
        Not an ``.npz``, an object array, a missing or extra entry, another
        format or code version, a wrong dtype or shape, a value an entry may not
        hold, or logits/labels that do not fit the stored calibration.
    """
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise CalibrationArraysError(f"stored calibration must be bytes, got {type(content).__name__}")
    try:
        with zipfile.ZipFile(io.BytesIO(bytes(content))) as zf:
            members = _members(zf)
            header = _header(_read_member(zf, members.pop("header", None), max_elements=_MAX_HEADER))
            shapes = _expected_shapes(header)
            if set(members) != set(shapes):
                missing, extra = sorted(set(shapes) - set(members)), sorted(set(members) - set(shapes))
                raise CalibrationArraysError(
                    f"entries do not match the header: missing {missing}, extra {extra}")
            entries = {name: _read_member(zf, members[name], shape=shapes[name]) for name in sorted(members)}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError, zlib.error) as exc:
        if isinstance(exc, CalibrationArraysError):
            raise
        raise CalibrationArraysError(f"not a readable .npz of plain arrays ({_short(exc)})") from None
    arrays = _checked_arrays(header, entries)
    return calibration_from_arrays(header, arrays, logits=logits, labels=labels)


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    out = {}
    for info in zf.infolist():
        name = info.filename
        if not name.endswith(".npy") or "/" in name or name[:-4] in out:
            raise CalibrationArraysError(f"unexpected entry {name!r} (only NAME.npy, once each)")
        out[name[:-4]] = info
    return out


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo | None, *, shape: tuple | None = None,
                 max_elements: int | None = None) -> np.ndarray | None:
    """One ``.npy`` entry, its header checked before any data is read (no object dtypes, the shape).

    The header is parsed by the loader's one safe reader (:func:`caliber_core.loading.npy.read_header`,
    numpy's parser under its header-size limit).
    """
    if info is None:
        return None
    name = info.filename[:-4]
    with zf.open(info) as f:
        try:
            header = read_header(f, src=name, where="the member")
        except LogitsFileError as exc:
            raise CalibrationArraysError(str(exc)) from None
        declared, fortran, dtype = header.shape, header.fortran_order, header.dtype
        if dtype.hasobject:
            raise CalibrationArraysError(f"{name} is an object array (refused: it would need pickle)")
        if shape is not None and declared != shape:
            raise CalibrationArraysError(f"{name} must have shape {shape}, got {declared}")
        if max_elements is not None and math.prod(declared) > max_elements:
            raise CalibrationArraysError(f"{name} is too large ({math.prod(declared)} elements)")
        data = f.read(math.prod(declared) * dtype.itemsize + 1)
    if len(data) != math.prod(declared) * dtype.itemsize:
        raise CalibrationArraysError(f"{name}: {len(data)} bytes for shape {declared} of {dtype}")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(declared[::-1]).T if fortran else arr.reshape(declared)


def _expected_shapes(h: dict) -> dict[str, tuple]:
    names = set(INTERVAL_ARRAYS + SWEEP_ARRAYS)
    if not h["has_labels"]:
        names -= set(_LABELLED_ONLY)
    if h["realizations"] == 0:  # closed-form curves: no draws stored
        names -= set(INTERVAL_ARRAYS)
    rows, grid = (h["n_samples"], h["realizations"]), (h["n_points"],)
    shapes = {name: rows if name in INTERVAL_ARRAYS else grid for name in names}
    if h["pooled"]:
        shapes["pool_rows"] = (h["n_samples"], h["realizations"] // 2)
    return shapes


def calibration_from_arrays(header: dict, arrays: dict[str, np.ndarray], *, logits,
                            labels=None) -> Calibration:
    """Build the calibration from a checked header and arrays (see :func:`calibration_from_bytes`).

    Parameters
    ----------
    header : dict
        A header checked by :func:`calibration_from_bytes`.
    arrays : dict of str to ndarray
        Its arrays, checked against the header's shapes.
    logits : LogitSample, or array_like of shape (n_samples, n_classes)
    labels : array_like of int, optional
        Only with raw logits.

    Returns
    -------
    Calibration

    Raises
    ------
    CalibrationArraysError
        Logits of another shape, labels missing or refused, or invalid logits or labels.
    """
    if isinstance(logits, LogitSample):
        sample = logits
        if labels is not None:
            raise CalibrationArraysError("labels come with the LogitSample; pass them when building it")
    else:
        try:
            sample = LogitSample(logits)
        except ValueError as exc:
            raise CalibrationArraysError(f"logits: {exc}") from None
    n, k = header["n_samples"], header["n_classes"]
    z = sample.logits
    if z.shape != (n, k):
        raise CalibrationArraysError(f"stored calibration is of {n} x {k} logits, got shape {z.shape}")
    y = sample.labels if isinstance(logits, LogitSample) else labels
    if header["has_labels"]:
        if y is None:
            raise CalibrationArraysError("stored calibration was made with labels; none given")
        if not sample.has_labels:
            try:
                sample = LogitSample(z, y)
            except ValueError as exc:
                raise CalibrationArraysError(f"labels: {exc}") from None
    elif y is not None:
        raise CalibrationArraysError("stored calibration was made without labels; labels given")
    a = arrays.get
    pool = a("pool_rows")
    if header["realizations"] == 0:
        intervals = TwoClassCurves(sample, seed=header["seed"])
    else:
        intervals = SurvivalIntervals(agree_hi=a("agree_hi"), acc_lo=a("acc_lo"), acc_hi=a("acc_hi"),
                                      n_classes=k, seed=header["seed"],
                                      pool_rows=None if pool is None else pool.astype(np.int64))
    sweep = NoiseSweep(sigma=a("sigma"), v=a("v"), accuracy=a("accuracy"), accuracy_se=a("accuracy_se"),
                       agreement=a("agreement"), agreement_se=a("agreement_se"), utility=a("utility"),
                       scale=header["sweep_scale"], clean_accuracy=header["clean_accuracy"], n_classes=k,
                       realizations=header["realizations"], seed=header["seed"])
    f = header["fit"]
    fit = LogisticFit(v50=f["v50"], p=f["p"], c=f["c"], r2=_none_to_nan(f["r2"]),
                      rmse=_none_to_nan(f["rmse"]), n_points=f["n_points"])
    return Calibration(
        name=header["name"], n_samples=n, n_classes=k, statistic=header["statistic"],
        scale=header["scale"], scales={s: _none_to_nan(v) for s, v in header["scales"].items()},
        clean_accuracy=header["clean_accuracy"], intervals=intervals, sweep=sweep, fit=fit,
        fit_quantity=header["fit_quantity"], curve_method=header["curve_method"], seed=header["seed"],
        sample=sample,
    )


def _none_to_nan(x) -> float:
    return float("nan") if x is None else x


def _short(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:200]


def _header(raw) -> dict:
    if raw is None:
        raise CalibrationArraysError("no header entry")
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise CalibrationArraysError(f"header must be 1-D uint8 (JSON text), got {raw.dtype} {raw.shape}")
    try:
        h = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationArraysError(f"header is not JSON ({_short(exc)})") from None
    if not isinstance(h, dict):
        raise CalibrationArraysError("header is not a JSON object")
    if h.get("format") != FORMAT:
        raise CalibrationArraysError(f"format must be {FORMAT!r}, got {h.get('format')!r}")
    if h.get("version") != __version__:
        raise CalibrationArraysError(f"written by version {h.get('version')!r}, this is {__version__}")
    _need(h, "name", isinstance(h.get("name"), str), "a string")
    for key, low in (("n_samples", 1), ("n_classes", 2), ("realizations", 0), ("n_points", _MIN_GRID)):
        _need(h, key, _is_int(h.get(key)) and h[key] >= low, f"an integer >= {low}")
    _need(h, "realizations", h["realizations"] % 2 == 0, "even (antithetic pairs)")
    _need(h, "realizations", (h["realizations"] == 0) == (h["n_classes"] == 2 and h.get("curve_method") == "exact"),
          "0 exactly at K = 2 with exact curves (closed form, no draws)")
    _need(h, "has_labels", isinstance(h.get("has_labels"), bool), "true or false")
    _need(h, "pooled", isinstance(h.get("pooled"), bool), "true or false")
    _need(h, "pooled", not (h["pooled"] and h["realizations"] == 0), "false without draws")
    _need(h, "statistic", h.get("statistic") in MARGIN_STATISTICS, f"one of {MARGIN_STATISTICS}")
    _need(h, "curve_method", h.get("curve_method") in CURVE_METHODS[1:], f"one of {CURVE_METHODS[1:]}")
    _need(h, "fit_quantity", h.get("fit_quantity") in _FIT_QUANTITIES, f"one of {_FIT_QUANTITIES}")
    _need(h, "fit_quantity", (h["fit_quantity"] == "accuracy") == h["has_labels"],
          "accuracy exactly when there are labels")
    _need(h, "seed", h.get("seed") is None or _is_int(h.get("seed")), "an integer or null")
    for key in ("scale", "sweep_scale"):
        _need(h, key, _is_float(h.get(key)) and h[key] > 0, "a finite number > 0")
    _need(h, "scale", h["scale"] == h["sweep_scale"], "the sweep's scale")
    scales = h.get("scales")
    _need(h, "scales", isinstance(scales, dict) and set(scales) == set(MARGIN_STATISTICS)
          and all(v is None or (_is_float(v) and v > 0) for v in scales.values()),
          f"numbers > 0 (or null) for exactly {MARGIN_STATISTICS}")
    _need(h, "scales", scales[h["statistic"]] == h["scale"], "the scale at its own statistic")
    a0, k = h.get("clean_accuracy"), h["n_classes"]
    if h["has_labels"]:
        _need(h, "clean_accuracy", _is_float(a0) and 1.0 / k < a0 <= 1.0, f"a number in (1/K, 1] (K={k})")
    else:
        _need(h, "clean_accuracy", a0 is None, "null without labels")
    fit = h.get("fit")
    ok = (isinstance(fit, dict) and set(fit) == {"v50", "p", "c", "r2", "rmse", "n_points"}
          and all(_is_float(fit[x]) for x in ("v50", "p", "c")) and fit["v50"] > 0 and fit["p"] > 0
          and 0 <= fit["c"] < 1 and all(fit[x] is None or _is_float(fit[x]) for x in ("r2", "rmse"))
          and _is_int(fit["n_points"]) and fit["n_points"] >= _MIN_GRID)
    _need(h, "fit", ok, "v50 > 0, p > 0, c in [0, 1), r2, rmse and n_points >= 3")
    return h


def _need(h: dict, key: str, ok: bool, rule: str) -> None:
    if not ok:
        raise CalibrationArraysError(f"header {key} must be {rule}, got {h.get(key)!r}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_float(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _checked_arrays(h: dict, entries: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name in sorted(entries):
        arr = entries[name]
        if arr.dtype != np.float64:
            raise CalibrationArraysError(f"{name} must be float64, got {arr.dtype}")
        if np.isnan(arr).any():
            raise CalibrationArraysError(f"{name} holds NaN")
    e = entries
    if "agree_hi" in e:  # absent for closed-form curves (no draws)
        _rule(e, "agree_hi", (e["agree_hi"] >= 0).all(), "ends >= 0 (inf allowed)")
    if "acc_lo" in e:
        _rule(e, "acc_lo", np.isfinite(e["acc_lo"]).all() and (e["acc_lo"] >= 0).all(), "finite ends >= 0")
        _rule(e, "acc_hi", (e["acc_hi"] >= e["acc_lo"]).all(), "ends >= acc_lo")
    if "pool_rows" in e:
        rows = e["pool_rows"]
        _rule(e, "pool_rows", ((rows >= 0) & (rows < 2**31) & (rows == np.floor(rows))).all(),
              "integers in [0, 2^31)")
    for name in ("sigma", "v"):
        arr = e[name]
        _rule(e, name, np.isfinite(arr).all() and arr[0] > 0 and (np.diff(arr) > 0).all(),
              "finite, > 0 and increasing")
    for name in ("accuracy", "agreement"):
        if name in e:
            _rule(e, name, ((e[name] >= 0) & (e[name] <= 1)).all(), "in [0, 1]")
    for name in ("accuracy_se", "agreement_se"):
        if name in e:
            _rule(e, name, np.isfinite(e[name]).all() and (e[name] >= 0).all(), "finite and >= 0")
    if "utility" in e:
        _rule(e, "utility", np.isfinite(e["utility"]).all(), "finite")
    # Native byte order, C order, writable: what a fresh calibration holds.
    return {name: np.array(arr, dtype=np.float64, order="C") for name, arr in entries.items()}


def _rule(entries: dict, name: str, ok, rule: str) -> None:
    if not bool(ok):
        raise CalibrationArraysError(f"{name} must hold {rule}")
