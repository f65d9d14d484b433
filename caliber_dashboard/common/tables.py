"""Tables the pages show and offer as CSV: the sweep, the loaded models, the fleet."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from caliber_core.calibration import margins as margin_stats
from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_core.calibration.calibrate import Calibration
from caliber_core.loading import LogitsData
from caliber_core.loading.checks import margins_in_chunks


def sweep_table(cal: Calibration) -> pd.DataFrame:
    """The sweep as a table (for CSV download)."""
    sw = cal.sweep
    cols = {"sigma": sw.sigma, "v": sw.v}
    if sw.accuracy is not None:
        cols.update(accuracy=sw.accuracy, accuracy_se=sw.accuracy_se, utility=sw.utility)
    cols.update(agreement=sw.agreement, agreement_se=sw.agreement_se,
                logistic=cal.fit.predict(sw.v))
    return pd.DataFrame(cols)


def fleet_model_table(cals: Sequence[Calibration]) -> pd.DataFrame:
    rows = []
    for c in cals:
        rows.append({
            "model": c.name, "K": c.n_classes, "A0": c.clean_accuracy,
            "S median": c.scales["median"], "S mean": c.scales["mean"],
            "S trimmed": c.scales["trimmed"], "own fit v50": c.fit.v50,
            "own fit p": c.fit.p, "own fit c": c.fit.c, "own fit R²": c.fit.r2,
        })
    return pd.DataFrame(rows)


def with_mean_row(rows: Sequence[dict], label_column: str, label: str = "mean", *,
                  text_columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A table with a final row averaging every numeric column.

    ``text_columns`` maps a column that has no meaningful mean (e.g. each model's
    own S) to a format: the column is written as text and left blank on the mean
    row, rather than shown as an empty number ("None").
    """
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    text_columns = dict(text_columns or {})
    mean = {c: df[c].mean() for c in df.columns
            if pd.api.types.is_numeric_dtype(df[c]) and c not in text_columns}
    mean[label_column] = label
    if "scale" in mean:  # each model's own S: no meaningful mean
        mean["scale"] = np.nan
    for c, spec in text_columns.items():
        if c in df.columns:
            df[c] = [format(float(x), spec) for x in df[c]]
            mean[c] = ""
    return pd.concat([df, pd.DataFrame([mean])], ignore_index=True)


def shown_models(selected: Sequence[str] | None, seen: Sequence[str] | None, loaded: Sequence[str], *,
                 first: int = 10) -> list[str]:
    """The models a multi-model plot shows: the user's selection, plus every model loaded since.

    ``selected`` is the last selection (None before the first), ``seen`` the
    models loaded when it was made. A model loaded since joins the plot at once;
    a removed one leaves it. The first time, the first ``first`` models.
    """
    if selected is None or seen is None:
        return list(loaded[:first])
    known = set(seen)
    keep = set(selected)
    return [sha for sha in loaded if sha in keep or sha not in known]


# A histogram of every row of a 45,000-row file ships 45,000 numbers per model to
# the browser (which bins them there); its shape needs far fewer.
HIST_MAX_ROWS = 10_000


def histogram_rows(values: np.ndarray, *, max_rows: int = HIST_MAX_ROWS) -> np.ndarray:
    """At most ``max_rows`` of ``values``, evenly spaced over the rows, first and last included.

    Deterministic: the same file always draws the same histogram. Fewer rows come back whole.
    """
    if not (isinstance(max_rows, (int, np.integer)) and max_rows >= 2):
        raise ValueError(f"max_rows must be an integer >= 2, got {max_rows!r}")
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {values.shape}")
    if values.size <= max_rows:
        return values
    return values[np.linspace(0, values.size - 1, max_rows).round().astype(np.intp)]


def model_table(datas: Sequence[LogitsData], *,
                margins: Sequence[np.ndarray] | None = None) -> pd.DataFrame:
    """One row per loaded model: name, N, K, A0, S under each statistic, digest prefix.

    Parameters
    ----------
    datas : sequence of LogitsData
    margins : sequence of ndarray, optional
        Each model's top-two margins when the caller already has them (the Data
        page keeps them per content digest); otherwise they are computed a block
        of rows at a time, never from a full copy of the logits.
    """
    if margins is not None and len(margins) != len(datas):
        raise ValueError(f"margins must hold one array per model ({len(datas)}), "
                         f"got {len(margins)}")
    rows = []
    for i, d in enumerate(datas):
        m = margins[i] if margins is not None else margins_in_chunks(d.logits)
        if np.shape(m) != (d.n_samples,):
            raise ValueError(f"margins of {d.name} must have shape ({d.n_samples},), "
                             f"got {np.shape(m)}")
        scales = {}
        for stat in MARGIN_STATISTICS:  # as margins.all_scales: NaN where S <= 0
            try:
                scales[stat] = margin_stats.scale_from_margins(m, statistic=stat)
            except ValueError:
                scales[stat] = float("nan")
        rows.append({
            "model": d.name,
            "file": re.split(r"[\\/]", d.source)[-1],
            "N": d.n_samples,
            "K": d.n_classes,
            "labels": "yes" if d.has_labels else "no",
            "A0": margin_stats.clean_accuracy(d.logits, d.labels) if d.has_labels else np.nan,
            "S median": scales["median"],
            "S mean": scales["mean"],
            "S trimmed": scales["trimmed"],
            "sha256": d.sha256[:12],
        })
    return pd.DataFrame(rows, columns=["model", "file", "N", "K", "labels", "A0", "S median",
                                       "S mean", "S trimmed", "sha256"])
