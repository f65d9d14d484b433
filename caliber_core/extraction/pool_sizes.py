"""The thief's frontier across campaign sizes: the same thieves, on pools of several sizes.

A campaign of n queries is modelled as the archive's first n pool rows: for
each size the whole frontier of :mod:`.thief_frontier` is measured on those
rows alone (σ solved on them, every thief distilled from their answers, the
clean thief's accuracy at the same size as the retention's denominator), so
that a point at 8,000 queries and one at 500 differ only in how much the
thief saw. The evaluation split is the same for every size.

An archive holds a fixed number of pool rows; a size beyond it is refused in
one line naming the sizes it can serve (``scripts/make_extraction_archive.py``
writes archives with as many rows as asked).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .thief_frontier import Frontier, measure_frontier

SCHEMA = "caliber.frontier-sizes/v1"
MIN_ROWS_PER_CLASS = 10  # the labelled thief holds 10 rows per class; fewer rows cannot feed it


@dataclass
class SizedFrontier:
    """One archive's frontier at several pool sizes.

    Attributes
    ----------
    archive : str
        The archive's name.
    sizes : list of int
        Pool sizes, ascending.
    frontiers : list of Frontier
        One per size, in the same order.
    """

    archive: str
    sizes: list[int]
    frontiers: list[Frontier]


def check_pool_sizes(sizes: Sequence[int], n_pool: int, n_classes: int, *, name: str = "the archive") -> list[int]:
    """The requested sizes, sorted and distinct, or one line saying which the archive can serve.

    Parameters
    ----------
    sizes : sequence of int
        Requested pool sizes.
    n_pool : int
        Pool rows the archive holds.
    n_classes : int
        K; a size needs at least :data:`MIN_ROWS_PER_CLASS` rows per class.
    name : str
        The archive, for the message.

    Returns
    -------
    list of int
        Ascending, duplicates dropped.

    Raises
    ------
    ValueError
        No sizes, a size too small for the thieves, or one larger than the pool.
    """
    wanted = sorted(set(int(s) for s in sizes))
    if not wanted:
        raise ValueError("--pool-sizes needs at least one size")
    smallest = MIN_ROWS_PER_CLASS * n_classes
    if wanted[0] < smallest:
        raise ValueError(f"--pool-sizes: {wanted[0]} rows is too few for {n_classes} classes; "
                         f"a pool size must be at least {smallest}")
    too_big = [s for s in wanted if s > n_pool]
    if too_big:
        fits = [s for s in wanted if s <= n_pool]
        served = f"of those asked it can serve {', '.join(map(str, fits))}" if fits else "it serves none of those asked"
        need = "needs" if len(too_big) == 1 else "need"
        raise ValueError(f"{name} holds {n_pool} pool rows: it can serve pool sizes {smallest} to {n_pool} "
                         f"({served}; {', '.join(map(str, too_big))} {need} a larger archive, e.g. from "
                         "scripts/make_extraction_archive.py)")
    return wanted


def measure_pool_sizes(path: str, *, sizes: Sequence[int], designs: Sequence[str], levels: Sequence[float],
                       keys: int, seeds: int, near_duplicates: int, processes: int = 1,
                       eval_path: str | None = None,
                       progress: Callable[[int, int], None] | None = None) -> SizedFrontier:
    """The frontier of every design at every pool size (see the module docstring).

    Parameters
    ----------
    path : str
        An extraction archive with at least ``max(sizes)`` pool rows (check with :func:`check_pool_sizes`).
    sizes : sequence of int
        Pool sizes.
    designs, levels, keys, seeds, near_duplicates, processes, eval_path
        As for :func:`~.thief_frontier.measure_frontier`.
    progress : callable, optional
        Called with (cells done, cells) over all sizes together.

    Returns
    -------
    SizedFrontier
    """
    sizes = sorted(set(int(s) for s in sizes))
    per_size = 1 + len(designs) * len(levels) * keys
    frontiers = []
    for i, n in enumerate(sizes):
        tick = None if progress is None else (lambda done, _t, _i=i: progress(_i * per_size + done,
                                                                              len(sizes) * per_size))
        frontiers.append(measure_frontier(path, designs=designs, levels=levels, keys=keys, seeds=seeds,
                                          near_duplicates=near_duplicates, processes=processes,
                                          eval_path=eval_path, pool_rows=n, progress=tick))
    return SizedFrontier(str(path), sizes, frontiers)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def sizes_table(result: SizedFrontier) -> list[str]:
    """One row per pool size, design and target: the user's and the strongest thief's retention, with intervals.

    Parameters
    ----------
    result : SizedFrontier

    Returns
    -------
    list of str
        Markdown lines: a caption, the header and the rows.
    """
    f0 = result.frontiers[0]
    lines = [f"**{Path(result.archive).name}** across pool sizes: {f0.keys} keys x {f0.seeds} training seeds per "
             "point; the thief's retention is over the strongest thief's accuracy on clean answers at the same "
             "pool size.", "",
             "| queries | design | target | σ/S | user keeps (x) | thief keeps (y) [95% CI] | y − x | "
             "strongest thief | clean thief accuracy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, f in zip(result.sizes, result.frontiers):
        for name in dict.fromkeys(p.design for p in f.points):
            for p in f.of(name):
                lines.append(f"| {n:,} | {name} | {p.level:.2f} | {p.sigma_over_s.mean:.2f} | {_pct(p.teacher.mean)}% "
                             f"[{_pct(p.teacher.lo)}, {_pct(p.teacher.hi)}] | **{_pct(p.thief.mean)}%** "
                             f"[{_pct(p.thief.lo)}, {_pct(p.thief.hi)}] | "
                             f"{100 * (p.thief.mean - p.teacher.mean):+.1f} pt | {p.attacker} | "
                             f"{_pct(f.clean_accuracy)}% ({f.clean_attacker}) |")
    return lines


def sizes_to_json(result: SizedFrontier) -> str:
    """Every point at every size as JSON under :data:`SCHEMA`.

    Parameters
    ----------
    result : SizedFrontier

    Returns
    -------
    str
        ``{"schema", "archive", "sizes": [{"pool_rows", "clean_accuracy", "clean_attacker", "keys", "seeds",
        "points"}]}``; the points as :meth:`~.thief_frontier.FrontierPoint.to_dict` writes them.
    """
    return json.dumps({"schema": SCHEMA, "archive": Path(result.archive).name, "sizes": [
        {"pool_rows": n, "clean_accuracy": f.clean_accuracy, "clean_attacker": f.clean_attacker, "keys": f.keys,
         "seeds": f.seeds, "points": [p.to_dict() for p in f.points]}
        for n, f in zip(result.sizes, result.frontiers)]}, indent=1)
