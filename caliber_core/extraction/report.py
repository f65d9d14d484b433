"""The ``caliber.extraction/v1`` report and the printed tables.

Schema (README.md, section "Extraction report"): ``clean``, ``targets``,
``averaging``, ``frontier`` and ``recipes``, plus
the settings, seeds and the frontier attacker. Every quantity measured on
surrogates is ``{"mean", "sd", "n"}`` over seeds; teacher accuracies are exact
expectations over the noise on the evaluation split.
"""

from __future__ import annotations

import json
import math

from ..version import __version__
from .experiment import Condition, ExtractionResult, Spread
from .recipes import LIGHT, STRONG, TUNED, TUNED_CANDIDATES

SCHEMA = "caliber.extraction/v1"


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _spread(s: Spread | None):
    return None if s is None else s.to_dict()


def _condition(c: Condition) -> dict:
    if not c.by_recipe:  # an unreachable surrogate target
        return {"kind": c.kind, "requested": c.requested, "sigma": None, "sigma_se": None,
                "teacher_accuracy": None, "surrogate_accuracy": None, "surrogate_agreement": None,
                "drop_recovered": None, "attacker": None, "by_recipe": {},
                "reachable": False, "note": c.root.reason if c.root else ""}
    best = c.best
    out = {
        "kind": c.kind,
        "requested": c.requested,
        "sigma": _num(c.sigma),
        "teacher_accuracy": _num(c.teacher_accuracy),
        "surrogate_accuracy": best.accuracy.to_dict(),
        "surrogate_agreement": best.agreement.to_dict(),
        "drop_recovered": best.drop_recovered.to_dict() if best.drop_recovered.n else None,
        "attacker": c.headline,
        "by_recipe": {name: {
            "surrogate_accuracy": st.accuracy.to_dict(),
            "surrogate_agreement": st.agreement.to_dict(),
            "drop_recovered": st.drop_recovered.to_dict() if st.drop_recovered.n else None,
            **({"chosen": st.chosen} if st.chosen is not None else {}),
        } for name, st in c.by_recipe.items()},
    }
    if c.kind == "surrogate-retention":
        root = c.root
        out.update({
            "reachable": True,
            "sigma_se": _num(c.sigma_se),
            "bracket": [_num(b) for b in root.bracket] if root and root.bracket else None,
            "frontier_retention": _spread(c.frontier_retention),
            "note": root.reason if root else "",
        })
    return out


def to_report(result: ExtractionResult) -> dict:
    """The ``caliber.extraction/v1`` document (plain JSON values).

    Parameters
    ----------
    result : ExtractionResult

    Returns
    -------
    dict
        The archive, settings, replicate seeds, student, every condition and
        the frontier, averaging rows and timings.
    """
    a, s = result.archive, result.settings
    clean = result.clean.best
    return {
        "schema": SCHEMA,
        "generator": f"caliber_core {__version__}",
        "model": a.name,
        "source": a.source,
        "eval_source": a.eval_source,
        "sha256": a.sha256,
        "n_pool": a.pool.n_samples,
        "n_eval": a.evaluation.n_samples,
        "n_features": a.n_features,
        "n_classes": a.n_classes,
        "settings": {
            "retention": list(s.retention), "surrogate_retention": list(s.surrogate_retention),
            "seeds": s.seeds, "seed": s.seed, "m": list(s.m_values), "attack": s.attack,
            "near_seeds": s.n_near(), "folds": s.folds,
        },
        "replicate_seeds": result.seeds,
        "student": {"architecture": s.architecture, "hidden": s.hidden if s.architecture == "mlp" else None,
                    "optimizer": "adam", "epochs": s.schedule.epochs, "min_steps": s.schedule.min_steps,
                    "batch_size": s.schedule.batch_size, "learning_rate": s.schedule.learning_rate,
                    "early_stop": {"patience": s.schedule.patience, "tolerance": s.schedule.tolerance},
                    "loss": "T^2 KL(softmax(answers/T) || softmax(student/T)); hard labels: cross-entropy"},
        "recipes": [r for r in (
            {**LIGHT.to_dict(), "kind": "fixed"} if "light" in result.recipes else None,
            {**STRONG.to_dict(), "kind": "fixed"} if "strong" in result.recipes else None,
            {"name": TUNED, "kind": "tuned", "folds": s.folds,
             "selection": "k-fold agreement of the student's argmax with the argmax of its own noisy "
                          "answers on the held-out fold (no true labels)",
             "shared": "one choice per noise level (sigma, or sigma / sqrt(M) for M fresh answers averaged), "
                       "kept by every replicate seed and by per-input answers at that sigma; fold f trains "
                       "on the answers of replicate seed f mod (seeds)",
             "candidates": [c.to_dict() for c in TUNED_CANDIDATES]} if TUNED in result.recipes else None,
        ) if r is not None],
        "calibration": {"clean_accuracy_pool": result.clean_accuracy_pool, "scale": result.scale,
                        "source": "caliber_core.calibration (pool logits and labels)"},
        "teacher": {"clean_accuracy": result.clean_accuracy_eval,
                    "accuracy_method": "exact expectation over the noise (quadrature), evaluation split"},
        "clean": {
            "teacher_accuracy": result.clean_accuracy_eval,
            "surrogate_accuracy": clean.accuracy.to_dict(),
            "surrogate_agreement": clean.agreement.to_dict(),
            "attacker": result.clean.headline,
            "by_recipe": {n: {"surrogate_accuracy": st.accuracy.to_dict(),
                              "surrogate_agreement": st.agreement.to_dict(),
                              **({"chosen": st.chosen} if st.chosen is not None else {})}
                          for n, st in result.clean.by_recipe.items()},
        },
        "targets": [_condition(c) for c in result.targets],
        "frontier_attacker": result.frontier_attacker.to_dict(),
        "frontier": [{"sigma": p.sigma, "teacher_accuracy": p.teacher_accuracy,
                      "surrogate_accuracy": p.surrogate_accuracy.to_dict(),
                      "surrogate_agreement": p.surrogate_agreement.to_dict(),
                      "surrogate_retention": p.surrogate_retention.to_dict()} for p in result.frontier],
        "averaging": [{"sigma": r.sigma, "m": r.m, "seeding": r.seeding, "labels": r.labels,
                       "surrogate_accuracy": r.surrogate_accuracy.to_dict(),
                       "surrogate_agreement": r.surrogate_agreement.to_dict(),
                       "label_agreement": _spread(r.label_agreement)} for r in result.averaging],
        "averaging_sigma": result.averaging_sigma,
        "training_runs": result.runs,
        "seconds": round(result.seconds, 1),
        "timings": {name: round(sec, 1) for name, sec in result.timings.items()},
        "notes": list(result.notes),
    }


