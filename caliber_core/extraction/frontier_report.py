"""The thief's frontier as markdown tables and as JSON (``caliber.frontier/v1``)."""

from __future__ import annotations

import json
from pathlib import Path

from .thief_frontier import Frontier

SCHEMA = "caliber.frontier/v1"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def frontier_table(frontier: Frontier) -> list[str]:
    """One row per design and target: sigma/S, the user's and the strongest thief's retention, with intervals.

    Parameters
    ----------
    frontier : Frontier
        One archive's measured frontier.

    Returns
    -------
    list of str
        Markdown lines: a caption, the header and one row per point.
    """
    lines = [f"**{Path(frontier.archive).name}**: strongest thief on clean answers {_pct(frontier.clean_accuracy)}% "
             f"({frontier.clean_attacker}); {frontier.keys} keys x {frontier.seeds} training seeds per point. "
             "Thief with labels: the same thieves holding 10 labelled pool rows per class (matrix scaling), "
             "outside the label-free threat model.", "",
             "| design | target | σ/S | user keeps (x) | thief keeps (y) [95% CI] | y − x | strongest thief | "
             "near-dups gain | thief with labels |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(p.design for p in frontier.points):
        for p in frontier.of(name):
            lines.append(f"| {name} | {p.level:.2f} | {p.sigma_over_s.mean:.2f} | {_pct(p.teacher.mean)}% "
                         f"[{_pct(p.teacher.lo)}, {_pct(p.teacher.hi)}] | **{_pct(p.thief.mean)}%** "
                         f"[{_pct(p.thief.lo)}, {_pct(p.thief.hi)}] | {100 * (p.thief.mean - p.teacher.mean):+.1f} pt "
                         f"| {p.attacker} | {p.near_gain:+.1f} pt | {_labelled(p)} |")
    return lines


def _labelled(point) -> str:
    return "–" if point.labelled is None else f"{_pct(point.labelled.mean)}%"


def frontier_summary(frontiers: list[Frontier]) -> list[str]:
    """The thief's retention where the flagged user keeps 0.75, one column per archive.

    Parameters
    ----------
    frontiers : list of Frontier

    Returns
    -------
    list of str
        Markdown lines; a dash where 0.75 lies outside an archive's measured range.
    """
    names = list(dict.fromkeys(p.design for f in frontiers for p in f.points))
    head = "| design | " + " | ".join(Path(f.archive).name for f in frontiers) + " |"
    lines = ["Thief's retention where the flagged user keeps 0.75 (linear between measured points; ± half the "
             "95% interval):", "", head, "|---|" + "---|" * len(frontiers)]
    for name in names:
        cells = []
        for f in frontiers:
            at = f.at(name, 0.75)
            cells.append("–" if at is None else f"{_pct(at[0])}% ± {100 * at[1]:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def frontier_to_json(frontiers: list[Frontier]) -> str:
    """Every measured point of every archive (see :class:`~.thief_frontier.FrontierPoint`).

    Parameters
    ----------
    frontiers : list of Frontier

    Returns
    -------
    str
        JSON text under this module's ``SCHEMA``.
    """
    return json.dumps({"schema": SCHEMA, "frontiers": [
        {"archive": Path(f.archive).name, "clean_accuracy": f.clean_accuracy, "clean_attacker": f.clean_attacker,
         "keys": f.keys, "seeds": f.seeds, "points": [p.to_dict() for p in f.points]} for f in frontiers]}, indent=1)
