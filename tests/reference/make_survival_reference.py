"""High-precision reference values of the survival probability (Proposition 1).

    P(sigma) = int phi(u) prod_j Phi(g_j / sigma + u) du            (Eq. top1-exact)

computed with mpmath at ``mp.dps = 30`` for a fixed set of (gaps, sigma) cases,
and written to ``survival_reference.json`` beside this file. The test
``tests/test_survival_reference.py`` compares ``caliber_core.calibration.survival`` against
these numbers; rerun this script only when the case list changes:

    .venv/bin/python tests/reference/make_survival_reference.py

(a few minutes, dominated by the two K = 1000 cases).

Method. Every gap and sigma is a float64 and is converted to mpf exactly, so the
reference is P at exactly the inputs the test feeds to the float64 code.

* Window. The integrand f(u) is log-concave: -log phi has curvature 1 and -log Phi
  has curvature in (0, 1), so log f has curvature between 1 and K. It has one mode
  u*, and only the window where log f > log f(u*) - 80 is integrated (its ends
  found in float64 with scipy's log_ndtr). By concavity the mass outside is at most
  f(u*) e^-80 (w / 80) with w <= sqrt(160) the half-width, while P >= f(u*)
  sqrt(2 pi / K); the truncation is below 1e-34 relative for K <= 1000.
* Rule. The window is cut into equal pieces of width <= 2 (each factor
  Phi(g/sigma + u) varies on the scale of 1 in u; a product of many sharpens to
  ~0.3) and integrated with mpmath's 48-node Gauss-Legendre rule on each piece.
* Checks. A value is accepted only when the same rule on a partition staggered by
  half a piece (different nodes) agrees to 1e-22 relative; for K <= 10, where it
  is cheap, mpmath's adaptive tanh-sinh over the whole real line must agree too
  whenever its own error estimate says it converged (it does not on peaks far out,
  u ~ 20..400, which arise at small sigma when the label trails).
* Speed only: a factor with g/sigma + u > 13 over the whole window is left out.
  There 1 - Phi < 7e-39, so even 999 such factors move P by < 1e-35 relative.

Closed forms stored alongside (no quadrature needed, exact in mpmath):

* K = 2: P = Phi(g / (sqrt(2) sigma));
* all K - 1 gaps zero: P = 1/K for every sigma > 0 (exchangeability).

Gaps of the K = 10, 100, 1000 cases come from ``numpy.random.default_rng(SEED)``
but are written to the JSON explicitly (float64 repr), so the test does not
depend on numpy's generator staying the same.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path

import mpmath as mp
import numpy as np
from mpmath.calculus.quadrature import GaussLegendre
from scipy.special import log_ndtr

mp.mp.dps = 30
DIGITS = 20  # significant digits written per value
SEED = 20240611
OUT = Path(__file__).with_name("survival_reference.json")

DROP_LOG = 80.0  # integrate where f > f(u*) e^-80; the rest is < 1e-32 relative
STEP = 2.0  # Gauss-Legendre pieces of width <= 2
DEGREE = 5  # mpmath degree 5: 48 nodes per piece
DROP_ABOVE = 13  # Phi(13) = 1 - 6e-39
CROSS_REL_TOL = mp.mpf("1e-22")
EST_REL_TOL = mp.mpf("1e-25")  # tanh-sinh counts as converged below this estimate


# --------------------------------------------------------------------------- cases


def _cases() -> list[dict]:
    rng = np.random.default_rng(SEED)
    cases: list[dict] = []

    def add(group, gaps, sigmas):
        for s in sigmas:
            cases.append({"group": group, "gaps": [float(g) for g in gaps], "sigma": float(s)})

    wide = [1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0, 1e3]

    # K = 2 (also checked against the closed form).
    for g in (0.5, 1.0, -0.7, 1e-6, -1e-6, 50.0, 1e3):
        add("K2", [g], [1e-3, 0.1, 1.0, 10.0, 1e3])

    # K = 3: agreement, label trailing, tiny, huge, label last.
    add("K3-positive", [0.3, 1.2], wide)
    add("K3-mixed", [-0.4, 0.9], wide)
    add("K3-tiny", [1e-8, 2.5e-8], [1e-9, 1e-8, 1e-3, 1.0])
    add("K3-huge", [40.0, 800.0], [1e-3, 1.0, 30.0, 300.0, 1e3])
    add("K3-last", [-5.0, -2.0], [0.1, 1.0, 3.0, 100.0])

    # K = 10: seeded gap vectors.
    pos10 = np.sort(rng.exponential(1.5, 9) + 0.05)
    mixed10 = np.sort(rng.normal(0.8, 1.5, 9))
    mixed10[0] = -0.35  # make sure the label trails at least one class
    tiny10 = np.sort(rng.exponential(1e-6, 9) + 1e-8)
    huge10 = np.sort(rng.exponential(200.0, 9) + 30.0)
    add("K10-positive", pos10, wide)
    add("K10-mixed", np.sort(mixed10), wide)
    add("K10-tiny", tiny10, [1e-7, 1e-6, 1e-5, 1e-3])
    add("K10-huge", huge10, [1e-3, 10.0, 100.0, 1e3])

    # K = 100.
    pos100 = np.sort(rng.gamma(2.0, 1.0, 99) + 0.02)
    mixed100 = np.sort(rng.normal(2.0, 1.2, 99))
    mixed100[0] = -0.6
    add("K100-positive", pos100, [1e-3, 0.1, 1.0, 3.0, 1e3])
    add("K100-mixed", np.sort(mixed100), [0.1, 1.0, 10.0])

    # K = 1000: two cases in the transition (mpmath is slow here).
    pos1000 = np.sort(rng.gamma(2.0, 1.5, 999) + 0.01)
    mixed1000 = np.sort(rng.normal(3.0, 1.5, 999))
    mixed1000[0] = -0.4
    add("K1000-positive", pos1000, [1.0])
    add("K1000-mixed", np.sort(mixed1000), [2.0])
    return cases


ZERO_GAP_K = (2, 3, 10, 100, 1000)
ZERO_GAP_SIGMAS = (1e-3, 1.0, 1e3)


# --------------------------------------------------------------------------- quadrature


def _mode(t: np.ndarray) -> float:
    """argmax of log phi(u) + sum log Phi(t + u): root of -u + sum Mills(t + u), decreasing."""

    def dlog(u):
        x = t + u
        return -u + float(np.sum(np.exp(-0.5 * x * x - 0.5 * np.log(2 * np.pi) - log_ndtr(x))))

    lo, hi = -1.0, 1.0
    while dlog(lo) < 0:
        lo *= 2.0
    while dlog(hi) > 0:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if dlog(mid) > 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


_GL = GaussLegendre(mp.mp)


def _gauss_legendre(f, edges, degree: int):
    """Sum of fixed-order Gauss-Legendre rules (3 * 2**(degree-1) nodes) over consecutive edges."""
    nodes = _GL.calc_nodes(degree, mp.mp.prec)
    total = mp.mpf(0)
    for a, b in zip(edges[:-1], edges[1:]):
        half, mid = (b - a) / 2, (a + b) / 2
        total += half * mp.fsum(w * f(half * x + mid) for x, w in nodes)
    return total


def _window(t: np.ndarray, u_star: float) -> tuple[float, float]:
    """Where log f has fallen DROP_LOG below its maximum, on each side of the mode."""

    def logf(u):
        return -0.5 * u * u + float(np.sum(log_ndtr(t + u)))

    top = logf(u_star)
    ends = []
    for direction in (-1.0, 1.0):
        near, far = 0.0, 1.0
        while logf(u_star + direction * far) > top - DROP_LOG:
            near, far = far, 2.0 * far
        for _ in range(100):
            mid = 0.5 * (near + far)
            if logf(u_star + direction * mid) > top - DROP_LOG:
                near = mid
            else:
                far = mid
        ends.append(u_star + direction * far)
    return ends[0], ends[1]


def survival_mp(gaps: list[float], sigma: float) -> tuple[mp.mpf, mp.mpf]:
    """(P, |difference between the two independent rules|) for float64 gaps and sigma > 0."""
    s = mp.mpf(sigma)
    t_float = np.asarray(gaps, dtype=np.float64) / sigma
    u_star = _mode(t_float)
    lo, hi = _window(t_float, u_star)
    t_mp = [mp.mpf(g) / s for g in gaps if not g / sigma + lo > DROP_ABOVE]

    def f(u):
        val = mp.npdf(u)
        for t in t_mp:
            val *= mp.ncdf(t + u)
        return val

    n_pieces = max(2, int(np.ceil((hi - lo) / STEP)))
    width = (mp.mpf(hi) - mp.mpf(lo)) / n_pieces
    edges = [mp.mpf(lo) + width * i for i in range(n_pieces + 1)]
    # The check uses a partition staggered by half a piece (its own nodes).
    staggered = [edges[0]] + [e + width / 2 for e in edges[:-1]] + [edges[-1]]
    val = _gauss_legendre(f, edges, DEGREE)
    check = _gauss_legendre(f, staggered, DEGREE)
    if len(gaps) <= 9 and val > mp.mpf("1e-300"):
        # Small K is cheap: also mpmath's adaptive tanh-sinh over the whole real line.
        # It loses accuracy on peaks far out (u ~ 20..400, when the label trails at
        # small sigma) and says so in its error estimate; only a converged answer counts.
        ts, ts_err = mp.quad(f, [mp.ninf] + edges + [mp.inf], error=True)
        if ts_err < EST_REL_TOL * abs(ts) and abs(ts - val) > CROSS_REL_TOL * abs(val):
            raise RuntimeError(f"tanh-sinh {ts} and Gauss-Legendre {val} disagree")
    diff = abs(check - val)
    if val != 0 and diff > CROSS_REL_TOL * abs(val):
        raise RuntimeError(f"the two Gauss-Legendre rules disagree: {val} vs {check}")
    return val, diff


def _one(case: dict) -> dict:
    t = time.time()
    val, diff = survival_mp(case["gaps"], case["sigma"])
    row = dict(case)
    row["value"] = mp.nstr(val, DIGITS)
    row["rule_difference"] = mp.nstr(diff, 3)
    if len(case["gaps"]) == 1:
        closed = mp.ncdf(mp.mpf(case["gaps"][0]) / (mp.sqrt(2) * mp.mpf(case["sigma"])))
        if val != 0 and abs(closed - val) > CROSS_REL_TOL * abs(val):
            raise RuntimeError(f"K=2 closed form {closed} != quadrature {val}")
        row["closed_form"] = mp.nstr(closed, DIGITS)
    print(f"{case['group']:15s} K={len(case['gaps']) + 1:4d} sigma={case['sigma']:<8g} "
          f"P={mp.nstr(val, 12):>22s} ({time.time() - t:.1f}s)", file=sys.stderr, flush=True)
    return row


def _zero_gaps(k: int, sigma: float) -> dict:
    exact = mp.mpf(1) / k
    if k <= 100:  # the quadrature agrees with the closed form
        val, _ = survival_mp([0.0] * (k - 1), sigma)
        if abs(val - exact) > CROSS_REL_TOL * exact:
            raise RuntimeError(f"zero gaps K={k}: quadrature {val} != 1/K")
    return {"group": f"K{k}-zero", "n_classes": k, "sigma": sigma, "value": mp.nstr(exact, DIGITS)}


def main() -> int:
    t0 = time.time()
    mp.mp.dps = 30
    cases = _cases()
    # Slowest first (K = 1000), spread over the cores; mp.dps is set in each worker on import.
    order = sorted(range(len(cases)), key=lambda i: -len(cases[i]["gaps"]))
    with multiprocessing.Pool() as pool:
        done = pool.map(_one, [cases[i] for i in order], chunksize=1)
        zero = pool.starmap(_zero_gaps, [(k, s) for k in ZERO_GAP_K for s in ZERO_GAP_SIGMAS])
    out_cases = [None] * len(cases)
    for i, row in zip(order, done):
        out_cases[i] = row
    doc = {
        "description": "P(sigma) = int phi(u) prod_j Phi(g_j/sigma + u) du (caliber.tex Eq. top1-exact); "
        "values are decimal strings of 20 significant digits computed with mpmath (mp.dps = 30) "
        "by tests/reference/make_survival_reference.py",
        "generator": "tests/reference/make_survival_reference.py",
        "mp_dps": mp.mp.dps,
        "seed": SEED,
        "cases": out_cases,
        "zero_gaps": zero,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(out_cases)} cases + {len(zero)} zero-gap rows to {OUT} in {time.time() - t0:.0f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
