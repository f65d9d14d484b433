"""Full-vocabulary dumps to agreement targets: one streaming pass, then sigma* on the reduced rows.

:func:`reduce_file` reads a ``.npy``/``.safetensors``/``.pt`` matrix block by
block (:mod:`caliber_core.loading.row_stream`) and keeps, per row, the top gaps
and a gap histogram (:mod:`.gap_histogram`): 4,000 x 128,000 float32 (2 GB)
becomes 4,000 x (32 + 1,282) numbers. :func:`config_for_full_vocab` solves each
agreement target on the reduced rows, whose bounds bracket the full
vocabulary's agreement; the side picks the bound (lower for at-least, upper
for at-most, the midpoint for point) and the config records both bounds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import __version__
from ..config import CERTIFIED_LEVEL, SCHEMA, SIDES, TargetRecord
from ..loading.row_stream import RowSource, open_rows
from ..loading.safety import DEFAULT_MAX_ELEMENTS, display_name, fail
from . import margins
from .fit import fit_logistic
from .gap_histogram import TOP_GAPS, ReducedRows, agreement_bounds, reduce_block

METHOD = "full-vocabulary-streamed-agreement"
#: Below this many classes a matrix is read whole as before; from here on it streams.
STREAM_MIN_CLASSES = 8192
_BOUND = {"at-least": 0, "at-most": 1}


def reduce_file(path, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS,
                progress: Callable[[float], None] | None = None) -> tuple[ReducedRows, RowSource, str]:
    """Stream a full-vocabulary matrix once and reduce every row.

    Parameters
    ----------
    path : str or os.PathLike
    m : int, default TOP_GAPS
        Gaps kept exactly per row.
    max_elements : int
        The element limit applies to what is kept: rows x (m + bins).
    progress : callable, optional
        Called with the fraction of rows done.

    Returns
    -------
    reduced : ReducedRows
    source : RowSource
    sha256 : str
        Of the file's bytes (hashed as they stream).

    Raises
    ------
    LogitsFileError
        A bad header, a truncated file, a NaN or +inf row, or a reduced size over ``max_elements``.
    """
    from .gap_histogram import N_BINS

    source = open_rows(path)
    src = display_name(source.path)
    m = min(m, source.n_classes - 1)
    kept = source.n_rows * (m + N_BINS)
    if kept > max_elements:
        raise fail(src, f"{source.n_rows:,} rows reduce to {kept:,} numbers, more than "
                   f"max_elements={max_elements:,}")
    top_gaps = np.empty((source.n_rows, m))
    counts = np.empty((source.n_rows, N_BINS), dtype=np.int32)
    digest = hashlib.sha256()
    with open(source.path, "rb") as fh:
        digest.update(fh.read(source.offset))
    # Three threads share the work: this one reads, one hashes the bytes as read (hashlib lets go of
    # the interpreter lock), one reduces; a buffer is reused only once both are done with it.
    hashing = source.dtype == "float32"  # other dtypes are converted in place: hashed from the file
    in_flight: list = []
    with ThreadPoolExecutor(max_workers=1) as hasher, ThreadPoolExecutor(max_workers=1) as reducer:
        for start, block in source.blocks(buffers=_BUFFERS):
            if len(in_flight) == _BUFFERS - 1:
                _finish(in_flight.pop(0), top_gaps, counts, src, progress, source.n_rows)
            digest_job = hasher.submit(digest.update, block.view(np.uint8)) if hashing else None
            in_flight.append((start, block, digest_job, reducer.submit(_reduce_after, digest_job, block, m)))
        while in_flight:
            _finish(in_flight.pop(0), top_gaps, counts, src, progress, source.n_rows)
    if source.dtype == "float32":
        with open(source.path, "rb") as fh:  # whatever follows the matrix (other tensors)
            fh.seek(source.offset + source.n_rows * source.n_classes * source.itemsize)
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                digest.update(chunk)
    sha = digest.hexdigest() if source.dtype == "float32" else _file_sha256(source.path)
    return ReducedRows(top_gaps, counts, source.n_classes), source, sha


_BUFFERS = 3


def _reduce_after(digest_job, block: np.ndarray, m: int):
    """Reduce a block once its bytes are hashed (the reduction overwrites them)."""
    if digest_job is not None:
        digest_job.result()
    try:
        return reduce_block(block, m=m)
    except ValueError:
        return None  # a NaN or +inf row: the block is untouched, _finish names the row


def _finish(job, top_gaps, counts, src, progress, n_rows) -> None:
    start, block, _, reduce_job = job
    result = reduce_job.result()
    if result is None:
        row = start + int(np.argmax(~np.isfinite(block.max(axis=1))))
        raise fail(src, f"row {row} holds NaN or +inf (every logit must be finite or -inf)")
    g, c = result
    top_gaps[start : start + g.shape[0]] = g
    counts[start : start + g.shape[0]] = c
    if progress is not None:
        progress((start + g.shape[0]) / n_rows)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


SUBSET_ROWS = 400


def subset(reduced: ReducedRows, rows: int = SUBSET_ROWS) -> ReducedRows:
    """Evenly spaced rows of a reduction (a first bracket for sigma, and the display fit).

    Parameters
    ----------
    reduced : ReducedRows
    rows : int, default ``SUBSET_ROWS``
        Rows kept; a reduction with no more rows is returned as is.

    Returns
    -------
    ReducedRows
    """
    if reduced.n_rows <= rows:
        return reduced
    pick = np.linspace(0, reduced.n_rows - 1, rows).round().astype(np.int64)
    return ReducedRows(reduced.top_gaps[pick], reduced.counts[pick], reduced.n_classes)


def mean_bounds(reduced: ReducedRows, sigma: float) -> tuple[float, float]:
    """Lower and upper bound of the mean agreement at sigma.

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
        >= 0.

    Returns
    -------
    lower, upper : float

    Raises
    ------
    ValueError
        An invalid sigma.

    Notes
    -----
    Means of the per-row bounds on Eq. ``top1-exact`` (:func:`agreement_bounds`).
    """
    lo, hi = agreement_bounds(reduced, sigma)
    return float(lo.mean()), float(hi.mean())


def _side_value(lo: float, hi: float, side: str) -> float:
    return 0.5 * (lo + hi) if side == "point" else (lo, hi)[_BOUND[side]]


def guess_sigma(grid, lower, upper, target: float, *, side: str = "point") -> float | None:
    """sigma where a curve measured on a grid crosses ``target`` (log-linear), or None outside it.

    Parameters
    ----------
    grid : ndarray of float > 0, increasing
    lower, upper : sequence of float
        The curve's bounds at each grid point.
    target : float
    side : {"point", "at-least", "at-most"}, default "point"
        Which curve: the bounds' midpoint, the lower bound or the upper bound.

    Returns
    -------
    float or None
        None when the curve is already below ``target`` at the first point or never falls below it.

    Raises
    ------
    KeyError
        An unknown ``side``.
    """
    values = np.array([_side_value(a, b, side) for a, b in zip(lower, upper)])
    below = np.flatnonzero(values < target)
    if below.size == 0 or below[0] == 0:
        return None
    j = int(below[0])
    x0, x1, y0, y1 = np.log(grid[j - 1]), np.log(grid[j]), values[j - 1], values[j]
    return float(np.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0)))


def sigma_for_agreement(reduced: ReducedRows, target: float, *, side: str = "point",
                        rel_tol: float = 1e-6, guess: float | None = None) -> float:
    """sigma at which the side's bound of the mean agreement equals ``target`` (Brent's method).

    ``guess`` (from :func:`guess_sigma` on evenly spaced rows) starts a 3% bracket,
    so the full rows are evaluated a few times only.

    Parameters
    ----------
    reduced : ReducedRows
    target : float
        In (0, 1).
    side : {"point", "at-least", "at-most"}, default "point"
        The bounds' midpoint, or the bound that keeps the target.
    rel_tol : float, default 1e-6
        Brent's relative tolerance, and the step by which the root is moved to the side.
    guess : float, optional
        Without it, a large reduction is first solved on :func:`subset` rows.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        A target outside (0, 1), or one above the agreement at sigma -> 0 (ties at the top).

    Notes
    -----
    Eq. ``top1-exact`` inverted through its per-row bounds.
    """
    from scipy.optimize import brentq

    if not 0.0 < target < 1.0:
        raise ValueError(f"agreement target must be in (0, 1), got {target!r}")
    ceiling = float(np.mean(np.where(reduced.top_gaps[:, 0] > 0, 1.0, 0.5)))
    if target >= ceiling:
        raise ValueError(f"agreement target {target:g} is above {ceiling:.4g}, the agreement as sigma -> 0 "
                         "(ties at the top of some rows)")

    memo: dict[float, float] = {}

    def gap(s: float) -> float:
        if s not in memo:  # brentq evaluates the bracket's ends again
            memo[s] = _side_value(*mean_bounds(reduced, s), side) - target
        return memo[s]

    if guess is None and reduced.n_rows > 2 * SUBSET_ROWS:
        guess = sigma_for_agreement(subset(reduced), target, side=side, rel_tol=1e-3)
    if guess is not None:
        a, b = guess / 1.03, guess * 1.03
    else:
        positive = reduced.top_gaps[:, 0][reduced.top_gaps[:, 0] > 0]
        a = b = float(np.median(positive))
    while gap(a) < 0:
        a /= 3.0
    if b <= a:
        b = a * 3.0
    while gap(b) >= 0:
        a, b = b, b * 3.0
    root = brentq(gap, a, b, xtol=1e-12, rtol=rel_tol)
    # Keep the side's promise at the returned sigma (Brent returns a point within rel_tol).
    if side == "at-least":
        while gap(root) < 0:
            root *= 1 - rel_tol
    elif side == "at-most":
        while gap(root) > 0:
            root *= 1 + rel_tol
    return float(root)


def config_for_full_vocab(
    reduced: ReducedRows,
    targets: Sequence[tuple[str, float]],
    *,
    name: str,
    side: str = "point",
    sha256: str | None = None,
    source: str | None = None,
) -> tuple[list[TargetRecord], dict]:
    """Agreement targets on a streamed full vocabulary, as a caliber.config/v2 dict.

    Parameters
    ----------
    reduced : ReducedRows
        The whole file, reduced.
    targets : sequence of (kind, value)
        Agreement targets only.
    name : str
        The model's name in the config.
    side : {"point", "at-least", "at-most"}, default "point"
    sha256, source : str, optional
        The file's digest and path, recorded in the config.

    Returns
    -------
    records : list of TargetRecord
        One per target, with its bounds as ``interval``.
    config : dict
        The config; its logistic fit (Eq. ``logistic-decay``) is for display only.

    Raises
    ------
    ValueError
        A non-agreement target (a dump holds no labels), an unknown side, an unreachable target,
        or a margin scale that is not positive.
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    wrong = [k for k, _ in targets if k != "agreement"]
    if wrong:
        raise ValueError(f"a full-vocabulary dump is read without labels: only --agreement targets apply, "
                         f"got {wrong[0]}")
    margins_ = reduced.top_gaps[:, 0]
    scale = margins.scale_from_margins(margins_, statistic="median")
    # The display curve on evenly spaced rows first: it also places each target's first bracket.
    shown = subset(reduced)
    grid = np.geomspace(scale / 20.0, scale * 20.0, 16)
    bounds = np.array([mean_bounds(shown, s) for s in grid])
    records = []
    for _, value in targets:
        sigma = sigma_for_agreement(reduced, value, side=side,
                                    guess=guess_sigma(grid, bounds[:, 0], bounds[:, 1], value, side=side))
        lo, hi = mean_bounds(reduced, sigma)
        interval = {"level": CERTIFIED_LEVEL, "method": "bounds from the reduced rows' bin edges "
                    f"(top {reduced.top_gaps.shape[1]} gaps exact)", "accuracy": None, "retention": None,
                    "agreement": [lo, hi]}
        records.append(TargetRecord(
            kind="agreement", requested=float(value), accuracy=None, retention=None, agreement=float(value),
            v=float(margins.normalized_noise(sigma, scale)), sigma=sigma, sigma_logistic=None,
            method=METHOD, side=side, interval=interval))
    if records and max(r.sigma for r in records) > grid[-1]:  # the config's sweep must cover every sigma
        grid = np.geomspace(scale / 20.0, 2.0 * max(r.sigma for r in records), grid.size)
        bounds = np.array([mean_bounds(shown, s) for s in grid])
    v = np.asarray(margins.normalized_noise(grid, scale))
    chance = 1.0 / reduced.n_classes
    fit = fit_logistic(v, (bounds.mean(axis=1) - chance) / (1.0 - chance))
    config = {
        "schema": SCHEMA, "generator": f"caliber_core {__version__}", "model": name, "source": source,
        "sha256": sha256, "n_samples": reduced.n_rows, "n_classes": reduced.n_classes, "statistic": "median",
        "scale": scale, "scales": {"median": scale}, "clean_accuracy": None, "chance": chance,
        "sweep": {"realizations": 0, "seed": None, "n_points": int(grid.size),
                  "v_min": float(v[0]), "v_max": float(v[-1])},
        "fit": {"mode": "per-model", "law": "logistic", "quantity": "agreement", **fit.to_dict()},
        "inversion": {"accuracy_targets": None, "agreement_targets": METHOD,
                      "note": "full vocabulary streamed once: each row's top gaps exactly and the rest "
                              "as a gap histogram; sigma inverts the side's bound of the mean agreement "
                              "(Eq. top1-exact); the logistic is for display only"},
        "bounds": {"method": "streamed gap histogram (bin edges bound the tail); the sigma grid's bounds "
                             f"from {shown.n_rows} evenly spaced rows (display)", "k": int(reduced.top_gaps.shape[1]),
                   "vocab_size": reduced.n_classes, "side": side,
                   "widths": [r.interval["agreement"][1] - r.interval["agreement"][0] for r in records],
                   "sigma": [float(x) for x in grid], "agreement_lower": [float(x) for x in bounds[:, 0]],
                   "agreement_upper": [float(x) for x in bounds[:, 1]]},
        "targets": [r.to_dict() for r in records],
    }
    return records, config


