"""The Export page's config: the CLI's pipeline with a side and a confidence, plus a σ aimed at the thief.

* :func:`config` -- ``pipeline.config_from_calibration(side=, confidence=)``,
  the step behind ``calibrate --side --confidence --out``, on the calibration
  the Calibrate page holds (no second sweep), checked here and cached in
  :func:`caliber_dashboard.common.cache.config` per file digest and options;
* :func:`surrogate_records` / :func:`with_surrogate` -- a ``surrogate-retention``
  target from a finished extraction run, made by
  :func:`caliber_core.extraction.targets.surrogate_records` (what ``extract
  --surrogate-retention R --out`` writes) against the exported file's own
  calibration, and the config rebuilt with ``build_config``;
* :func:`preview_table` -- every target with its side, interval and, for a
  surrogate target, the standard error of σ.

No page code; the table is a plain function tests call without Streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd

from caliber_core.calibration.calibrate import Calibration
from caliber_core.calibration.intervals import Interval
from caliber_core.calibration.config_build import build_config
from caliber_core.config import TargetRecord
from caliber_core.extraction.experiment import ExtractionResult
from caliber_core.extraction import targets as extraction_targets
from caliber_core.loading import LogitsData
from caliber_core.target_record import DEFAULT_CONFIDENCE, check_confidence, check_side

from caliber_dashboard.common import cache
from caliber_dashboard.common.commands import cli_command, file_argument
from caliber_dashboard.common import readouts
from caliber_dashboard.common.readouts import SIDE_LABELS

QUANTITIES = ("accuracy", "retention", "agreement")


def config(cal: Calibration, data: LogitsData, targets: Sequence[tuple[str, float]], *, inversion: str = "curve",
           saturate: bool = False, side: str = "point",
           confidence: float = DEFAULT_CONFIDENCE) -> tuple[list[TargetRecord], dict]:
    """The CLI's config, with ``side`` and ``confidence``, on the calibration the page holds (cached).

    ``cal`` is the Calibrate page's calibration of ``data`` (``cache.calibration``):
    no sweep runs here. Returns (targets, config); the page's choices are checked
    here, once, by the rules the CLI's arguments use.

    Raises
    ------
    ValueError
        Not cached: an unreachable target, missing labels, a side that cannot
        be guaranteed, or a bad side or level.
    """
    return cache.config_on(data, cal, targets, inversion=inversion, saturate=saturate, side=check_side(side),
                           confidence=check_confidence(confidence))


def surrogate_records(cal: Calibration, data: LogitsData, result: ExtractionResult,
                      requested: float) -> list[TargetRecord]:
    """The ``surrogate-retention`` record of ``result`` for ``requested``, on the exported calibration.

    The record is the command line's (:func:`caliber_core.extraction.targets.surrogate_records`);
    its accuracy, retention and v are measured with ``cal`` -- the exported
    file's calibration, with the page's margin statistic -- so they agree with
    the config's scale. Empty when the run did not reach that target.
    """
    if data.sha256 != result.archive.sha256:
        raise ValueError(f"the extraction run is for file {result.archive.sha256[:12]}…, "
                         f"the config for {data.sha256[:12]}…")
    return [r for r in extraction_targets.surrogate_records(replace(result, calibration=cal))
            if abs(r.requested - requested) < 1e-9]


def with_surrogate(cal: Calibration, results: Sequence[TargetRecord], data: LogitsData,
                   extra: Sequence[TargetRecord]) -> dict:
    """The config of ``results`` then ``extra``, through ``build_config`` like every other config."""
    return build_config(cal, list(results) + list(extra), sha256=data.sha256, source=data.source)


def _bounds(interval: dict | None, quantity: str) -> str:
    b = None if interval is None else interval.get(quantity)
    if b is None:
        return "—"
    # Ends rounded outward to 0.1 point, so a value inside the interval reads inside it too.
    low, high = math.floor(1000 * b[0] + 1e-6) / 10, math.ceil(1000 * b[1] - 1e-6) / 10
    return f"{low:.1f}–{high:.1f}%"


def _delivered(record: TargetRecord, quantity: str) -> float | None:
    """What the record's sigma delivers on the sample, in percent (the reference; else the point record's value)."""
    ref = record.reference if isinstance(record.reference, dict) else {}
    value = ref.get(quantity)
    if value is None and record.side == "point":
        value = getattr(record, quantity)
    return None if value is None else 100 * value


def sigma_shown(cal: Calibration, record: TargetRecord) -> str:
    """σ served with its range (``readouts.sigma_range`` on the record's own interval), rounded to it.

    A surrogate-retention record has no interval: its σ with its standard error instead.
    """
    interval = (record.interval or {}).get(record.kind) if record.kind in QUANTITIES else None
    if interval is None:
        se = (record.attacker or {}).get("sigma_se")
        return sigma_text(record.sigma, se if isinstance(se, (int, float)) else None)
    ref = record.reference if isinstance(record.reference, dict) else {}
    estimate = ref.get(record.kind, 0.5 * (interval[0] + interval[1]))
    found = readouts.sigma_range(cal, record.sigma, Interval(float(estimate), float(interval[0]), float(interval[1])),
                                 record.kind)
    return readouts.sigma_text(record.sigma, found)


def preview_table(records: Sequence[TargetRecord], *, cal: Calibration | None = None) -> pd.DataFrame:
    """One row per target: σ served (with its standard error for a surrogate target), what it delivers, intervals.

    Accuracy, retention and agreement are what the served σ delivers on the calibration
    sample (the record's drift ``reference``), in percent like the intervals beside them, so
    each sits inside its interval; the target asked for is the "target" column. Off the
    point side the record's own fields hold the target, not what σ delivers.

    With ``cal``, a "σ (range)" column shows σ rounded to its range (:func:`sigma_shown`).

    Interval columns are named with their level (e.g. "retention 95% interval");
    a surrogate-retention row has none (its precision is σ's standard error and
    the spread over seeds of the retention the thief keeps there).
    """
    levels = sorted({r.interval["level"] for r in records if r.interval})
    named = f" {100 * levels[0]:g}%" if len(levels) == 1 else ""
    rows = []
    for r in records:
        a = r.attacker or {}
        kept = a.get("surrogate_retention") or {}
        se = a.get("sigma_se")
        rows.append({
            "target": f"{r.kind} {100 * r.requested:g}%", "side": SIDE_LABELS.get(r.side, r.side),
            "σ served": r.sigma,
            **({} if cal is None else {"σ (range)": sigma_shown(cal, r)}),
            "σ s.e.": se if isinstance(se, (int, float)) and math.isfinite(se) else None, "v = σ²/S²": r.v,
            **{f"{q} %": _delivered(r, q) for q in QUANTITIES},
            **{f"{q}{named} interval": _bounds(r.interval, q) for q in QUANTITIES},
            "thief keeps": (f"{100 * kept['mean']:.1f} ± {100 * (kept.get('sd') or 0):.1f}%"
                            if kept.get("mean") is not None else None),
            "σ logistic": r.sigma_logistic, "method": r.method,
        })
    df = pd.DataFrame(rows).dropna(axis=1, how="all")
    return df.loc[:, [c for c in df.columns if not (c.endswith("interval") and (df[c] == "—").all())]]


def calibrate_command(data: LogitsData, targets: Sequence[tuple[str, float]], *, statistic: str = "median",
                      inversion: str = "curve", saturate: bool = False, side: str = "point",
                      confidence: float = DEFAULT_CONFIDENCE, out: str = "cfg.json") -> str:
    """The ``calibrate`` command line that writes the same config as the page, from the files uploaded.

    The logits file and, when the labels came in a file of their own, that file
    (``--labels``), by the names they were uploaded under: run it in the folder
    holding them. Every argument is shell-quoted; options at their defaults are left out.
    """
    words = [file_argument(data.source)]
    if data.labels_source is not None and data.labels_source != data.source:
        words += ["--labels", file_argument(data.labels_source)]
    flags: list[tuple[str, list[str]]] = []
    for kind, value in targets:  # consecutive targets of one kind share a flag (order kept)
        flag = "--target-accuracy" if kind == "accuracy" else f"--{kind}"
        if not flags or flags[-1][0] != flag:
            flags.append((flag, []))
        flags[-1][1].append(repr(float(value)))
    for flag, values in flags:
        words += [flag, *values]
    if statistic != "median":
        words += ["--margin-stat", statistic]
    if inversion != "curve":
        words += ["--inversion", inversion]
    if saturate:
        words.append("--saturate")
    if side != "point":
        words += ["--side", side]
    if float(confidence) != DEFAULT_CONFIDENCE:
        words += ["--confidence", f"{float(confidence):g}"]
    words += ["--out", file_argument(out)]
    return cli_command("calibrate", *words)


def sigma_text(sigma: float, se: float | None) -> str:
    """"14.65 ± 0.50": σ to the decimal of its standard error's second significant digit."""
    if se is None or not (math.isfinite(se) and se > 0):
        return f"{sigma:.4g}"
    decimals = max(0, 1 - math.floor(math.log10(se)))
    return f"{sigma:.{decimals}f} ± {se:.{decimals}f}"


def extract_command(source: str, result: ExtractionResult, requested: float) -> str:
    """The ``extract`` command line whose ``--out`` writes the same surrogate-retention record.

    Every word is shell-quoted (:func:`caliber_dashboard.common.commands.cli_command`), the
    file name included, whatever it holds.
    """
    s = result.settings
    words = [file_argument(source), "--retention", *(f"{r:g}" for r in s.retention),
             "--surrogate-retention", f"{requested:g}", "--seeds", str(s.seeds), "--attack", str(s.attack),
             "--seed", str(s.seed)]
    if s.architecture != "mlp":
        words += ["--student", str(s.architecture)]
    return cli_command("extract", *words, "--out", "CONFIG")


def attacker_summary(record: TargetRecord) -> str:
    """One paragraph: the attacker record a surrogate-retention target carries into the config."""
    a = record.attacker or {}
    recipe = a.get("recipe") or {}
    student = a.get("student") or {}
    kept = a.get("surrogate_retention") or {}
    se = a.get("sigma_se")
    parts = [
        f"σ = {sigma_text(record.sigma, se)}" + (" (± its standard error from the search)" if se else
                                                " (standard error not estimated: too few seeds near the crossing)"),
        f"attacker {recipe.get('name', '?')} (T={recipe.get('temperature', float('nan')):g}, weight decay "
        f"{recipe.get('weight_decay', float('nan')):g}), student {student.get('architecture', '?')}"
        + (f" D-{student['hidden']}-K" if student.get("hidden") else ""),
        f"replicate seeds {a.get('seeds')}, {a.get('near_seeds')} seeds near the crossing (base seed "
        f"{a.get('base_seed')})",
    ]
    if kept.get("mean") is not None:
        parts.append(f"the thief keeps {100 * kept['mean']:.1f} ± {100 * (kept.get('sd') or 0):.1f}% "
                     f"of its clean-answer accuracy there (mean ± sd over {kept.get('n')} seeds)")
    if record.retention is not None:
        parts.append(f"a flagged user keeps {100 * record.retention:.1f}% of A0 on the calibration file")
    return "; ".join(parts) + "."
