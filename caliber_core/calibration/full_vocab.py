"""Full-vocabulary dumps to targets: one streaming pass, then sigma* on the reduced rows.

:func:`reduce_file` reads a ``.npy``/``.safetensors``/``.pt``/stored ``.npz``
matrix block by block (:mod:`caliber_core.loading.row_stream`; float32 in place
through a memory map) and keeps, per row, the top gaps, a gap histogram and,
with labels, the label's gap (:mod:`.gap_histogram`): 4,000 x 128,000 float32
(2 GB) becomes 4,000 x (32 + 1,282) numbers. :func:`config_for_full_vocab`
solves each target on the reduced rows, whose bounds bracket the full
vocabulary's agreement and (with labels) expected accuracy: the classes far
below the top, which cannot win, enter only through the bounds. The side picks
the bound (lower for at-least, upper for at-most, the midpoint for point) and
the config records both bounds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import __version__
from ..config import CERTIFIED_LEVEL, SCHEMA, SIDES, TargetRecord
from ..loading.row_stream import BLOCK_BYTES, MappedMatrix, RowSource, can_map, open_rows
from ..loading.safety import DEFAULT_MAX_ELEMENTS, display_name, fail
from . import margins
from .fit import fit_logistic
from .gap_histogram import TOP_GAPS, ReducedRows, reduce_block, row_bounds

METHOD = "full-vocabulary-streamed-agreement"
#: Below this many classes a matrix is read whole as before; from here on it streams.
STREAM_MIN_CLASSES = 8192
_BOUND = {"at-least": 0, "at-most": 1}


def reduce_file(path, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS,
                progress: Callable[[float], None] | None = None,
                labels: np.ndarray | None = None, source: RowSource | None = None,
                ) -> tuple[ReducedRows, RowSource, str]:
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
    labels : ndarray of shape (n_rows,), int, optional
        Validated labels in [0, V): each row's label gap is kept exactly (accuracy rows).
    source : RowSource, optional
        Where the matrix lies (default: :func:`open_rows` of ``path``).

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

    source = open_rows(path) if source is None else source
    src = display_name(source.path)
    m = check_kept_size(source, m=m, max_elements=max_elements)
    top_gaps = np.empty((source.n_rows, m))
    counts = np.empty((source.n_rows, N_BINS), dtype=np.int32)
    out = [top_gaps, counts]
    if labels is not None:
        out += [np.empty(source.n_rows), np.empty(source.n_rows, dtype=np.int32)]
    if can_map(source):
        sha = _reduce_mapped(source, m, labels, out, src, progress)
    else:
        _reduce_read(source, m, labels, out, src, progress)
        sha = _file_sha256(source.path)  # converted blocks are not the file's bytes: hashed from the file
    return ReducedRows(top_gaps, counts, source.n_classes, *out[2:]), source, sha


_BUFFERS = 3
#: Threads that reduce blocks (numpy lets go of the interpreter lock in the row work).
REDUCERS = 2


def _reduce_mapped(source: RowSource, m: int, labels, out, src, progress) -> str:
    """Reduce a float32 matrix read in place through a memory map; return the file's SHA-256.

    One thread hashes the file's bytes in order (hashlib lets go of the interpreter lock), others
    reduce blocks of rows; a block's pages are let go once both are done with it, so the resident
    set holds the blocks in flight only.
    """
    digest = hashlib.sha256()
    per_block = max(1, BLOCK_BYTES // (source.n_classes * 4))
    workers = max(1, min(REDUCERS, os.cpu_count() or 1))
    in_flight: list = []
    with MappedMatrix(source) as mapped, ThreadPoolExecutor(max_workers=1) as hasher, \
            ThreadPoolExecutor(max_workers=workers) as reducers:
        hasher.submit(digest.update, mapped.bytes_between(0, source.offset))
        for start in range(0, source.n_rows, per_block):
            stop = min(source.n_rows, start + per_block)
            lo, hi = source.offset + start * mapped.row_bytes, source.offset + stop * mapped.row_bytes
            hashed = hasher.submit(digest.update, mapped.bytes_between(lo, hi))
            block = mapped.rows[start:stop]
            y = None if labels is None else labels[start:stop]
            in_flight.append((start, block, hashed, reducers.submit(_reduce, block, m, y)))
            if len(in_flight) > 2 * workers:
                _finish(in_flight.pop(0), out, src, progress, source.n_rows, mapped)
        while in_flight:
            _finish(in_flight.pop(0), out, src, progress, source.n_rows, mapped)
        end = source.offset + source.n_rows * mapped.row_bytes
        hasher.submit(digest.update, mapped.bytes_between(end, mapped.size)).result()
        del block
    return digest.hexdigest()


def _reduce_read(source: RowSource, m: int, labels, out, src, progress) -> None:
    """Reduce a matrix read (and converted to float32) into reused buffers, one thread reading, one reducing."""
    in_flight: list = []
    with ThreadPoolExecutor(max_workers=1) as reducer:
        for start, block in source.blocks(buffers=_BUFFERS):
            if len(in_flight) == _BUFFERS - 1:
                _finish(in_flight.pop(0), out, src, progress, source.n_rows)
            y = None if labels is None else labels[start : start + block.shape[0]]
            in_flight.append((start, block, None, reducer.submit(_reduce, block, m, y)))
        while in_flight:
            _finish(in_flight.pop(0), out, src, progress, source.n_rows)


def check_kept_size(source: RowSource, *, m: int = TOP_GAPS, max_elements: int = DEFAULT_MAX_ELEMENTS) -> int:
    """Refuse, from the header alone, a matrix whose reduction would hold more than ``max_elements``.

    Returns
    -------
    int
        The gaps kept exactly per row (``m``, at most V - 1).

    Raises
    ------
    LogitsFileError
        Rows x (m + bins) over ``max_elements``.
    """
    from .gap_histogram import N_BINS

    m = min(m, source.n_classes - 1)
    kept = source.n_rows * (m + N_BINS)
    if kept > max_elements:
        raise fail(display_name(source.path), f"{source.n_rows:,} rows reduce to {kept:,} numbers, more than "
                   f"max_elements={max_elements:,}")
    return m


def _reduce(block: np.ndarray, m: int, labels):
    try:
        return reduce_block(block, m=m, labels=labels)
    except ValueError:
        return None  # a NaN or +inf row: _finish names it


def _finish(job, out, src, progress, n_rows, mapped=None) -> None:
    start, block, hashed, reduce_job = job
    result = reduce_job.result()
    if hashed is not None:
        hashed.result()
    if mapped is not None and result is not None:
        mapped.release(start, start + block.shape[0])
    if result is None:
        row = start + int(np.argmax(~np.isfinite(block.max(axis=1))))
        raise fail(src, f"row {row} holds NaN or +inf (every logit must be finite or -inf)")
    rows = result[0].shape[0]
    for whole, part in zip(out, result):
        whole[start : start + rows] = part
    if progress is not None:
        progress((start + rows) / n_rows)


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
    if not reduced.has_labels:
        return ReducedRows(reduced.top_gaps[pick], reduced.counts[pick], reduced.n_classes)
    return ReducedRows(reduced.top_gaps[pick], reduced.counts[pick], reduced.n_classes,
                       reduced.label_gaps[pick], reduced.label_slots[pick])


KINDS = ("agreement", "accuracy", "retention")


def mean_bounds(reduced: ReducedRows, sigma: float, kind: str = "agreement") -> tuple[float, float]:
    """Lower and upper bound of the mean agreement, expected accuracy or retention at sigma.

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
        >= 0.
    kind : {"agreement", "accuracy", "retention"}, default "agreement"
        The last two need a reduction with labels; retention is accuracy / A0.

    Returns
    -------
    lower, upper : float

    Raises
    ------
    ValueError
        An invalid sigma, an unknown kind, or accuracy without labels.

    Notes
    -----
    Means of the per-row bounds on Eq. ``top1-exact`` (:func:`row_bounds`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind != "agreement" and not reduced.has_labels:
        raise ValueError(f"{kind} targets need labels; this reduction has none")
    b = bounds_at(reduced, sigma, agreement=kind == "agreement")
    if kind == "agreement":
        return float(b.agree_lo.mean()), float(b.agree_hi.mean())
    scale = 1.0 if kind == "accuracy" else 1.0 / clean_accuracy(reduced)
    return float(b.acc_lo.mean()) * scale, float(b.acc_hi.mean()) * scale


_CACHE: list = []  # the last few (reduction, sigma, bounds): a target's record reads its solve's last sigma
_CACHE_SIZE = 8


def bounds_at(reduced: ReducedRows, sigma: float, *, agreement: bool = True):
    """:func:`row_bounds` at sigma, the last few evaluations on the same reduction kept.

    Parameters
    ----------
    reduced : ReducedRows
    sigma : float
    agreement : bool, default True
        False: the accuracy rows only (see :func:`row_bounds`).

    Returns
    -------
    RowBounds
    """
    s = float(sigma)
    for red, at, full, b in _CACHE:
        if red is reduced and at == s and (full or not agreement):
            return b
    b = row_bounds(reduced, s, agreement=agreement)
    _CACHE.append((reduced, s, agreement or not reduced.has_labels, b))
    del _CACHE[:-_CACHE_SIZE]
    return b


def clean_accuracy(reduced: ReducedRows) -> float:
    """A0, the share of rows whose clean argmax is the label.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        A reduction without labels.
    """
    if not reduced.has_labels:
        raise ValueError("the clean accuracy needs labels; this reduction has none")
    return float(np.mean(reduced.correct))


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
                        rel_tol: float = 1e-5, guess: float | None = None) -> float:
    """sigma at which the side's bound of the mean agreement equals ``target`` (:func:`sigma_for`).

    Returns
    -------
    float
    """
    return sigma_for(reduced, target, kind="agreement", side=side, rel_tol=rel_tol, guess=guess)