def report_to_json(report: dict) -> str:
    """A report (:func:`to_report`) as indented JSON text ending in a newline.

    Parameters
    ----------
    report : dict

    Returns
    -------
    str

    Raises
    ------
    ValueError
        A NaN or infinity in the report (``allow_nan=False``).
    """
    return json.dumps(report, indent=2, allow_nan=False) + "\n"


def _pm(s: Spread | None, *, scale: float = 100.0, digits: int = 1) -> str:
    if s is None or s.n == 0 or math.isnan(s.mean):
        return "—"
    if s.sd is None:
        return f"{s.mean * scale:.{digits}f}"
    return f"{s.mean * scale:.{digits}f} ± {s.sd * scale:.{digits}f}"


def format_tables(result: ExtractionResult) -> str:
    """Table-3 analogue (targets), Table-4 analogue (averaging), hard-label rows; percentages.

    Parameters
    ----------
    result : ExtractionResult

    Returns
    -------
    str
        Plain-text tables, mean ± sd over seeds.
    """
    lines = [f"{result.archive.name}: pool N={result.archive.pool.n_samples}, eval N="
             f"{result.archive.evaluation.n_samples}, D={result.archive.n_features}, K={result.archive.n_classes}; "
             f"{len(result.seeds)} seeds; accuracies in %, mean ± sd over seeds"]
    conds = [result.clean] + result.targets
    head = ["condition", "sigma", "teacher"] + [f"surrogate {n}" for n in result.recipes] + ["headline", "drop recovered"]
    rows = []
    for c in conds:
        if not c.by_recipe:
            rows.append([f"surrogate {c.requested:g}", "—", "—"] + ["—"] * len(result.recipes)
                        + ["out of reach", "—"])
            continue
        label = "clean" if c.kind == "clean" else (
            f"{'retention' if c.kind == 'retention' else 'surrogate'} {c.requested:g}")
        sigma = f"{c.sigma:.4g}" + (f" ± {c.sigma_se:.2g}" if c.sigma_se else "")
        rows.append([label, sigma, f"{c.teacher_accuracy * 100:.1f}"]
                    + [_pm(c.by_recipe[n].accuracy) for n in result.recipes]
                    + [c.headline, _pm(c.best.drop_recovered, digits=0) if c.best.drop_recovered.n else "—"])
    lines += ["", "Extraction under calibrated noise (Table 3 analogue)", *_grid(head, rows)]
    for c in result.targets:
        if c.kind == "surrogate-retention":
            lines.append(f"  surrogate {c.requested:g}: " + (c.root.reason if c.root else "") + (
                f"; frontier attacker keeps {_pm(c.frontier_retention)}% of its clean accuracy"
                if c.frontier_retention else ""))
    lines.append(f"  {result.notes[0]}" if result.notes else "")
    soft = [r for r in result.averaging if r.labels == "soft"]
    if soft:
        ms = sorted({r.m for r in soft})
        rows = []
        for seeding in ("fresh", "per-input"):
            cells = {r.m: _pm(r.surrogate_accuracy) for r in soft if r.seeding == seeding}
            rows.append([seeding] + [cells.get(m, "—") for m in ms])
        lines += ["", f"Averaging M queries per input at sigma={result.averaging_sigma:.4g} "
                      f"(Table 4 analogue; clean-answer surrogate {_pm(result.clean.best.accuracy)})",
                  *_grid(["noise drawn"] + [f"M={m}" for m in ms], rows)]
    hard = [r for r in result.averaging if r.labels == "hard"]
    if hard:
        rows = [["clean labels", "1", "—", _pm(hard[-1].surrogate_accuracy)]]
        for r in hard[:-1]:
            rows.append([r.seeding, str(r.m), _pm(r.label_agreement), _pm(r.surrogate_accuracy)])
        lines += ["", "Hard labels only (majority vote over M, random tie-break)",
                  *_grid(["noise drawn", "M", "label = clean argmax", "surrogate"], rows)]
    return "\n".join(lines)


def _grid(head, rows) -> list[str]:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
