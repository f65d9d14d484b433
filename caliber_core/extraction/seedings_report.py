"""The seeding comparison as a printed table and as JSON (``caliber.seedings/v1``)."""

from __future__ import annotations

import json

from .seedings import SeedingComparison

SCHEMA = "caliber.seedings/v1"


def _fmt(spread) -> str:
    if spread is None:
        return ""
    return f"{spread.mean:.3f}" + (f" ± {spread.sd:.3f}" if spread.sd is not None else "")


def format_seedings(result: SeedingComparison, *, first: str = "consistent") -> str:
    """Per level, each seeding: sigma, teacher retention, strongest thief's retention (mean ± sd over keys).

    Parameters
    ----------
    result : SeedingComparison
    first : str, default "consistent"
        The seeding listed first at each level.

    Returns
    -------
    str
    """
    design = ("the class cycle, version 2" if result.length_scale is None
              else f"length scale {result.length_scale:g} S")
    lines = [f"{result.archive}: per-input against consistent seeding ({design}), "
             f"{result.keys} key(s); strongest clean-answer surrogate {result.clean_surrogate:.4f} "
             f"({result.clean_attacker})",
             f"{'teacher target':>14} {'seeding':>10} {'sigma':>16} {'teacher retention':>18} "
             f"{'thief retention':>16} {'near-dup avg':>14}  strongest attacker per key"]
    order = [first] + [s for s in ("per-input", "consistent") if s != first]
    levels = sorted({p.level for p in result.points}, reverse=True)
    for level in levels:
        for seeding in order:
            for p in (q for q in result.points if q.seeding == seeding and q.level == level):
                near = _fmt(p.near_duplicate_retention)
                lines.append(f"{level:>14.2f} {seeding:>10} {_fmt(p.sigma):>16} {_fmt(p.teacher_retention):>18} "
                             f"{_fmt(p.thief_retention):>16} {near:>14}  {', '.join(p.attackers)}")
    if result.near_duplicates:
        lines.append(f"near-dup avg: {result.near_duplicates} near-duplicates of each pool row answered and "
                     "averaged, thief retention")
    return "\n".join(lines)


def seedings_to_json(result: SeedingComparison) -> str:
    """The comparison as JSON text under this module's ``SCHEMA`` (points and per-key curves).

    Parameters
    ----------
    result : SeedingComparison

    Returns
    -------
    str
    """
    def spread(s):
        return None if s is None else s.to_dict()

    doc = {
        "schema": SCHEMA, "archive": result.archive, "length_scale": result.length_scale, "keys": result.keys,
        "clean_surrogate": result.clean_surrogate, "clean_attacker": result.clean_attacker,
        "near_duplicates": result.near_duplicates,
        "points": [{"seeding": p.seeding, "level": p.level, "sigma": spread(p.sigma), "sigmas": p.sigmas,
                    "teacher_retention": spread(p.teacher_retention), "thief_retention": spread(p.thief_retention),
                    "attackers": p.attackers, "near_duplicate_retention": spread(p.near_duplicate_retention)}
                   for p in result.points],
        "key_curves": {"sigma": [float(s) for s in result.curve_sigmas],
                       "teacher_retention": [[float(v) for v in row] for row in result.curves]},
    }
    return json.dumps(doc, indent=2)