#: How far past the median margin a target is sought before it is called out of reach.
SEARCH_REACH = 1e4


def sigma_for(reduced: ReducedRows, target: float, *, kind: str = "agreement", side: str = "point",
              rel_tol: float = 1e-5, guess: float | None = None, slope: float | None = None) -> float:
    """sigma at which the side's bound of the mean ``kind`` equals ``target`` (Brent's method).

    ``guess`` (from :func:`guess_sigma` on evenly spaced rows) starts a 3% bracket,
    so the full rows are evaluated a few times only.

    Parameters
    ----------
    reduced : ReducedRows
    target : float
        Agreement or accuracy in (0, 1); retention > 0 (a fraction of A0).
    kind : {"agreement", "accuracy", "retention"}, default "agreement"
    side : {"point", "at-least", "at-most"}, default "point"
        The bounds' midpoint, or the bound that keeps the target.
    rel_tol : float, default 1e-5
        Brent's relative tolerance, and the step by which the root is moved to the side.
    guess : float, optional
        Without it, a large reduction is first solved on :func:`subset` rows.
    slope : float, optional
        d(side's value) / d sigma near ``guess`` (negative), for the first secant step.

    Returns
    -------
    float
        0 when the target asks for no degradation (accuracy >= A0, retention >= 1).

    Raises
    ------
    ValueError
        A target outside its range, one above the clean model's value (ties at the top),
        or one the curve does not reach before sigma = ``SEARCH_REACH`` x the median margin.

    Notes
    -----
    Eq. ``top1-exact`` inverted through its per-row bounds.
    """
    if kind == "agreement":
        if not 0.0 < target < 1.0:
            raise ValueError(f"agreement target must be in (0, 1), got {target!r}")
        ceiling = float(np.mean(np.where(reduced.top_gaps[:, 0] > 0, 1.0, 0.5)))
        if target >= ceiling:
            raise ValueError(f"agreement target {target:g} is above {ceiling:.4g}, the agreement as sigma -> 0 "
                             "(ties at the top of some rows)")
    else:
        a0 = clean_accuracy(reduced)
        if not (np.isfinite(target) and target > 0.0) or (kind == "accuracy" and target > 1.0):
            raise ValueError(f"{kind} target must be in (0, 1]{' (of A0)' if kind == 'retention' else ''}, "
                             f"got {target!r}")
        if target >= (a0 if kind == "accuracy" else 1.0):
            return 0.0

    memo: dict[float, float] = {}

    def gap(s: float) -> float:
        if s not in memo:  # brentq evaluates the bracket's ends again
            memo[s] = _side_value(*mean_bounds(reduced, s, kind), side) - target
        return memo[s]

    positive = reduced.top_gaps[:, 0][reduced.top_gaps[:, 0] > 0]
    median = float(np.median(positive)) if positive.size else 1.0
    if guess is None and reduced.n_rows > 2 * SUBSET_ROWS:
        try:
            guess = sigma_for(subset(reduced), target, kind=kind, side=side, rel_tol=1e-3)
        except ValueError:
            guess = None  # the evenly spaced rows alone miss it: search the whole
        guess = guess or None
    root = _secant(gap, guess, rel_tol, slope, side) if guess is not None else None
    if root is None:
        root = _bracketed(gap, guess, median, rel_tol, kind, target, reduced.n_classes)
    # Keep the side's promise at the returned sigma (Brent returns a point within rel_tol).
    if side == "at-least":
        while gap(root) < 0:
            root *= 1 - rel_tol
    elif side == "at-most":
        while gap(root) > 0:
            root *= 1 + rel_tol
    return float(root)


