"""Exact survival probabilities against high-precision mpmath references.

The reference values (``tests/reference/survival_reference.json``) are
P(sigma) = int phi(u) prod_j Phi(g_j / sigma + u) du (Eq. top1-exact) computed
at mp.dps = 30 by ``tests/reference/make_survival_reference.py`` and stored as
20-digit strings; their own error is below 1e-22 relative (the script checks two
independent rules against each other), so every difference seen here is the
float64 code's.

The code under test (``caliber_core.calibration.survival``) uses the trapezoid
rule on |u| <= U_MAX = 8 with spacing QUAD_STEP_FEW = 0.3 for K <= 10 and
QUAD_STEP = 0.2 above. Tolerances, |got - ref| <= ATOL + RTOL * ref, per range of K:

* K <= 10: ATOL 1e-14, RTOL 1e-12. At spacing 0.3 the rule has converged to
  float64 round-off (errors below 3e-15).
* K = 100 and 1000: ATOL 1e-9 (the project's accuracy aim for P), RTOL 1e-8.
  The product of ~1e2-1e3 Phi factors sharpens the integrand to a width ~0.3 in
  u, where spacing 0.2 is no longer at round-off (errors below 2e-11).

Tiny values (P < 1e-18, e.g. 1e-176 when the label trails at small sigma) are
only held to ATOL: their mass lies beyond the quadrature window |u| <= 8 by
design, which is far below float64 resolution of a probability.

Exact points are checked exactly: sigma = 0 gives exactly 1 (all gaps > 0) or
exactly 0 (any gap <= 0). Closed forms: K = 2 is Phi(g / (sqrt(2) sigma)) to
1e-12; all gaps zero give 1/K (exchangeability), held to the same per-K range.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.engine import CurveEngine
from caliber_core.calibration.survival import agreement_probability, survival_probability

REFERENCE = Path(__file__).parent / "reference" / "survival_reference.json"
DATA = json.loads(REFERENCE.read_text())
CASES = DATA["cases"]
ZERO_GAPS = DATA["zero_gaps"]


def _tolerance(n_classes: int) -> tuple[float, float]:
    """(ATOL, RTOL) for a number of classes; see the module docstring."""
    return (1e-14, 1e-12) if n_classes <= 10 else (1e-9, 1e-8)


# The K = 1000 cases set the trapezoid spacing: 0.25 missed the 1e-9 aim (up to
# 9.7e-9 for all-zero gaps, P = 1/1000 exactly); 0.2 keeps it under 1.5e-10.

def _id(case: dict) -> str:
    return f"{case['group']}-sigma{case['sigma']:g}"


def _case_params():
    return [pytest.param(case, id=_id(case)) for case in CASES]


def _zero_params():
    return [pytest.param(row, id=_id(row)) for row in ZERO_GAPS]


def test_reference_file_covers_the_required_ranges():
    ks = {len(c["gaps"]) + 1 for c in CASES}
    sigmas = [c["sigma"] for c in CASES]
    assert {2, 3, 10, 100, 1000} <= ks
    assert min(sigmas) <= 1e-3 and max(sigmas) >= 1e3
    assert any(min(c["gaps"]) < 0 < max(c["gaps"]) for c in CASES)  # the label trails
    assert any(max(abs(g) for g in c["gaps"]) < 1e-5 for c in CASES)  # tiny gaps
    assert any(min(c["gaps"]) >= 30 for c in CASES)  # huge gaps
    assert {row["n_classes"] for row in ZERO_GAPS} == {2, 3, 10, 100, 1000}
    # Values carry more digits than float64 holds (20 significant digits,
    # trailing zeros dropped by mpmath), unless exactly 0 or 1 at that precision.
    assert DATA["mp_dps"] >= 30
    for c in CASES:
        digits = c["value"].split("e")[0].replace(".", "").lstrip("0")
        assert len(digits) >= 17 or float(c["value"]) in (0.0, 1.0), c["value"]


@pytest.mark.parametrize("case", _case_params())
def test_survival_probability_matches_mpmath(case):
    gaps = np.sort(np.array(case["gaps"], dtype=np.float64))[None, :]
    ref = float(case["value"])
    got = survival_probability(gaps, case["sigma"])
    assert got.shape == (1,)
    atol, rtol = _tolerance(gaps.shape[1] + 1)
    assert abs(got[0] - ref) <= atol + rtol * ref, (got[0], ref, got[0] - ref)


@pytest.mark.parametrize("case", [c for c in CASES if len(c["gaps"]) == 1], ids=_id)
def test_two_classes_closed_form(case):
    # K = 2: the survival event is xi_1 - xi_0 < g / sigma with xi_1 - xi_0 ~ N(0, 2).
    g = case["gaps"][0]
    closed = float(case["closed_form"])
    got = survival_probability(np.array([[g]]), case["sigma"])[0]
    assert abs(got - closed) <= 1e-12
    # The closed form is what mpmath's quadrature gave as well.
    assert abs(float(case["value"]) - closed) <= 1e-20


@pytest.mark.parametrize("row", _zero_params())
def test_all_gaps_zero_give_chance(row):
    k = row["n_classes"]
    got = survival_probability(np.zeros((1, k - 1)), row["sigma"])[0]
    atol, rtol = _tolerance(k)
    assert float(row["value"]) == pytest.approx(1.0 / k, rel=1e-15)
    assert abs(got - 1.0 / k) <= atol + rtol / k


@pytest.mark.parametrize(
    "gaps, expected",
    [
        ([0.5], 1.0),
        ([1e-12, 3.0, 7.0], 1.0),
        ([-1e-12, 3.0, 7.0], 0.0),
        ([-2.0, -1.0], 0.0),
        ([0.0, 1.0], 0.0),  # a tie at the top is not a strict win
        ([0.0] * 9, 0.0),
    ],
)
def test_noise_free_is_exactly_zero_or_one(gaps, expected):
    got = survival_probability(np.sort(np.array(gaps))[None, :], 0.0)
    assert got.dtype == np.float64
    assert got[0] == expected


def test_rows_are_independent_of_their_batch():
    # Chunking and the per-block column cut must not mix rows: a batch of all
    # K = 10 cases at one sigma equals the cases one by one.
    rows = [c for c in CASES if len(c["gaps"]) == 9 and c["sigma"] == 1.0]
    assert len(rows) >= 2
    gaps = np.sort(np.array([c["gaps"] for c in rows]), axis=1)
    batch = survival_probability(gaps, 1.0)
    single = np.array([survival_probability(g[None, :], 1.0)[0] for g in gaps])
    np.testing.assert_allclose(batch, single, rtol=1e-14)  # BLAS may round differently
    np.testing.assert_allclose(batch, [float(c["value"]) for c in rows], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", [c for c in CASES if 1 < len(c["gaps"]) < 99 and min(c["gaps"]) > 0], ids=_id)
def test_agreement_probability_from_logits_matches_mpmath(case):
    # Logits with the clean argmax in the middle column: z_a = 0, z_j = -g_j (shuffled).
    gaps = np.array(case["gaps"])
    k = gaps.size + 1
    rng = np.random.default_rng(k)
    others = rng.permutation(-gaps)
    logits = np.insert(others, k // 2, 0.0)[None, :]
    assert np.argmax(logits) == k // 2
    got = agreement_probability(logits, case["sigma"])
    atol, rtol = _tolerance(k)
    assert abs(got[0] - float(case["value"])) <= atol + rtol * float(case["value"])


def test_exact_accuracy_is_the_mean_survival_of_the_label():
    # Rows built from K = 10 reference gaps, the label as the reference class:
    # the engine's exact accuracy must be the mean of the references at that sigma.
    sigma = 1.0
    rows = [c for c in CASES if len(c["gaps"]) == 9 and c["sigma"] == sigma]
    logits, labels = [], []
    for i, c in enumerate(rows):
        label = i % 10
        z = np.insert(-np.array(c["gaps"]), label, 0.0)
        logits.append(z)
        labels.append(label)
    curves = CurveEngine(np.array(logits), np.array(labels), method="exact")
    expected = np.mean([float(c["value"]) for c in rows])
    assert curves.accuracy(sigma)[0] == pytest.approx(expected, rel=1e-12, abs=1e-14)
