"""Full-vocabulary dumps to targets: one streaming pass, then sigma* on the reduced rows.

:func:`config_for_vocab_file` streams a dump once (:mod:`.vocab_stream`) and
:func:`config_for_full_vocab` solves each target on the reduced rows
(:mod:`.vocab_sigma`), whose bounds bracket the full vocabulary's agreement
and (with labels) expected accuracy. The side picks the bound (lower for
at-least, upper for at-most, the midpoint for point) and the config records
both bounds. The streaming and solving names are importable from here too.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import __version__
from ..config import CERTIFIED_LEVEL, SCHEMA, SIDES, TargetRecord
from ..loading.row_stream import open_rows
from ..loading.safety import DEFAULT_MAX_ELEMENTS
from . import bound_kernel, margins
from .accuracy_bounds import accuracy_row_bounds
from .fit import fit_logistic
from .gap_histogram import ReducedRows, row_bounds
from .vocab_sigma import (
    KINDS,
    SEARCH_REACH,
    bounds_at,
    clean_accuracy,
    guess_sigma,
    mean_bounds,
    quadrature_step,
    side_value,
    sigma_for,
    sigma_for_agreement,
)
from .blas_threads import one_blas_thread
from .vocab_stream import (REDUCERS, SUBSET_ROWS, check_kept_size, reduce_file, reduce_file_hashing, stream_labels,
                           subset)

__all__ = [
    "KINDS", "METHOD", "METHOD_ACCURACY", "REDUCERS", "SEARCH_REACH", "STREAM_MIN_CLASSES", "SUBSET_ROWS",
    "bounds_at", "check_kept_size", "clean_accuracy", "config_for_full_vocab", "config_for_vocab_file",
    "guess_sigma", "mean_bounds", "reduce_file", "reduce_file_hashing", "sigma_for", "sigma_for_agreement",
    "stream_labels", "subset",
]

METHOD = "full-vocabulary-streamed-agreement"
#: Below this many classes a matrix is read whole as before; from here on it streams.
STREAM_MIN_CLASSES = 8192


def config_for_full_vocab(
    reduced: ReducedRows,
    targets: Sequence[tuple[str, float]],
    *,
    name: str,
    side: str = "point",
    sha256: str | None = None,
    source: str | None = None,
) -> tuple[list[TargetRecord], dict]:
    """Targets on a streamed full vocabulary, as a caliber.config/v2 dict.

    Parameters
    ----------
    reduced : ReducedRows
        The whole file, reduced (with labels for accuracy and retention targets).
    targets : sequence of (kind, value)
        Agreement targets; accuracy and retention ones too when the reduction has labels.
    name : str
        The model's name in the config.
    side : {"point", "at-least", "at-most"}, default "point"
    sha256, source : str, optional
        The file's digest and path, recorded in the config.

    Returns
    -------
    records : list of TargetRecord
        One per target, with its certified bounds as ``interval``.
    config : dict
        The config; its logistic fit (Eq. ``logistic-decay``) is for display only.

    Raises
    ------
    ValueError
        An accuracy or retention target without labels, an unknown side, an unreachable
        target, or a margin scale that is not positive.
    """
    with one_blas_thread():
        return _config(reduced, targets, name=name, side=side, sha256=sha256, source=source)


def _config(reduced: ReducedRows, targets, *, name: str, side: str, sha256, source) -> tuple[list[TargetRecord], dict]:
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    wrong = [k for k, _ in targets if k != "agreement"]
    if wrong and not reduced.has_labels:
        raise ValueError(f"a full-vocabulary dump read without labels: only --agreement targets apply, "
                         f"got {wrong[0]} (give --labels, or a .npz with a `labels` array)")
    labelled = reduced.has_labels
    a0 = clean_accuracy(reduced) if labelled else None
    chance = 1.0 / reduced.n_classes
    if labelled and not a0 > chance:
        raise ValueError(f"clean accuracy A0={a0:.4g} is not above chance 1/K={chance:.4g}: nothing to calibrate")
    margins_ = reduced.top_gaps[:, 0]
    scale = margins.scale_from_margins(margins_, statistic="median")
    # The display curve on evenly spaced rows first: it also places each target's first bracket.
    shown = subset(reduced)
    grid = np.geomspace(scale / 20.0, scale * 20.0, 16)
    curves = _curves(shown, grid)
    records = []
    for kind, value in targets:
        guess, slope = _guess(grid, *curves[kind], value, side) if kind in curves else (None, None)
        sigma = sigma_for(reduced, value, kind=kind, side=side, guess=guess, slope=slope)
        records.append(_record(reduced, kind, float(value), sigma, side, scale, a0))
    served = [r.sigma for r in records if r.sigma > 0]
    if served and max(served) > grid[-1]:  # the config's sweep must cover every sigma
        grid = np.geomspace(scale / 20.0, 2.0 * max(served), grid.size)
        curves = _curves(shown, grid)
    v = np.asarray(margins.normalized_noise(grid, scale))
    if labelled:
        acc = np.mean(curves["accuracy"], axis=0)
        fit = fit_logistic(v, (acc - chance) / (a0 - chance))
    else:
        fit = fit_logistic(v, (np.mean(curves["agreement"], axis=0) - chance) / (1.0 - chance))
    methods = {k: _method(k) for k in KINDS}
    width = [_width(r) for r in records]
    config = {
        "schema": SCHEMA, "generator": f"caliber_core {__version__}", "model": name, "source": source,
        "sha256": sha256, "n_samples": reduced.n_rows, "n_classes": reduced.n_classes, "statistic": "median",
        "scale": scale, "scales": {"median": scale}, "clean_accuracy": a0, "chance": chance,
        "sweep": {"realizations": 0, "seed": None, "n_points": int(grid.size),
                  "v_min": float(v[0]), "v_max": float(v[-1])},
        "fit": {"mode": "per-model", "law": "logistic", "quantity": "accuracy" if labelled else "agreement",
                **fit.to_dict()},
        "inversion": {"accuracy_targets": methods["accuracy"] if labelled else None,
                      "agreement_targets": METHOD,
                      "note": "full vocabulary streamed once: each row's top gaps (and its label's gap) exactly "
                              "and the rest as a gap histogram; sigma inverts the side's bound of the mean "
                              "(Eq. top1-exact); the logistic is for display only"},
        "bounds": {"method": "streamed gap histogram (bin edges bound the tail); the sigma grid's bounds "
                             f"from {shown.n_rows} evenly spaced rows (display)", "k": int(reduced.top_gaps.shape[1]),
                   "vocab_size": reduced.n_classes, "side": side, "widths": width,
                   "sigma": [float(x) for x in grid]},
        "targets": [r.to_dict() for r in records],
    }
    shown_kind = "accuracy" if labelled else "agreement"
    config["bounds"][f"{shown_kind}_lower"] = [float(x) for x in curves[shown_kind][0]]
    config["bounds"][f"{shown_kind}_upper"] = [float(x) for x in curves[shown_kind][1]]
    return records, config


METHOD_ACCURACY = "full-vocabulary-streamed-accuracy"


def _guess(grid, lower, upper, target: float, side: str) -> tuple[float | None, float | None]:
    """:func:`guess_sigma` on the display curve, and the curve's slope in sigma there."""
    sigma = guess_sigma(grid, lower, upper, target, side=side)
    if sigma is None:
        return None, None
    values = np.array([side_value(a, b, side) for a, b in zip(lower, upper)])
    j = int(np.clip(np.searchsorted(grid, sigma), 1, grid.size - 1))
    return sigma, float((values[j] - values[j - 1]) / (grid[j] - grid[j - 1]))


