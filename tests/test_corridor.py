"""The corridor of Corollary 1 at any size: the exact route against per-row quadrature, the
Monte-Carlo route against the exact quadrature within its standard error, the closed-form
width, the kept per-row values, and agreement targets on a file too large for quadrature."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtr

from caliber_core.calibration import corridor
from caliber_core.calibration.calibrate import calibrate_model, sigma_for_target
from caliber_core.calibration.intervals import BootstrapIntervals
from caliber_core.calibration.engine import EXACT_BUDGET, CurveEngine, choose_method, exact_cost
from caliber_core.calibration.survival import agreement_probability, sorted_gaps, survival_probability
from caliber_core.calibration.config_build import build_config
from caliber_core.loading import load_logits
from caliber_core.simulation.synthetic import make_synthetic_logits

DATA = Path(__file__).resolve().parent.parent / "data"
# |Monte Carlo - exact| <= Z_MC standard errors at every grid point. With ~3 x 24
# grid points per check and strongly correlated errors along sigma (common random
# numbers), 4.5 s.e. leaves a false-alarm rate far below 1e-3.
Z_MC = 4.5


@pytest.fixture(scope="module")
def demo():
    data = load_logits(DATA / "digits_mlp-narrow.npz")
    return calibrate_model(data.logits, data.labels, name="mlp-narrow")


@pytest.fixture(scope="module")
def synthetic():
    """A file with K = 200: quadrature is still affordable in a test, Monte Carlo is cheap."""
    z, y = make_synthetic_logits(300, 200, seed=7)
    return calibrate_model(z, y, name="synthetic-300x200", realizations=64)


def _grid(cal, n=24):
    lo, hi = cal.sigma_range()
    return np.geomspace(lo, hi, n)


def test_exact_route_equals_per_row_quadrature(demo):
    grid = _grid(demo)
    got = corridor.model_curves(demo.logits, demo.labels, grid, method="exact")
    z, y = demo.logits, demo.labels
    n = z.shape[0]
    correct = np.argmax(z, 1) == y
    h = corridor.misclassified_deficits(z, y)
    for j, s in enumerate(grid):
        pi = agreement_probability(z, s)
        a = survival_probability(sorted_gaps(z, y), s)  # the label as reference, every row
        lower = pi[correct].sum() / n
        assert got.agreement[j] == pytest.approx(pi.mean(), abs=1e-12)
        assert got.accuracy[j] == pytest.approx(a.mean(), abs=1e-12)
        assert got.lower[j] == pytest.approx(lower, abs=1e-12)
        assert got.upper[j] == pytest.approx(lower + ndtr(-h / (np.sqrt(2) * s)).sum() / n, abs=1e-12)
    assert got.method == "exact" and not got.estimated and got.max_error() == 0.0
    assert got.agreement_se is None and got.lower_se is None


def test_corridor_holds_and_its_floor_falls(demo):
    c = corridor.model_curves(demo.logits, demo.labels, _grid(demo, 40), method="exact")
    assert np.all(c.lower <= c.accuracy + 1e-12) and np.all(c.accuracy <= c.upper + 1e-12)
    assert np.all(np.diff(c.lower) < 0)  # strictly decreasing (Corollary 1)
    a0 = float(np.mean(np.argmax(demo.logits, 1) == demo.labels))
    assert c.lower[0] <= a0 and c.upper[-1] > c.lower[-1]


def test_monte_carlo_route_agrees_with_quadrature_within_its_error(synthetic):
    grid = _grid(synthetic)
    mc = corridor.model_curves(synthetic.logits, synthetic.labels, grid, draws=synthetic.intervals,
                               method="monte-carlo")
    ex = corridor.model_curves(synthetic.logits, synthetic.labels, grid, method="exact")
    assert mc.method == "monte-carlo" and mc.estimated
    for name, se in (("agreement", mc.agreement_se), ("accuracy", mc.accuracy_se),
                     ("lower", mc.lower_se)):
        err = np.abs(getattr(mc, name) - getattr(ex, name))
        assert np.all(se > 0), name
        assert np.all(err <= Z_MC * se + 1e-12), (name, float(np.max(err / se)))
    # The width is closed form: identical on both routes.
    np.testing.assert_allclose(mc.upper - mc.lower, ex.upper - ex.lower, rtol=0, atol=1e-15)
    assert mc.max_error() == pytest.approx(max(mc.agreement_se.max(), mc.accuracy_se.max(),
                                               mc.lower_se.max()))
    # One standard error with R = 64 draws on 300 rows is a few thousandths.
    assert 1e-4 < mc.max_error() < 0.02


def test_deficit_term_closed_form(demo):
    h = corridor.misclassified_deficits(demo.logits, demo.labels)
    pred = np.argmax(demo.logits, 1)
    wrong = pred != demo.labels
    assert h.shape == (wrong.sum(),) and np.all(h > 0)
    n = demo.n_samples
    sig = np.array([0.0, 0.5, 2.0, 1e6])
    term = corridor.deficit_term(h, sig, n_samples=n)
    assert term[0] == 0.0
    assert term[1] == pytest.approx(np.sum(ndtr(-h / (np.sqrt(2) * 0.5))) / n, rel=1e-12)
    assert term[-1] == pytest.approx(0.5 * wrong.sum() / n, rel=1e-5)  # beta -> 1/2
    assert np.all(np.diff(term) > 0)
    assert np.all(corridor.deficit_term([], sig, n_samples=3) == 0.0)
    with pytest.raises(ValueError, match="n_samples must be an int >= the number of deficits"):
        corridor.deficit_term(h, sig, n_samples=h.size - 1)


def test_the_engine_keeps_the_grid_and_serves_the_bootstrap(demo):
    grid = _grid(demo, 12)
    c = corridor.model_curves(demo.logits, demo.labels, grid, method="exact")
    rows = c.rows
    assert rows.at(grid) is rows.at(grid)  # kept, not evaluated again
    fresh = CurveEngine(demo.logits, demo.labels, method="exact")
    np.testing.assert_allclose(rows.at(grid).accuracy, fresh.at(grid).accuracy, rtol=0, atol=1e-15)
    off = rows.at([1.2345])  # not the grid: computed anew
    np.testing.assert_allclose(off.agreement, fresh.at([1.2345]).agreement, rtol=0, atol=1e-15)
    assert rows.n_samples == demo.n_samples and rows.method == "exact" and rows.has_labels
    kept = BootstrapIntervals(rows, resamples=300, seed=3).bands(grid)
    direct = BootstrapIntervals(fresh, resamples=300, seed=3).bands(grid)
    for q in ("accuracy", "retention", "agreement"):
        for k in ("estimate", "low", "high"):
            np.testing.assert_allclose(kept.bands[q][k], direct.bands[q][k], rtol=0, atol=1e-12)


def test_auto_picks_exact_when_cheap_and_monte_carlo_when_not(demo):
    assert choose_method(500, 10) == "exact"
    assert choose_method(2000, 1000) == "monte-carlo"
    assert exact_cost(2000, 1000) > 1e8
    grid = _grid(demo, 6)
    assert corridor.model_curves(demo.logits, demo.labels, grid, draws=demo.intervals).method == "exact"
    assert corridor.model_curves(demo.logits, demo.labels, grid).method == "exact"  # no draws
    # The calibration's own engine follows the same policy as its sigma*.
    assert demo.engine.method == demo.curve_method == "exact"
    assert corridor.curves_of(demo.engine, grid).method == "exact"


def test_a_plotted_grid_is_exact_only_while_the_whole_grid_is_cheap():
    # The bundled 500 x 10 models keep exact curves on the dashboard's 60 points ...
    assert choose_method(500, 10, 60) == "exact"
    # ... a 2,000 x 100 file is exact for one sigma (its sigma*) but not for 60 of them.
    assert choose_method(2000, 100) == "exact"
    assert choose_method(2000, 100, 60) == "monte-carlo"
    assert choose_method(2000, 100, 1) == "exact"
    assert choose_method(10**6, 2, 60) == "exact"  # closed form at K = 2
    n = int(EXACT_BUDGET // (60 * exact_cost(1, 10)))  # the largest 10-class file still exact on 60 points
    assert choose_method(n, 10, 60) == "exact" and choose_method(n + 1, 10, 60) == "monte-carlo"


def test_unlabelled_curves_have_agreement_only(demo):
    c = corridor.model_curves(demo.logits, None, _grid(demo, 6), method="exact")
    assert c.accuracy is None and c.lower is None and c.upper is None
    assert np.all(np.diff(c.agreement) < 0)


def test_monte_carlo_without_draws_runs_its_own_sweep(synthetic):
    grid = _grid(synthetic, 6)
    c = corridor.model_curves(synthetic.logits, synthetic.labels, grid, method="monte-carlo")
    assert c.method == "monte-carlo" and c.max_error() > 0
    assert c.rows.draws.n_samples == synthetic.n_samples


def test_bad_input_is_refused_with_the_rule(demo, synthetic):
    grid = _grid(demo, 4)
    with pytest.raises(ValueError, match="method must be one of"):
        corridor.model_curves(demo.logits, demo.labels, grid, method="bucketed")
    with pytest.raises(ValueError, match="draws cover 300 rows, logits have 500"):
        corridor.model_curves(demo.logits, demo.labels, grid, draws=synthetic.intervals,
                              method="monte-carlo")
    with pytest.raises(ValueError, match="sigma .the grid. is required"):
        corridor.model_curves(demo.logits, demo.labels)
    with pytest.raises(ValueError, match="sigma must be finite and >= 0"):
        corridor.model_curves(demo.logits, demo.labels, [0.1, -1.0])
    with pytest.raises(ValueError, match="chunk must be an int >= 1"):
        corridor.model_curves(demo.logits, demo.labels, grid, chunk=0)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        corridor.misclassified_deficits(demo.logits, demo.labels[:-1])


def test_agreement_targets_on_a_large_file_invert_the_sweeps_curve(demo):
    z, y = make_synthetic_logits(300, 1000, seed=11)
    cal = calibrate_model(z, y, name="synthetic-300x1000")
    assert cal.curve_method == "monte-carlo"
    t = sigma_for_target(cal, 0.7, kind="agreement")
    assert t.method == "monte-carlo-agreement" and t.agreement == 0.7
    # What that sigma delivers exactly (one quadrature pass), within the sweep's error.
    exact = float(CurveEngine(z, y, method="exact").agreement([t.sigma])[0])
    se = float(cal.intervals.agreement_stderr([t.sigma])[0])
    assert abs(exact - 0.7) <= Z_MC * se + 2e-3  # + the crossing grid's resolution
    cfg = build_config(cal, [t])
    assert cfg["inversion"]["agreement_targets"] == "monte-carlo-agreement"
    assert demo.curve_method == "exact"  # a small file keeps the quadrature
    assert cal.engine.method == "monte-carlo" and cal.engine.draws is cal.intervals
    assert sigma_for_target(demo, 0.7, kind="agreement").method == "exact-agreement"