def _secant(gap, guess: float, rel_tol: float, slope: float | None = None, side: str = "point",
            steps: int = 8) -> float | None:
    """The root by secant steps from a close guess (a few evaluations), or None when they stray.

    The curves are smooth and monotone in sigma and the guess comes from evenly
    spaced rows, so two or three steps reach ``rel_tol``. The sigma returned is
    one already evaluated (its bounds are cached for the record) whose next step
    would move it by at most ``rel_tol``, on the side's side of the target;
    anything else falls back to the bracketed search.
    """
    s0, f0 = guess, gap(guess)
    if slope is not None and slope < 0:
        s1 = min(max(guess - f0 / slope, guess / 1.1), guess * 1.1)
    else:
        s1 = guess * (1.01 if f0 > 0 else 1 / 1.01)  # the curves fall with sigma
    if s1 == s0:
        return s0 if _on_side(f0, side) else None
    for _ in range(steps):
        f1 = gap(s1)
        if f1 == f0:
            return None
        s2 = s1 - f1 * (s1 - s0) / (f1 - f0)
        if not (s2 > 0 and guess / 2 < s2 < guess * 2):
            return None
        if abs(s2 - s1) <= rel_tol * s1:
            if _on_side(f1, side):
                return s1
            s2 = s2 * (1 - rel_tol) if side == "at-least" else s2 * (1 + rel_tol)  # just past the root
        s0, f0, s1 = s1, f1, s2
    return None