def config_for_vocab_file(path, targets: Sequence[tuple[str, float]], *, side: str = "point",
                          max_elements: int = DEFAULT_MAX_ELEMENTS,
                          progress: Callable[[float], None] | None = None) -> tuple[list[TargetRecord], dict]:
    """Stream a full-vocabulary file and calibrate its agreement targets (the CLI's path for V >= 8,192).

    Parameters
    ----------
    path : str or path-like
    targets : sequence of (kind, value)
        Agreement targets only.
    side : {"point", "at-least", "at-most"}, default "point"
    max_elements : int, default ``DEFAULT_MAX_ELEMENTS``
        The most numbers the reduction may hold.
    progress : callable, optional
        Called with the fraction read in [0, 1].

    Returns
    -------
    records : list of TargetRecord
    config : dict

    Raises
    ------
    LogitsFileError
        See :func:`reduce_file`.
    ValueError
        See :func:`config_for_full_vocab`.
    """
    wrong = [k for k, _ in targets if k != "agreement"]
    if wrong:
        raise ValueError(f"a full-vocabulary dump is read without labels: only --agreement targets apply, "
                         f"got {wrong[0]}")
    reduced, source, sha = reduce_file(path, max_elements=max_elements, progress=progress)
    return config_for_full_vocab(reduced, targets, name=source.name, side=side, sha256=sha,
                                 source=str(path))
