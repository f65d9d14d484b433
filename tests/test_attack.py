"""Tests for caliber_core.simulation.attack: the averaging attack of Proposition 2.

The statistical checks compare the simulation with the exact single-query
agreement of Proposition 1 (Eq. ``top1-exact``), computed here by quadrature
so the reference does not share code with the simulation. Seeds are fixed,
so the tests are deterministic; the tolerances state what Monte-Carlo error
they allow.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from scipy.special import log_ndtr

from caliber_core.simulation.attack import ATTACK_COLUMNS, format_attack_table, simulate_averaging_attack
from caliber_core.serving.runtime import Perturber

N_SAMPLES, N_CLASSES = 2000, 10
SIGMA = 2.0  # median top-two margin of the synthetic logits is ~0.8: single-query agreement ~0.43
Z_TOL = 4.5  # Monte-Carlo tolerance in standard errors (two-sided false alarm ~7e-6)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(20240607)
    logits = rng.normal(0.0, 2.0, size=(N_SAMPLES, N_CLASSES))
    clean = logits.argmax(axis=1)
    labels = np.where(rng.random(N_SAMPLES) < 0.8, clean, rng.integers(0, N_CLASSES, N_SAMPLES))
    return logits, labels


@pytest.fixture(scope="module")
def table(synthetic):
    logits, labels = synthetic
    return simulate_averaging_attack(logits, labels, sigma=SIGMA, m_values=(1, 2, 4, 16), seed=1)


def exact_agreement(logits, sigma, n_nodes=801):
    """Per-row Proposition 1: int phi(u) prod_{j != a} Phi(g_j / sigma + u) du.

    Trapezoid rule on [-9, 9]: the integrand is smooth and its tails beyond
    |u| = 9 weigh < 1e-18; 801 nodes agree with 1601 to ~1e-14.
    """
    n_rows, n_classes = logits.shape
    top = logits.argmax(axis=1)
    gaps = logits[np.arange(n_rows), top][:, None] - logits
    others = np.ones_like(logits, dtype=bool)
    others[np.arange(n_rows), top] = False
    gaps = gaps[others].reshape(n_rows, n_classes - 1)
    u = np.linspace(-9.0, 9.0, n_nodes)
    weights = np.full(n_nodes, u[1] - u[0])
    weights[[0, -1]] /= 2
    log_integrand = np.zeros((n_rows, n_nodes))
    for j in range(n_classes - 1):
        log_integrand += log_ndtr(gaps[:, j, None] / sigma + u[None, :])
    phi = np.exp(-(u**2) / 2) / math.sqrt(2 * math.pi)
    return np.exp(log_integrand) @ (phi * weights)


def value(table, seeding, estimator, m, column="agreement"):
    row = table[(table.seeding == seeding) & (table.estimator == estimator) & (table.m == m)]
    assert len(row) == 1
    return float(row[column].iloc[0])


def test_table_shape_and_columns(table):
    assert list(table.columns) == list(ATTACK_COLUMNS)
    assert len(table) == 2 * 2 * 4
    assert list(table.seeding.unique()) == ["fresh", "per-input"]
    assert list(table.estimator.unique()) == ["soft-average", "majority-vote"]
    assert table.attrs["sigma"] == SIGMA and table.attrs["n_samples"] == N_SAMPLES
    assert table[["agreement", "accuracy"]].apply(lambda c: c.between(0, 1).all()).all()


@pytest.mark.parametrize("m", [1, 2, 4, 16])
def test_fresh_soft_average_matches_single_query_at_sigma_over_sqrt_m(synthetic, table, m):
    # Proposition 2(i): the mean of M fresh responses carries noise
    # N(0, sigma^2 / M), so its agreement is the exact single-query agreement
    # at sigma / sqrt(M). Each input's hit is Bernoulli(pi_i): the simulated
    # mean has standard error sqrt(sum pi_i (1 - pi_i)) / N.
    logits, _ = synthetic
    pi = exact_agreement(logits, SIGMA / math.sqrt(m))
    se = math.sqrt(np.sum(pi * (1 - pi))) / N_SAMPLES
    simulated = value(table, "fresh", "soft-average", m)
    assert abs(simulated - pi.mean()) < Z_TOL * se, (simulated, pi.mean(), se)


def test_fresh_averaging_recovers_agreement(table):
    gain = value(table, "fresh", "soft-average", 16) - value(table, "fresh", "soft-average", 1)
    # Exact values: 0.430 at M = 1, 0.795 at M = 16.
    assert gain > 0.3
    vote_gain = value(table, "fresh", "majority-vote", 16) - value(table, "fresh", "majority-vote", 1)
    assert vote_gain > 0.15
    # Voting discards the soft information, so it recovers less than averaging.
    assert value(table, "fresh", "majority-vote", 16) < value(table, "fresh", "soft-average", 16)


@pytest.mark.parametrize("estimator", ["soft-average", "majority-vote"])
def test_per_input_seeding_gives_no_recovery_at_all(table, estimator):
    # Proposition 2(ii): the M responses are identical, so every M returns
    # exactly the single-query decision.
    rows = table[(table.seeding == "per-input") & (table.estimator == estimator)]
    assert rows.agreement.nunique() == 1 and rows.accuracy.nunique() == 1


def test_per_input_single_query_is_what_the_runtime_serves(synthetic, table):
    logits, labels = synthetic
    served = Perturber(SIGMA, key=b"simulation key, not a secret").perturb(logits, [str(i) for i in range(N_SAMPLES)])
    decision = served.argmax(axis=1)
    assert value(table, "per-input", "soft-average", 16) == np.mean(decision == logits.argmax(axis=1))
    assert value(table, "per-input", "soft-average", 16, "accuracy") == np.mean(decision == labels)


def test_per_input_single_query_matches_proposition_1(synthetic, table):
    logits, _ = synthetic
    pi = exact_agreement(logits, SIGMA)
    se = math.sqrt(np.sum(pi * (1 - pi))) / N_SAMPLES
    assert abs(value(table, "per-input", "soft-average", 1) - pi.mean()) < Z_TOL * se


def test_single_query_estimators_coincide(table):
    for seeding in ("fresh", "per-input"):
        assert value(table, seeding, "soft-average", 1) == value(table, seeding, "majority-vote", 1)


def test_standard_errors_are_binomial(table):
    p = table.agreement.to_numpy()
    np.testing.assert_allclose(table.agreement_se, np.sqrt(p * (1 - p) / N_SAMPLES), rtol=1e-12)


def test_reproducible_for_a_seed_and_different_across_seeds(synthetic):
    logits, _ = synthetic
    kwargs = dict(sigma=SIGMA, m_values=(1, 8), seedings=("fresh",))
    a = simulate_averaging_attack(logits[:300], seed=5, **kwargs)
    b = simulate_averaging_attack(logits[:300], seed=5, **kwargs)
    c = simulate_averaging_attack(logits[:300], seed=6, **kwargs)
    pd.testing.assert_frame_equal(a, b)
    assert not a.agreement.equals(c.agreement)


def test_per_input_results_do_not_depend_on_chunking(synthetic):
    logits, labels = synthetic
    kwargs = dict(sigma=SIGMA, m_values=(1, 3), seedings=("per-input",))
    a = simulate_averaging_attack(logits[:200], labels[:200], chunk_size=7, **kwargs)
    b = simulate_averaging_attack(logits[:200], labels[:200], **kwargs)
    pd.testing.assert_frame_equal(a, b)


def test_without_labels_accuracy_is_nan(synthetic):
    logits, _ = synthetic
    t = simulate_averaging_attack(logits[:100], sigma=1.0, m_values=(1, 2))
    assert t.accuracy.isna().all() and t.accuracy_se.isna().all()
    assert t.agreement.notna().all()


def test_sigma_zero_agrees_everywhere(synthetic):
    logits, labels = synthetic
    t = simulate_averaging_attack(logits[:100], labels[:100], sigma=0.0, m_values=(1, 3))
    assert (t.agreement == 1.0).all()
    assert np.allclose(t.accuracy, np.mean(logits[:100].argmax(1) == labels[:100]))


def test_repeats_pool_independent_passes(synthetic):
    logits, _ = synthetic
    one = simulate_averaging_attack(logits[:300], sigma=SIGMA, m_values=(1,), repeats=1)
    three = simulate_averaging_attack(logits[:300], sigma=SIGMA, m_values=(1,), repeats=3)
    # Per-input repeats use derived keys, so they are new draws, not copies.
    per_input = three[three.seeding == "per-input"].agreement.iloc[0]
    assert per_input != one[one.seeding == "per-input"].agreement.iloc[0]
    np.testing.assert_allclose(three.agreement_se,
                               np.sqrt(three.agreement * (1 - three.agreement) / 900), rtol=1e-12)
    assert three.attrs["repeats"] == 3


def test_progress_is_reported_up_to_one(synthetic):
    logits, _ = synthetic
    fractions = []
    simulate_averaging_attack(logits[:100], sigma=1.0, m_values=(1, 2), chunk_size=30, repeats=2,
                              progress=fractions.append)
    # 2 repeats x 2 seedings x 4 chunks.
    assert len(fractions) == 16
    assert fractions == sorted(fractions) and 0 < fractions[0] and fractions[-1] == 1.0


def test_memory_stays_bounded_by_the_chunk():
    # N x K x M float64 would be 400 * 1000 * 64 * 8 B = 205 MB; a chunk of 50
    # rows keeps a handful of 50 x 1000 arrays (0.4 MB each) alive.
    logits = np.random.default_rng(0).normal(size=(400, 1000))
    tracemalloc.start()
    try:
        simulate_averaging_attack(logits, sigma=1.0, m_values=(64,), seedings=("fresh",), chunk_size=50)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10e6, f"peak traced memory {peak / 1e6:.1f} MB"


def test_subset_of_seedings_and_estimators(synthetic):
    logits, _ = synthetic
    t = simulate_averaging_attack(logits[:50], sigma=1.0, m_values=(4, 1), seedings="per-input",
                                  estimators=("majority-vote",))
    assert list(t.seeding) == ["per-input"] * 2 and list(t.estimator) == ["majority-vote"] * 2
    assert list(t.m) == [1, 4]


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"sigma": -1.0}, ValueError, r"sigma must be finite and >= 0, got -1\.0"),
        ({"sigma": 1.0, "m_values": ()}, ValueError, "m_values must hold at least one query count"),
        ({"sigma": 1.0, "m_values": (1, 0)}, ValueError, "each of m_values must be a positive integer, got 0"),
        ({"sigma": 1.0, "m_values": (1, 2.5)}, ValueError, "each of m_values must be a positive integer, got 2.5"),
        ({"sigma": 1.0, "m_values": (2, 2)}, ValueError, r"m_values has duplicates: \(2, 2\)"),
        ({"sigma": 1.0, "seedings": ("fresh", "sticky")}, ValueError, "seedings must be drawn from .*got 'sticky'"),
        ({"sigma": 1.0, "seedings": ()}, ValueError, "seedings must name at least one"),
        ({"sigma": 1.0, "estimators": ("median",)}, ValueError, "estimators must be drawn from .*got 'median'"),
        ({"sigma": 1.0, "seed": -1}, ValueError, "seed must be a non-negative integer, got -1"),
        ({"sigma": 1.0, "key": b""}, ValueError, "key is 0 bytes; need at least 16"),
        ({"sigma": 1.0, "repeats": 0}, ValueError, "repeats must be a positive integer, got 0"),
        ({"sigma": 1.0, "chunk_size": 0}, ValueError, "chunk_size must be a positive integer, got 0"),
        ({"sigma": 1.0, "progress": 3}, TypeError, "progress must be callable or None, got int"),
    ],
)
def test_invalid_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        simulate_averaging_attack(np.zeros((3, 4)) + np.arange(4), **kwargs)


@pytest.mark.parametrize(
    "logits, labels, match",
    [
        (np.zeros(4), None, r"logits must be 2-D \(n_samples, n_classes\), got shape \(4,\)"),
        (np.zeros((0, 4)), None, r"no rows \(n_samples=0\)"),
        (np.zeros((3, 1)), None, "at least 2 classes, got n_classes=1"),
        (np.array([[0.0, np.inf]]), None, "logits must be finite, got inf at row 0, class 1"),
        (np.array([["a", "b"]]), None, "logits must be real numbers, got dtype <U1"),
        (np.zeros((3, 4)), [0, 1], r"inconsistent numbers of samples: logits 3, labels \(2,\)"),
        (np.zeros((3, 4)), [0.0, 1.0, 2.0], r"labels must be integers in \[0, 4\) \(class indices\), got dtype float64"),
        (np.zeros((3, 4)), [0, 1, 4], r"labels must be integers in \[0, 4\), got range \[0, 4\]"),
    ],
)
def test_invalid_data(logits, labels, match):
    with pytest.raises(ValueError, match=match):
        simulate_averaging_attack(logits, labels, sigma=1.0)


# --------------------------------------------------------------------------
# format_attack_table
# --------------------------------------------------------------------------


def test_format_attack_table(table):
    text = format_attack_table(table)
    lines = text.split("\n")
    assert len(lines) == len(table) + 2
    assert lines[0].split() == ["seeding", "estimator", "M", "agreement", "accuracy"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    first = table.iloc[0]
    assert lines[2].split()[:3] == [first.seeding, first.estimator, str(first.m)]
    assert f"{first.agreement:.4f} +/- {first.agreement_se:.4f}" in lines[2]
    # Fixed width: every value column ends at the same offset.
    assert len({len(line) for line in lines}) == 1


def test_format_attack_table_without_labels_or_errors():
    t = pd.DataFrame({"seeding": ["fresh"], "estimator": ["soft-average"], "m": [4], "agreement": [0.5]})
    assert format_attack_table(t).split("\n")[2].split() == ["fresh", "soft-average", "4", "0.5000", "n/a"]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['agreement'\]"):
        format_attack_table(t.drop(columns="agreement"))
    with pytest.raises(TypeError, match="must be a pandas DataFrame, got dict"):
        format_attack_table({"seeding": "fresh"})