def _method(kind: str) -> str:
    return METHOD if kind == "agreement" else METHOD_ACCURACY


def _curves(reduced: ReducedRows, grid) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Lower and upper bound of each kind's mean on a sigma grid (one pass over the rows per sigma)."""
    out = {"agreement": (np.empty(grid.size), np.empty(grid.size))}
    if reduced.has_labels:
        a0 = clean_accuracy(reduced)
        out["accuracy"] = (np.empty(grid.size), np.empty(grid.size))

    def at(s: float):
        # With labels only the accuracy is drawn and solved: the wrong rows' agreement is not computed.
        return (accuracy_row_bounds(reduced, s) if reduced.has_labels
                else row_bounds(reduced, s, step=quadrature_step(reduced)))

    # One sigma a task, a thread a core (numpy lets go of the interpreter lock): the same numbers in grid order.
    with ThreadPoolExecutor(max_workers=min(grid.size, os.cpu_count() or 1)) as pool:
        every = list(pool.map(at, grid))
    for i, b in enumerate(every):
        out["agreement"][0][i], out["agreement"][1][i] = b.agree_lo.mean(), b.agree_hi.mean()
        if reduced.has_labels:
            out["accuracy"][0][i], out["accuracy"][1][i] = b.acc_lo.mean(), b.acc_hi.mean()
    if reduced.has_labels:
        out["retention"] = (out["accuracy"][0] / a0, out["accuracy"][1] / a0)
    return out