def _on_side(f: float, side: str) -> bool:
    """Whether a point whose side value minus the target is ``f`` keeps the side's promise."""
    return side == "point" or (f >= 0 if side == "at-least" else f <= 0)


def _bracketed(gap, guess, median, rel_tol, kind, target, n_classes) -> float:
    """The root by Brent's method in a bracket grown from ``guess`` (3% around it) or the median margin."""
    from scipy.optimize import brentq

    a, b = (guess / 1.03, guess * 1.03) if guess is not None else (median, median)
    while gap(a) < 0:
        if a < 1e-9 * median:
            raise ValueError(f"{kind} target {target:g} is above what the clean model delivers as sigma -> 0 "
                             "(ties at the top of some rows)")
        a /= 3.0
    if b <= a:
        b = a * 3.0
    while gap(b) >= 0:
        if b > SEARCH_REACH * median:
            raise ValueError(f"{kind} target {target:g} is out of reach: it only falls towards chance "
                             f"1/K={1 / n_classes:.3g} and the bounds never cross it")
        a, b = b, b * 3.0
    return brentq(gap, a, b, xtol=1e-12, rtol=rel_tol)


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
    values = np.array([_side_value(a, b, side) for a, b in zip(lower, upper)])
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
    for i, s in enumerate(grid):
        # With labels only the accuracy is drawn and solved: the wrong rows' agreement is not computed.
        b = row_bounds(reduced, s, agreement=not reduced.has_labels)
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
                          labels_path=None) -> tuple[list[TargetRecord], dict]:
    """Stream a full-vocabulary file and calibrate its targets (the CLI's path for V >= 8,192).

    Parameters
    ----------
    path : str or path-like
        ``.npy``, ``.safetensors``, ``.pt`` or an uncompressed ``.npz`` (its ``labels`` array read too).
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
    source = open_rows(path)
    check_kept_size(source, max_elements=max_elements)  # from the header, before anything is read
    labels = stream_labels(source, labels_path, max_elements=max_elements)
    wrong = [k for k, _ in targets if k != "agreement"]
    if wrong and labels is None:  # before the file is read, not after
        raise ValueError(f"a full-vocabulary dump read without labels: only --agreement targets apply, "
                         f"got {wrong[0]} (give --labels, or a .npz with a `labels` array)")
    reduced, source, sha = reduce_file(path, max_elements=max_elements, progress=progress, labels=labels,
                                       source=source)
    return config_for_full_vocab(reduced, targets, name=source.name, side=side, sha256=sha,
                                 source=str(path))


def stream_labels(source: RowSource, labels_path=None, *, max_elements: int = DEFAULT_MAX_ELEMENTS):
    """The labels of a streamed matrix, validated against its shape, or None when there are none.

    Parameters
    ----------
    source : RowSource
    labels_path : str or path-like, optional
        A separate labels file; without it an ``.npz``'s ``labels`` array, if any.
    max_elements : int

    Returns
    -------
    ndarray of shape (n_rows,), int64, or None

    Raises
    ------
    LogitsFileError
        A labels file that does not parse, of another length, or with a label outside [0, V).
    """
    from ..loading.checks import validate_labels
    from ..loading.labels_file import read_labels_file
    from ..loading.load import LABELS_EXTENSIONS, _read_file
    from ..loading.row_stream import npz_labels

    src = display_name(source.path)
    if labels_path is not None:
        content = _read_file(labels_path, max_elements=max_elements, allowed=LABELS_EXTENSIONS, what="labels")
        lsrc = display_name(labels_path)
        raw = read_labels_file(content, os.path.splitext(str(labels_path))[1].lower(), lsrc,
                               max_elements=max_elements)
    else:
        raw, lsrc = npz_labels(source, max_elements=max_elements), src
        if raw is None:
            return None
    return validate_labels(raw, lsrc, n_samples=source.n_rows, n_classes=source.n_classes, logits_src=src)
