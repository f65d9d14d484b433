"""Draw the README's picture: the demo models' accuracy against raw σ, and the same
curves on the normalized axes, where they fall onto one logistic law.

Usage: python scripts/make_curve_figure.py [--out docs/assets/normalized-curve.svg]

Every point comes from the bundled demo data (data/*.npz) through the same
calibration the CLI runs (sweep of each model, then one logistic fit of the pooled
normalized points). The SVG is written by hand, so nothing beyond numpy is needed.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from caliber_core.calibration.calibrate import calibrate_model
from caliber_core.calibration.fit import fit_logistic
from caliber_core.loading import load_logits

ROOT = Path(__file__).resolve().parents[1]
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
W, H, PAD_L, PAD_B, PAD_T, GAP = 900, 360, 56, 46, 34, 70
PANEL_W = (W - PAD_L - GAP - 20) / 2
PANEL_H = H - PAD_B - PAD_T


def _panel(x0: float, title: str, xlabel: str, ylabel: str, xticks, xmap, yticks, ymap) -> list[str]:
    out = [f'<rect x="{x0:.1f}" y="{PAD_T}" width="{PANEL_W:.1f}" height="{PANEL_H}" fill="none" stroke="#444"/>',
           f'<text x="{x0 + PANEL_W / 2:.1f}" y="{PAD_T - 12}" text-anchor="middle" font-weight="bold">{title}</text>',
           f'<text x="{x0 + PANEL_W / 2:.1f}" y="{H - 8}" text-anchor="middle">{xlabel}</text>',
           f'<text transform="translate({x0 - 40:.1f},{PAD_T + PANEL_H / 2:.1f}) rotate(-90)" text-anchor="middle">{ylabel}</text>']
    for value, label in xticks:
        x = x0 + xmap(value) * PANEL_W
        out.append(f'<line x1="{x:.1f}" y1="{PAD_T + PANEL_H}" x2="{x:.1f}" y2="{PAD_T + PANEL_H + 5}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{PAD_T + PANEL_H + 18}" text-anchor="middle" font-size="11">{label}</text>')
    for value, label in yticks:
        y = PAD_T + (1 - ymap(value)) * PANEL_H
        out.append(f'<line x1="{x0 - 5:.1f}" y1="{y:.1f}" x2="{x0:.1f}" y2="{y:.1f}" stroke="#444"/>')
        out.append(f'<text x="{x0 - 8:.1f}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    return out


def _polyline(x0: float, xs, ys, colour: str, *, width: float = 1.6, dash: str = "") -> str:
    pts = " ".join(f"{x0 + x * PANEL_W:.1f},{PAD_T + (1 - y) * PANEL_H:.1f}"
                   for x, y in zip(xs, ys) if 0 <= x <= 1 and np.isfinite(y))
    style = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="{width}"{style}/>'


def draw(out: Path) -> None:
    models = []
    for path in sorted((ROOT / "data").glob("digits_*.npz")):
        data = load_logits(path)
        cal = calibrate_model(data.logits, data.labels, name=data.name, seed=0)
        models.append(cal)
    v_all = np.concatenate([m.sweep.v for m in models])
    u_all = np.concatenate([m.sweep.utility for m in models])
    shared = fit_logistic(v_all, u_all)

    sigma_max = 40.0
    log_lo, log_hi = math.log10(1e-3), math.log10(256.0)
    raw_x = lambda s: s / sigma_max  # noqa: E731
    norm_x = lambda v: (math.log10(v) - log_lo) / (log_hi - log_lo)  # noqa: E731
    ident = lambda a: a  # noqa: E731
    right = PAD_L + PANEL_W + GAP
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="13" viewBox="0 0 {W} {H}">',
             '<rect width="100%" height="100%" fill="white"/>']
    parts += _panel(PAD_L, "Accuracy against raw σ", "σ (logit units)", "accuracy",
                    [(s, f"{s:g}") for s in (0, 10, 20, 30, 40)], raw_x,
                    [(a, f"{a:g}") for a in (0, 0.25, 0.5, 0.75, 1)], ident)
    parts += _panel(right, "Normalized: Ã against v = σ²/S²", "v (log scale)", "Ã = (A − 1/K)/(A₀ − 1/K)",
                    [(v, f"{v:g}") for v in (0.001, 0.01, 0.1, 1, 10, 100)], norm_x,
                    [(a, f"{a:g}") for a in (0, 0.25, 0.5, 0.75, 1)], ident)
    for i, m in enumerate(models):
        colour = COLOURS[i % len(COLOURS)]
        sig, acc = m.sweep.sigma, m.sweep.accuracy
        parts.append(_polyline(PAD_L, [raw_x(s) for s in sig], acc, colour))
        parts.append(_polyline(right, [norm_x(v) for v in m.sweep.v], m.sweep.utility, colour))
        y = PAD_T + 14 + 15 * i
        parts.append(f'<text x="{PAD_L + PANEL_W - 8:.1f}" y="{y}" text-anchor="end" font-size="11" '
                     f'fill="{colour}">{m.name} (S = {m.scale:.2g})</text>')
    grid = np.logspace(log_lo, log_hi, 200)
    parts.append(_polyline(right, [norm_x(v) for v in grid], shared.predict(grid), "black", width=2.4, dash="6 4"))
    parts.append(f'<text x="{right + 8:.1f}" y="{PAD_T + PANEL_H - 10}" font-size="11">dashed: one logistic law '
                 f'fitted to all {len(models)} models (R² = {shared.r2:.3f})</text>')
    parts.append("</svg>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "normalized-curve.svg")
    args = parser.parse_args()
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