def _width(record: TargetRecord) -> float:
    bounds = record.interval[record.kind] if record.interval else None
    return 0.0 if bounds is None else float(bounds[1] - bounds[0])


def _record(reduced: ReducedRows, kind: str, value: float, sigma: float, side: str, scale: float,
            a0: float | None) -> TargetRecord:
    """The target's record at its sigma, with the certified bounds of every quantity there."""
    # An accuracy target's bounds are the accuracy rows' (the agreement of every row would cost a pass more).
    b = bounds_at(reduced, sigma, agreement=kind == "agreement")
    agree = None if kind != "agreement" else [float(b.agree_lo.mean()), float(b.agree_hi.mean())]
    acc = None if a0 is None else [float(b.acc_lo.mean()), float(b.acc_hi.mean())]
    interval = {"level": CERTIFIED_LEVEL, "method": "bounds from the reduced rows' bin edges "
                f"(top {reduced.top_gaps.shape[1]} gaps exact)", "agreement": agree,
                "accuracy": acc, "retention": None if acc is None else [x / a0 for x in acc]}
    if kind == "agreement":
        accuracy = retention = None
    else:
        accuracy = value if kind == "accuracy" else value * a0
        retention = accuracy / a0
    method = "none-needed" if sigma == 0.0 else _method(kind)
    return TargetRecord(
        kind=kind, requested=value, accuracy=accuracy, retention=retention,
        agreement=value if kind == "agreement" else None,
        v=float(margins.normalized_noise(sigma, scale)), sigma=sigma, sigma_logistic=None,
        method=method, side=side, interval=interval)


def config_for_vocab_file(path, targets: Sequence[tuple[str, float]], *, side: str = "point",
                          max_elements: int = DEFAULT_MAX_ELEMENTS,
                          progress: Callable[[float], None] | None = None,
                          labels_path=None, early_digest=None) -> tuple[list[TargetRecord], dict]:
    """Stream a full-vocabulary file and calibrate its targets (the CLI's path for V >= 8,192).

    Parameters
    ----------
    path : str or path-like
        ``.npy``, ``.safetensors``, ``.pt`` or ``.npz`` (``np.savez`` or ``np.savez_compressed``; its
        ``labels`` array read too).
    targets : sequence of (kind, value)
        Agreement targets; accuracy and retention ones with labels.
    side : {"point", "at-least", "at-most"}, default "point"
    max_elements : int, default ``DEFAULT_MAX_ELEMENTS``
        The most numbers the reduction may hold.
    progress : callable, optional
        Called with the fraction read in [0, 1].
    labels_path : str or path-like, optional
        A labels file (``.npy``, ``.npz``, ``.csv``, ``.txt``), one label per row; it replaces
        an ``.npz``'s own.
    early_digest : EarlyDigest, optional
        The file's SHA-256 begun before this call (:func:`.loading.early_digest.begin_digest`):
        taken over, or closed.

    Returns
    -------
    records : list of TargetRecord
    config : dict

    Raises
    ------
    LogitsFileError
        See :func:`reduce_file`; labels of another length, or one outside [0, V) (its row named).
    ValueError
        See :func:`config_for_full_vocab`.
    """
    try:
        source = open_rows(path)
        check_kept_size(source, max_elements=max_elements)  # from the header, before anything is read
        labels = stream_labels(source, labels_path, max_elements=max_elements)
        wrong = [k for k, _ in targets if k != "agreement"]
        if wrong and labels is None:  # before the file is read, not after
            raise ValueError(f"a full-vocabulary dump read without labels: only --agreement targets apply, "
                             f"got {wrong[0]} (give --labels, or a .npz with a `labels` array)")
    except BaseException:
        if early_digest is not None:
            early_digest.close()
        raise
    # What the solve needs loads while the file streams: without labels the compiled bounds (built on first
    # use), else scipy.special (the bounds' normal CDF, ~0.5 CPU-s to import; the compiled bounds need none).
    warm = (bound_kernel.available,) if labels is None else (importlib.import_module, "scipy.special")
    threading.Thread(target=warm[0], args=warm[1:], daemon=True).start()
    reduced, source, digest = reduce_file_hashing(path, max_elements=max_elements, progress=progress, labels=labels,
                                                  source=source, early_digest=early_digest)
    try:  # the file's digest finishes on its own thread while the targets are solved
        records, config = config_for_full_vocab(reduced, targets, name=source.name, side=side, source=str(path))
    except BaseException:
        digest.close()
        raise
    config["sha256"] = digest.result()
    return records, config
